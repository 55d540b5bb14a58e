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

from mot import patches
from mot.data import digits, preprocess
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


def open_image(source: Any) -> tuple[Image.Image, str]:
  """(PIL image, name for messages) of a path or PIL image; one-line InputErrors."""
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
  return img, name


def _on_white(img: Image.Image) -> Image.Image:
  """Transparency composited onto white (as a viewer shows the file)."""
  if "A" not in img.getbands() and "transparency" not in img.info:
    return img
  rgba = img.convert("RGBA")
  return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)


def load_image(source: Any, size: Any, channels: int = 1) -> np.ndarray:
  """float32 in [0, 1] from a path or PIL image: [H, W] (channels 1) or [H, W, 3]
  (channels 3), (H, W) = `size` (an int S: S x S).

  Any size is resampled (area-averaged when shrinking; `size=None` keeps the file's
  size), transparency composited onto white. channels 1: any mode is made grayscale, and
  dark ink on a light background (a bright border, as on paper) is inverted, so ink is
  always the bright value, as in the digits data. channels 3: the RGB values as they are.
  """
  img, name = open_image(source)
  if channels == 3:
    arr = np.asarray(_on_white(img).convert("RGB"), np.float32) / 255.0
  elif img.mode in ("I", "F") or img.mode.startswith("I;16"):
    arr = np.asarray(img, np.float32)
    top = arr.max(initial=0.0)
    arr = arr / (1.0 if top <= 1.0 else 255.0 if top <= 255.0 else 65535.0)
  else:
    arr = np.asarray(_on_white(img).convert("L"), np.float32) / 255.0
  if not np.all(np.isfinite(arr)):
    raise InputError(f"{name} has non-finite pixel values")
  arr = np.clip(arr, 0.0, 1.0)
  if channels == 1:
    border = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]])
    if np.median(border) > 0.5:
      arr = 1.0 - arr
  return arr.astype(np.float32) if size is None else resize_unit(arr, size)


def resize_unit(arr: np.ndarray, size: Any) -> np.ndarray:
  """float [h, w] or [h, w, C] in [0, 1] -> float32 [H, W(, C)] ((H, W) = `size`, an int
  S: S x S), area-averaged when shrinking, bilinear when growing."""
  h, w = patches.image_shape(size)
  if arr.shape[:2] == (h, w):
    return arr.astype(np.float32)
  if arr.ndim == 3:
    return np.stack([resize_unit(arr[..., c], (h, w)) for c in range(arr.shape[-1])], -1)
  shrink = arr.shape[0] >= h and arr.shape[1] >= w
  method = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
  out = Image.fromarray(arr.astype(np.float32), mode="F").resize((w, h), method)
  return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def to_unit_images(images: Any, size: Any, channels: int = 1) -> tuple[np.ndarray, bool]:
  """(float32 [N, H, W] (channels 1) or [N, H, W, 3] in [0, 1] ((H, W) = `size`, an int
  S: S x S), whether a single image was given).

  Arrays: [H, W] / [N, H, W] (channels 1) or [H, W, 3] / [N, H, W, 3]; uint8 is read as
  0..255; for channels 1, floats with a maximum above 1 as the digits scale 0..16, other
  floats as 0..1. Paths and PIL images go through `load_image`; a list may mix them.
  """
  if isinstance(images, (str, os.PathLike, Image.Image)):
    return load_image(images, size, channels)[None], True
  if isinstance(images, (list, tuple)):
    if not images:
      raise InputError("images is an empty list")
    return np.concatenate([to_unit_images(x, size, channels)[0] for x in images]), False
  arr = np.asarray(images)
  rank = 2 if channels == 1 else 3
  if (arr.ndim not in (rank, rank + 1) or arr.size == 0
      or (channels > 1 and arr.shape[-1] != channels)):
    shapes = ("[H, W] or [N, H, W]" if channels == 1
              else f"[H, W, {channels}] or [N, H, W, {channels}]")
    raise InputError(f"images must be an array {shapes}, got shape {arr.shape}")
  single = arr.ndim == rank
  arr = _unit_scale(arr[None] if single else arr, channels)
  return np.stack([resize_unit(x, size) for x in arr]), single


def to_run_images(images: Any, options: preprocess.ImageOptions) -> tuple[np.ndarray, bool]:
  """(float32 [N, *options.shape] in [0, 1], whether a single image was given): images
  through a user-data run's own preprocessing (`mot.data.preprocess`: size, channels,
  crop / pad / stretch, invert), exactly as its training files were read.

  Paths and PIL images are decoded as training decoded its files; arrays [H, W(, C)] /
  [N, H, W(, C)] (uint8 0..255 or floats 0..1, any size; C = options.channels) are the
  decoded pixels, fitted the same way.
  """
  if isinstance(images, (str, os.PathLike, Image.Image)):
    name = "PIL image" if isinstance(images, Image.Image) else os.fspath(images)
    if not isinstance(images, Image.Image) and not os.path.isfile(name):
      raise InputError(f"image {name} does not exist or is not a file")
    try:
      return preprocess.load_unit(images, options, name)[None], True
    except ValueError as e:
      raise InputError(str(e)) from None
  if isinstance(images, (list, tuple)):
    if not images:
      raise InputError("images is an empty list")
    return np.concatenate([to_run_images(x, options)[0] for x in images]), False
  arr = np.asarray(images)
  rank = 2 if options.channels == 1 else 3
  if (arr.ndim not in (rank, rank + 1) or arr.size == 0
      or (rank == 3 and arr.shape[-1] != options.channels)):
    shapes = ("[H, W] or [N, H, W]" if rank == 2 else
              f"[H, W, {options.channels}] or [N, H, W, {options.channels}]")
    raise InputError(f"images must be an array {shapes}, got shape {arr.shape}")
  single = arr.ndim == rank
  arr = _unit_scale(arr[None] if single else arr, 3)  # [0, 1] or uint8: no digits scale
  return np.stack([preprocess.fit(x, options) for x in arr]), single


def _unit_scale(arr: np.ndarray, channels: int) -> np.ndarray:
  """uint8 0..255 or float 0..1 (grayscale also the digits' 0..16) -> float32 0..1."""
  if arr.dtype == np.uint8:
    return arr.astype(np.float32) / 255.0
  arr = arr.astype(np.float32)
  top = digits.MAX_PIXEL if channels == 1 else 1.0
  scales = "[0, 16] (digits) or [0, 1]" if channels == 1 else "[0, 1] (or uint8 0..255)"
  if not np.all(np.isfinite(arr)):
    raise InputError("images hold non-finite values")
  if arr.min() < 0:
    raise InputError(f"images must be in {scales}, got a minimum of {arr.min():g}")
  if arr.max() > top:
    raise InputError(f"images must be in {scales}, got a maximum of {arr.max():g}")
  return arr / digits.MAX_PIXEL if arr.max() > 1.0 else arr


def to_model_scale(unit: np.ndarray) -> np.ndarray:
  """[0, 1] pixels -> the model's [-1, 1] scale (digits' 0..16 scaled as in training)."""
  return (np.asarray(unit, np.float32) * 2.0 - 1.0).astype(np.float32)


def _pil(pixels: np.ndarray) -> Image.Image:
  """uint8 [H, W] (grayscale) or [H, W, 3] (RGB) as a PIL image."""
  return Image.fromarray(pixels, mode="L" if pixels.ndim == 2 else "RGB")


def save_png(path: str, image01: np.ndarray, scale: int = 1) -> None:
  """Writes float [H, W] (grayscale, ink bright) or [H, W, 3] (RGB) in [0, 1] as an 8-bit
  PNG, upscaled by `scale`."""
  img = _pil(np.round(np.clip(image01, 0, 1) * 255).astype(np.uint8))
  if scale > 1:
    img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
  img.save(path)


def save_gif(path: str, frames01: np.ndarray, scale: int = GIF_SCALE,
             duration_ms: int = GIF_FRAME_MS) -> None:
  """Writes float [T, H, W] (or [T, H, W, 3]) in [0, 1] as a looping GIF, upscaled by
  `scale`.

  Pillow merges consecutive identical frames into one frame shown that much longer (a
  digit that stays still); `load_clip` counts such a frame once per `duration_ms`, so
  the clip reads back with all T frames.
  """
  pixels = np.round(np.clip(frames01, 0, 1) * 255).astype(np.uint8)
  pixels = np.repeat(np.repeat(pixels, scale, axis=1), scale, axis=2)
  images = [_pil(f) for f in pixels]
  images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms,
                 loop=0)


def load_clip(source: str, size: Any, channels: int = 1) -> np.ndarray:
  """float32 [T, H, W(, 3)] in [0, 1] ((H, W) = `size`, an int S: S x S; None: the first
  frame's): the frames of a GIF (or other multi-frame image) or of a folder's image files
  (sorted by name), each read as `load_image` reads one."""
  name = os.fspath(source)
  if os.path.isdir(name):
    return np.stack([load_image(p, size, channels) for p in image_paths([name])])
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
    size = (frames[0].height, frames[0].width)
  clip = np.stack([load_image(f, size, channels) for f in frames])
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
  """float [rows * cols, H, W(, C)] -> one mosaic image [R, C(, C)] on a grey ground,
  cells upscaled by `scale`."""
  n, h, w = images.shape[:3]
  cols = math.ceil(n / rows)
  images = np.repeat(np.repeat(images, scale, axis=1), scale, axis=2)
  h, w = h * scale, w * scale
  out = np.full((rows * (h + gap) + gap, cols * (w + gap) + gap, *images.shape[3:]), 0.35,
                np.float32)
  for k in range(n):
    r, c = divmod(k, cols)
    out[gap + r * (h + gap):gap + r * (h + gap) + h,
        gap + c * (w + gap):gap + c * (w + gap) + w] = images[k]
  return out
