"""The run's image preprocessing: one function from a file (or an array) to the pixels the
model trains on, shared by the data pipeline (`mot.data.user_data`, `mot.data.user_video`)
and by sampling (`mot.Pipeline` on a checkpoint trained on user data), so a checkpoint
reads a user's file exactly as it read its training files.

  options = preprocess.image_options(config.data)   # size (H, W), channels, invert, resize
  unit = preprocess.load_unit(path, options)         # float32 [H, W] or [H, W, 3] in [0, 1]
  x = preprocess.to_model_range(unit)                # [-1, 1], the model's scale

The steps, in order: decode (any Pillow mode, EXIF rotation applied; transparency
composited onto white; channels 1: grayscale luma, channels 3: RGB), `data.invert`
(1 - x: dark ink on light paper becomes high values, like the digits), fit the aspect
ratio of (H, W) (`data.resize`: "crop" the centred largest region, "pad" with black
around it, or "stretch"), and resize (area-averaged when shrinking, bilinear when
growing, per channel, in float).
"""
from __future__ import annotations

import dataclasses
import io
import os
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from mot import patches
from mot.errors import field

RESIZE_MODES = ("crop", "pad", "stretch")
# Pillow modes that hold one channel (a palette image is gray when its palette is).
GRAY_MODES = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N")
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
  """How a file becomes the model's image: size (H, W) (an int S is S x S), channels 1
  (grayscale [H, W]) or 3 (RGB [H, W, 3]), invert, and the aspect fit ("crop", "pad",
  "stretch")."""
  size: Any = 8
  invert: bool = False
  resize: str = "crop"
  channels: int = 1

  def __post_init__(self):
    object.__setattr__(self, "size", patches.image_shape(self.size))

  @property
  def shape(self) -> tuple[int, ...]:
    """Shape of one preprocessed image: (H, W) or (H, W, C)."""
    return self.size if self.channels == 1 else (*self.size, self.channels)


def image_options(data_config: Any) -> ImageOptions:
  """The ImageOptions of a (filled, see `mot.data.auto_config`) `config.data`, checked."""
  size = field(data_config, "image_size", "config.data")
  try:
    h, w = patches.image_shape(size)
  except ValueError:
    raise ValueError(f"config.data.image_size={size!r} must be an int S or a pair (H, W) "
                     "(train.py fills an unset () from the data)") from None
  if h < 1 or w < 1:
    raise ValueError(f"config.data.image_size={size!r} must be positive")
  resize = str(field(data_config, "resize", "config.data"))
  if resize not in RESIZE_MODES:
    raise ValueError(f"config.data.resize={resize!r} is unknown; known: {RESIZE_MODES}")
  channels = field(data_config, "channels", "config.data")
  if channels not in (1, 3):
    raise ValueError(f"config.data.channels={channels!r} must be 1 (grayscale) or 3 (RGB) "
                     "(train.py fills an unset 0 from the data)")
  return ImageOptions((h, w), bool(field(data_config, "invert", "config.data")), resize,
                      channels)


# ----------------------------------------------------------------------------------------
# Decoding.
# ----------------------------------------------------------------------------------------
def is_gray(im: Image.Image) -> bool:
  """Whether a Pillow image holds one channel (by its mode, or a palette of grays)."""
  if im.mode in GRAY_MODES:
    return True
  if im.mode in ("P", "PA"):
    palette = im.getpalette() or []
    triples = np.asarray(palette[:len(palette) // 3 * 3]).reshape(-1, 3)
    return bool(np.all(triples == triples[:, :1]))
  return False


def decode(im: Image.Image, channels: int) -> np.ndarray:
  """float32 [H, W] (channels 1) or [H, W, 3] in [0, 1] of any Pillow image."""
  if im.mode.startswith("I") or im.mode == "F":  # 16/32-bit integer or float grayscale
    top = 1.0 if im.mode == "F" else 65535.0
    gray = np.clip(np.asarray(im, np.float32) / top, 0.0, 1.0)
    return gray if channels == 1 else np.repeat(gray[..., None], 3, -1)
  if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info:
    rgba = im.convert("RGBA")
    im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
  return np.asarray(im.convert("L" if channels == 1 else "RGB"), np.float32) / 255.0


def _open(source: Any):
  """A context manager of the Pillow image of a path, bytes or PIL image."""
  if isinstance(source, Image.Image):
    return _Borrowed(source)
  return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)


class _Borrowed:
  """`with` over a PIL image the caller owns (not closed on exit)."""

  def __init__(self, im: Image.Image):
    self.im = im

  def __enter__(self) -> Image.Image:
    return self.im

  def __exit__(self, *exc) -> None:
    pass


def load_unit(source: Any, options: ImageOptions, name: str | None = None) -> np.ndarray:
  """float32 [H, W] or [H, W, 3] in [0, 1]: a path, encoded bytes or PIL image through the
  whole preprocessing. A file that does not decode is a one-line ValueError naming `name`
  (default: the path)."""
  name = name or (os.fspath(source) if isinstance(source, (str, os.PathLike))
                  else "image")
  h, w = options.size
  try:
    with _open(source) as im:
      if not isinstance(source, Image.Image):  # JPEG: decode at a reduced scale
        im.draft("L" if options.channels == 1 else "RGB", (w, h))
      arr = decode(ImageOps.exif_transpose(im), options.channels)
  except _DECODE_ERRORS as e:
    raise ValueError(f"{name}: cannot decode the image ({e}); re-save it as PNG or JPEG, "
                     "or remove it from the data") from None
  return fit(arr, options)


def load_image(source: Any, options: ImageOptions, name: str | None = None) -> np.ndarray:
  """`load_unit` in the model's range [-1, 1] (what the data pipeline feeds)."""
  return to_model_range(load_unit(source, options, name))


def to_model_range(unit: np.ndarray) -> np.ndarray:
  """[0, 1] -> [-1, 1] (the same arithmetic as `mot.media.to_model_scale`)."""
  return (np.asarray(unit, np.float32) * 2.0 - 1.0).astype(np.float32)


# ----------------------------------------------------------------------------------------
# Invert, fit the aspect ratio, resize.
# ----------------------------------------------------------------------------------------
def fit(arr: np.ndarray, options: ImageOptions) -> np.ndarray:
  """float [h, w(, C)] in [0, 1] -> float32 options.shape in [0, 1]: invert, crop / pad /
  stretch to the aspect ratio of options.size, resize."""
  g = 1.0 - arr if options.invert else arr
  g = fit_aspect(g, options.size, options.resize)
  if g.ndim == 3:
    return np.stack([resize(g[..., c], options.size) for c in range(g.shape[-1])], -1)
  return resize(g, options.size)


def fit_aspect(g: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
  """The centred largest region of g with the aspect ratio of size (H, W) ("crop"), g
  padded with 0 to the smallest such region ("pad"), or g as it is ("stretch")."""
  h, w = g.shape[:2]
  th, tw = size
  if mode == "stretch" or h * tw == w * th:
    return g
  wide = w * th > h * tw        # wider than the target: crop width, or pad height
  if mode == "crop":
    ch, cw = (h, max(1, round(h * tw / th))) if wide else (max(1, round(w * th / tw)), w)
    top, left = (h - ch) // 2, (w - cw) // 2
    return g[top:top + ch, left:left + cw]
  ph, pw = (max(h, round(w * th / tw)), w) if wide else (h, max(w, round(h * tw / th)))
  top, left = (ph - h) // 2, (pw - w) // 2
  pad = [(top, ph - h - top), (left, pw - w - left)] + [(0, 0)] * (g.ndim - 2)
  return np.pad(g, pad)  # With the background: -1 once scaled.


def resize(g: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """float [h, w] -> float32 [H, W] in [0, 1]: BOX averages the pixels each output pixel
  covers (no aliasing, no ringing) when shrinking; BILINEAR when enlarging."""
  th, tw = size
  shrink = g.shape[0] >= th and g.shape[1] >= tw
  resample = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
  small = np.asarray(Image.fromarray(np.ascontiguousarray(g, np.float32)).resize(
      (tw, th), resample), np.float32)
  return np.clip(small, 0.0, 1.0)


# ----------------------------------------------------------------------------------------
# Headers (cheap checks while a dataset is opened).
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Header:
  """What opening an image's header tells: its size and whether it is grayscale."""
  height: int
  width: int
  gray: bool


def check_header(source: Any, name: str) -> Header:
  """Opens the image header only (cheap); a one-line ValueError if it is not an image."""
  try:
    with _open(source) as im:
      w, h = im.size
      gray = is_gray(im)
  except FileNotFoundError:
    raise ValueError(f"{name}: the image file does not exist") from None
  except _DECODE_ERRORS as e:
    raise ValueError(f"{name}: not an image Pillow can read ({type(e).__name__}); "
                     "convert it to PNG or JPEG, or remove it from the data") from None
  if w < 1 or h < 1:
    raise ValueError(f"{name}: the image is empty ({w}x{h} pixels)")
  return Header(h, w, gray)
