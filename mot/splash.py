"""Pallas splash attention (TPU) with the mask rule of `mot.masks` given block by block.

Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) reads its mask as a
`MaskInfo`: per (query block, key block) tile whether it is empty (skipped: neither
loaded nor computed), full, or partial (then a boolean tile says which pairs). The rule
depends on the ids, i.e. on the data, so the mask goes in as splash's dynamic mask: the
rule evaluated once per row and pass from the ids (bool [L, L], one byte a pair, no float
scores), cut into `block_q` x `block_kv` tiles by splash's `process_dynamic_mask`; the
kernel then skips every tile the rule empties (other packed examples, later blocks of
causal text), forward and backward.

Grouped-query heads run as multi-head attention over the key/value heads repeated (O(L)
memory); rows run one after the other (`lax.map`). A query that may read no key (padding)
reads its own key inside the kernel, so no row is empty there, and its output is then
replaced by the uniform average of the values, the dense path's convention. Lengths are
padded to the blocks (blocks never exceed the padded length). On a CPU the kernel runs in
Pallas' interpreter (`interpret=True`: the tests); `model.attention_impl="splash"` itself
is refused off a TPU (`mot.config.validate_model`).
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash_lib

from mot import masks

Array = jax.Array
LANES = 128   # a TPU tile's minor dimension: splash's blocks are multiples of it


def _pad(x: Array, length: int, value=0) -> Array:
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, length - x.shape[1])
  return jnp.pad(x, pad, constant_values=value)


def _padded_ids(ids: masks.MaskIds, length: int) -> masks.MaskIds:
  return masks.MaskIds(index=_pad(ids.index, length), segment=_pad(ids.segment, length),
                       block=_pad(ids.block, length), noised=_pad(ids.noised, length),
                       keep=_pad(ids.keep, length, False))


def block_sizes(length: int, block_q: int, block_kv: int) -> tuple[int, int, int]:
  """(block_q, block_kv, padded length): blocks cut to the length rounded up to LANES,
  the length padded to a multiple of both."""
  top = -(-length // LANES) * LANES
  bq, bk = min(block_q, top), min(block_kv, top)
  step = math.lcm(bq, bk)
  return bq, bk, -(-length // step) * step


def attention(q: Array, k: Array, v: Array, q_ids: masks.MaskIds, k_ids: masks.MaskIds,
              block_q: int, block_kv: int, interpret: bool | None = None) -> Array:
  """Masked attention of q [B, L, H, D] over k, v [B, L, K, D] (one sequence: queries are
  the keys) by splash attention; returns [B, L, H, D] in v's dtype. `interpret` defaults
  to True off a TPU (splash's blocks are multiples of 128 even in the interpreter).

  Under a mesh of several devices the kernel runs per device on its rows (`shard_map`
  over the axes the logical rules give "activation_batch"; heads are gathered)."""
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  run = functools.partial(_attention, block_q=block_q, block_kv=block_kv,
                          interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return run(q, k, v, q_ids, k_ids)
  rows = jax.P(nn.logical_to_mesh_axes(("activation_batch",))[0])
  return jax.shard_map(run, mesh=mesh, in_specs=rows, out_specs=rows, check_vma=False)(
      q, k, v, q_ids, k_ids)


def _attention(q, k, v, q_ids, k_ids, *, block_q: int, block_kv: int, interpret: bool):
  b, length, h, d = q.shape
  groups = h // k.shape[2]
  bq, bk, padded = block_sizes(length, block_q, block_kv)
  allowed = masks.attention_mask(_padded_ids(q_ids, padded), _padded_ids(k_ids, padded))[:, 0]
  seen = jnp.any(allowed, axis=-1)                                     # [B, Lp]
  own = jnp.eye(padded, dtype=bool)[None] & ~seen[..., None]
  sizes = splash_lib.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                                block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq,
                                block_kv_dq=bk)
  heads_first = lambda x: jnp.moveaxis(_pad(x, padded), 2, 1)        # [B, heads, Lp, D]

  def one_row(xs):
    qr, kr, vr, mask = xs
    kernel = splash_lib.make_splash_mha(mask[None], block_sizes=sizes, head_shards=1,
                                        q_seq_shards=1, interpret=interpret)
    # make_splash_mha turns MaskInfo's Python flag into an array, traced here (inside
    # lax.map), which its __call__ then tests in Python; the flag only names a scope.
    kernel.fwd_mask_info = kernel.fwd_mask_info._replace(is_dynamic_mask=True)
    return kernel(qr, jnp.repeat(kr, groups, axis=0), jnp.repeat(vr, groups, axis=0))

  out = jax.lax.map(one_row, (heads_first(q * d ** -0.5), heads_first(k), heads_first(v),
                              allowed | own))
  out = jnp.moveaxis(out, 1, 2)[:, :length]                           # [B, L, H, D]
  mean = jnp.repeat(jnp.mean(v.astype(jnp.float32), axis=1), groups, axis=1)   # [B, H, D]
  return jnp.where(seen[:, :length, None, None], out, mean[:, None]).astype(v.dtype)
