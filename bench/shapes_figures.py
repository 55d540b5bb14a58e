"""Figures of the Shapes benchmark's data side (docs/shapes.md), numpy only, no model.

  python -m bench.shapes_figures [--scenes 10000] [--seed 0]

Prints one JSON line:
- detector: of `scenes` random scenes (all kinds, half with a held-out pair), how many
  `detect(render(scene))` returns exactly (every object's colour, shape, box, centre),
  and how many after perturbing each image (colour noise of +-40 per channel, two black
  pixels inside each object, a 4-pixel speck of a palette colour away from the objects);
- tokens: `shapes.max_text_tokens()`, the longest texts in byte tokens;
- captions: distinct captions per category, training and held-out;
- scenes: distinct training-type scenes of 1 and 2 objects (exact), and estimates for 3
  and 4 (Monte Carlo over random boxes), before the 1/8 reserved for evaluation.
"""
from __future__ import annotations

import json
import math

import numpy as np
from absl import app, flags

from mot import shapes_detector
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  flags.DEFINE_integer("scenes", 10_000, "random scenes the detector reads")
  flags.DEFINE_integer("seed", 0, "seed of the scenes and perturbations")


def perturb(image: np.ndarray, scene: shapes_scene.Scene, rng) -> np.ndarray:
  """Colour noise, two black pixels inside each object, a speck away from the objects."""
  out = np.clip(image.astype(int) + rng.integers(-40, 41, image.shape), 0, 255)
  clear = np.ones(image.shape[:2], bool)
  for o in scene.objects:
    out[rng.integers(o.top + 1, o.top + o.height - 1, 2),
        rng.integers(o.left + 1, o.left + o.width - 1, 2)] = 0
    clear[max(o.top - 3, 0):o.top + o.height + 2, max(o.left - 3, 0):o.left + o.width + 2] = 0
  spots = np.argwhere(clear[:-1, :-1])
  if len(spots):
    r, c = spots[rng.integers(len(spots))]
    out[r:r + 2, c:c + 2] = shapes_scene.PALETTE["green"]
  return out.astype(np.uint8)


def detector_figures(n: int, seed: int) -> dict:
  rng = shapes_scene.rng_for("bench/detector", seed)
  exact = perturbed = objects = 0
  for i in range(n):
    scene = shapes_scene.sample_scene(rng, shapes_scene.KINDS[i % 4], heldout=i % 2 == 1)
    image = shapes_scene.render(scene)
    exact += shapes_detector.detect(image) == scene
    perturbed += shapes_detector.detect(perturb(image, scene, rng)) == scene
    objects += len(scene.objects)
  return {"scenes": n, "objects": objects, "exact": int(exact), "perturbed": int(perturbed)}


def scene_counts(options=shapes_scene.DEFAULT_OPTIONS, trials: int = 2_000_000) -> dict:
  """Distinct scenes of k training-type objects: exact for k <= 2, estimated above."""
  sizes = range(options.min_size, options.max_size + 1)
  n = options.image_size
  boxes = np.array([(top, left, s) for s in sizes for top in range(n - s + 1)
                    for left in range(n - s + 1)])
  types = len(options.training_types)
  pairs = sum(int(shapes_scene.free_positions(s, [tuple(b)], n).sum())
              for b in boxes for s in sizes)
  out = {"1": types * len(boxes), "2": types ** 2 * pairs // 2}
  rng = np.random.default_rng(0)
  for k in (3, 4):
    top, left, s = np.moveaxis(boxes[rng.integers(len(boxes), size=(trials, k))], -1, 0)
    ok = np.ones(trials, bool)
    for i in range(k):
      for j in range(i):
        rows = (top[:, i] >= top[:, j] + s[:, j] + 2) | (top[:, j] >= top[:, i] + s[:, i] + 2)
        cols = ((left[:, i] >= left[:, j] + s[:, j] + 2)
                | (left[:, j] >= left[:, i] + s[:, i] + 2))
        ok &= rows | cols
    out[str(k)] = float(f"{(types * len(boxes)) ** k * ok.mean() / math.factorial(k):.3g}")
  return out


def main(argv) -> None:
  del argv
  captions = {split or "training": {c: len(shapes.category_requirements(c, split))
                                    for c in grammar.CATEGORIES}
              for split in (None, "heldout")}
  print(json.dumps({"detector": detector_figures(FLAGS.scenes, FLAGS.seed),
                    "tokens": shapes.max_text_tokens(), "captions": captions,
                    "scenes": scene_counts()}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
