"""Grid neighbours of image and video patches (model.patch_mixing, mot.patch_neighbours)."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from mot import modalities, patch_neighbours
from mot.config import ConfigError, validate_model
from tests._models import model_config

TEXT, IMAGE, VIDEO, ACTION = (modalities.TEXT, modalities.IMAGE, modalities.VIDEO,
                              modalities.ACTION)


def _row(parts, length):
  """positions [L, 3], block ids [L], modality [L] of `parts` laid out as the data builder
  does: text tokens, then blocks of start + (frame, row, col) in raster order; padding."""
  positions, blocks, modality = [], [], []
  start, block = 0, 0
  for kind, shape in parts:
    if kind == TEXT:
      for _ in range(shape):
        positions.append((start,) * 3), blocks.append(0), modality.append(TEXT)
        start += 1
      continue
    block += 1
    frames, rows, cols = shape
    for f in range(frames):
      for r in range(rows):
        for c in range(cols):
          positions.append((start + f, start + r, start + c))
          blocks.append(block), modality.append(kind)
    start += max(shape)
  pad = length - len(blocks)
  return (np.array(positions + [(0, 0, 0)] * pad), np.array(blocks + [0] * pad),
          np.array(modality + [TEXT] * pad))


def _brute_force(positions, blocks, modality):
  """For each token and offset, the index of the token holding that neighbour's place, or
  -1: a search over every token."""
  coords = {}
  for j, b in enumerate(blocks):
    if b > 0:
      first = np.flatnonzero(blocks == b)[0]
      coords[j] = tuple(positions[j] - positions[first])
  out = -np.ones((len(blocks), len(patch_neighbours.OFFSETS)), int)
  for i, b in enumerate(blocks):
    if b == 0 or modality[i] not in patch_neighbours.SPATIAL:
      continue
    f, r, c = coords[i]
    for k, (dr, dc) in enumerate(patch_neighbours.OFFSETS):
      for j in np.flatnonzero(blocks == b):
        if coords[j] == (f, r + dr, c + dc):
          out[i, k] = j
  return out


def test_neighbours_are_the_tokens_at_those_grid_places():
  """Two rows: images of 3x4 and 2x2 patches, a two-frame video, an action chunk and
  text between; every neighbour found is the token at that place of the same block and
  frame, and every such token is found."""
  rows = [[(TEXT, 2), (IMAGE, (1, 3, 4)), (TEXT, 1), (IMAGE, (1, 2, 2)), (ACTION, (3, 1, 1))],
          [(TEXT, 3), (VIDEO, (2, 3, 3)), (TEXT, 2), (IMAGE, (1, 1, 5))]]
  built = [_row(parts, 40) for parts in rows]
  positions, blocks, modality = (jnp.asarray(np.stack(a)) for a in zip(*built))
  index, valid = patch_neighbours.find(positions, blocks, modality)
  found = np.where(np.asarray(valid), np.asarray(index), -1)
  for row, (p, b, m) in enumerate(built):
    np.testing.assert_array_equal(found[row], _brute_force(p, b, m))
  # ordered pairs of 8-connected places: 3x4 has 29 pairs, 2x2 has 6, 3x3 20, 1x5 4
  assert (found[0] >= 0).sum() == 2 * (29 + 6)
  assert (found[1] >= 0).sum() == 2 * (2 * 20 + 4)            # both frames, and 1x5


def test_gather_reads_the_neighbours_values_and_zero_where_none():
  positions, blocks, modality = (jnp.asarray(a)[None] for a in _row([(IMAGE, (1, 2, 2))], 5))
  values = jnp.arange(10, dtype=jnp.float32).reshape(1, 5, 2)
  around = patch_neighbours.gather(values, *patch_neighbours.find(positions, blocks, modality))
  # token 0 (row 0, col 0): right (0, 1) is token 1, below (1, 0) token 2, diagonal token 3
  right, below, diagonal = (patch_neighbours.OFFSETS.index(o) for o in ((0, 1), (1, 0), (1, 1)))
  np.testing.assert_array_equal(around[0, 0, [right, below, diagonal]], values[0, 1:4])
  others = [k for k in range(8) if k not in (right, below, diagonal)]
  assert not np.asarray(around[0, 0, others]).any() and not np.asarray(around[0, 4]).any()


def test_an_unknown_patch_mixing_is_one_line():
  with pytest.raises(ConfigError, match="patch_mixing='conv' is unknown") as e:
    validate_model(dataclasses.replace(model_config(), patch_mixing="conv"))
  assert "\n" not in str(e.value)
