"""Latent diffusion end to end on a tiny VAE (tests/golden/vae_sd: random weights, 4
latent channels, 4x downsampling): images encoded once into a cache, a step of training,
then generation decoded to PNG and reading of the same clean latents; the cache's and
the config's one-line errors; the resolution-dependent timestep shift."""
import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from configs import digits, image_folder
from mot import config as config_lib
from mot import diffusion, latent, sample_cli, train_lib
from mot.data import input_pipeline, latent_cache, user_data
from mot.pipeline import Pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAE = os.path.join(ROOT, "tests", "golden", "vae_sd")
COLORS = [(230, 20, 20), (20, 200, 40), (30, 40, 220)]
NAMES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """Nine 16x16 RGB images of a coloured square, captioned by colour."""
  d = tmp_path_factory.mktemp("latent_data")
  rng = np.random.default_rng(0)
  lines = []
  for i in range(9):
    im = np.full((16, 16, 3), 250, np.uint8)
    r, c = rng.integers(0, 12, 2)
    im[r:r + 4, c:c + 4] = COLORS[i % 3]
    Image.fromarray(im).save(d / f"{i}.png")
    lines.append(json.dumps({"image": f"{i}.png", "caption": f"a {NAMES[i % 3]} square"}))
  (d / "captions.jsonl").write_text("\n".join(lines) + "\n")
  return d


@pytest.fixture(scope="module")
def cache(folder, tmp_path_factory):
  out = tmp_path_factory.mktemp("cache") / "latents"
  user_data.main([str(folder), str(out), "--vae", VAE])
  return out


def latent_config(folder, cache):
  c = image_folder.get_config("tiny")
  c.data.path, c.data.latent_cache, c.latent.vae = str(folder), str(cache), VAE
  c.data.num_heldout = 1
  c.resolution_shift_tokens = 1          # 4 latent tokens an image: shift sqrt(4) = 2
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 1
  return c


def test_the_cache_holds_each_image_encoded_and_scaled(folder, cache):
  meta = latent_cache.read_meta(str(cache))
  assert meta["latent_shape"] == [4, 4, 4] and meta["image_size"] == [16, 16]
  latents = np.load(cache / latent_cache.LATENTS_FILE)
  from mot import vae as vae_lib
  vae = vae_lib.load_diffusers(VAE)
  x = np.asarray(Image.open(folder / "3.png"), np.float32)[None] / 255.0 * 2 - 1
  np.testing.assert_allclose(latents[3], vae.scale_latents(vae.encode(x))[0], atol=1e-5)


@pytest.fixture(scope="module")
def run(folder, cache, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("latent_run"))
  train_lib.train_and_evaluate(latent_config(folder, cache), workdir)
  return workdir


def test_latent_run_generates_decoded_images_and_reads_the_same_latents(run, folder, cache,
                                                                         tmp_path):
  pipe = Pipeline.from_workdir(run)
  assert pipe.prompts.channels == 4 and tuple(pipe.prompts.image_size) == (4, 4)
  assert pipe.time_shift == pytest.approx(2.0)
  assert tuple(pipe.model_cfg.modality_patch_dims[1:3]) == (16, 16)   # 2x2 patches of 4
  images = pipe.generate("a red square", num_samples=2, steps=2)
  assert images.shape == (2, 16, 16, 3) and 0 <= images.min() and images.max() <= 1
  # Reading a file encodes it as the cache did: the clean latents the reading task saw.
  unit, _ = pipe.unit_images(str(folder / "8.png"))
  held = input_pipeline.heldout_images(pipe.config.data)
  np.testing.assert_allclose(pipe.encode_latents(unit)[0], held[0], atol=1e-5)
  assert isinstance(pipe.reason(images=str(folder / "8.png"), max_new_tokens=3), str)
  out = tmp_path / "out"
  sample_cli.run_sample(sample_cli.Request(run, "generate", prompts=["a blue square"],
                                           out=str(out), steps=1), stdout=open(os.devnull, "w"))
  with Image.open(out / "sample_0000.png") as png:
    assert png.size == (16, 16) and png.mode == "RGB"


def filled(c, values=16):
  """The fields train.py would fill from the data, set by hand."""
  c.data.image_size, c.data.channels, c.data.patch_dim = (16, 16), 3, values
  c.model.modality_patch_dims, c.sample.max_new_tokens = (0, values, values, 2), 16
  return c


def test_latent_config_errors_are_one_line(folder, cache, tmp_path):
  c = filled(latent_config(folder, cache), 12)          # RGB pixel patches, not latents
  with pytest.raises(config_lib.ConfigError, match=r"modality_patch_dims\[1\]=12 disagrees "
                     r"with the latent: patch_size\*\*2 \* the VAE's 4 latent channels = 16"):
    config_lib.validate(c)
  c = filled(latent_config(folder, ""))
  with pytest.raises(config_lib.ConfigError, match="data.latent_cache is empty: encode"):
    config_lib.validate(c)
  c.data.latent_cache, c.data.image_size = str(cache), (16, 24)
  with pytest.raises(config_lib.ConfigError, match=r"encoded with image_size \[16, 16\] "
                                                   r"\(config: \[16, 24\]\)"):
    config_lib.validate(c)


def test_a_stale_cache_is_refused(folder, cache, tmp_path):
  moved = tmp_path / "data"
  moved.mkdir()
  for name in os.listdir(folder):
    (moved / name).write_bytes((folder / name).read_bytes())
  lines = (moved / "captions.jsonl").read_text().splitlines()
  (moved / "captions.jsonl").write_text("\n".join(lines[::-1]) + "\n")  # another order
  c = filled(latent_config(moved, cache))
  with pytest.raises(ValueError, match="was written from other pairs"):
    input_pipeline.validate(c.data)


def test_resolution_shift_moves_training_and_sampling_times_alike():
  config = digits.get_config("tiny")
  assert latent.timestep_shift(config) == 1.0                 # off: nothing moves
  config.resolution_shift_tokens = 4                           # 16 tokens of 2x2 patches
  assert latent.timestep_shift(config) == pytest.approx(2.0)
  block_ids = np.array([[1, 1, 2, 2, 0]])
  noised = block_ids > 0
  rng = jax.random.PRNGKey(0)
  plain = diffusion.block_timesteps(rng, block_ids, noised)
  shifted = diffusion.block_timesteps(rng, block_ids, noised, shift=2.0)
  np.testing.assert_allclose(shifted, np.where(noised, 2 * plain / (1 + plain), 0), rtol=1e-6)
  assert np.all(shifted[noised] > plain[noised])
  np.testing.assert_allclose(diffusion.time_grid(4, 2.0),
                             diffusion.shift_time(diffusion.time_grid(4), 2.0), rtol=1e-6)
