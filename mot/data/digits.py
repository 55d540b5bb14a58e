"""scikit-learn's bundled 8x8 handwritten digits: the default data set (docs/design.md §5).

It ships with scikit-learn, so the default run needs no download. The split is fixed by
the order `load_digits` returns: the first 1,500 images train, the last 297 are held
out and never trained on. For tuning, `validation` > 0 keeps the last that many of the
1,500 out of training and puts them where the held-out digits were, so settings are chosen
without reading the 297. Pixels are scaled from 0..16 to [-1, 1], a range that suits
rectified-flow targets against unit-variance noise.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from mot import patches

NUM_TRAIN = 1500
SIDE = 8          # the digits are SIDE x SIDE pixels
MAX_PIXEL = 16.0
BACKGROUND = -1.0  # A blank (value 0) pixel after scaling.


MAX_VALIDATION = 750  # at most half the training images become the validation split


def _digits_table() -> np.ndarray:
  """float64 [1797, 65]: scikit-learn's digits.csv.gz (64 pixels, then the label), the
  file `sklearn.datasets.load_digits` reads. Read straight from the installed package,
  because importing scikit-learn takes about a second, and every training, sampling and
  test process reads the digits; `load_digits` itself if the file has moved."""
  spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
  path = os.path.join(spec.submodule_search_locations[0], "datasets", "data",
                      "digits.csv.gz") if spec and spec.submodule_search_locations else ""
  if os.path.isfile(path):
    return np.loadtxt(path, delimiter=",")
  from sklearn import datasets  # lazy: scikit-learn is slow to import
  digits = datasets.load_digits()
  return np.concatenate([digits.data, digits.target[:, None]], axis=1)


def check_validation_size(validation: object) -> int:
  """`validation` as an int in [0, MAX_VALIDATION], or a ValueError naming the fix."""
  if (isinstance(validation, bool) or not isinstance(validation, (int, np.integer))
      or not 0 <= validation <= MAX_VALIDATION):
    raise ValueError(f"config.data.validation_size={validation!r} must be an integer in "
                     f"[0, {MAX_VALIDATION}]: 0 evaluates on the held-out digits, N > 0 "
                     "trains without the last N training digits and evaluates on them")
  return int(validation)


def validation_size(data_config) -> int:
  """config.data.validation_size, checked."""
  return check_validation_size(data_config.validation_size)


@functools.lru_cache(maxsize=4)
def load_digits_split(validation: int = 0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train_images float32 [1500, 8, 8], train_labels int64 [1500],
  heldout_images float32 [297, 8, 8], heldout_labels int64 [297]), pixels in [-1, 1].

  validation > 0: (the first 1500 - validation training images and labels, the last
  `validation` of them) instead; the 297 held-out digits are then not returned at all.
  Cached and read-only, because every caller shares the same arrays.
  """
  validation = check_validation_size(validation)
  table = _digits_table()
  images = (table[:, :-1].reshape(-1, SIDE, SIDE) / (MAX_PIXEL / 2) - 1).astype(np.float32)
  labels = table[:, -1].astype(np.int64)
  cut = NUM_TRAIN - validation
  stop = NUM_TRAIN if validation else len(images)
  out = (images[:cut], labels[:cut], images[cut:stop], labels[cut:stop])
  for x in out:
    x.setflags(write=False)
  return out


def to_pixels(x: np.ndarray) -> np.ndarray:
  """Inverse of the scaling: float [...] in [-1, 1] -> float [...] in [0, 16] (clipped)."""
  return np.clip((np.asarray(x, np.float32) + 1) * (MAX_PIXEL / 2), 0, MAX_PIXEL)


def patchify(img: np.ndarray, patch_size: int) -> np.ndarray:
  """Cuts grayscale images [..., H, W] into [..., H/p, W/p, p*p] patches (row-major in a
  patch): `mot.patches.patchify` with one channel."""
  return patches.patchify(np.asarray(img)[..., None], patch_size)


def patchify_window(img: np.ndarray, patch_size: int, window: int) -> np.ndarray:
  """Images [..., H, W] -> [..., H/p, W/p, window**2]: each p x p patch with its
  neighbourhood, the window x window square centred on it (BACKGROUND beyond the border).

  The patch's own p*p pixels come first, in `patchify`'s order, then the surrounding
  ring row by row, so the first p*p dims equal `patchify`'s. A linear embedding of these
  overlapping windows is a strided convolution, the "convolutional stem" that helps
  vision transformers on little data (Xiao et al. 2021): a token sees the strokes
  around it, not only its own four pixels. `window == 0` (or == p) is `patchify`.
  """
  if window in (0, patch_size):
    return patchify(img, patch_size)
  img = np.asarray(img, np.float32)
  *lead, h, w = img.shape
  patches.check_divisible(h, w, patch_size)
  if window < patch_size or (window - patch_size) % 2:
    raise ValueError(f"window {window} must exceed patch_size {patch_size} by an even "
                     "number of pixels (centred on the patch)")
  m, p = (window - patch_size) // 2, patch_size
  padded = np.pad(img, [(0, 0)] * len(lead) + [(m, m), (m, m)], constant_values=BACKGROUND)
  own = [(m + a, m + b) for a in range(p) for b in range(p)]
  ring = [(a, b) for a in range(window) for b in range(window) if (a, b) not in own]
  return np.stack([padded[..., a:a + h:p, b:b + w:p] for a, b in own + ring], axis=-1)


def unpatchify(tokens: np.ndarray, patch_size: int) -> np.ndarray:
  """Inverse of `patchify`: [..., hp, wp, p*p] -> [..., hp*p, wp*p]."""
  return patches.unpatchify(tokens, patch_size, 1)[..., 0]
