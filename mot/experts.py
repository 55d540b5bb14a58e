"""Mixture-of-Transformers routing at dense cost (docs/design.md §3).

`config.model.experts` picks how the blocks' weights are tied across tokens:
  shared    one set of weights for every token (no routing at all);
  mode      expert 0 = understanding (text and clean media), 1 = generation (noised media:
            `mask_ids.noised`), as BAGEL and Cosmos-3's AR + DM transformers;
  modality  expert = the token's modality id (0 text, 1 image, ...), as Meta's MoT.
Each expert owns its QKV/O projections, QK-norms, both pre-norms and MLP; attention stays
global over the whole sequence. Routing is a pure function of `modality` and
`mask_ids.noised`, so a KV-cached decode routes every new token as the full forward does
and the cache holds each token's own expert's keys and values.

Grouping (`group_tokens`, once per forward, shared by every layer): the B rows are split
into S data shards of B/S rows, as many as the logical rules split the batch axis at trace
time (`mot.sharding.batch_shards`: the mesh axes of "activation_batch", S = 1 without a
mesh), and each shard's tokens are grouped on their own. Within a shard the N = B/S*L
tokens are laid out expert by expert in a buffer of R rows: a token's row is its expert's
start plus its rank among that expert's tokens (a cumulative sum: a stable sort by expert
without a sort). The buffer [S, R, ...] keeps the batch axis's logical name, so shard s
lives on the devices that hold rows [s*B/S, (s+1)*B/S) of the batch and moving tokens in
and out is a gather inside one device: no all-to-all and no all-gather of activations,
whatever the data and fsdp sizes (grouping across the whole batch would move every token
to wherever its expert's buffer row lives). Experts' weights are not split by expert (the
rules map "expert" to no mesh axis): every device holds its fsdp share of every expert,
as of any shared weight. The residual stream lives in the buffer through the whole stack;
only attention (RoPE, mask, KV cache) returns to the [B, L] layout. Moving rows in and out
is a gather whose transpose is the opposite gather (`_move_rows`), so no scatter appears
in training. A token's result does not depend on S: only the order in which the gradient
of a kernel sums its rows does.

Two ways to multiply the buffer by each group's weights (`grouped_matmul`):
  ragged  `jax.lax.ragged_dot_general` with the group sizes, the shard a batch dimension
          (R = N). On TPU this is one native grouped matmul; on CPU (and GPU without
          cuDNN's ragged-dot fusion) XLA expands it into one dense matmul per expert: E
          times the FLOPs.
  tiled   every expert's group starts on a tile boundary (tiles of T rows), so every tile
          belongs to one expert; one batched matmul over the K tiles with each tile's
          weights. K = ceil(N / T) + E - 1 covers any split, so (E - 1) * T padding rows
          are computed (6 % for mode at N = 4096, T = 256), plus a gather of K kernel
          copies that the backward pass recomputes rather than keeps (`_tiled_matmul`).
`expert_impl="auto"` takes ragged on TPU and tiled elsewhere (the step-time ratio of "mode"
to "shared" is in docs/performance.md, from bench/experts_step_time.py).

  groups = experts.group_tokens(cfg, inputs.modality, inputs.mask_ids.noised)  # or None
  buf = groups.dispatch(x)                   # [B, L, d] -> [S, R, d]
  y = experts.grouped_matmul(buf, kernel, groups)   # kernel [E, d, out]
  x = groups.combine(y)                      # [S, R, out] -> [B, L, out]
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import optax
import jax.numpy as jnp

from mot import sharding
from mot.config import ModelConfig

Array = jax.Array

UNDERSTANDING, GENERATION = 0, 1   # expert ids of "mode"


def num_experts(cfg: ModelConfig) -> int:
  return {"shared": 1, "mode": 2, "modality": cfg.num_modalities}[cfg.experts]


def expert_ids(cfg: ModelConfig, modality: Array, noised: Array) -> Array:
  """int32 [B, L]: the expert of every token (all 0 for "shared")."""
  if cfg.experts == "mode":
    return noised.astype(jnp.int32) * GENERATION
  if cfg.experts == "modality":
    return jnp.clip(modality, 0, num_experts(cfg) - 1).astype(jnp.int32)
  return jnp.zeros(modality.shape, jnp.int32)


def resolve_impl(impl: str) -> str:
  if impl == "auto":
    return "ragged" if jax.default_backend() == "tpu" else "tiled"
  return impl


# ----------------------------------------------------------------------------------------
# Moving rows between the token layout and the grouped buffer.
# ----------------------------------------------------------------------------------------
def _take_rows(x: Array, index: Array, mask: Array | None) -> Array:
  out = jnp.take(x, index, axis=0, mode="clip", unique_indices=mask is None)
  if mask is not None:
    out = jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), out, 0)
  return out


@jax.custom_vjp
def _move_rows(x, index, inverse, mask, inverse_mask):
  """x[index] (zero where ~mask); `inverse` maps the rows back, so the transpose is the
  gather ct[inverse] (zero where ~inverse_mask) rather than a scatter-add."""
  del inverse, inverse_mask
  return _take_rows(x, index, mask)


def _move_rows_fwd(x, index, inverse, mask, inverse_mask):
  return _take_rows(x, index, mask), (inverse, inverse_mask)


def _move_rows_bwd(res, ct):
  inverse, inverse_mask = res
  return _take_rows(ct, inverse, inverse_mask), None, None, None, None


_move_rows.defvjp(_move_rows_fwd, _move_rows_bwd)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Groups:
  """Tokens grouped by expert, per data shard: one static-shape plan for every layer of a
  forward pass.

  The B rows form S shards of B/S rows. Token n of shard s (of its N = B/S*L tokens,
  row-major) sits in buffer row dest[s, n]; buffer row r of shard s holds token src[s, r]
  where valid[s, r] (padding rows hold zeros). A shard's buffer is K tiles of R // K rows,
  tile k belonging to expert tile_expert[s, k] (ragged: K = R, one row a tile).
  """
  dest: Array           # int32 [S, N]
  src: Array            # int32 [S, R]
  valid: Array          # bool [S, R]
  tile_expert: Array    # int32 [S, K]
  group_sizes: Array    # int32 [S, E] tokens per expert in each shard
  token_shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})  # (B, L)
  impl: str = dataclasses.field(metadata={"static": True})    # "tiled" | "ragged"

  @property
  def num_experts(self) -> int:
    return self.group_sizes.shape[-1]

  @property
  def shards(self) -> int:
    return self.src.shape[0]

  @property
  def tile(self) -> int:
    return self.src.shape[-1] // self.tile_expert.shape[-1]

  def dispatch(self, x: Array) -> Array:
    """[B, L, ...] -> buffer [S, R, ...]."""
    flat = x.reshape((self.shards, -1) + x.shape[2:])
    return jax.vmap(_move_rows)(flat, self.src, self.dest, self.valid, None)

  def combine(self, y: Array) -> Array:
    """Buffer [S, R, ...] -> [B, L, ...]."""
    out = jax.vmap(_move_rows)(y, self.dest, self.src, None, self.valid)
    return out.reshape(self.token_shape + y.shape[2:])

  def tiles(self, x: Array) -> Array:
    """Buffer [S, R, ...] -> [S, K, R // K, ...]."""
    return x.reshape(self.tile_expert.shape + (self.tile,) + x.shape[2:])


def tile_rows(num_tokens: int, num_experts: int, tile: int) -> int:
  """Rows per tile: `tile`, smaller when there are few tokens (decoding)."""
  per_expert = -(-num_tokens // num_experts)
  return max(1, min(tile, -(-per_expert // 8) * 8))


def group_by_expert(expert: Array, num_experts: int, impl: str = "tiled", tile: int = 256,
                    shards: int = 1) -> Groups:
  """The grouping plan of the tokens whose experts are `expert` int32 [B, L], each of
  `shards` blocks of B/shards rows grouped on its own."""
  if impl not in ("tiled", "ragged"):
    raise ValueError(f"unknown expert_impl {impl!r}: use 'auto', 'tiled' or 'ragged'")
  b = expert.shape[0]
  if b % shards:
    raise ValueError(f"{b} rows do not split into {shards} shards")
  per_shard = expert.reshape(shards, -1).astype(jnp.int32)
  plan = jax.vmap(functools.partial(_shard_plan, num_experts=num_experts, impl=impl,
                                    tile=tile))(per_shard)
  return Groups(*plan, token_shape=tuple(expert.shape), impl=impl)


def _shard_plan(e: Array, num_experts: int, impl: str, tile: int):
  """(dest, src, valid, tile_expert, counts) of one shard's tokens e int32 [N]."""
  n = e.shape[0]
  onehot = jax.nn.one_hot(e, num_experts, dtype=jnp.int32)                    # [N, E]
  counts = jnp.sum(onehot, axis=0)                                             # [E]
  # Rank among the tokens of the same expert, in token order: a stable sort by expert.
  rank = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=1) - 1             # [N]
  if impl == "ragged":
    rows, t = n, 1
    starts = jnp.cumsum(counts) - counts
  else:
    t = tile_rows(n, num_experts, tile)
    rows = (-(-n // t) + num_experts - 1) * t
    tiles = -(-counts // t)
    tile_end = jnp.cumsum(tiles)
    starts = (tile_end - tiles) * t
  dest = starts[e] + rank
  src = jnp.zeros((rows,), jnp.int32).at[dest].set(jnp.arange(n, dtype=jnp.int32),
                                                   unique_indices=True)
  valid = jnp.zeros((rows,), bool).at[dest].set(True, unique_indices=True)
  if impl == "ragged":
    tile_expert = e[src]
  else:
    k = rows // t
    tile_expert = jnp.minimum(
        jnp.sum(jnp.arange(k, dtype=jnp.int32)[:, None] >= tile_end[None, :], axis=1),
        num_experts - 1).astype(jnp.int32)
  return dest, src, valid, tile_expert, counts


def group_tokens(cfg: ModelConfig, modality: Array, noised: Array) -> Groups | None:
  """The plan for `cfg.experts` (None for "shared": the dense path, unchanged), grouped
  per data shard of the batch as the current mesh and logical rules split it."""
  if cfg.experts == "shared":
    return None
  return group_by_expert(expert_ids(cfg, modality, noised), num_experts(cfg),
                         resolve_impl(cfg.expert_impl), cfg.expert_tile,
                         sharding.batch_shards(modality.shape[0]))


# ----------------------------------------------------------------------------------------
# Per-expert computation on the buffer.
# ----------------------------------------------------------------------------------------
def grouped_matmul(x: Array, kernel: Array, groups: Groups, in_dims: int = 1,
                   operand_dtype=None) -> Array:
  """Buffer x [S, R, *in] times its rows' experts' kernel [E, *in, *out] -> [S, R, *out].

  operand_dtype (None: x's dtype, the plain product): round both operands to it and
  accumulate in float32, as `mot.matmul.rounded_matmul` does for the dense layers. The
  tiled path rounds its gradient products the same way (the cotangent too); the ragged
  path leaves them to autodiff: products of the float32 cotangent, whose results are
  rounded to operand_dtype on their way back through the operands' casts.
  """
  in_shape = x.shape[2:]
  assert len(in_shape) == in_dims and kernel.shape[1:1 + in_dims] == in_shape, (
      x.shape, kernel.shape, in_dims)
  out_shape = kernel.shape[1 + in_dims:]
  # Matrices [*, in] x [in, out] (free reshapes): XLA:CPU has fast kernels for plain 2-D
  # products, not for the same contraction with several in/out dims.
  shards, rows = x.shape[:2]
  x = x.reshape(shards, rows, -1)
  kernel = kernel.reshape(kernel.shape[0], math.prod(in_shape), -1)
  if groups.impl == "ragged":
    y = _ragged_matmul(_round(x, operand_dtype), _round(kernel, operand_dtype),
                       groups.group_sizes, _acc(operand_dtype))
  else:
    y = _tiled_matmul(groups.tiles(x), kernel, groups.tile_expert, operand_dtype)
  return y.reshape((shards, rows) + out_shape).astype(x.dtype)


def _ragged_matmul(x: Array, kernel: Array, group_sizes: Array, acc) -> Array:
  """x [S, R, in] (each shard's rows sorted by expert, group_sizes [S, E]) times kernel
  [E, in, out] -> [S, R, out]: the shard is a batch dimension of one ragged product."""
  shards = x.shape[0]
  numbers = jax.lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(([2], [2]), ([0], [0])), lhs_ragged_dimensions=[1],
      rhs_group_dimensions=[1])
  return jax.lax.ragged_dot_general(x, jnp.broadcast_to(kernel, (shards,) + kernel.shape),
                                    group_sizes, numbers, preferred_element_type=acc)


def _round(a: Array, dtype) -> Array:
  return a if dtype is None else a.astype(dtype)


def _acc(dtype):
  """preferred_element_type of a product of operands rounded to dtype (None: unrounded)."""
  return None if dtype is None else jnp.float32


def _tile_kernels(kernel: Array, tile_expert: Array) -> Array:
  return jnp.take(kernel, tile_expert, axis=0, mode="clip")         # [S, K, in, out]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tiled_matmul(x: Array, kernel: Array, tile_expert: Array, operand_dtype=None) -> Array:
  """x [S, K, T, in] times each tile's expert's kernel [E, in, out] -> [S, K, T, out],
  from operands rounded to operand_dtype (None: as they are), float32 accumulation."""
  return jnp.einsum("skti,skio->skto", _round(x, operand_dtype),
                    _tile_kernels(_round(kernel, operand_dtype), tile_expert),
                    preferred_element_type=_acc(operand_dtype))


def _tiled_matmul_fwd(x, kernel, tile_expert, operand_dtype):
  # Saves the kernel, not its K tile copies: under nn.scan those would be stacked for
  # every layer (K x the layer's weights of memory) and copied twice.
  return (_tiled_matmul(x, kernel, tile_expert, operand_dtype),
          (x, kernel, tile_expert))


def _tiled_matmul_bwd(operand_dtype, res, ct):
  x, kernel, tile_expert = res
  ct = _round(ct, operand_dtype)
  w = _tile_kernels(_round(kernel, operand_dtype), tile_expert)
  acc = _acc(operand_dtype)
  dx = jnp.einsum("skto,skio->skti", ct, w, preferred_element_type=acc).astype(x.dtype)
  dw = jnp.einsum("skti,skto->skio", _round(x, operand_dtype), ct,
                  preferred_element_type=acc)
  # Sum the tiles' kernel gradients per expert: a tiny one-hot matmul (S*K x E), exact.
  onehot = jax.nn.one_hot(tile_expert, kernel.shape[0], dtype=dw.dtype)
  dkernel = jnp.einsum("ske,skio->eio", onehot, dw, precision=jax.lax.Precision.HIGHEST)
  return dx, dkernel.astype(kernel.dtype), None


_tiled_matmul.defvjp(_tiled_matmul_fwd, _tiled_matmul_bwd)


def expert_scale(x: Array, scale: Array, groups: Groups) -> Array:
  """x [S, R, ..., f] times its rows' experts' scale [E, f]."""
  # Whole on every device before the lookup: the rows are split by shard, and a scale
  # split over f (fsdp) could only be gathered by replicating the looked-up rows.
  scale = nn.with_logical_constraint(scale, (None, None))
  rows = jnp.take(scale, groups.tile_expert, axis=0)                 # [S, K, f]
  rows = rows.reshape(rows.shape[:2] + (1,) * (x.ndim - 2) + rows.shape[2:])
  return (groups.tiles(x) * rows).reshape(x.shape)


def expert_bias(x: Array, bias: Array, groups: Groups) -> Array:
  """x [S, R, *out] (the grouped buffer) plus its rows' experts' bias [E, *out]."""
  # Whole on every device before the lookup, as expert_scale's scale.
  bias = nn.with_logical_constraint(bias, (None,) * bias.ndim)
  rows = jnp.take(bias, groups.tile_expert, axis=0)                  # [S, K, *out]
  rows = rows.reshape(rows.shape[:2] + (1,) + rows.shape[2:])
  return (groups.tiles(x) + rows).reshape(x.shape)


def expert_init(init: Callable, cfg: ModelConfig) -> Callable:
  """Initialiser of a stacked [E, ...] expert weight from a per-expert `init`.

  With `cfg.init_generation_from_understanding` every expert starts as a copy of expert 0
  (BAGEL: the generation expert begins as the understanding expert).
  """
  def stacked(key, shape, dtype=jnp.float32):
    if cfg.init_generation_from_understanding:
      return jnp.broadcast_to(init(key, shape[1:], dtype), shape)
    return init(key, shape, dtype)
  return stacked


# ----------------------------------------------------------------------------------------
# Parameter trees.
# ----------------------------------------------------------------------------------------
def expert_axis(path: tuple, cfg: ModelConfig) -> int | None:
  """Where the expert axis of the parameter at `path` is (None: not an expert weight)."""
  names = [getattr(k, "key", getattr(k, "name", k)) for k in path]
  if cfg.experts == "shared" or "backbone" not in names:
    return None
  return 1 if cfg.scan_layers else 0


def expand_shared(params: Any, cfg: ModelConfig) -> Any:
  """The expert tree whose every expert equals a "shared" tree's block: e.g. to start a
  "mode" run from a trained shared model (BAGEL starts both experts from one LLM)."""
  e = num_experts(cfg)

  def expand(path, leaf):
    axis = expert_axis(path, cfg)
    if axis is None:
      return leaf
    return jnp.repeat(jnp.expand_dims(leaf, axis), e, axis=axis)

  return jax.tree_util.tree_map_with_path(expand, params)


def understanding_mask(params: Any, cfg: ModelConfig) -> Any:
  """A tree of float masks broadcastable against `params`: 0 on what "freeze the
  understanding expert" holds fixed, 1 elsewhere.

  Frozen: expert 0's slice of every block weight (QKV/O, QK-norms, pre-norms, MLP of every
  layer), the token embedding and the AR head — the weights only the understanding path
  uses. Trained: the generation expert, the patch projection, the timestep embedding and
  the DM head.
  """
  def mask(path, leaf):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    shape = getattr(leaf, "shape", ())
    if "ar_head" in names or "token_embedding" in names:
      return jnp.zeros((1,) * len(shape), jnp.float32)
    axis = expert_axis(path, cfg)
    if axis is None:
      return jnp.ones((1,) * len(shape), jnp.float32)
    m = jnp.ones((shape[axis],), jnp.float32).at[UNDERSTANDING].set(0.0)
    return m.reshape((1,) * axis + (shape[axis],) + (1,) * (len(shape) - axis - 1))

  return jax.tree_util.tree_map_with_path(mask, params)


def freeze_understanding(cfg: ModelConfig) -> optax.GradientTransformation:
  """optax transformation zeroing the updates of the understanding expert (see
  `understanding_mask`); stateless, the mask is rebuilt from shapes inside the step."""
  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    masks = understanding_mask(updates, cfg)
    return jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, masks), state

  return optax.GradientTransformation(init, update)
