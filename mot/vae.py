"""A KL autoencoder (VAE) with diffusers' `AutoencoderKL` layout, read from and written to
diffusers folders (config.json + diffusion_pytorch_model.safetensors) without torch.

  from mot import vae as vae_lib
  vae = vae_lib.load_diffusers("runs/vae_shapes/vae")   # or any AutoencoderKL folder
  x = vae_lib.images_to_input(images_uint8)     # uint8 [B, H, W, 3] -> float32 in [-1, 1]
  z = vae.encode(x)                             # posterior mean, unscaled, [B, H/f, W/f, C]
  s = vae.scale_latents(z)                      # what a diffusion model sees
  y = vae.decode(vae.unscale_latents(s))        # images in [-1, 1] (not clipped)
  vae_lib.save_diffusers(vae, "some/dir")       # the same two files, loadable by diffusers

`f` is `vae.downsample_factor` (2 ** (levels - 1)); C is `vae.latent_channels` (4 for
SD-style VAEs, 16 for FLUX-style ones). The network is mot.vae_layers; its outputs equal
diffusers' in float32 (tests/test_vae.py, against fixtures written by
tools/make_golden_vae.py). Every problem with a folder raises VAEError: one line naming
the file or tensor and the fix; nothing is written on failure.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from absl import logging

from mot.errors import VAEError

from mot.vae_layers import (ACTIVATIONS, DOWN_BLOCK, UP_BLOCK, AutoencoderKL, VAEConfig,
                            param_shapes)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
CLASS_NAME = "AutoencoderKL"
# diffusers reads "_diffusers_version" for information only; we write the version whose
# AutoencoderKL the fixtures were checked against.
DIFFUSERS_FORMAT_VERSION = "0.42.1"
# Attention names of diffusers' older checkpoints, which diffusers itself renames on load.
DEPRECATED_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v",
                        "proj_attn": "to_out.0"}

__all__ = ["VAE", "VAEConfig", "VAEError", "config_from_diffusers", "images_to_input",
           "load_diffusers", "output_to_images", "save_diffusers"]


# ----------------------------------------------------------------------------------------
# The loaded model.
# ----------------------------------------------------------------------------------------
class VAE:
  """An AutoencoderKL's config and float32 parameters, with jitted encode and decode.

  Build one with `load_diffusers(path)`, or `VAE(config, params)` from parameters you
  trained (mot.vae_train_lib does). `params` is the Flax tree of mot.vae_layers.
  """

  def __init__(self, config: VAEConfig, params: Any):
    validate_config(config, "VAEConfig")
    self.config = config
    self.params = params
    self.model = AutoencoderKL(config)
    self._encode, self._moments, self._decode = _jitted(config.network)

  @property
  def latent_channels(self) -> int:
    """Channels of the latent (4: SD-style, 16: FLUX-style)."""
    return self.config.latent_channels

  @property
  def downsample_factor(self) -> int:
    """Image pixels per latent pixel along H and along W (diffusers' vae_scale_factor)."""
    return self.config.downsample_factor

  @property
  def scaling_factor(self) -> float:
    return float(self.config.scaling_factor)

  @property
  def shift_factor(self) -> float:
    """The config's shift_factor; 0.0 where it is None (SD-style VAEs)."""
    return float(self.config.shift_factor or 0.0)

  def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
    """(h, w, C) of the latent of a height x width image (sizes divisible by f)."""
    f = self.downsample_factor
    if height % f or width % f:
      raise VAEError(f"image size {height}x{width} is not divisible by the VAE's "
                     f"downsampling factor {f}: resize or crop to a multiple of {f}")
    return height // f, width // f, self.latent_channels

  def encode(self, x) -> jax.Array:
    """float32 images [B, H, W, in_channels] in [-1, 1] -> the posterior mean, unscaled,
    [B, ceil(H/f), ceil(W/f), latent_channels]."""
    return self._encode(self.params, self._check_images(x))

  def moments(self, x) -> tuple[jax.Array, jax.Array]:
    """(posterior mean, log-variance clamped to [-30, 20]), both as `encode` returns."""
    return self._moments(self.params, self._check_images(x))

  def decode(self, z) -> jax.Array:
    """Unscaled latents [B, h, w, latent_channels] -> images [B, h*f, w*f, out_channels],
    nominally in [-1, 1] and not clipped (`output_to_images` clips and rounds)."""
    z = jnp.asarray(z, jnp.float32)
    if z.ndim != 4 or z.shape[-1] != self.latent_channels:
      raise VAEError(f"decode takes latents [B, h, w, {self.latent_channels}] (NHWC), not "
                     f"shape {tuple(z.shape)}")
    return self._decode(self.params, z)

  def scale_latents(self, z) -> jax.Array:
    """Unscaled latents -> the scaled latents a diffusion model sees:
    (z - shift_factor) * scaling_factor (about unit variance for a well-set config)."""
    return (jnp.asarray(z) - self.shift_factor) * self.scaling_factor

  def unscale_latents(self, scaled) -> jax.Array:
    """The inverse of `scale_latents`: scaled / scaling_factor + shift_factor."""
    return jnp.asarray(scaled) / self.scaling_factor + self.shift_factor

  def _check_images(self, x) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    c = self.config.in_channels
    if x.ndim != 4 or x.shape[-1] != c:
      hint = (": it looks NCHW, transpose it to NHWC" if x.ndim == 4 and x.shape[1] == c
              else "")
      raise VAEError(f"encode takes images [B, H, W, {c}] (NHWC, float32 in [-1, 1]), not "
                     f"shape {tuple(x.shape)}{hint}")
    return x


@functools.lru_cache(maxsize=8)
def _jitted(config: VAEConfig):
  """Jitted (encode, moments, decode) of (params, x), shared by every VAE of one network
  (a training loop that evaluates often, and its export, compile them once)."""
  model = AutoencoderKL(config)
  apply = lambda method: jax.jit(lambda p, x: model.apply({"params": p}, x, method=method))
  return (apply(AutoencoderKL.encode), apply(AutoencoderKL.moments),
          apply(AutoencoderKL.decode))


def images_to_input(images) -> np.ndarray:
  """uint8 images [..., H, W, C] -> float32 in [-1, 1], as the VAE expects."""
  return np.asarray(images, np.float32) / 127.5 - 1.0


def output_to_images(x) -> np.ndarray:
  """Decoded images in [-1, 1] -> uint8 [..., H, W, C] (clipped and rounded)."""
  x = np.clip(np.asarray(x, np.float32), -1.0, 1.0)
  return np.round((x + 1.0) * 127.5).astype(np.uint8)


# ----------------------------------------------------------------------------------------
# config.json <-> VAEConfig.
# ----------------------------------------------------------------------------------------
def config_from_diffusers(raw: Any, source: str) -> VAEConfig:
  """A diffusers AutoencoderKL config dict -> VAEConfig; `source` names it in errors.

  Fields it leaves out take diffusers' defaults (as diffusers does); fields of no
  AutoencoderKL are ignored with a warning (as diffusers does).
  """
  if not isinstance(raw, dict) or raw.get("_class_name") != CLASS_NAME:
    found = raw.get("_class_name") if isinstance(raw, dict) else type(raw).__name__
    raise VAEError(f"{source} is not an {CLASS_NAME} config (_class_name: {found!r}): pass "
                   f"the folder of a diffusers {CLASS_NAME}, e.g. a Stable Diffusion "
                   "repository's vae/ subfolder")
  fields = {f.name for f in dataclasses.fields(VAEConfig)}
  values = {k: v for k, v in raw.items() if k in fields}
  ignored = sorted(k for k in raw if k not in fields and not k.startswith("_")
                   and k not in ("down_block_types", "up_block_types"))
  if ignored:
    logging.warning("%s: ignoring fields that AutoencoderKL does not have: %s", source,
                    ", ".join(ignored))
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  channels = values.get("block_out_channels", VAEConfig.block_out_channels)
  if not isinstance(channels, tuple):
    raise VAEError(f"{source}: block_out_channels={channels!r} must be a list of channel "
                   "counts, one per resolution level")
  levels = len(channels)
  for key, kind in (("down_block_types", DOWN_BLOCK), ("up_block_types", UP_BLOCK)):
    types = raw.get(key, [kind])
    if not isinstance(types, list) or any(t != kind for t in types) or len(types) != levels:
      raise VAEError(f"{source}: {key}={types!r} is not supported: mot's AutoencoderKL has "
                     f"one {kind} per entry of block_out_channels ({levels})")
  try:
    config = VAEConfig(**values)
  except TypeError as e:
    raise VAEError(f"{source}: {e}") from None
  validate_config(config, source)
  return config


def config_to_diffusers(config: VAEConfig) -> dict:
  """VAEConfig -> the config.json dict diffusers' save_pretrained would write."""
  levels = len(config.block_out_channels)
  out = {"_class_name": CLASS_NAME, "_diffusers_version": DIFFUSERS_FORMAT_VERSION,
         "down_block_types": [DOWN_BLOCK] * levels, "up_block_types": [UP_BLOCK] * levels}
  for f in dataclasses.fields(VAEConfig):
    value = getattr(config, f.name)
    out[f.name] = list(value) if isinstance(value, tuple) else value
  return out


def _positive_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def validate_config(c: VAEConfig, source: str) -> None:
  """Raises VAEError (one line, naming `source` and the field) for a config that cannot
  build the network."""
  def check(ok: bool, message: str):
    if not ok:
      raise VAEError(f"{source}: {message}")
  for name in ("in_channels", "out_channels", "layers_per_block", "latent_channels",
               "norm_num_groups"):
    check(_positive_int(getattr(c, name)),
          f"{name}={getattr(c, name)!r} must be a positive integer")
  check(len(c.block_out_channels) > 0 and all(map(_positive_int, c.block_out_channels)),
        f"block_out_channels={c.block_out_channels!r} must be positive integers")
  check(all(ch % c.norm_num_groups == 0 for ch in c.block_out_channels),
        f"norm_num_groups={c.norm_num_groups} must divide every block_out_channels entry "
        f"{tuple(c.block_out_channels)}")
  check(c.act_fn in ACTIVATIONS, f"act_fn={c.act_fn!r} is not supported: use one of "
        f"{sorted(ACTIVATIONS)}")
  check(isinstance(c.scaling_factor, (int, float)) and c.scaling_factor > 0,
        f"scaling_factor={c.scaling_factor!r} must be a positive number")
  check(c.shift_factor is None or isinstance(c.shift_factor, (int, float)),
        f"shift_factor={c.shift_factor!r} must be a number or null")


# ----------------------------------------------------------------------------------------
# Parameter names and layouts: Flax tree <-> diffusers state dict.
# ----------------------------------------------------------------------------------------
def _torch_key(path: tuple[str, ...]) -> str:
  """('encoder', 'down_blocks_0', 'resnets_1', 'norm1', 'scale') ->
  'encoder.down_blocks.0.resnets.1.norm1.weight'."""
  parts = [re.sub(r"_(\d+)$", r".\1", p) for p in path[:-1]]
  leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[path[-1]]
  return ".".join(parts + [leaf])


def _to_torch(x: np.ndarray) -> np.ndarray:
  """A Flax parameter -> diffusers' layout: conv HWIO -> OIHW, linear [in, out] -> [out, in]."""
  if x.ndim == 4:
    return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)))
  if x.ndim == 2:
    return np.ascontiguousarray(x.T)
  return np.ascontiguousarray(x)


def _from_torch(x: np.ndarray) -> np.ndarray:
  if x.ndim == 4:
    return np.transpose(x, (2, 3, 1, 0))
  if x.ndim == 2:
    return x.T
  return x


def _flat(tree: Any) -> dict[tuple[str, ...], Any]:
  return {tuple(getattr(k, "key", str(k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def expected_tensors(config: VAEConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
  """{diffusers key: (Flax path, diffusers shape)} of every parameter `config` implies."""
  flat = _flat(param_shapes(config))
  out = {}
  for path, s in flat.items():
    shape = s.shape
    torch_shape = ((shape[3], shape[2], shape[0], shape[1]) if len(shape) == 4
                   else (shape[1], shape[0]) if len(shape) == 2 else tuple(shape))
    out[_torch_key(path)] = (path, tuple(int(d) for d in torch_shape))
  return out


def params_to_state_dict(params: Any) -> dict[str, np.ndarray]:
  """Flax parameters -> diffusers' state dict (float32 numpy, diffusers' layouts)."""
  return {_torch_key(path): _to_torch(np.asarray(leaf, np.float32))
          for path, leaf in _flat(params).items()}


def _rename_deprecated(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for key, value in tensors.items():
    parts = key.split(".")
    if len(parts) >= 2 and "attentions" in parts and parts[-2] in DEPRECATED_ATTENTION:
      key = ".".join(parts[:-2] + [DEPRECATED_ATTENTION[parts[-2]], parts[-1]])
    out[key] = value
  return out


def state_dict_to_params(tensors: dict[str, np.ndarray], config: VAEConfig,
                         source: str) -> dict:
  """diffusers' state dict -> Flax parameters (float32), refusing any missing, extra or
  misshapen tensor with a VAEError naming it and `source`."""
  tensors = _rename_deprecated(tensors)
  expected = expected_tensors(config)
  missing = sorted(set(expected) - set(tensors))
  extra = sorted(set(tensors) - set(expected))
  mismatch = "the weights and config.json are from different models: use the config.json " \
             "that was saved with these weights"
  if missing:
    raise VAEError(f"{source} lacks tensor {missing[0]}" + (
        f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") + f": {mismatch}")
  if extra:
    raise VAEError(f"{source} has tensor {extra[0]} that config.json does not imply" + (
        f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") + f": {mismatch}")
  params: dict = {}
  for key, (path, shape) in expected.items():
    value = tensors[key]
    if tuple(value.shape) != shape:
      raise VAEError(f"{source}: tensor {key} has shape {tuple(value.shape)} but config.json "
                     f"implies {shape}: {mismatch}")
    node = params
    for name in path[:-1]:
      node = node.setdefault(name, {})
    node[path[-1]] = jnp.asarray(_from_torch(np.asarray(value, np.float32)))
  return params


# ----------------------------------------------------------------------------------------
# Folders.
# ----------------------------------------------------------------------------------------
def _read_config(path: str) -> VAEConfig:
  if not os.path.isdir(path):
    what = "is a file" if os.path.exists(path) else "does not exist"
    raise VAEError(f"VAE folder {path} {what}: pass a diffusers {CLASS_NAME} folder "
                   f"({CONFIG_FILE} + {WEIGHTS_FILE})")
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    hint = (f"; {path}/vae/ holds one: pass that folder"
            if os.path.isfile(os.path.join(path, "vae", CONFIG_FILE)) else "")
    raise VAEError(f"{path} has no {CONFIG_FILE}: pass a diffusers {CLASS_NAME} folder "
                   f"({CONFIG_FILE} + {WEIGHTS_FILE}){hint}")
  try:
    with open(config_path) as f:
      raw = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise VAEError(f"{config_path} cannot be read as JSON ({' '.join(str(e).split())}): "
                   "restore it from the model's source") from None
  return config_from_diffusers(raw, config_path)


def _read_tensors(path: str) -> dict[str, np.ndarray]:
  weights = os.path.join(path, WEIGHTS_FILE)
  if not os.path.isfile(weights):
    others = sorted(n for n in os.listdir(path)
                    if n.startswith("diffusion_pytorch_model") and n != WEIGHTS_FILE)
    hint = (f" (it has {', '.join(others)}: save it as {WEIGHTS_FILE} with diffusers' "
            "save_pretrained(..., safe_serialization=True))") if others else ""
    raise VAEError(f"{path} has no {WEIGHTS_FILE}{hint}: pass a folder with the weights "
                   "in safetensors format")
  try:
    return safetensors.numpy.load_file(weights)
  except (safetensors.SafetensorError, OSError, ValueError) as e:
    raise VAEError(f"{weights} cannot be read ({' '.join(str(e).split())}): it is truncated "
                   "or not a safetensors file; download or export it again") from None


def load_diffusers(path: str) -> VAE:
  """Reads a diffusers AutoencoderKL folder (config.json + diffusion_pytorch_model
  .safetensors) into a float32 VAE. Raises VAEError for any problem with the folder."""
  config = _read_config(path)
  tensors = _read_tensors(path)
  params = state_dict_to_params(tensors, config, os.path.join(path, WEIGHTS_FILE))
  return VAE(config, params)


def save_diffusers(vae: VAE, path: str) -> str:
  """Writes `vae` as a diffusers AutoencoderKL folder (config.json + diffusion_pytorch_model
  .safetensors, float32) that diffusers' from_pretrained and `load_diffusers` read.
  Each file is written beside its final name and renamed into place. Returns `path`."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise VAEError(f"cannot save the VAE to {path}: it is a file; pass a directory")
  tensors = params_to_state_dict(vae.params)
  expected = expected_tensors(vae.config)
  if set(tensors) != set(expected):
    raise VAEError("the VAE's parameters do not match its config (e.g. "
                   f"{min(set(tensors) ^ set(expected))}): build it with that config")
  os.makedirs(path, exist_ok=True)
  weights = os.path.join(path, WEIGHTS_FILE)
  safetensors.numpy.save_file(tensors, weights + ".tmp", metadata={"format": "pt"})
  os.replace(weights + ".tmp", weights)
  config_path = os.path.join(path, CONFIG_FILE)
  with open(config_path + ".tmp", "w") as f:
    json.dump(config_to_diffusers(vae.config), f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(config_path + ".tmp", config_path)
  return path
