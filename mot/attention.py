"""Which attention runs (`model.attention_impl`), the mask it reads, and the cached path.

  "xla", "cudnn"  jax.nn.dot_product_attention over a dense bool mask [B, 1, Lq, Lk];
  "blockwise"     `mot.blockwise`: tiles, the mask rule per tile from the ids, no L x L
                  array in either pass;
  "splash"        Pallas splash attention on a TPU (`mot.splash`), given the rule's dense
                  bool mask [B, Lp, Lp] (a known limitation: docs/performance.md §8);
  "auto"          splash on a TPU, cuDNN on a GPU where it applies, blockwise for rows of
                  at least `attention_blockwise_min_length` keys elsewhere, else XLA. With
                  a KV cache (which splash and cuDNN have no path for here) blockwise from
                  that many keys on every backend, else XLA.

`make_mask` runs once per pass (in `MoT.trunk`) and builds only what the chosen kernel
reads: the dense mask for the dense kernels, the ids for blockwise; every layer then calls
`attend` (or `attend_cached` with a KV cache) with it.
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mot import blockwise, masks, splash
from mot.config import ModelConfig

Array = jax.Array


@flax.struct.dataclass
class AttentionMask:
  """What every layer's attention reads: the kernel, and the dense mask or the ids."""
  impl: str = flax.struct.field(pytree_node=False)   # "xla" | "cudnn" | "blockwise" | "splash"
  block_q: int = flax.struct.field(pytree_node=False)
  block_kv: int = flax.struct.field(pytree_node=False)
  dense: Array | None = None              # bool [B, 1, Lq, Lk] (dense kernels)
  q_ids: masks.MaskIds | None = None      # [B, Lq] (blockwise, splash)
  k_ids: masks.MaskIds | None = None      # [B, Lk]


def _cudnn_applies(q, backend: str) -> bool:
  """cuDNN's fused kernel: a GPU of compute capability >= 8.0, bf16/fp16 compute, head_dim
  a multiple of 8 and <= 128, an even sequence length (jax._src.cudnn's conditions for a
  masked training step)."""
  if backend != "gpu" or q.dtype not in (jnp.bfloat16, jnp.float16):
    return False
  head_dim, length = q.shape[-1], q.shape[1]
  if head_dim % 8 or head_dim > 128 or length % 2:
    return False
  capability = getattr(jax.local_devices()[0], "compute_capability", "0")
  return float(capability) >= 8.0


def attention_implementation(cfg: ModelConfig, q, kv_length: int | None = None,
                             cached: bool = False, backend: str | None = None) -> str:
  """Which kernel runs: "xla", "cudnn", "blockwise" or "splash".

  JAX's own default (implementation=None) is XLA's einsum + softmax on every backend, so
  "auto" chooses here (see the module docstring). q: [B, L, H, D] in compute dtype (an
  array or a ShapeDtypeStruct); kv_length: keys per row (default: L); cached: a KV-cache
  call, which only blockwise and XLA serve; backend: jax.default_backend() unless given
  (tests choose for a TPU or a GPU without one).
  """
  if cfg.attention_impl != "auto":
    return cfg.attention_impl
  backend = jax.default_backend() if backend is None else backend
  length = q.shape[1] if kv_length is None else kv_length
  tiled = "blockwise" if length >= cfg.attention_blockwise_min_length else "xla"
  if cached:
    return tiled
  if backend == "tpu":
    return "splash"
  return "cudnn" if _cudnn_applies(q, backend) else tiled


def make_mask(cfg: ModelConfig, q_ids: masks.MaskIds, k_ids: masks.MaskIds,
              cached: bool = False) -> AttentionMask:
  """The pass's mask for the chosen kernel, from the queries' and keys' ids.

  With a KV cache (`cached`), k_ids are the cache slots' ids; the cached path runs
  blockwise when the choice is blockwise and the dense `cached_attention` otherwise.
  """
  b, lq = q_ids.segment.shape
  q = jax.ShapeDtypeStruct((b, lq, cfg.num_heads, cfg.head_dim), cfg.compute_dtype)
  impl = attention_implementation(cfg, q, k_ids.segment.shape[1], cached=cached)
  if cached and impl != "blockwise":   # an explicit splash or cudnn: no cached path
    impl = "xla"
  blocks = dict(block_q=cfg.attention_block_q, block_kv=cfg.attention_block_kv)
  if impl in ("blockwise", "splash"):
    return AttentionMask(impl=impl, q_ids=q_ids, k_ids=k_ids, **blocks)
  return AttentionMask(impl=impl, dense=masks.attention_mask(q_ids, k_ids), **blocks)


def attend(q: Array, k: Array, v: Array, mask: AttentionMask) -> Array:
  """q [B, L, H, D], k, v [B, L, K, D] -> [B, L, H, D] under the pass's mask."""
  if mask.impl == "blockwise":
    return blockwise.attention(q, k, v, mask.q_ids, mask.k_ids, mask.block_q, mask.block_kv)
  if mask.impl == "splash":
    return splash.attention(q, k, v, mask.q_ids, mask.k_ids, mask.block_q, mask.block_kv)
  return jax.nn.dot_product_attention(q, k, v, mask=mask.dense, implementation=mask.impl)


def attend_cached(q: Array, new_kv: dict, cache: dict, cache_index, mask: AttentionMask
                  ) -> Array:
  """`cached_attention` (dense mask) or `blockwise_cached_attention` (ids)."""
  if mask.impl == "blockwise":
    return blockwise_cached_attention(q, new_kv, cache, cache_index, mask.q_ids, mask.k_ids,
                                      mask.block_q, mask.block_kv)
  return cached_attention(q, new_kv, cache, cache_index, mask.dense)


def cached_attention(q: Array, new_kv: dict, cache: dict, cache_index, mask: Array) -> Array:
  """Attention of L new queries over the old cache and their own new keys/values.

  q [B, L, H, D]; new_kv k, v [B, L, K, D]; cache k, v [B, Lmax, K, D] (read only: the
  caller writes new_kv into slots [cache_index, cache_index + L) once, for all layers, so
  a decode step never copies the whole cache); mask bool [B, 1, L, Lmax] over the cache
  slots, the new tokens' own slots included. Returns float32 [B, L, H, D], equal to
  attention over the updated cache.
  """
  b, l, h, d = q.shape
  kv_heads = new_kv["k"].shape[2]
  lmax = cache["k"].shape[1]
  f32 = jnp.float32
  qg = q.astype(f32).reshape(b, l, kv_heads, h // kv_heads, d) * (d ** -0.5)
  slots = jnp.arange(lmax)
  stale = (slots >= cache_index) & (slots < cache_index + l)  # Not yet written.
  mask_old = mask[:, 0] & ~stale                                           # [B, L, Lmax]
  mask_new = jax.lax.dynamic_slice_in_dim(mask[:, 0], cache_index, l, axis=2)  # [B, L, L]
  logits = jnp.concatenate(
      [jnp.einsum("bqkgd,bskd->bkgqs", qg, cache["k"].astype(f32)),
       jnp.einsum("bqkgd,bskd->bkgqs", qg, new_kv["k"].astype(f32))], axis=-1)
  allowed = jnp.concatenate([mask_old, mask_new], axis=-1)[:, None, None]  # [B,1,1,L,S]
  # Same convention as jax.nn.dot_product_attention: masked logits get a large negative
  # number (a query with no allowed key averages uniformly instead of producing NaN).
  logits = jnp.where(allowed, logits, -0.7 * jnp.finfo(f32).max)
  probs = jax.nn.softmax(logits, axis=-1)
  out = (jnp.einsum("bkgqs,bskd->bqkgd", probs[..., :lmax], cache["v"].astype(f32))
         + jnp.einsum("bkgqs,bskd->bqkgd", probs[..., lmax:], new_kv["v"].astype(f32)))
  return out.reshape(b, l, h, d)


def blockwise_cached_attention(q: Array, new_kv: dict, cache: dict, cache_index,
                               q_ids: masks.MaskIds, cache_ids: masks.MaskIds,
                               block_q: int, block_kv: int) -> Array:
  """`cached_attention` with the mask rule per tile from the ids (no [L, Lmax] mask).

  The old cache is read in key blocks (tiles the rule masks are skipped; the slots the new
  tokens will occupy are hidden as not yet written), the new keys as one more set; the
  two online-softmax results merge. cache_ids: [B, Lmax] ids of every cache slot. Returns
  float32 [B, L, H, D]; a query that may read nothing averages uniformly over the old
  slots and the new keys, as `cached_attention`.
  """
  l, lmax = q.shape[1], cache["k"].shape[1]
  block_q, block_kv = min(block_q, l), min(block_kv, lmax)
  slots = jnp.arange(lmax)
  stale = (slots >= cache_index) & (slots < cache_index + l)
  old_ids = dataclasses.replace(cache_ids, keep=cache_ids.keep & ~stale)
  new_ids = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, cache_index, l, axis=1),
                         cache_ids)
  old = blockwise.stats(q, cache["k"], cache["v"], q_ids, old_ids, block_q, block_kv)
  new = blockwise.stats(q, new_kv["k"], new_kv["v"], q_ids, new_ids, block_q, l)
  f32 = jnp.float32
  total = (jnp.sum(cache["v"].astype(f32), axis=1) + jnp.sum(new_kv["v"].astype(f32), axis=1))
  out, _, _ = blockwise.normalise(*blockwise.merge_stats(old, new), fallback=total / (lmax + l))
  return blockwise.untile(out, l)
