"""mot.vae_train_lib: the tiny VAE trains, exports a diffusers folder, resumes exactly."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from configs import vae_shapes
from mot import checkpoint as ckpt_lib
from mot import vae as vae_lib
from mot import vae_train_lib
from mot.data import shapes_scene
from mot.errors import ConfigError
from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny run of 6 steps (checkpoints at 3 and 6), its result and its exported weights."""
  workdir = str(tmp_path_factory.mktemp("vae_tiny"))
  config = vae_shapes.get_config("tiny")
  result = vae_train_lib.train_and_evaluate(config, workdir)
  weights = safetensors.numpy.load_file(
      os.path.join(workdir, vae_train_lib.VAE_DIR, vae_lib.WEIGHTS_FILE))
  return config, workdir, result, weights, read_metrics(workdir)


def test_tiny_trains_and_exports(trained):
  config, workdir, result, _, records = trained
  train = [r for r in records if "loss" in r]
  assert [r["step"] for r in train] == [2, 4, 6]
  assert train[-1]["loss"] < 0.8 * train[0]["loss"], train
  assert [r["step"] for r in records if "eval_psnr" in r] == [3, 6]
  assert result["step"] == 6 and np.isfinite(result["psnr"]) and result["kl"] > 0
  with open(os.path.join(workdir, vae_train_lib.EVAL_FILE)) as f:
    assert json.load(f)["psnr"] == result["psnr"]
  assert os.path.isfile(os.path.join(workdir, "reconstructions.png"))

  vae = vae_lib.load_diffusers(os.path.join(workdir, vae_train_lib.VAE_DIR))
  assert vae.config.block_out_channels == tuple(config.vae.block_out_channels)
  images = vae_train_lib.shapes_images("heldout", config.data.num_heldout, config.seed)
  x = vae_lib.images_to_input(images)
  z = vae.encode(x)
  assert z.shape == (len(images), 8, 8, config.vae.latent_channels)
  assert vae.decode(z).shape == x.shape
  # The exported shift and scale standardise the held-out latents they were measured on.
  scaled = np.asarray(vae.scale_latents(z))
  assert abs(scaled.mean()) < 1e-4 and abs(scaled.std() - 1.0) < 1e-4
  assert vae.shift_factor == pytest.approx(result["latent_mean"])


def test_resume_is_exact(trained, tmp_path):
  """Dropping the last checkpoint and running again resumes at step 3 and ends with the
  same weights and the same logged losses as the uninterrupted run."""
  config, workdir, _, weights, records = trained
  resumed = str(tmp_path / "resumed")
  shutil.copytree(workdir, resumed)
  shutil.rmtree(os.path.join(ckpt_lib.checkpoint_dir(resumed), "6"))
  vae_train_lib.train_and_evaluate(config, resumed)
  again = safetensors.numpy.load_file(
      os.path.join(resumed, vae_train_lib.VAE_DIR, vae_lib.WEIGHTS_FILE))
  assert sorted(again) == sorted(weights)
  for key in weights:
    np.testing.assert_array_equal(again[key], weights[key], err_msg=key)
  strip = lambda rs: [{k: v for k, v in r.items() if k != "steps_per_s"} for r in rs]
  assert strip(read_metrics(resumed)) == strip(records)
  # Run again once finished: nothing to do, nothing rewritten.
  before = snapshot(resumed)
  assert vae_train_lib.train_and_evaluate(config, resumed)["step"] == 6
  assert snapshot(resumed) == before


def test_resume_refuses_another_vae(trained, tmp_path):
  config, workdir, _, _, _ = trained
  other = str(tmp_path / "other")
  shutil.copytree(workdir, other)
  before = snapshot(other)
  config = vae_shapes.get_config("tiny")
  config.vae.latent_channels = 8
  with pytest.raises(ckpt_lib.CheckpointError, match=r"different config.vae fields "
                     r"\(latent_channels\)"):
    vae_train_lib.train_and_evaluate(config, other)
  assert snapshot(other) == before


def test_batches_are_a_permutation_per_epoch():
  pool, batch = 10, 4
  seen = np.concatenate([vae_train_lib.batch_indices(0, step, batch, pool)
                         for step in range(1, 6)])      # 20 positions: two epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
  assert not np.array_equal(seen[:10], seen[10:])
  np.testing.assert_array_equal(vae_train_lib.batch_indices(0, 3, batch, pool), seen[8:12])
  assert not np.array_equal(vae_train_lib.batch_indices(1, 1, batch, pool), seen[:4])


def test_shapes_source():
  train = vae_train_lib.shapes_images("train", 6, 0)
  assert train.shape == (6, 32, 32, 3) and train.dtype == np.uint8
  np.testing.assert_array_equal(train, vae_train_lib.shapes_images("train", 6, 0))
  assert not np.array_equal(train, vae_train_lib.shapes_images("train", 6, 1))
  heldout = vae_train_lib.shapes_images("heldout", 6, 0)
  np.testing.assert_array_equal(heldout, vae_train_lib.shapes_images("heldout", 6, 1))
  assert not any(np.array_equal(h, t) for h in heldout for t in train)
  colours = {tuple(c) for c in np.concatenate([train, heldout]).reshape(-1, 3)}
  assert colours <= {(0, 0, 0)} | {tuple(c) for c in shapes_scene.PALETTE.values()}
  with pytest.raises(ValueError, match="unknown split"):
    vae_train_lib.shapes_images("test", 1, 0)


BAD_CONFIGS = {
    "unknown source": ({"data.source": "imagenet"}, "config.data.source='imagenet'"),
    "image size vs downsampling": ({"data.image_size": 30}, "config.data.image_size=30"),
    "groups vs channels": ({"vae.norm_num_groups": 3}, "config.vae: norm_num_groups=3"),
    "unknown activation": ({"vae.act_fn": "tanh"}, "act_fn='tanh'"),
    "unknown loss": ({"recon_loss": "l3"}, "config.recon_loss='l3'"),
    "unknown latent statistics": ({"latent_stats": "std"}, "config.latent_stats='std'"),
    "negative KL weight": ({"kl_weight": -1.0}, "config.kl_weight=-1.0"),
    "pool smaller than a batch": ({"data.num_train": 2}, "config.data.num_train=2"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config(case, tmp_path):
  changes, words = BAD_CONFIGS[case]
  config = vae_shapes.get_config("tiny")
  for key, value in changes.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError) as e:
    vae_train_lib.train_and_evaluate(config, str(workdir))
  assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not workdir.exists()


def test_cli_errors_are_one_line(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("keep\n")
  cases = {"--config.vae.norm_num_groups=3": str(tmp_path / "run"), "": str(a_file)}
  for override, workdir in cases.items():
    argv = [sys.executable, "-m", "mot.vae_train", "--config", "configs/vae_shapes.py:tiny",
            "--workdir", workdir] + ([override] if override else [])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith("W")]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
  assert not (tmp_path / "run").exists() and a_file.read_text() == "keep\n"
