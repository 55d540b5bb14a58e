"""The space the DM head denoises (docs/design.md §9): image pixels, or a VAE's latents.

  config.latent.vae = ""           pixels: image patches in [-1, 1] (the digits, ...)
  config.latent.vae = "DIR"        a diffusers AutoencoderKL folder (`mot.vae`): the DM head
                                   denoises p x p patches of the scaled latent
                                   (z - shift_factor) * scaling_factor, encoded once and
                                   cached (config.data.latent_cache, written by
                                   `python -m mot.data.user_data SRC CACHE --vae DIR`);
                                   sampling decodes them to images, and the reading head
                                   reads the clean latents of the same VAE.

`timestep_shift(config)` is the resolution-dependent timestep shift (SD3 §5.3.2, FLUX):
an image of more tokens carries its content redundantly across them, so the same t hides
less of it: training's timesteps and sampling's time grid move toward noise by
sqrt(image tokens / config.resolution_shift_tokens) (1 when that field is 0).
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any

from mot import patches
from mot import vae as vae_lib
from mot.data import input_pipeline, latent_cache, user_data
from mot.errors import ConfigError, field


def vae_dir(config: Any) -> str:
  """config.latent.vae: "" (pixels) or the VAE folder."""
  return str(field(field(config, "latent"), "vae", "config.latent") or "")


def vae_config(path: str) -> vae_lib.VAEConfig:
  """The VAEConfig of a VAE folder, from its config.json alone (cached); a one-line
  ConfigError naming the folder otherwise."""
  config_path = os.path.join(path, vae_lib.CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise ConfigError(f"config.latent.vae={path} has no {vae_lib.CONFIG_FILE}: pass a "
                      f"diffusers AutoencoderKL folder ({vae_lib.CONFIG_FILE} + "
                      f"{vae_lib.WEIGHTS_FILE})")
  return _read_vae_config(config_path, os.stat(config_path).st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_vae_config(config_path: str, stamp: int) -> vae_lib.VAEConfig:
  del stamp  # Only part of the cache key.
  try:
    with open(config_path) as f:
      return vae_lib.config_from_diffusers(json.load(f), config_path)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"{config_path} cannot be read as JSON ({' '.join(str(e).split())})"
                      ) from None
  except vae_lib.VAEError as e:
    raise ConfigError(str(e)) from None


def model_channels(config: Any) -> int:
  """Channels of the arrays the DM head denoises: the latent's, or the image's."""
  path = vae_dir(config)
  if path:
    return vae_config(path).latent_channels
  return int(field(config.data, "channels", "config.data"))


def image_grid(config: Any) -> tuple[int, int]:
  """(h, w) of the arrays the DM head denoises: the image's (H, W), or its latent's."""
  data = config.data
  h, w = patches.image_shape(data.canvas_size if data.dataset == "moving_digits"
                             else data.image_size)
  path = vae_dir(config)
  if not path:
    return h, w
  f = vae_config(path).downsample_factor
  if h % f or w % f:
    raise ConfigError(f"config.data.image_size=({h}, {w}) is not divisible by the VAE's "
                      f"downsampling factor {f} (config.latent.vae={path}): use a multiple "
                      f"of {f}")
  return h // f, w // f


def image_tokens(config: Any) -> int:
  """Patch tokens of one image (or video frame) in the space the DM head denoises."""
  h, w = image_grid(config)
  p = int(config.data.patch_size)
  return (h // p) * (w // p)


def timestep_shift(config: Any) -> float:
  """The resolution-dependent shift (module doc): sqrt(image tokens / base tokens), or 1."""
  base = field(config, "resolution_shift_tokens")
  if not isinstance(base, int) or isinstance(base, bool) or base < 0:
    raise ConfigError(f"config.resolution_shift_tokens={base!r} must be an integer >= 0 "
                      "(0: no resolution-dependent timestep shift)")
  return 1.0 if base == 0 else math.sqrt(image_tokens(config) / base)


def cache_dir(config: Any) -> str:
  """config.data.latent_cache: "" (pixels) or a latent cache folder. Only the user datasets
  read files a cache could hold, and their configs declare the field (configs/image_folder.py
  and configs/video_folder.py built on it); the bundled datasets draw their own images."""
  if config.data.dataset not in input_pipeline.USER_DATASETS:
    return ""
  return user_data.latent_dir(config.data)


def check(config: Any) -> None:
  """A latent run's fields agree: a user image dataset with a latent cache, and patches
  whose values are patch_size**2 * the latent channels (one-line ConfigErrors)."""
  path = vae_dir(config)
  data = config.data
  cache = cache_dir(config)
  if not path:
    if cache:
      raise ConfigError(f"config.data.latent_cache={cache} is set but config.latent.vae is "
                        "empty: set the VAE the cache was written with")
    return
  if data.dataset not in ("image_folder", "array_record"):
    raise ConfigError(f"config.latent.vae is set, but config.data.dataset={data.dataset!r} "
                      "is not an image dataset with a latent cache (image_folder or "
                      "array_record): set config.latent.vae=''")
  vae = vae_config(path)
  values = int(data.patch_size) ** 2 * vae.latent_channels
  dims = tuple(config.model.modality_patch_dims)
  if dims[1] != values:
    raise ConfigError(f"config.model.modality_patch_dims[1]={dims[1]} disagrees with the "
                      f"latent: patch_size**2 * the VAE's {vae.latent_channels} latent "
                      f"channels = {values} (config.latent.vae={path}); set it to {values}, "
                      "or leave it () to derive it")
  image_grid(config)  # the image size divides into latent pixels
  if not cache:
    raise ConfigError("config.latent.vae is set but config.data.latent_cache is empty: "
                      "encode the images once with python -m mot.data.user_data "
                      f"{data.path or 'DATA'} CACHE --vae {path}, then set "
                      "--config.data.latent_cache=CACHE")
  try:
    meta = latent_cache.read_meta(cache)
    if meta["vae_weights_sha256"] != latent_cache.weights_digest(path):
      raise ConfigError(f"config.data.latent_cache={cache} was encoded by another VAE "
                        f"({meta['vae']}) than config.latent.vae={path}: write the cache "
                        "again with this VAE, or set the VAE it was written with")
  except (ValueError, OSError) as e:
    raise ConfigError(" ".join(str(e).split())) from None
