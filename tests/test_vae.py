"""mot.vae against diffusers' AutoencoderKL: golden fixtures, folder round-trips, bad input.

The fixtures under tests/golden/ were written by tools/make_golden_vae.py with diffusers
0.42.1 and torch 2.13.0 (neither is needed here). Relative error of an output y against
diffusers' y_ref is ||y - y_ref||_2 / ||y_ref||_2 over the whole tensor (all batch
elements, positions and channels), computed in float64 from float32 outputs.
"""
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from mot import vae as vae_lib
from tests._procs import snapshot

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
FIXTURES = ("vae_sd", "vae_flux")
TOLERANCE = 1e-4


def rel_error(y, ref) -> float:
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module", params=FIXTURES)
def golden(request):
  name = request.param
  return (name, vae_lib.load_diffusers(os.path.join(GOLDEN, name)),
          dict(np.load(os.path.join(GOLDEN, f"{name}.npz"))))


def fixture_errors(vae, ref) -> dict[str, float]:
  """Relative errors of mot against diffusers on one fixture (docs/results.md prints them:
  python -c "from tests.test_vae import print_fixture_errors as p; p()")."""
  mean, logvar = vae.moments(ref["x"])
  return {"mean": rel_error(mean, ref["mean"]), "logvar": rel_error(logvar, ref["logvar"]),
          "encode": rel_error(vae.encode(ref["x"]), ref["mean"]),
          "decoded": rel_error(vae.decode(ref["z"]), ref["decoded"])}


def print_fixture_errors():
  for name in FIXTURES:
    ref = dict(np.load(os.path.join(GOLDEN, f"{name}.npz")))
    errors = fixture_errors(vae_lib.load_diffusers(os.path.join(GOLDEN, name)), ref)
    print(name, " ".join(f"{k} {v:.1e}" for k, v in errors.items()))


def test_matches_diffusers(golden):
  name, vae, ref = golden
  errors = fixture_errors(vae, ref)
  assert max(errors.values()) < TOLERANCE, (name, errors)
  assert vae.encode(ref["x"]).shape == ref["mean"].shape
  assert vae.decode(ref["z"]).shape == ref["decoded"].shape


def test_fixture_configs():
  sd = vae_lib.load_diffusers(os.path.join(GOLDEN, "vae_sd"))
  flux = vae_lib.load_diffusers(os.path.join(GOLDEN, "vae_flux"))
  assert (sd.latent_channels, sd.downsample_factor, sd.shift_factor) == (4, 4, 0.0)
  assert sd.config.use_quant_conv and sd.config.use_post_quant_conv
  assert (flux.latent_channels, flux.downsample_factor) == (16, 8)
  assert not flux.config.use_quant_conv and not flux.config.use_post_quant_conv
  assert flux.shift_factor == pytest.approx(0.1159) and flux.scaling_factor == \
      pytest.approx(0.3611)
  assert "quant_conv" not in flux.params and "quant_conv" in sd.params
  assert flux.latent_shape(16, 24) == (2, 3, 16)


def test_no_fixture_tensor_is_constant(golden):
  """diffusers initialises GroupNorm scales to 1 and biases to 0; the fixtures perturb
  every tensor (tools/make_golden_vae.py also checks, with torch's autograd, that each one
  moves the outputs), so a swapped scale and bias or a skipped norm cannot pass."""
  name, vae, _ = golden
  constant = ["/".join(k) for k, v in vae_lib._flat(vae.params).items()
              if np.ptp(np.asarray(v)) == 0]
  assert not constant, (name, constant)


def test_scaled_latents(golden):
  _, vae, ref = golden
  z = jnp.asarray(ref["mean"])
  scaled = vae.scale_latents(z)
  shift = vae.config.shift_factor or 0.0
  np.testing.assert_allclose(scaled, (ref["mean"] - shift) * vae.config.scaling_factor,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(vae.unscale_latents(scaled), z, rtol=1e-5, atol=1e-6)


def test_save_round_trip(golden, tmp_path):
  name, vae, ref = golden
  out = vae_lib.save_diffusers(vae, str(tmp_path / "saved"))
  assert sorted(os.listdir(out)) == [vae_lib.CONFIG_FILE, vae_lib.WEIGHTS_FILE]
  original = safetensors.numpy.load_file(os.path.join(GOLDEN, name, vae_lib.WEIGHTS_FILE))
  written = safetensors.numpy.load_file(os.path.join(out, vae_lib.WEIGHTS_FILE))
  assert sorted(written) == sorted(original)
  for key, value in original.items():
    np.testing.assert_array_equal(written[key], value, err_msg=key)
  with open(os.path.join(GOLDEN, name, vae_lib.CONFIG_FILE)) as f:
    theirs = json.load(f)
  with open(os.path.join(out, vae_lib.CONFIG_FILE)) as f:
    ours = json.load(f)
  assert ours == theirs
  again = vae_lib.load_diffusers(out)
  np.testing.assert_array_equal(again.decode(ref["z"]), vae.decode(ref["z"]))


def test_deprecated_attention_names(tmp_path):
  """Older diffusers checkpoints name the attention query/key/value/proj_attn."""
  src = os.path.join(GOLDEN, "vae_sd")
  dst = tmp_path / "old"
  dst.mkdir()
  shutil.copy(os.path.join(src, vae_lib.CONFIG_FILE), dst)
  renames = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
  tensors = {}
  for key, value in safetensors.numpy.load_file(
      os.path.join(src, vae_lib.WEIGHTS_FILE)).items():
    for new, old in renames.items():
      key = key.replace(f".{new}.", f".{old}.")
    tensors[key] = value
  assert any(".proj_attn." in k for k in tensors)
  safetensors.numpy.save_file(tensors, str(dst / vae_lib.WEIGHTS_FILE))
  ref = np.load(os.path.join(GOLDEN, "vae_sd.npz"))
  assert rel_error(vae_lib.load_diffusers(str(dst)).decode(ref["z"]), ref["decoded"]) \
      < TOLERANCE


def test_uint8_helpers():
  images = np.array([[[[0, 128, 255]]]], np.uint8)
  x = vae_lib.images_to_input(images)
  assert x.dtype == np.float32 and x.min() == -1.0 and x.max() == 1.0
  np.testing.assert_array_equal(vae_lib.output_to_images(x), images)
  np.testing.assert_array_equal(vae_lib.output_to_images(np.array([-3.0, 3.0])), [0, 255])


# ----------------------------------------------------------------------------------------
# Bad input: one line naming the file or tensor and the fix, nothing written.
# ----------------------------------------------------------------------------------------
def _copy(tmp_path, name="vae_sd"):
  dst = tmp_path / name
  shutil.copytree(os.path.join(GOLDEN, name), dst)
  return dst


def _edit_config(folder, **changes):
  path = folder / vae_lib.CONFIG_FILE
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(json.dumps(config))


def _edit_tensors(folder, edit):
  path = str(folder / vae_lib.WEIGHTS_FILE)
  tensors = safetensors.numpy.load_file(path)
  edit(tensors)
  safetensors.numpy.save_file(tensors, path)


def _truncate(folder):
  path = folder / vae_lib.WEIGHTS_FILE
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


BAD_FOLDERS = {
    # case: (how to break a copy of vae_sd, words the message must contain)
    "no config.json": (lambda d: (d / vae_lib.CONFIG_FILE).unlink(),
                       ["config.json", "AutoencoderKL folder"]),
    "config not JSON": (lambda d: (d / vae_lib.CONFIG_FILE).write_text("{oops"),
                        ["config.json", "cannot be read as JSON"]),
    "not an AutoencoderKL": (lambda d: _edit_config(d, _class_name="UNet2DConditionModel"),
                             ["config.json", "not an AutoencoderKL", "UNet2DConditionModel"]),
    "unsupported block type": (
        lambda d: _edit_config(d, down_block_types=["DownEncoderBlock2D",
                                                    "AttnDownEncoderBlock2D",
                                                    "DownEncoderBlock2D"]),
        ["config.json", "down_block_types", "not supported"]),
    "groups do not divide channels": (lambda d: _edit_config(d, norm_num_groups=3),
                                      ["config.json", "norm_num_groups=3", "divide"]),
    "no weights file": (lambda d: (d / vae_lib.WEIGHTS_FILE).unlink(),
                        [vae_lib.WEIGHTS_FILE, "safetensors"]),
    "missing tensor": (lambda d: _edit_tensors(d, lambda t: t.pop("decoder.conv_out.bias")),
                       ["lacks tensor decoder.conv_out.bias", vae_lib.WEIGHTS_FILE]),
    "extra tensor": (lambda d: _edit_tensors(d, lambda t: t.update(
        {"encoder.extra.weight": np.zeros(3, np.float32)})),
                     ["encoder.extra.weight", "does not imply", vae_lib.WEIGHTS_FILE]),
    "tensor shape disagrees with config.json": (
        lambda d: _edit_tensors(d, lambda t: t.update(
            {"decoder.conv_out.bias": np.zeros(4, np.float32)})),
        ["tensor decoder.conv_out.bias", "(4,)", "implies (3,)", vae_lib.WEIGHTS_FILE]),
    "config.json disagrees with the tensors": (
        lambda d: _edit_config(d, latent_channels=8),
        ["has shape", "config.json implies", vae_lib.WEIGHTS_FILE]),
    "truncated safetensors": (_truncate, [vae_lib.WEIGHTS_FILE, "truncated"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_folder(case, tmp_path):
  folder = _copy(tmp_path)
  breaker, words = BAD_FOLDERS[case]
  breaker(folder)
  before = snapshot(str(folder))
  with pytest.raises(vae_lib.VAEError) as e:
    vae_lib.load_diffusers(str(folder))
  message = str(e.value)
  assert "\n" not in message, message
  for word in words:
    assert word in message, (case, word, message)
  assert snapshot(str(folder)) == before


def test_bad_paths_and_inputs(tmp_path):
  with pytest.raises(vae_lib.VAEError, match="does not exist"):
    vae_lib.load_diffusers(str(tmp_path / "nope"))
  (tmp_path / "f").write_text("x")
  with pytest.raises(vae_lib.VAEError, match="is a file"):
    vae_lib.load_diffusers(str(tmp_path / "f"))
  with pytest.raises(vae_lib.VAEError, match="is a file"):
    vae_lib.save_diffusers(vae_lib.load_diffusers(os.path.join(GOLDEN, "vae_sd")),
                           str(tmp_path / "f"))
  assert (tmp_path / "f").read_text() == "x"
  repo = tmp_path / "repo"
  shutil.copytree(os.path.join(GOLDEN, "vae_sd"), repo / "vae")
  with pytest.raises(vae_lib.VAEError, match="vae/ holds one"):
    vae_lib.load_diffusers(str(repo))
  vae = vae_lib.load_diffusers(str(repo / "vae"))
  with pytest.raises(vae_lib.VAEError, match="looks NCHW"):
    vae.encode(np.zeros((1, 3, 16, 16), np.float32))
  with pytest.raises(vae_lib.VAEError, match=r"latents \[B, h, w, 4\]"):
    vae.decode(np.zeros((1, 4, 4, 16), np.float32))
  with pytest.raises(vae_lib.VAEError, match="not divisible"):
    vae.latent_shape(18, 16)
