"""Planned drawing (`data.layout_plan`): does it fail in the plan or in the drawing?

  python -m bench.plan_follow --workdir runs/shapes_plan [--items 32]

Draws one image for each in-distribution GenEval prompt (the protocol's fixed sets,
`--items` a category; the run's sampling defaults, seed 0) through
`Pipeline.plan_then_draw`, which writes a layout plan per image and then draws it, and
reports per category:
- plan valid: the plan parses and names exactly the caption's objects, and on position
  prompts its places put them in the caption's relation;
- drawn as planned: the detector finds exactly the plan's objects, each of its kind
  within one place step (3 px) of its planned column and row;
- GenEval: the image passes the protocol's test (`shapes_metrics.score_image`).
And, apart, how far the drawing follows a plan's places: "a red circle" drawn from the
given plans " red circle C R" at the four corner places (1 and 8), `--place_samples` each;
the place response is how far the red ink's mean centre moves between the two columns
(rows), over how far the plans move it: 1 follows the plan, 0 ignores it.
A valid plan drawn as planned passes unless the drawn objects miss the 3-px relation
margin or a shape; so the first figure bounds what the AR head gives, the second what
the DM head keeps of it. Prints a markdown table, then one JSON line with every figure.
"""
from __future__ import annotations

import collections
import json
import sys

from absl import app
from absl import flags
import numpy as np

import bench
from mot import eval_shapes, shapes_detector, shapes_metrics
from mot.data import shapes_grammar as grammar
from mot.data import shapes_tasks, shapes_think
from mot.data.shapes_scene import Scene

FLAGS = flags.FLAGS
_BEFORE = {"left of": (2, True), "right of": (2, False), "above": (3, True),
           "below": (3, False)}   # plan item index compared, and whether a comes first


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Shapes workdir trained with data.layout_plan.")
  flags.DEFINE_integer("items", 32, "Prompts per GenEval category.")
  flags.DEFINE_integer("place_samples", 8, "Images per corner plan for the place response.")
  flags.mark_flag_as_required("workdir")


def plan_valid(prompt: str, plan: str) -> bool:
  """Whether `plan` names exactly the objects of caption `prompt` and, for a relation
  caption, places its first object before the second on the relation's axis."""
  req, items = grammar.parse_caption(prompt), shapes_think.parse_plan(plan)
  if req is None or items is None:
    return False
  if collections.Counter((c, s) for c, s, _, _ in items) != collections.Counter(req.kinds):
    return False
  if req.relation is None:
    return True
  (ca, sa, _), (cb, sb, _) = req.objects
  a = next(it for it in items if it[:2] == (ca, sa))
  b = next(it for it in items if it[:2] == (cb, sb) and it is not a)
  axis, a_first = _BEFORE[req.relation]
  return a[axis] != b[axis] and (a[axis] < b[axis]) == a_first


def drawn_as_planned(plan: str, scene: Scene) -> bool:
  """Whether the detected `scene` holds exactly the plan's objects, each of its kind
  within one place step of its planned places (matched greedily, in plan order)."""
  items = shapes_think.parse_plan(plan)
  if items is None or len(items) != len(scene.objects):
    return False
  left = [(o.kind, shapes_think.place(o, "left of"), shapes_think.place(o, "above"))
          for o in scene.objects]
  for color, shape, col, row in items:
    hit = next((d for d in left if d[0] == (color, shape) and abs(d[1] - col) <= 1
                and abs(d[2] - row) <= 1), None)
    if hit is None:
      return False
    left.remove(hit)
  return True


def probe(pipe, n: int) -> tuple[dict, list[str]]:
  """({category and "all": {"items", "plan_valid", "drawn_as_planned", "geneval"}}, the
  first eight plans)."""
  options = shapes_tasks.scene_options(pipe.config.data)
  sets = eval_shapes.generation_prompts(n, options)["in_distribution"]
  prompts = [p for ps in sets.values() for p in ps]
  steps, cfg, sampler = pipe.sampling_settings(1)
  plans, images = pipe.plan_then_draw(prompts, 1, steps, cfg, sampler, seed=0)
  images = eval_shapes.to_uint8(images)
  rows = collections.defaultdict(list)
  for prompt, plan, image in zip(prompts, plans, images):
    category = grammar.parse_caption(prompt).category
    rows[category].append((plan_valid(prompt, plan),
                           drawn_as_planned(plan, shapes_detector.detect(image)),
                           bool(shapes_metrics.score_image(prompt, image))))
  rows["all"] = [r for c in sets for r in rows[c]]
  return {c: {"items": len(r), **{k: float(np.mean([x[i] for x in r])) for i, k in
                                  enumerate(("plan_valid", "drawn_as_planned", "geneval"))}}
          for c, r in rows.items()}, plans[:8]


CORNERS = ((1, 1), (8, 1), (1, 8), (8, 8))   # (column, row) places of the given plans


def place_response(pipe, samples: int) -> dict:
  """{"column", "row": how far the red ink's centre follows the plans' places (1 = as
  planned), "no_ink": images without red ink} for "a red circle" planned at CORNERS."""
  plans = [f" red circle {c} {r}" for c, r in CORNERS for _ in range(samples)]
  size = pipe.config.data.image_size
  examples = [pipe.prompts.generation_example(
      shapes_think.plan_prompt("a red circle"), pipe.tokenizer.encode(p),
      canvas=shapes_think.drawing_canvas(p, pipe.config.data)) for p in plans]
  steps, cfg, sampler = pipe.sampling_settings(1)
  images = eval_shapes.to_uint8(pipe.to_images(pipe.denoise(examples, 1, steps, cfg,
                                                            sampler, 0)))
  red = (images[..., 0] > 127) & (images[..., 1] < 128) & (images[..., 2] < 128)
  inked = red.any((1, 2))
  ys, xs = np.indices((size, size))
  centre = np.stack([(red * xs).sum((1, 2)), (red * ys).sum((1, 2))], -1) / np.maximum(
      red.sum((1, 2)), 1)[:, None]
  mean = [c[i].mean(0) if i.any() else np.full(2, np.nan) for c, i in zip(
      centre.reshape(len(CORNERS), samples, 2), inked.reshape(len(CORNERS), samples))]
  span = (8 - 1) * shapes_think.PLACE_STEP
  return {"column": float((mean[1][0] + mean[3][0] - mean[0][0] - mean[2][0]) / 2 / span),
          "row": float((mean[2][1] + mean[3][1] - mean[0][1] - mean[1][1]) / 2 / span),
          "no_ink": float(1 - inked.mean())}


def table(figures: dict) -> str:
  pct = lambda x: f"{100 * x:.1f} %"
  lines = ["| category | items | plan valid | drawn as planned | GenEval |",
           "|---|---|---|---|---|"]
  for c, f in figures.items():
    lines.append(f"| {c} | {f['items']} | {pct(f['plan_valid'])} | "
                 f"{pct(f['drawn_as_planned'])} | {pct(f['geneval'])} |")
  return "\n".join(lines)


def main(argv) -> None:
  del argv
  if FLAGS.items < 1:
    sys.exit(f"plan_follow: --items must be >= 1, got {FLAGS.items}")
  pipe = bench.load_shapes_pipeline(FLAGS.workdir, "plan_follow")
  if pipe.plan_temperature is None:
    sys.exit(f"plan_follow: {FLAGS.workdir} was not trained with data.layout_plan: train "
             "with --config.data.layout_plan=True")
  if FLAGS.place_samples < 1:
    sys.exit(f"plan_follow: --place_samples must be >= 1, got {FLAGS.place_samples}")
  figures, examples = probe(pipe, FLAGS.items)
  figures["place_response"] = place_response(pipe, FLAGS.place_samples)
  print(table({c: f for c, f in figures.items() if c != "place_response"}))
  r = figures["place_response"]
  print(f"place response: columns {r['column']:.2f}, rows {r['row']:.2f} (1 = as planned, "
        f"0 = ignored); {100 * r['no_ink']:.1f} % of images without red ink")
  print("plans:", examples)
  print(json.dumps(figures))


if __name__ == "__main__":
  define_flags()
  app.run(main)
