"""Does the model read where objects are? Answers and captions under a mirrored image.

  python -m bench.relation_flip --workdir runs/shapes [--items 80]

Every Shapes object is left-right symmetric (squares, discs, isosceles triangles), so
mirroring a scene left to right keeps each object and swaps "left of" with "right of".
Three probes, all on fixed in-distribution items (`mot.data.shapes` evaluation sets):
- relation questions about left / right ("Is the red circle left of the blue square?"):
  accuracy on the scene, accuracy on its mirror (whose truth is the opposite answer), and
  how often the answer changes when the scene is mirrored;
- "Describe this image." on two-object scenes: how many captions are true of the scene
  (the grammar's `captions`), how many use a relation, and how often the caption changes
  when the scene is mirrored;
- order questions about the same pairs as the relation questions ("Which is left of the
  other, the red circle or the blue square?", the training-only curriculum of
  `mot.data.shapes_order`): the same three figures, the mirror's truth being the other
  object. A run that did not train on them says so by its accuracy.
A run trained with relation traces (`data.relation_trace`) gets a fourth figure set, of
its replies to the relation questions: replies in the trace's form, both written places
within one step of the truth, and yes / no answers that follow the reply's own places.
A model that reads positions changes its answer under the mirror about as often as the
truth changes (always, for the questions); one that ignores them does not, and scores 50 %
on yes / no. Prints a markdown table, then one JSON line with every figure.
"""
from __future__ import annotations

import json
import sys

from absl import app
from absl import flags
import numpy as np

import bench
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_order
from mot.data import shapes_scene
from mot.data import shapes_think

FLAGS = flags.FLAGS
HORIZONTAL = ("left of", "right of")


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Shapes training workdir (its newest checkpoint).")
  flags.DEFINE_integer("items", 80, "Questions, and captioned scenes, per probe.")
  flags.mark_flag_as_required("workdir")


def mirrored(image: np.ndarray) -> np.ndarray:
  """The scene mirrored left to right."""
  return np.ascontiguousarray(image[:, ::-1])


def relation_items(n: int, options=shapes_scene.DEFAULT_OPTIONS):
  """n in-distribution (scene, QA) relation items about left / right."""
  pool = shapes.vqa_set("relation", "in_distribution", 8 * n, options)
  items = [it for it in pool if any(f" {r} " in it[1].question for r in HORIZONTAL)]
  return items[:n]


def order_item(scene, qa: grammar.QA) -> tuple[str, str, str]:
  """(order question, its answer, the mirror's answer) about the two objects of relation
  item (scene, qa), with its relation word."""
  relation = next(r for r in HORIZONTAL if f" {r} " in qa.question)
  a, b = (scene.objects[i] for i in qa.objects)
  first = shapes_order.first_of(a, b, relation)  # a relation item's pair always has one
  other = b if first is a else a
  return (shapes_order.question_text(relation, a.kind, b.kind), " ".join(first.kind),
          " ".join(other.kind))


def pair_scenes(n: int, options=shapes_scene.DEFAULT_OPTIONS):
  """n in-distribution captioned scenes of two objects of different kinds."""
  pool = shapes.caption_set("in_distribution", 8 * n, options)
  return [s for s in pool if len(s.objects) == 2 and len({o.kind for o in s.objects}) == 2][:n]


def question_figures(truth, answers, mirror_answers, mirror_truth=None) -> dict:
  """Accuracy on the scenes, on their mirrors (truth flipped: yes / no swapped unless
  `mirror_truth` is given), and answers changed."""
  flip = {"yes": "no", "no": "yes"}
  mirror_truth = mirror_truth or [flip[t] for t in truth]
  return {"items": len(truth),
          "accuracy": float(np.mean([a == t for a, t in zip(answers, truth)])),
          "mirror_accuracy": float(np.mean([a == t for a, t in
                                            zip(mirror_answers, mirror_truth)])),
          "changed": float(np.mean([a != b for a, b in zip(answers, mirror_answers)]))}


def caption_figures(scenes, captions, mirror_captions) -> dict:
  """Captions true of their scene, captions naming a relation, captions changed."""
  true = [c in grammar.captions(s) for s, c in zip(scenes, captions)]
  relational = [any(f" {r} " in c for r in grammar.RELATIONS) for c in captions]
  return {"items": len(scenes), "true": float(np.mean(true)),
          "with_relation": float(np.mean(relational)),
          "changed": float(np.mean([a != b for a, b in zip(captions, mirror_captions)]))}


def trace_figures(items, replies) -> dict:
  """Of replies to relation items (scene, QA): replies in the trace's form, both places
  within one step of the truth, answers that follow the reply's own places."""
  form, near, follows = [], [], []
  for (scene, qa), reply in zip(items, replies):
    parsed = shapes_think.parse_trace(reply)
    form.append(parsed is not None)
    if parsed is None:
      near.append(False)
      follows.append(False)
      continue
    relation = shapes_think.relation_of(qa.question)
    truth = [shapes_think.place(scene.objects[i], relation) for i in qa.objects]
    near.append(all(abs(a - b) <= 1 for a, b in zip(parsed[:2], truth)))
    follows.append(parsed[2] == shapes_think.implied_answer(*parsed[:2], relation))
  return {"items": len(items), "form": float(np.mean(form)),
          "places_within_one_step": float(np.mean(near)),
          "answer_follows_places": float(np.mean(follows))}


def probe(pipe, n: int) -> dict:
  """The probes' figures for a `mot.Pipeline` (the trace figures for a traced run)."""
  items = relation_items(n)
  images = [shapes_scene.render(s) for s, _ in items]
  questions = [qa.question for _, qa in items]
  mirrors = [mirrored(i) for i in images]
  replies = pipe.reason(questions, images=images, raw=True)
  relation = question_figures([qa.answer for _, qa in items],
                              [shapes_think.final_answer(r) for r in replies],
                              pipe.reason(questions, images=mirrors))
  orders = [order_item(s, qa) for s, qa in items]
  ask = [q for q, _, _ in orders]
  order = question_figures([t for _, t, _ in orders], pipe.reason(ask, images=images),
                           pipe.reason(ask, images=mirrors), [m for _, _, m in orders])
  scenes = pair_scenes(n)
  images = [shapes_scene.render(s) for s in scenes]
  ask = [grammar.DESCRIBE_QUESTION] * len(scenes)
  caption = caption_figures(scenes, pipe.reason(ask, images=images),
                            pipe.reason(ask, images=[mirrored(i) for i in images]))
  figures = {"relation_left_right": relation, "describe_two_objects": caption,
             "order_left_right": order}
  if pipe.config.data.relation_trace:
    figures["relation_traces"] = trace_figures(items, replies)
  return figures


def table(figures: dict) -> str:
  r, c, o = (figures[k] for k in ("relation_left_right", "describe_two_objects",
                                   "order_left_right"))
  pct = lambda x: f"{100 * x:.1f} %"
  return "\n".join([
      "| probe | items | correct | correct on the mirror | changed by the mirror |",
      "|---|---|---|---|---|",
      f"| relation left / right | {r['items']} | {pct(r['accuracy'])} | "
      f"{pct(r['mirror_accuracy'])} | {pct(r['changed'])} |",
      f"| order left / right (curriculum) | {o['items']} | {pct(o['accuracy'])} | "
      f"{pct(o['mirror_accuracy'])} | {pct(o['changed'])} |",
      f"| describe, two objects ({pct(c['with_relation'])} with a relation) | {c['items']} | "
      f"{pct(c['true'])} | | {pct(c['changed'])} |"] + trace_line(figures, pct))


def trace_line(figures: dict, pct) -> list[str]:
  """The trace figures' line under the table, for a traced run."""
  t = figures.get("relation_traces")
  if t is None:
    return []
  return [f"\nrelation traces ({t['items']}): {pct(t['form'])} in form, both places within "
          f"one step {pct(t['places_within_one_step'])}, answer follows the written places "
          f"{pct(t['answer_follows_places'])}"]


def main(argv) -> None:
  del argv
  if FLAGS.items < 1:
    sys.exit(f"relation_flip: --items must be >= 1, got {FLAGS.items}")
  pipe = bench.load_shapes_pipeline(FLAGS.workdir, "relation_flip")
  figures = probe(pipe, FLAGS.items)
  print(table(figures))
  print(json.dumps({"workdir": FLAGS.workdir, **figures}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
