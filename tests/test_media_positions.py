"""Absolute media positions (model.media_pos_embed): grid coordinates inside each block,
the sin-cos features, and their place in the input embedding."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot import media_positions
from mot.config import ConfigError, validate_model
from mot.data.builder import SequenceBuilder
from mot.model import InputEmbedding, inputs_from_batch
from tests._models import model_config

CFG = model_config(d_model=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                   mlp_dim=64, rope_sections=(2, 3, 3), time_embed_dim=64, patch_dim=4)


def mixed_example(seq_len=None):
  """Text, a 2 x 3 image, text, a 2-frame 2 x 2 clip, then a clip laid out frame by frame."""
  b = SequenceBuilder(patch_dim=4)
  b.add_text([70, 71, 72])
  b.add_image(np.ones((2, 3, 4)), noised=False)
  b.add_text([73])
  b.add_video(np.ones((2, 2, 2, 4)), noised=True)
  b.add_video_frames(np.ones((2, 2, 2, 4)), roles=("given", "noised"))
  return b.build(seq_len)


def expected_coordinates(example):
  """(frame, row, col) of each block's tokens in the builder's row-major order, by hand."""
  out = np.zeros((len(example["block_ids"]), 3), np.int32)
  grids = {1: (1, 2, 3), 2: (2, 2, 2), 3: (1, 2, 2), 4: (1, 2, 2)}
  for block, (t, h, w) in grids.items():
    where = np.flatnonzero(example["block_ids"] == block)
    out[where] = np.stack(np.meshgrid(*map(np.arange, (t, h, w)), indexing="ij"), -1).reshape(-1, 3)
  return out


def test_block_coordinates_are_each_tokens_grid_place_and_zero_for_text():
  ex = mixed_example(seq_len=40)   # padded: padding is text, coordinates 0
  coords = media_positions.block_coordinates(jnp.asarray(ex["positions"])[None],
                                             jnp.asarray(ex["block_ids"])[None])
  assert sorted(set(ex["block_ids"].tolist())) == [0, 1, 2, 3, 4]
  np.testing.assert_array_equal(coords[0], expected_coordinates(ex))


def test_a_block_alone_or_left_padded_finds_the_same_coordinates():
  """A sampler feeds the noised block without its prefix (cached) or after padding."""
  ex = mixed_example()
  where = ex["block_ids"] == 2
  alone = media_positions.block_coordinates(jnp.asarray(ex["positions"][where])[None],
                                            jnp.asarray(ex["block_ids"][where])[None])
  np.testing.assert_array_equal(alone[0], expected_coordinates(ex)[where])
  padded_ids = np.concatenate([np.zeros(5, np.int32), ex["block_ids"]])
  padded_pos = np.concatenate([np.zeros((5, 3), np.int32), ex["positions"]])
  coords = media_positions.block_coordinates(jnp.asarray(padded_pos)[None],
                                             jnp.asarray(padded_ids)[None])
  np.testing.assert_array_equal(coords[0, 5:], expected_coordinates(ex))


def test_sincos_features_by_formula_and_zero_padded():
  coords = jnp.asarray([[[0, 0, 0], [1, 2, 3]]])
  emb = np.asarray(media_positions.sincos_embedding(coords, 64))   # 10 frequencies an axis
  assert emb.shape == (1, 2, 64)
  freqs = 10000.0 ** (-np.arange(10) / 10)
  for axis, value in enumerate((1, 2, 3)):
    block = emb[0, 1, axis * 20:(axis + 1) * 20]
    np.testing.assert_allclose(block, np.concatenate([np.sin(value * freqs),
                                                      np.cos(value * freqs)]), rtol=1e-6)
  np.testing.assert_array_equal(emb[0, 0, :60], np.tile(np.repeat([0.0, 1.0], 10), 3))
  np.testing.assert_array_equal(emb[..., 60:], 0.0)
  with pytest.raises(ValueError, match="d_model >= 6"):
    media_positions.sincos_embedding(coords, 5)


def test_the_embedding_adds_the_grid_features_to_media_tokens_only():
  batch = jax.tree.map(lambda a: jnp.asarray(a)[None], mixed_example(seq_len=40))
  batch["segment_ids"] = jnp.ones((1, 40), jnp.int32)
  inputs = inputs_from_batch(batch)
  t_emb = jnp.zeros((1, 40, CFG.d_model))
  with_grid = dataclasses.replace(CFG, media_pos_embed="sincos")
  params = nn.meta.unbox(InputEmbedding(CFG).init(jax.random.PRNGKey(0), inputs, t_emb))
  plain = InputEmbedding(CFG).apply(params, inputs, t_emb)
  placed = InputEmbedding(with_grid).apply(params, inputs, t_emb)
  coords = jnp.asarray(expected_coordinates(mixed_example(40)))[None]
  grid = media_positions.sincos_embedding(coords, CFG.d_model)
  media = (batch["modality"] > 0)[..., None]
  np.testing.assert_allclose(placed, plain + jnp.where(media, grid, 0.0), atol=1e-6)
  assert not np.allclose(placed, plain)


def test_an_unknown_media_pos_embed_is_one_line():
  with pytest.raises(ConfigError, match="media_pos_embed='learned' is unknown") as e:
    validate_model(dataclasses.replace(CFG, media_pos_embed="learned"))
  assert "\n" not in str(e.value)
