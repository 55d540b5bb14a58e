"""The eight grid neighbours of every image or video patch (`model.patch_mixing`).

Attention lets a patch read every other patch, but a small DM head trained briefly does
not learn to: `bench.patch_coupling` measured a Shapes patch's clean estimate reading its
own noise ~30x more than an edge neighbour's, so each 8x8 patch settled its part of an
object alone and objects broke at patch borders (docs/results.md §6). `"neighbours"`
gives the model the neighbourhood directly, as a convolution would: the input
projection also reads the 3x3 patches around a token (an overlapping patch embedding)
and the DM head's output also writes from its neighbours' hidden states (an overlapping
unpatchify, as U-ViT's final convolution joins patches).

A block lays its tokens out in raster order, start + (frame, row, col) (`mot.data.builder`),
and arrives whole in one call (`mot.media_positions`), so the neighbour at (row + dr,
col + dc) is the token dr * width + dc places away, width being the block's columns. Every
candidate is checked against the coordinates it must hold, so a token at a border, a text
token, an action or another block is never read. The cost is linear in the sequence.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mot import media_positions, modalities

Array = jax.Array
OFFSETS = ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1))  # (dr, dc)
SPATIAL = (modalities.IMAGE, modalities.VIDEO)   # modalities laid out on a grid


def block_width(coordinates: Array, block_ids: Array) -> Array:
  """int32 [B, L]: the number of columns of the token's block (1 + its largest column).

  Each block is one run of an id, so its largest column is a running maximum that
  restarts at the run's first token, then carried back to the run's earlier tokens by a
  reversed running maximum: both linear in L."""
  previous = jnp.pad(block_ids[:, :-1], ((0, 0), (1, 0)))
  run = jnp.cumsum((block_ids != previous).astype(jnp.int32), axis=1)   # run index
  span = coordinates.shape[1] + 1                   # larger than any column
  col = coordinates[..., 2]
  forward = jax.lax.cummax(run * span + col, axis=1) - run * span        # max so far in run
  backward = jax.lax.cummax(-run * span + forward, axis=1, reverse=True) + run * span
  return jnp.where(block_ids > 0, backward + 1, 0).astype(jnp.int32)


def find(positions: Array, block_ids: Array, modality: Array) -> tuple[Array, Array]:
  """(index int32 [B, L, 8], valid bool [B, L, 8]): where each token's neighbour at
  `OFFSETS[k]` sits in the sequence, and whether it exists (same image or video block,
  same frame, that row and column). Tokens outside a spatial block have none."""
  coords = media_positions.block_coordinates(positions, block_ids)
  width = block_width(coords, block_ids)
  length = block_ids.shape[1]
  here = jnp.arange(length, dtype=jnp.int32)[None, :, None]
  steps = jnp.asarray(OFFSETS, jnp.int32)                              # [8, 2]
  index = here + steps[:, 0] * width[..., None] + steps[:, 1]          # [B, L, 8]
  inside = (index >= 0) & (index < length)
  index = jnp.clip(index, 0, length - 1)
  take = lambda a: jnp.take_along_axis(a[:, None, :], index.reshape(a.shape[0], 1, -1),
                                       axis=2).reshape(index.shape)
  want = coords[:, :, None, :] + jnp.pad(steps, ((0, 0), (1, 0)))       # [B, L, 8, 3]
  same_place = jnp.stack([take(coords[..., a]) == want[..., a] for a in range(3)], -1)
  # A block holds one medium, so a neighbour in the token's block shares its modality.
  spatial = jnp.isin(modality, jnp.asarray(SPATIAL)) & (block_ids > 0)
  valid = (inside & same_place.all(-1) & (take(block_ids) == block_ids[..., None])
           & spatial[..., None])
  return index, valid


def gather(values: Array, index: Array, valid: Array) -> Array:
  """[B, L, 8, C]: values [B, L, C] of each token's neighbours, zero where none."""
  b, l, k = index.shape
  picked = jnp.take_along_axis(values, index.reshape(b, l * k, 1), axis=1)
  picked = picked.reshape(b, l, k, values.shape[-1])
  return jnp.where(valid[..., None], picked, jnp.zeros((), values.dtype))
