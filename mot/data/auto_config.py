"""Fields a config leaves to the data, filled once before a run starts (train.py).

configs/image_folder.py (and configs/video_folder.py) declare them unset:

  data.image_size = ()            -> the most common (H, W) among the images (or frames)
  data.channels = 0               -> 3 (RGB) unless every image is grayscale, then 1
  data.patch_dim = 0              -> an image patch's values: patch_size**2 * channels
                                     (read_window**2 if that is larger)
  model.modality_patch_dims = ()  -> (0, d, d, 2), d = that patch's values
  sample.max_new_tokens = 0       -> the longest caption's tokens + 1 (its EOS)

A latent run (config.data.latent_cache) takes the size its latents were encoded at, RGB,
and patches of p*p latent channels.

`fill_from_data(config)` sets them in place and logs ONE line saying what it chose; the
filled config is what every checkpoint saves, so sampling reads a user's files at the
size and in the channels the run trained on. A value the user set is kept (and checked
by `mot.config.validate` as usual).
"""
from __future__ import annotations

import logging
import os
from typing import Any

from mot import latent
from mot import tokenizer as tokenizer_lib
from mot.data import input_pipeline, latent_cache
from mot.errors import ConfigError, field


def unset_fields(config: Any) -> list[str]:
  """The names of the fields `fill_from_data` would fill (empty once filled)."""
  data, model, sample = (field(config, k) for k in ("data", "model", "sample"))
  unset = []
  # Only the user datasets leave image_size to their files (the bundled ones fix it, and
  # the moving digits' configs name a canvas_size instead).
  if data.dataset in input_pipeline.USER_DATASETS and _is_unset(data.image_size):
    unset.append("config.data.image_size")
  for section, name, where in ((data, "channels", "data"), (data, "patch_dim", "data"),
                               (model, "modality_patch_dims", "model"),
                               (sample, "max_new_tokens", "sample")):
    if _is_unset(field(section, name, f"config.{where}")):
      unset.append(f"config.{where}.{name}")
  return unset


def _is_unset(value) -> bool:
  return value is None or (isinstance(value, (tuple, list)) and not value) or (
      isinstance(value, int) and not isinstance(value, bool) and value == 0)


def check_filled(config: Any) -> None:
  """A ConfigError naming the first field still left to the data."""
  unset = unset_fields(config)
  if unset:
    raise ConfigError(f"{unset[0]} is left to the data: train.py fills it "
                      "(mot.data.auto_config.fill_from_data(config)); or set it")


def fill_from_data(config: Any) -> str | None:
  """Fills the unset fields of `config` from its data (see the module doc) and returns
  the one line it logged (None when nothing was unset).

  Raises:
    ConfigError: a bad dataset (one line from `mot.data.user_data`), or images of mixed
      sizes where no size is the most common (set config.data.image_size).
  """
  _absolute_paths(config)
  unset = unset_fields(config)
  if not unset:
    return None
  data = config.data
  try:
    scan = (input_pipeline.scan_user(data) if data.dataset in input_pipeline.USER_DATASETS
            else None)
    cache = latent_cache.read_meta(data.latent_cache) if latent.cache_dir(config) else None
  except ValueError as e:
    raise ConfigError(" ".join(str(e).split())) from None
  chosen = []
  if "config.data.image_size" in unset:
    if cache is not None:  # the size the latents were encoded at
      data.image_size = tuple(cache["image_size"])
      chosen.append(f"image_size {tuple(data.image_size)} (config.data.latent_cache's)")
    else:
      data.image_size = _most_common_size(scan, data)
      chosen.append(f"image_size {tuple(data.image_size)} ({_size_reason(scan)})")
  if "config.data.channels" in unset:
    data.channels = 3 if cache is not None else (
        1 if _need(scan, data, "channels").all_gray else 3)
    chosen.append(f"channels {data.channels} ("
                  f"{'every image is grayscale' if data.channels == 1 else 'RGB'})")
  # An image patch's values: p*p of the image's channels, or of its latent's.
  values = int(data.patch_size) ** 2 * (int(cache["latent_shape"][2]) if cache is not None
                                        else int(data.channels))
  if "config.data.patch_dim" in unset:
    data.patch_dim = max(values, int(field(data, "read_window", "config.data")) ** 2)
    chosen.append(f"patch_dim {data.patch_dim}")
  if "config.model.modality_patch_dims" in unset:
    config.model.modality_patch_dims = (0, values, values, 2)
    chosen.append(f"modality_patch_dims {tuple(config.model.modality_patch_dims)}")
  if "config.sample.max_new_tokens" in unset:
    longest = _need(scan, data, "sample.max_new_tokens").longest_caption
    config.sample.max_new_tokens = len(tokenizer_lib.from_config(config).encode(longest)) + 1
    chosen.append(f"sample.max_new_tokens {config.sample.max_new_tokens} (the longest "
                  "caption and its EOS)")
  line = f"{data.dataset} {data.path}: from the data, " + "; ".join(chosen)
  logging.info(line)
  return line


def _absolute_paths(config: Any) -> None:
  """The VAE and the latent cache by absolute path: sampling may run elsewhere."""
  if latent.vae_dir(config):
    config.latent.vae = os.path.abspath(config.latent.vae)
  if latent.cache_dir(config):
    config.data.latent_cache = os.path.abspath(config.data.latent_cache)


def _need(scan, data: Any, what: str):
  if scan is None:
    raise ConfigError(f"config.{'data.' if what == 'channels' else ''}{what} is left to the "
                      f"data, but config.data.dataset={data.dataset!r} is not a user "
                      "dataset: set it")
  return scan


def _most_common_size(scan, data: Any) -> tuple[int, int]:
  """The (H, W) most images have; a ConfigError when sizes tie for the most."""
  try:
    return _need(scan, data, "image_size").most_common_size()
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _size_reason(scan) -> str:
  counts = scan.size_counts()
  n = max(counts.values())
  total = sum(counts.values())
  return "every image" if n == total else f"the most common size, {n} of {total} images"
