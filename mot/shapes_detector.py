"""An exact, programmatic detector for Shapes images (issue #39), numpy only.

`detect(image)` returns the `Scene` an image shows, in four steps:
1. Palette segmentation: each pixel takes the nearest of black and the six palette
   colours (Euclidean RGB distance) when that distance is <= `tolerance` (so slightly off
   generated colours still count); black is background; a pixel farther than `tolerance`
   from every reference (e.g. a blurred edge halfway to black) is ignored.
2. Connected components of each colour, 8-connected (objects of one colour are >= 2 px
   apart by the contract, so they never merge).
3. Size filter: components under `min_area` pixels are specks and are dropped.
4. Shape test on the component's tight bounding box (h x w): its row-width profile
   (pixels per row / w) is compared with each shape's exact profile at side h
   (`shape_mask`), mean absolute difference; the nearest shape wins if that difference is
   <= PROFILE_TOLERANCE and the fill ratio (pixels / (h * w)) is within FILL_TOLERANCE of
   that shape's; otherwise, or when the box is far from square (ratio > MAX_ASPECT), the
   object's shape is UNKNOWN_SHAPE ("unknown"). A few wrong pixels move both numbers little.
On a rendered scene every object comes back exactly (colour, shape, box, so centre).
"""
from __future__ import annotations

import numpy as np

from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject

TOLERANCE = 100.0        # max RGB distance of a pixel to its palette colour (or to black)
MIN_AREA = 10            # components smaller than this are specks (the smallest object has 17)
PROFILE_TOLERANCE = 0.15  # max mean |row width - ideal| / width of a recognised shape
FILL_TOLERANCE = 0.12    # max |fill ratio - ideal| of a recognised shape
MAX_ASPECT = 1.5         # boxes longer than this on one side are no shape of ours
IGNORED, BACKGROUND = -1, 0   # pixel classes besides 1 + palette index
_REFERENCES = np.array([(0, 0, 0), *shapes_scene.PALETTE.values()], np.float32)
_NEIGHBOURS = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]


def _check_image(image) -> np.ndarray:
  image = np.asarray(image)
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"expected an RGB image [H, W, 3], got shape {image.shape}")
  return image.astype(np.float32)


def classify_pixels(image, tolerance: float = TOLERANCE) -> np.ndarray:
  """int32 [H, W]: IGNORED, BACKGROUND, or 1 + the index of the pixel's palette colour."""
  image = _check_image(image)
  dist = np.linalg.norm(image[:, :, None, :] - _REFERENCES, axis=-1)  # [H, W, 7]
  nearest = dist.argmin(-1).astype(np.int32)
  return np.where(dist.min(-1) <= tolerance, nearest, IGNORED)


def _shifted(x: np.ndarray, dr: int, dc: int, fill) -> np.ndarray:
  """x moved by (dr, dc): out[r, c] = x[r - dr, c - dc], `fill` where that is outside."""
  out = np.full_like(x, fill)
  h, w = x.shape
  out[max(dr, 0):h + min(dr, 0), max(dc, 0):w + min(dc, 0)] = (
      x[max(-dr, 0):h + min(-dr, 0), max(-dc, 0):w + min(-dc, 0)])
  return out


def components(classes: np.ndarray) -> np.ndarray:
  """int32 [H, W]: 0 off-object, else a component id shared by the 8-connected pixels of
  one colour class (ids are not consecutive). Labels propagate as the minimum over
  same-class neighbours until nothing changes."""
  on = classes > BACKGROUND
  big = np.iinfo(np.int32).max
  labels = np.where(on, np.arange(1, classes.size + 1, dtype=np.int32).reshape(classes.shape),
                    big)
  while True:
    new = labels
    for dr, dc in _NEIGHBOURS:
      same = on & (_shifted(classes, dr, dc, IGNORED) == classes)
      new = np.minimum(new, np.where(same, _shifted(labels, dr, dc, big), big))
    if np.array_equal(new, labels):
      return np.where(on, labels, 0)
    labels = new


def shape_of(mask: np.ndarray) -> str:
  """The shape whose exact raster best matches bool `mask` [h, w] (a component cut to its
  tight bounding box) by row-width profile and fill ratio, or "unknown"."""
  h, w = mask.shape
  if min(h, w) < shapes_scene.MIN_SIDE or max(h, w) > MAX_ASPECT * min(h, w):
    return shapes_scene.UNKNOWN_SHAPE
  profile = mask.sum(1) / w
  fill = mask.mean()
  best, best_gap = shapes_scene.UNKNOWN_SHAPE, np.inf
  for shape in shapes_scene.SHAPES:
    ideal = shapes_scene.shape_mask(shape, h)
    gap = np.abs(profile - ideal.sum(1) / h).mean()
    if (gap < best_gap and gap <= PROFILE_TOLERANCE
        and abs(fill - ideal.mean()) <= FILL_TOLERANCE):
      best, best_gap = shape, gap
  return best


def detect(image, tolerance: float = TOLERANCE, min_area: int = MIN_AREA) -> Scene:
  """The scene `image` (uint8-valued RGB [H, W, 3], H == W) shows: one SceneObject per
  component of at least `min_area` pixels, its shape possibly "unknown"."""
  classes = classify_pixels(image, tolerance)
  if classes.shape[0] != classes.shape[1]:
    raise ValueError(f"expected a square image, got {classes.shape[0]}x{classes.shape[1]}")
  labels = components(classes)
  objects = []
  for label in np.unique(labels[labels > 0]):
    rows, cols = np.nonzero(labels == label)
    if rows.size < min_area:
      continue
    top, left = rows.min(), cols.min()
    h, w = rows.max() - top + 1, cols.max() - left + 1
    mask = np.zeros((h, w), bool)
    mask[rows - top, cols - left] = True
    color = shapes_scene.COLORS[classes[rows[0], cols[0]] - 1]
    objects.append(SceneObject(int(top), int(left), int(h), int(w), color, shape_of(mask)))
  return Scene(tuple(objects), classes.shape[0])
