"""Images <-> patch tokens, for any size and number of channels.

An image float [..., H, W, C] is cut into (H/p) x (W/p) patches of p x p pixels; a patch
token's vector lists its pixels row by row, each pixel's C channels together:
index (row_in_patch * p + col_in_patch) * C + channel. A grayscale image is C = 1, so its
vector is the p*p pixels row by row (`mot.data.digits.patchify` is this with C = 1).
"""
from __future__ import annotations

import numpy as np


def check_divisible(h: int, w: int, patch_size: int) -> None:
  """Refuses an image side that patch_size does not divide."""
  if patch_size < 1 or h % patch_size or w % patch_size:
    raise ValueError(f"image of {h}x{w} pixels cannot be cut into {patch_size}x"
                     f"{patch_size} patches: H and W must be divisible by patch_size")


def patchify(images: np.ndarray, patch_size: int) -> np.ndarray:
  """float [..., H, W, C] -> [..., H/p, W/p, p*p*C]."""
  images = np.asarray(images)
  *lead, h, w, c = images.shape
  check_divisible(h, w, patch_size)
  p = patch_size
  x = images.reshape(*lead, h // p, p, w // p, p, c)
  x = np.moveaxis(x, -4, -3)  # [..., hp, wp, p, p, C]
  return x.reshape(*lead, h // p, w // p, p * p * c)


def unpatchify(tokens: np.ndarray, patch_size: int, channels: int) -> np.ndarray:
  """Inverse of `patchify`: [..., hp, wp, p*p*C] -> [..., hp*p, wp*p, C]."""
  tokens = np.asarray(tokens)
  *lead, hp, wp, d = tokens.shape
  p, c = patch_size, channels
  if d != p * p * c:
    raise ValueError(f"patches of dim {d} do not match patch_size {p} and {c} channels "
                     f"(need {p * p * c})")
  x = tokens.reshape(*lead, hp, wp, p, p, c)
  x = np.moveaxis(x, -3, -4)  # [..., hp, p, wp, p, C]
  return x.reshape(*lead, hp * p, wp * p, c)


def image_shape(size) -> tuple[int, int]:
  """(H, W) of a config's image size: an int S (S x S), or a pair / one-element sequence
  (H, W) / (S,) as the command line gives tuples (`--config.data.image_size='(24, 32)'`)."""
  if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
    return int(size), int(size)
  if isinstance(size, (tuple, list)) and len(size) in (1, 2) and all(
      isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in size):
    return int(size[0]), int(size[-1])
  raise ValueError(f"image size {size!r} must be an int S (S x S pixels) or a pair (H, W)")


def to_patches(images: np.ndarray, patch_size: int, channels: int) -> np.ndarray:
  """`patchify` of images [..., H, W] (channels 1) or [..., H, W, C]."""
  images = np.asarray(images)
  return patchify(images[..., None] if channels == 1 else images, patch_size)


def from_patches(tokens: np.ndarray, patch_size: int, channels: int) -> np.ndarray:
  """Inverse of `to_patches`: [..., H, W] (channels 1) or [..., H, W, C]."""
  out = unpatchify(tokens, patch_size, channels)
  return out[..., 0] if channels == 1 else out
