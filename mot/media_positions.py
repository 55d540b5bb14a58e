"""Absolute positions of media tokens inside their block (`model.media_pos_embed`).

M-RoPE tells attention how far apart two tokens are, never where a token is: a patch's
value carries its pixels but not its row or column, so "is the red circle left of the
blue square?" must be inferred from attention patterns alone. DiT, MAE and BAGEL add a
fixed sin-cos embedding of each patch's grid coordinates to its projection; "sincos" does
the same for every media token, from the (frame, row, col) it holds in its block.

A block's coordinates are its tokens' M-RoPE positions less its first token's (the data
builder lays a block out as start + (frame, row, col): `mot.data.builder`). Blocks are
contiguous runs of one block id and arrive whole in one call (training rows, the prefix
of a cached call, the noised block a sampler denoises), so the first token is found by a
running maximum, linear in the sequence length.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
MAX_PERIOD = 10000.0   # the sin-cos base, as DiT's and MAE's grid embeddings


def block_coordinates(positions: Array, block_ids: Array) -> Array:
  """int32 [B, L, 3]: a token's (frame, row, col) in its block; 0 outside blocks.

  Args:
    positions: int [B, L, 3] M-RoPE (t, h, w) positions.
    block_ids: int [B, L] block ids (0 = text); a block is a run of one id > 0.
  """
  length = block_ids.shape[1]
  index = jnp.arange(length, dtype=jnp.int32)[None]
  previous = jnp.pad(block_ids[:, :-1], ((0, 0), (1, 0)))
  starts = (block_ids > 0) & (block_ids != previous)
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  origin = jnp.take_along_axis(positions, first[..., None], axis=1)
  inside = (block_ids > 0)[..., None]
  return jnp.where(inside, positions - origin, 0).astype(jnp.int32)


def sincos_embedding(coordinates: Array, dim: int) -> Array:
  """float32 [B, L, dim]: sin and cos of each of the 3 coordinates at dim // 6
  frequencies 1 / MAX_PERIOD**(i / (dim // 6)); zero-padded when 6 does not divide dim."""
  per_axis = dim // 6
  if per_axis == 0:
    raise ValueError(f"a sin-cos grid embedding needs d_model >= 6, got {dim}")
  freqs = MAX_PERIOD ** (-jnp.arange(per_axis, dtype=jnp.float32) / per_axis)
  angles = coordinates.astype(jnp.float32)[..., None] * freqs        # [B, L, 3, F]
  features = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)  # [B, L, 3, 2F]
  features = features.reshape(*coordinates.shape[:-1], 6 * per_axis)
  return jnp.pad(features, [(0, 0)] * (features.ndim - 1) + [(0, dim - 6 * per_axis)])


def embedding(kind: str, positions: Array, block_ids: Array, dim: int) -> Array | None:
  """The [B, L, dim] absolute embedding `kind` adds to media tokens, or None for "none"."""
  if kind == "none":
    return None
  if kind == "sincos":
    return sincos_embedding(block_coordinates(positions, block_ids), dim)
  raise ValueError(f"unknown media_pos_embed {kind!r}")
