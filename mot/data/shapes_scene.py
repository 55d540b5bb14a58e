"""The Shapes scene contract (issue #39): palette, rasterisation, layout and options.

An independent judge renders and detects by this contract, so every rule is exact:

- An image is `image_size` x `image_size` (32) RGB uint8 on a black (0, 0, 0) background.
- Each object is filled with one flat palette colour, no antialiasing: red (255, 0, 0),
  green (0, 255, 0), blue (0, 0, 255), yellow (255, 255, 0), magenta (255, 0, 255),
  cyan (0, 255, 255).
- Each object occupies an s x s bounding box, s in [min_size, max_size] (7..11), whose top
  row is `top` and left column `left`; its pixels are `shape_mask(shape, s)` (see there:
  square, circle, triangle), and every mask touches all four sides of its box, so the
  tight bounding box of an object's pixels is its box.
- 1..max_objects (4) objects; every two boxes are separated on at least one axis by at
  least GAP = 2 background rows or columns, e.g. `b.top >= a.top + a.height + 2`.
  Objects of the same colour therefore never touch, even diagonally.
- Coordinates: x is the column (grows right), y the row (grows down). An object's centre
  is its box's centre, (left + (width - 1) / 2, top + (height - 1) / 2).
- Held-out compositions: the (colour, shape) pairs in `heldout_pairs` (blue triangle,
  yellow circle, magenta square) never appear in a training scene.

Scenes are values (`Scene`, a sorted tuple of `SceneObject`s) and `render` draws them;
`sample_scene` draws random scenes from a numpy Generator, `rng_for` keys Generators by
(tag, seed, index) so a scene is a pure function of its key.
"""
from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools
import zlib

import numpy as np

PALETTE = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "magenta": (255, 0, 255),
    "cyan": (0, 255, 255),
}
COLORS = tuple(PALETTE)
SHAPES = ("square", "circle", "triangle")
UNKNOWN_SHAPE = "unknown"  # the detector's name for a blob that fits no shape
HELDOUT_PAIRS = (("blue", "triangle"), ("yellow", "circle"), ("magenta", "square"))
GAP = 2             # background pixels between two boxes on at least one axis
MAX_OBJECTS = 4     # the grammar's number words stop at "four"
MIN_SIDE = 5        # smallest box the detector's shape test separates reliably
# Scene kinds `sample_scene` draws: one object; 2..max_objects identical objects; two
# objects of different (colour, shape); 1..max_objects objects of any types.
KINDS = ("single", "count", "pair", "mixed")
_MAX_LAYOUT_TRIES = 10_000


@dataclasses.dataclass(frozen=True, order=True)
class SceneObject:
  """One object: its box (top row, left column, height, width), colour and shape.

  Rendered objects have height == width == s; detected ones may not. `shape` is one of
  SHAPES, or UNKNOWN_SHAPE for a detected blob that fits no shape.
  """
  top: int
  left: int
  height: int
  width: int
  color: str
  shape: str

  @property
  def center(self) -> tuple[float, float]:
    """(x, y) of the box's centre: column and row, halves where the side is even."""
    return (self.left + (self.width - 1) / 2, self.top + (self.height - 1) / 2)

  @property
  def kind(self) -> tuple[str, str]:
    return (self.color, self.shape)


@dataclasses.dataclass(frozen=True)
class Scene:
  """Objects sorted by (top, left, ...), so equal scenes compare equal."""
  objects: tuple[SceneObject, ...]
  image_size: int = 32

  def __post_init__(self):
    object.__setattr__(self, "objects", tuple(sorted(self.objects)))

  def count(self, color: str | None = None, shape: str | None = None) -> int:
    """Number of objects of `color` and/or `shape` (None: any)."""
    return sum((color is None or o.color == color) and (shape is None or o.shape == shape)
               for o in self.objects)

  def key(self) -> str:
    """A stable text key (same on every machine and run), e.g. for hashing."""
    return ";".join(f"{o.top},{o.left},{o.height},{o.width},{o.color},{o.shape}"
                    for o in self.objects) + f"@{self.image_size}"


@dataclasses.dataclass(frozen=True)
class ShapesOptions:
  """What a run may draw; build it with `validate_options` from config fields."""
  image_size: int = 32
  min_size: int = 7
  max_size: int = 11
  max_objects: int = MAX_OBJECTS
  colors: tuple[str, ...] = COLORS
  shapes: tuple[str, ...] = SHAPES
  heldout_pairs: tuple[tuple[str, str], ...] = HELDOUT_PAIRS

  @property
  def all_types(self) -> tuple[tuple[str, str], ...]:
    """Every (colour, shape) of the options, colour-major."""
    return tuple((c, s) for c in self.colors for s in self.shapes)

  @property
  def training_types(self) -> tuple[tuple[str, str], ...]:
    return tuple(t for t in self.all_types if t not in self.heldout_pairs)

  @property
  def heldout_types(self) -> tuple[tuple[str, str], ...]:
    return tuple(t for t in self.all_types if t in self.heldout_pairs)

  def is_heldout(self, kind: tuple[str, str]) -> bool:
    return tuple(kind) in self.heldout_pairs

  def scene_is_heldout(self, scene: Scene) -> bool:
    """True when any object of `scene` is a held-out (colour, shape) pair."""
    return any(self.is_heldout(o.kind) for o in scene.objects)


DEFAULT_OPTIONS = ShapesOptions()


# ---------------------------------------------------------------------------- raster


@functools.cache
def shape_mask(shape: str, s: int) -> np.ndarray:
  """bool [s, s], read-only: the pixels of `shape` in an s x s box (row r, column c).

  - square: every pixel.
  - circle (filled disc): pixel (r, c) iff (2r - (s-1))**2 + (2c - (s-1))**2 <= s**2,
    i.e. its centre lies within s/2 of the box centre (integer test, no rounding).
  - triangle (isosceles, apex up, base = the bottom row): row r is the centred run of
    w_r = s - 2 * floor((s - 1 - r) / 2) pixels, columns (s - w_r)/2 .. (s + w_r)/2 - 1;
    so the widths grow by 2 every second row from the bottom (s, s, s-2, s-2, ...) up to
    the apex row of 1 (odd s) or 2 (even s) pixels.
  """
  if s < 1:
    raise ValueError(f"box side {s} must be positive")
  r, c = np.mgrid[0:s, 0:s]
  if shape == "square":
    mask = np.ones((s, s), bool)
  elif shape == "circle":
    mask = (2 * r - (s - 1)) ** 2 + (2 * c - (s - 1)) ** 2 <= s * s
  elif shape == "triangle":
    widths = s - 2 * ((s - 1 - np.arange(s)) // 2)
    lo = (s - widths) // 2
    mask = (c >= lo[:, None]) & (c < (lo + widths)[:, None])
  else:
    raise ValueError(f"unknown shape {shape!r}: use one of {SHAPES}")
  mask.setflags(write=False)
  return mask


def render(scene: Scene) -> np.ndarray:
  """uint8 [image_size, image_size, 3]: the scene drawn by the contract."""
  n = scene.image_size
  image = np.zeros((n, n, 3), np.uint8)
  for o in scene.objects:
    if o.height != o.width or o.top < 0 or o.left < 0 or max(
        o.top, o.left) + o.height > n:
      raise ValueError(f"object {o} is not an s x s box inside the {n}x{n} image")
    box = image[o.top:o.top + o.height, o.left:o.left + o.width]
    box[shape_mask(o.shape, o.height)] = PALETTE[o.color]
  return image


def to_model(images: np.ndarray) -> np.ndarray:
  """uint8 [..., H, W, 3] -> float32 in [-1, 1], the range rectified flow targets use."""
  return np.asarray(images, np.float32) / 127.5 - 1.0


def to_uint8(x: np.ndarray) -> np.ndarray:
  """Inverse of `to_model`: float [..., H, W, 3] in [-1, 1] -> uint8 (rounded, clipped)."""
  return np.clip(np.round((np.asarray(x, np.float32) + 1.0) * 127.5), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- options


def _one_line(field: str, value, fix: str) -> ValueError:
  return ValueError(f"{field}={value!r} {fix}")


def _names(field: str, value, known: Sequence[str], what: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, Sequence) or not value:
    raise _one_line(field, value, f"must be a non-empty list of {what} names from {known}")
  for name in value:
    if name not in known:
      raise _one_line(field, value, f"has unknown {what} {name!r}: use names from {known}")
  if len(set(value)) != len(value):
    raise _one_line(field, value, f"repeats a {what}: list each {what} once")
  return tuple(value)


def _integer(field: str, value, lo: int, hi: int, why: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
      lo <= value <= hi):
    raise _one_line(field, value, f"must be an integer in [{lo}, {hi}] ({why})")
  return int(value)


def validate_options(image_size=32, min_size=7, max_size=11, max_objects=MAX_OBJECTS,
                     colors=COLORS, shapes=SHAPES, heldout_pairs=HELDOUT_PAIRS,
                     prefix: str = "config.data.shapes") -> ShapesOptions:
  """The ShapesOptions these config fields describe, or a one-line ValueError that names
  the field (`prefix`.name) and the fix (mot.config turns it into a ConfigError)."""
  p = prefix + "."
  image_size = _integer(p + "image_size", image_size, MIN_SIDE, 1024, "pixels a side")
  min_size = _integer(p + "min_size", min_size, MIN_SIDE, image_size,
                      "smallest object side: the shape test needs 5 or more")
  max_size = _integer(p + "max_size", max_size, min_size, image_size,
                      f"largest object side, at least {p}min_size")
  max_objects = _integer(p + "max_objects", max_objects, 1, MAX_OBJECTS,
                         "the captions count up to four")
  if max_objects > 1 and 2 * max_size + GAP > image_size:
    raise _one_line(p + "max_size", max_size,
                    f"cannot fit {max_objects} objects {GAP} px apart on a {image_size}x"
                    f"{image_size} image: lower it to {(image_size - GAP) // 2} or set "
                    f"{p}max_objects=1")
  colors = _names(p + "colors", colors, COLORS, "colour")
  shapes = _names(p + "shapes", shapes, SHAPES, "shape")
  if isinstance(heldout_pairs, str) or not isinstance(heldout_pairs, Sequence):
    raise _one_line(p + "heldout_pairs", heldout_pairs,
                    "must be a list of (colour, shape) pairs, e.g. [('blue', 'triangle')]")
  pairs = []
  for pair in heldout_pairs:
    if isinstance(pair, str) or len(pair) != 2 or pair[0] not in colors or (
        pair[1] not in shapes):
      raise _one_line(p + "heldout_pairs", heldout_pairs,
                      f"has {pair!r}, not a (colour, shape) pair of {p}colors and {p}shapes")
    pairs.append((pair[0], pair[1]))
  options = ShapesOptions(image_size, min_size, max_size, max_objects, colors, shapes,
                          tuple(pairs))
  for color, shape in options.heldout_pairs:
    trained = options.training_types
    if not any(c == color for c, _ in trained) or not any(s == shape for _, s in trained):
      raise _one_line(p + "heldout_pairs", heldout_pairs,
                      f"leaves no training object of colour {color!r} or shape {shape!r}: "
                      "hold out fewer pairs, so each part is seen in another composition")
  return options


# ---------------------------------------------------------------------------- layout


def rng_for(*key: int | str) -> np.random.Generator:
  """A Generator that depends only on `key` (strings by CRC-32, stable across runs)."""
  ints = []
  for k in key:
    if isinstance(k, str):
      k = zlib.crc32(k.encode())
    if int(k) < 0:
      raise ValueError(f"seed/index {k} must be >= 0")
    ints.append(int(k))
  return np.random.default_rng(np.random.SeedSequence(ints))


def free_positions(s: int, placed: Sequence[tuple[int, int, int]], n: int) -> np.ndarray:
  """bool [n-s+1, n-s+1]: top-left corners where an s-box keeps GAP from every box placed."""
  pos = np.arange(n - s + 1)
  free = np.ones((pos.size, pos.size), bool)
  for top, left, side in placed:
    rows_apart = (pos >= top + side + GAP) | (pos + s + GAP <= top)
    cols_apart = (pos >= left + side + GAP) | (pos + s + GAP <= left)
    free &= rows_apart[:, None] | cols_apart[None, :]
  return free


def layout(sizes: Sequence[int], rng: np.random.Generator, image_size: int
           ) -> list[tuple[int, int]]:
  """(top, left) per box of side sizes[i], uniform among corners keeping the boxes GAP
  apart, placed in order; a dead end starts the placement again (validated options
  always admit a 2 x 2 arrangement, so this ends)."""
  for _ in range(_MAX_LAYOUT_TRIES):
    placed = []
    for s in sizes:
      free = np.flatnonzero(free_positions(s, placed, image_size))
      if not free.size:
        break
      top, left = divmod(int(free[rng.integers(free.size)]), image_size - s + 1)
      placed.append((top, left, s))
    else:
      return [(top, left) for top, left, _ in placed]
  raise ValueError(f"cannot place boxes of sides {list(sizes)} on a {image_size}x"
                   f"{image_size} image {GAP} px apart")


def place(kinds: Sequence[tuple[str, str]], rng: np.random.Generator,
          options: ShapesOptions) -> Scene:
  """A scene of one object per (colour, shape) in `kinds`, random sizes and positions."""
  sizes = [int(s) for s in rng.integers(options.min_size, options.max_size + 1, len(kinds))]
  corners = layout(sizes, rng, options.image_size)
  return Scene(tuple(SceneObject(top, left, s, s, c, sh)
                     for (top, left), s, (c, sh) in zip(corners, sizes, kinds, strict=True)),
               options.image_size)


def _pick(rng: np.random.Generator, items: Sequence, n: int | None = None):
  """One item of `items` (or a list of n, with replacement), uniformly."""
  if n is None:
    return items[int(rng.integers(len(items)))]
  return [items[int(i)] for i in rng.integers(len(items), size=n)]


def sample_kinds(rng: np.random.Generator, kind: str, options: ShapesOptions,
                 heldout: bool = False) -> list[tuple[str, str]]:
  """(colour, shape) per object of a scene of `kind` (see KINDS).

  heldout=False draws training types only; heldout=True makes the first object a held-out
  pair and draws the others from every type, so the scene contains a held-out pair.
  """
  pool = options.all_types if heldout else options.training_types
  first = _pick(rng, options.heldout_types if heldout else pool)
  top = options.max_objects
  if kind == "single":
    return [first]
  if kind == "count":
    return [first] * int(rng.integers(2, top + 1)) if top >= 2 else [first]
  if kind == "pair":
    others = [t for t in pool if t != first]
    return [first, _pick(rng, others)] if top >= 2 and others else [first]
  if kind == "mixed":
    return [first] + _pick(rng, pool, int(rng.integers(0, top)))
  raise ValueError(f"unknown scene kind {kind!r}: use one of {KINDS}")


def sample_scene(rng: np.random.Generator, kind: str, options: ShapesOptions = DEFAULT_OPTIONS,
                 heldout: bool = False) -> Scene:
  """A random scene of `kind`; see `sample_kinds` for `heldout`. Objects are shuffled
  before placement, so the held-out one is not always placed first."""
  kinds = sample_kinds(rng, kind, options, heldout)
  order = rng.permutation(len(kinds))
  return place([kinds[i] for i in order], rng, options)
