"""A user image dataset's latents, encoded once by a VAE and cached (docs/design.md §9).

  python -m mot.data.user_data my_folder/ cache/ --vae vae/ [--image_size '(32, 32)']

writes cache/latents.npy (float32 [N, h, w, C]: every pair's image through the run's
preprocessing, encoded to the posterior mean and scaled, (z - shift) * scale, in the
dataset's order) and cache/cache.json (what made them: the pairs, the preprocessing, the
VAE's config and weights digest). A run reads them with config.data.latent_cache=cache/
and config.latent.vae=vae/: training never runs the encoder, and the reading and the
drawing tasks see the same latents. A cache that no longer matches its data, the config's
preprocessing or the VAE is refused in one line naming what changed.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from mot.data import preprocess

CACHE_FILE = "cache.json"
LATENTS_FILE = "latents.npy"
FORMAT = 1
ENCODE_BATCH = 16          # images encoded per VAE call


def data_digest(files: Sequence[str], captions: Sequence[str]) -> str:
  """Changes when the pairs do (their files, order or captions)."""
  return hashlib.sha256(json.dumps([list(files), list(captions)]).encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, stamp: tuple) -> str:
  del stamp  # Only part of the cache key.
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def weights_digest(vae_path: str) -> str:
  """sha256 of a VAE folder's weights file (cached while it is unchanged)."""
  from mot import vae as vae_lib  # lazy: the data pipeline reads caches without the VAE
  weights = os.path.join(vae_path, vae_lib.WEIGHTS_FILE)
  st = os.stat(weights)
  return _file_digest(weights, (st.st_mtime_ns, st.st_size))


def write_cache(out: str, images: Sequence[Any], keys: Sequence[str],
                captions: Sequence[str], where: str, options: preprocess.ImageOptions,
                vae: Any, vae_path: str) -> dict:
  """Encodes every image (a path or encoded bytes, through `options`) and writes the
  cache folder `out` (replaced as a whole, only once every image has encoded). `keys`
  identify the pairs (`mot.data.user_data.Scan.keys`). Returns its metadata."""
  h, w, c = vae.latent_shape(*options.size)
  parent = os.path.dirname(os.path.abspath(out)) or "."
  tmp = tempfile.mkdtemp(prefix=".latent_cache-", dir=parent)
  try:
    latents = np.lib.format.open_memmap(os.path.join(tmp, LATENTS_FILE), mode="w+",
                                        dtype=np.float32, shape=(len(images), h, w, c))
    for start in range(0, len(images), ENCODE_BATCH):
      batch = [preprocess.load_image(x, options, _name(x, where, start + k))
               for k, x in enumerate(images[start:start + ENCODE_BATCH])]
      latents[start:start + len(batch)] = np.asarray(vae.scale_latents(
          vae.encode(np.stack(batch))), np.float32)
    latents.flush()
    del latents
    meta = {"format": FORMAT, "where": where, "pairs": len(images),
            "data_digest": data_digest(keys, captions),
            "captions": list(captions), "image_size": list(options.size),
            "resize": options.resize, "invert": options.invert,
            "latent_shape": [h, w, c], "vae": os.path.abspath(vae_path),
            "vae_weights_sha256": weights_digest(vae_path)}
    with open(os.path.join(tmp, CACHE_FILE), "w") as f:
      json.dump(meta, f, indent=1)
    if os.path.isdir(out):
      shutil.rmtree(out)
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return meta


def _name(image: Any, where: str, i: int) -> str:
  return os.fspath(image) if not isinstance(image, bytes) else f"{where} record {i}"


def read_meta(cache: str) -> dict:
  """cache.json of a cache folder (cached while it is unchanged); a one-line ValueError
  for a folder that is not a cache."""
  path = os.path.join(cache, CACHE_FILE)
  if not os.path.isfile(path) or not os.path.isfile(os.path.join(cache, LATENTS_FILE)):
    raise ValueError(f"config.data.latent_cache={cache} is not a latent cache ({CACHE_FILE} "
                     f"+ {LATENTS_FILE}): write it with python -m mot.data.user_data "
                     "DATA CACHE --vae VAE_DIR")
  return _read(path, os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read(path: str, stamp: int) -> dict:
  del stamp
  try:
    with open(path) as f:
      meta = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} cannot be read ({type(e).__name__}): write the cache again"
                     ) from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ValueError(f"{path} is not a format-{FORMAT} latent cache: write it again with "
                     "python -m mot.data.user_data DATA CACHE --vae VAE_DIR")
  return meta


def check_meta(cache: str, meta: dict, keys: Sequence[str], captions: Sequence[str],
               options: preprocess.ImageOptions) -> None:
  """Refuses (one-line ValueError) a cache written from other pairs or preprocessing."""
  again = "; write it again with python -m mot.data.user_data DATA CACHE --vae VAE_DIR"
  if meta["data_digest"] != data_digest(keys, captions):
    raise ValueError(f"config.data.latent_cache={cache} was written from other pairs "
                     f"({meta['where']}, {meta['pairs']} pairs) than config.data.path's{again}")
  ours = {"image_size": list(options.size), "resize": options.resize,
          "invert": options.invert}
  theirs = {k: meta[k] for k in ours}
  if ours != theirs:
    changed = ", ".join(f"{k} {theirs[k]} (config: {ours[k]})" for k in ours
                        if ours[k] != theirs[k])
    raise ValueError(f"config.data.latent_cache={cache} was encoded with {changed}: set "
                     f"the config to match{again}")


@dataclasses.dataclass(frozen=True)
class LatentSource:
  """source[i] -> (scaled latent float32 [h, w, C], caption) from a cache (memory-mapped
  in each process that reads it; picklable for grain workers)."""
  path: str
  captions: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.captions)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    return np.array(_latents(self.path)[i], np.float32), self.captions[i]


@functools.lru_cache(maxsize=4)
def _latents(path: str) -> np.ndarray:
  return np.load(os.path.join(path, LATENTS_FILE), mmap_mode="r")
