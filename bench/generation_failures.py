"""Why generated Shapes images fail the GenEval-style protocol: each image's first fault.

  python -m bench.generation_failures --workdir runs/shapes [--steps 24] [--cfg_scale 1]

Draws the evaluation's in-distribution prompts (`config.eval_set_size` a category, one
image each, seed 0: the images `mot.evaluate` scores) and sorts every image by the
first of these faults the exact detector finds:
- "more objects" / "fewer objects" than the prompt names (a blob of no shape counts);
- "no shape": the count is right but a blob fits no shape;
- "wrong attribute": count and shapes fine, but a colour, shape or relation is wrong;
- "correct": the image fulfils its prompt (the GenEval-style hit).
Prints a markdown table of the fractions, then one JSON line with the counts.
"""
from __future__ import annotations

import collections
import json

from absl import app
from absl import flags

import bench
from mot import eval_shapes
from mot import shapes_detector
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data import shapes_tasks

FLAGS = flags.FLAGS
KINDS = ("more objects", "fewer objects", "no shape", "wrong attribute", "correct")


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Shapes training workdir (its newest checkpoint).")
  flags.DEFINE_integer("steps", None, "Denoising steps (default: the run's sample.steps).")
  flags.DEFINE_float("cfg_scale", None, "Guidance scale (default: the run's).")
  flags.mark_flag_as_required("workdir")


def fault(prompt: str, scene: shapes_scene.Scene) -> str:
  """The first fault (KINDS) of a detected `scene` drawn for `prompt` (in the grammar)."""
  req = grammar.parse_caption(prompt)
  wanted = sum(n for _, _, n in req.objects)
  if len(scene.objects) != wanted:
    return KINDS[0] if len(scene.objects) > wanted else KINDS[1]
  if any(o.shape == shapes_scene.UNKNOWN_SHAPE for o in scene.objects):
    return KINDS[2]
  return KINDS[4] if grammar.satisfies(scene, req) else KINDS[3]


def faults(pipe, steps=None, cfg_scale=None) -> collections.Counter:
  """Counter of KINDS over the in-distribution images of the evaluation protocol."""
  options = shapes_tasks.validate(pipe.config.data, pipe.tokenizer).scene
  sets = eval_shapes.generation_prompts(int(pipe.config.eval_set_size), options)
  prompts = [p for ps in sets["in_distribution"].values() for p in ps]
  images = eval_shapes.to_uint8(pipe.generate(prompts, num_samples=1, steps=steps,
                                              cfg_scale=cfg_scale, seed=0))
  return collections.Counter(fault(p, shapes_detector.detect(image))
                             for p, image in zip(prompts, images, strict=True))


def main(argv) -> None:
  del argv
  pipe = bench.load_shapes_pipeline(FLAGS.workdir, "generation_failures")
  counts = faults(pipe, FLAGS.steps, FLAGS.cfg_scale)
  total = sum(counts.values())
  print("| " + " | ".join(KINDS) + " |")
  print("|" + "---|" * len(KINDS))
  print("| " + " | ".join(f"{100 * counts[k] / total:.1f} %" for k in KINDS) + " |")
  print(json.dumps({"workdir": FLAGS.workdir, "images": total,
                    "faults": {k: counts[k] for k in KINDS}}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
