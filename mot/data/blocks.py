"""A trivial synthetic image source: flat-colour squares, discs and triangles on black.

A stand-in with the look of the shapes scenes (issue #39: 32x32 RGB, black background,
the six-colour palette, objects 7-11 px across, no antialiasing), without their layout
rules: objects may overlap and touch the border, and no captions exist. It feeds the VAE
trainer's tests (mot.vae_train_lib) and works as its data where mot.data.shapes is absent.

  images("train", 1000, seed=0)   # uint8 [1000, 32, 32, 3]; a pure function of its args
"""
from __future__ import annotations

import numpy as np

PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255),
                    (0, 255, 255)], np.uint8)
SPLITS = {"train": 0, "heldout": 1}     # independent random streams
MIN_SIZE, MAX_SIZE = 7, 11              # object bounding boxes, pixels a side
MAX_OBJECTS = 4


def _mask(kind: int, s: int) -> np.ndarray:
  """bool [s, s]: 0 square, 1 disc (pixel centres within s/2 of the box centre),
  2 triangle (apex up: row r covers the centred (r + 1) / s of the width)."""
  yy, xx = np.mgrid[0:s, 0:s] + 0.5
  if kind == 0:
    return np.ones((s, s), bool)
  if kind == 1:
    return (yy - s / 2) ** 2 + (xx - s / 2) ** 2 <= (s / 2) ** 2
  half = (np.arange(s)[:, None] + 1) / s * s / 2
  return np.abs(xx - s / 2) <= half


def images(split: str, n: int, seed: int, size: int = 32) -> np.ndarray:
  """uint8 [n, size, size, 3]: 1-4 random objects each, the same for the same arguments."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}: use one of {sorted(SPLITS)}")
  rng = np.random.default_rng([seed, SPLITS[split]])
  out = np.zeros((n, size, size, 3), np.uint8)
  for i in range(n):
    for _ in range(rng.integers(1, MAX_OBJECTS + 1)):
      s = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
      y, x = rng.integers(0, size - s + 1, size=2)
      mask = _mask(int(rng.integers(3)), s)
      out[i, y:y + s, x:x + s][mask] = PALETTE[rng.integers(len(PALETTE))]
  return out
