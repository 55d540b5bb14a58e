"""Colour through the image path: patches, files, arrays and prompts with C channels."""
import numpy as np
import pytest
from PIL import Image

from mot import media, patches
from mot.data import digits
from mot.errors import InputError
from mot.prompts import PromptBuilder


def test_patchify_orders_pixels_then_channels_and_round_trips():
  images = np.random.default_rng(0).random((2, 8, 12, 3)).astype(np.float32)
  tokens = patches.patchify(images, 4)
  assert tokens.shape == (2, 2, 3, 48)
  # Token (1, 2) is the 4x4x3 block at rows 4..7, columns 8..11, pixel-major.
  np.testing.assert_array_equal(tokens[0, 1, 2], images[0, 4:8, 8:12].reshape(-1))
  np.testing.assert_array_equal(patches.unpatchify(tokens, 4, 3), images)
  gray = images[..., 0]
  np.testing.assert_array_equal(digits.patchify(gray, 2), patches.patchify(gray[..., None], 2))
  with pytest.raises(ValueError, match="need 16"):
    patches.unpatchify(tokens, 4, 1)


def test_rgb_files_and_arrays_read_as_unit_images(tmp_path):
  rgb = np.zeros((16, 16, 3), np.uint8)
  rgb[2:6, 3:9] = (255, 0, 0)
  rgb[10:14, 10:14] = (0, 255, 255)
  Image.fromarray(rgb, "RGB").save(tmp_path / "a.png")
  loaded = media.load_image(tmp_path / "a.png", None, channels=3)
  np.testing.assert_array_equal(loaded, rgb / 255.0)           # no inversion, no mixing
  half = media.load_image(tmp_path / "a.png", 8, channels=3)
  assert half.shape == (8, 8, 3) and half[2, 3].tolist() == [1.0, 0.0, 0.0]
  arrays, single = media.to_unit_images([rgb, rgb], 16, channels=3)
  assert arrays.shape == (2, 16, 16, 3) and not single
  np.testing.assert_allclose(arrays[1], rgb / 255.0)
  one, single = media.to_unit_images(rgb, 16, channels=3)
  assert one.shape == (1, 16, 16, 3) and single
  with pytest.raises(InputError, match=r"\[H, W, 3\]"):
    media.to_unit_images(np.zeros((16, 16)), 16, channels=3)
  with pytest.raises(InputError, match="maximum of 2"):
    media.to_unit_images(np.full((16, 16, 3), 2.0), 16, channels=3)


def test_rgb_png_and_grid_round_trip(tmp_path):
  image = np.random.default_rng(1).random((6, 6, 3)).astype(np.float32)
  media.save_png(str(tmp_path / "x.png"), image)
  with Image.open(tmp_path / "x.png") as png:
    assert png.mode == "RGB"
  np.testing.assert_allclose(media.load_image(tmp_path / "x.png", None, 3), image, atol=1 / 255)
  mosaic = media.grid(np.stack([image] * 4), rows=2, scale=2)
  assert mosaic.shape == (2 * (12 + 1) + 1, 2 * (12 + 1) + 1, 3)
  np.testing.assert_array_equal(mosaic[1:3, 1:3], image[:1, :1].repeat(2, 0).repeat(2, 1))


def test_prompts_cut_rgb_images_into_wide_patches():
  builder = PromptBuilder(patch_dim=48, patch_size=4, image_size=16, channels=3,
                          read_window=0, video_layout="clip", action_dim=2)
  image = np.random.default_rng(2).random((16, 16, 3)).astype(np.float32)
  ex = builder.reasoning_prompt("What color is the square?", image)
  block = ex["modality"] == 1
  assert block.sum() == 16 and ex["patches"].shape[-1] == 48
  np.testing.assert_allclose(ex["patches"][block][0], (image[:4, :4] * 2 - 1).reshape(-1))
  gen = builder.generation_example("a red square")
  assert (gen["dm_mask"] > 0).sum() == 16
  assert builder.frame_shape == (16, 16, 3)
