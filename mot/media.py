"""Images and clips in and out of files: loading (any size and colour mode), PNG and GIF
writing, grids, and the array conventions `mot.Pipeline` takes.

Pixels are float32 in [0, 1], 1 = most ink (the digits' convention); `to_model_scale` maps
them to the model's [-1, 1]. Every user error is an `InputError` with one line.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageSequence, UnidentifiedImageError

from mot.data import digits
from mot.errors import InputError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp",
                    ".pgm", ".ppm", ".pbm")
GIF_SCALE = 8                             # GIF pixels per model pixel
GIF_FRAME_MS = 150                        # GIF frame duration


def written_grid(folder: str) -> str | None:
  """The montage file that `write_samples` / `write_clips` put beside their samples (the
  "grid" of the folder's manifest.json), or None: a folder without such a manifest."""
  try:
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
      grid_name = json.load(f).get("grid")
  except (OSError, ValueError, AttributeError):
    return None
  return grid_name if isinstance(grid_name, str) else None


def image_paths(items: Sequence[str]) -> list[str]:
  """Files as given, folders expanded to their image files (sorted, not recursive).

  A folder that sample.py wrote (its manifest.json names a grid) is read without that
  grid: it is a montage of the samples beside it, not one more image of them. Named as a
  file, a grid is read like any image."""
  out = []
  for item in items:
    if not os.path.exists(item):
      raise InputError(f"image {item} does not exist")
    if os.path.isdir(item):
      grid_name = written_grid(item)
      found = sorted(os.path.join(item, f) for f in os.listdir(item)
                     if f.lower().endswith(IMAGE_EXTENSIONS) and f != grid_name
                     and os.path.isfile(os.path.join(item, f)))
      if not found:
        raise InputError(f"folder {item} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
      out.extend(found)
    else:
      out.append(item)
  return out


def load_image(source: Any, size: int | None) -> np.ndarray:
  """float32 [size, size] in [0, 1] (1 = ink) from a path or PIL image.

  Any mode is made grayscale (transparency composited onto white), any size resampled
  (area-averaged when shrinking; `size=None` keeps the file's size). Dark ink on a light
  background (a bright border, as on paper) is inverted, so ink is always the bright
  value, as in the digits data.
  """
  if isinstance(source, Image.Image):
    img, name = source, "PIL image"
  else:
    name = os.fspath(source)
    if not os.path.isfile(name):
      raise InputError(f"image {name} does not exist or is not a file")
    try:
      with Image.open(name) as opened:
        opened.load()
        img = opened.copy()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
      raise InputError(f"{name} is not an image Pillow can read ({type(e).__name__})"
                       ) from None
  if img.width < 1 or img.height < 1:
    raise InputError(f"{name} is an empty image")
  if img.mode in ("I", "F") or img.mode.startswith("I;16"):
    arr = np.asarray(img, np.float32)
    top = arr.max(initial=0.0)
    arr = arr / (1.0 if top <= 1.0 else 255.0 if top <= 255.0 else 65535.0)
  else:
    if "A" in img.getbands() or "transparency" in img.info:
      rgba = img.convert("RGBA")
      white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
      img = Image.alpha_composite(white, rgba)
    arr = np.asarray(img.convert("L"), np.float32) / 255.0
  if not np.all(np.isfinite(arr)):
    raise InputError(f"{name} has non-finite pixel values")
  arr = np.clip(arr, 0.0, 1.0)
  border = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]])
  if np.median(border) > 0.5:
    arr = 1.0 - arr
  return arr.astype(np.float32) if size is None else resize_unit(arr, size)


def resize_unit(arr: np.ndarray, size: int) -> np.ndarray:
  """float [H, W] in [0, 1] -> float32 [size, size], area-averaged when shrinking."""
  if arr.shape == (size, size):
    return arr.astype(np.float32)
  shrink = arr.shape[0] >= size and arr.shape[1] >= size
  method = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
  out = Image.fromarray(arr.astype(np.float32), mode="F").resize((size, size), method)
  return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def to_unit_images(images: Any, size: int) -> tuple[np.ndarray, bool]:
  """(float32 [N, size, size] in [0, 1], whether a single image was given).

  Arrays: [H, W] or [N, H, W]; uint8 is read as 0..255, floats with a maximum above 1
  as the digits scale 0..16, other floats as 0..1. Paths and PIL images go through
  `load_image`; a list may mix them.
  """
  if isinstance(images, (str, os.PathLike, Image.Image)):
    return load_image(images, size)[None], True
  if isinstance(images, (list, tuple)):
    if not images:
      raise InputError("images is an empty list")
    out = [to_unit_images(x, size)[0] for x in images]
    return np.concatenate(out), False
  arr = np.asarray(images)
  if arr.ndim not in (2, 3) or arr.size == 0:
    raise InputError(f"images must be an array [H, W] or [N, H, W], got shape {arr.shape}")
  single = arr.ndim == 2
  arr = arr[None] if single else arr
  if arr.dtype == np.uint8:
    arr = arr.astype(np.float32) / 255.0
  else:
    arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
      raise InputError("images hold non-finite values")
    if arr.min() < 0:
      raise InputError(f"images must be in [0, 16] (digits) or [0, 1], got a minimum of "
                       f"{arr.min():g}")
    if arr.max() > digits.MAX_PIXEL:
      raise InputError(f"images must be in [0, 16] (digits) or [0, 1], got a maximum of "
                       f"{arr.max():g}")
    if arr.max() > 1.0:
      arr = arr / digits.MAX_PIXEL
  return np.stack([resize_unit(x, size) for x in arr]), single


def to_model_scale(unit: np.ndarray) -> np.ndarray:
  """[0, 1] pixels -> the model's [-1, 1] scale (digits' 0..16 scaled as in training)."""
  return (np.asarray(unit, np.float32) * 2.0 - 1.0).astype(np.float32)


def save_png(path: str, image01: np.ndarray, scale: int = 1) -> None:
  """Writes float [H, W] in [0, 1] as 8-bit grayscale (ink bright), upscaled by `scale`."""
  pixels = np.round(np.clip(image01, 0, 1) * 255).astype(np.uint8)
  img = Image.fromarray(pixels, mode="L")
  if scale > 1:
    img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
  img.save(path)


def save_gif(path: str, frames01: np.ndarray, scale: int = GIF_SCALE,
             duration_ms: int = GIF_FRAME_MS) -> None:
  """Writes float [T, H, W] in [0, 1] as a looping grayscale GIF, upscaled by `scale`.

  Pillow merges consecutive identical frames into one frame shown that much longer (a
  digit that stays still); `load_clip` counts such a frame once per `duration_ms`, so
  the clip reads back with all T frames.
  """
  pixels = np.round(np.clip(frames01, 0, 1) * 255).astype(np.uint8)
  pixels = np.repeat(np.repeat(pixels, scale, axis=1), scale, axis=2)
  images = [Image.fromarray(f, mode="L") for f in pixels]
  images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms,
                 loop=0)


def load_clip(source: str, size: int | None) -> np.ndarray:
  """float32 [T, size, size] in [0, 1]: the frames of a GIF (or other multi-frame image)
  or of a folder's image files (sorted by name), each read as `load_image` reads one."""
  name = os.fspath(source)
  if os.path.isdir(name):
    return np.stack([load_image(p, size) for p in image_paths([name])])
  if not os.path.isfile(name):
    raise InputError(f"clip {name} does not exist")
  try:
    with Image.open(name) as opened:
      read = [(f.convert("RGBA").copy(), f.info.get("duration"))
              for f in ImageSequence.Iterator(opened)]
  except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
    raise InputError(f"{name} is not an image Pillow can read ({type(e).__name__})"
                     ) from None
  frames, durations = zip(*read)
  if size is None:
    size = frames[0].height
  clip = np.stack([load_image(f, size) for f in frames])
  return np.repeat(clip, frame_repeats(list(durations)), axis=0)


def frame_repeats(durations: list) -> list[int]:
  """How many time steps each GIF frame stands for, from the frames' durations (ms).

  GIF writers (Pillow among them, see `save_gif`) store a run of identical frames as one
  frame shown k times as long. When every duration is a whole multiple of the shortest,
  a frame k times the shortest counts k times; otherwise (hand-timed GIFs, missing
  durations) every frame counts once.
  """
  if not durations or any(not isinstance(d, (int, float)) or d <= 0 for d in durations):
    return [1] * len(durations)
  shortest = min(durations)
  repeats = [d / shortest for d in durations]
  if any(abs(r - round(r)) > 1e-6 for r in repeats):
    return [1] * len(durations)
  return [int(round(r)) for r in repeats]


def grid(images: np.ndarray, rows: int, gap: int = 1, scale: int = 8) -> np.ndarray:
  """float [rows * cols, H, W] -> one [R, C] mosaic image, cells upscaled by `scale`."""
  n, h, w = images.shape
  cols = math.ceil(n / rows)
  images = np.repeat(np.repeat(images, scale, axis=1), scale, axis=2)
  h, w = h * scale, w * scale
  out = np.full((rows * (h + gap) + gap, cols * (w + gap) + gap), 0.35, np.float32)
  for k in range(n):
    r, c = divmod(k, cols)
    out[gap + r * (h + gap):gap + r * (h + gap) + h,
        gap + c * (w + gap):gap + c * (w + gap) + w] = images[k]
  return out
