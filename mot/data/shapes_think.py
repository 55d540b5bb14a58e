"""Think-then-answer for the Shapes relation questions: both places in text, then yes / no.

"Is the red circle left of the blue square?" needs two objects found by name and their
places compared in one step; trained so, the answer stays at chance (docs/results.md §6,
`bench.relation_flip`). With `config.data.relation_trace` the training answer first
writes each named object's place on the relation's axis, then the answer:

  Is the red circle left of the blue square?   red circle 2, blue square 7: yes

So the question becomes two lookups of an object's place (an attribute, as its colour is
one) and a comparison of two digits in text. A place is the centre's column (left of /
right of) or row (above / below) in PLACE_STEP-pixel steps; a relation holds with
MARGIN px to spare and PLACE_STEP = MARGIN, so the two places always differ and the trace
decides the answer. `Pipeline.reason` returns only the text after the trace
(`final_answer`), so answers keep the grammar's form.

Drawing has the same trouble: the DM head alone lets each 8x8 patch settle its part of a
scene from its own noise, and the parts do not agree (docs/results.md §6). With
`config.data.layout_plan` a caption is followed by its layout, written by the AR head
and then drawn by the DM head, conditioned on both:

  a red circle left of a blue square: red circle 1 5, blue square 7 3   [image]

each object (scene order: top to bottom, then left to right) with its centre's column and
row place. Count, colours and places are then decided in text, one token at a time,
where an AR head resolves choices; `Pipeline.generate` writes the plan first
(`mot.pipeline.Pipeline.plan_then_draw`). With `config.data.layout_canvas` the plan is
also drawn as a canvas (`plan_canvas`: a mark of each object's colour at its places), a
clean image the DM head reads before drawing, so the places sit where the patches are.
"""
from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np

from mot.data import shapes_grammar as grammar
from mot.data.shapes_scene import PALETTE
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject
from mot.data.shapes_scene import ShapesOptions

SEPARATOR = ": "            # ends the trace; no grammar answer contains it
PLAN_SEPARATOR = ":"        # ends a caption that a layout plan follows
PLACE_STEP = grammar.MARGIN  # px a place step: two related objects' places always differ
CANVAS_DOT = 3              # px side of a planned object's mark on a layout canvas
_AXIS = {"left of": 0, "right of": 0, "above": 1, "below": 1}   # index into SceneObject.center
_PLAN_ITEM = re.compile(r"([a-z]+) ([a-z]+) (\d+) (\d+)")
_TRACE = re.compile(r"([a-z]+ [a-z]+) (\d+), ([a-z]+ [a-z]+) (\d+): (yes|no)")


def relation_of(question: str) -> str:
  """The relation word of a relation question ("left of", ...)."""
  found = [r for r in grammar.RELATIONS if f" {r} the " in question]
  if grammar.question_type(question) != "relation" or len(found) != 1:
    raise ValueError(f"{question!r} is not a relation question of the Shapes grammar")
  return found[0]


def place(obj: SceneObject, relation: str) -> int:
  """The object's place on the relation's axis: its centre in PLACE_STEP-px steps."""
  return int(obj.center[_AXIS[relation]] // PLACE_STEP)


def plan_prompt(caption: str) -> str:
  """The text a layout plan follows: the caption and PLAN_SEPARATOR."""
  return caption.strip() + PLAN_SEPARATOR


def plan_text(objects) -> str:
  """" red circle 1 5, blue square 7 3": each object's colour, shape, and its centre's
  column (left of / right of) and row (above / below) places, in the given order."""
  return " " + ", ".join(f"{' '.join(o.kind)} {place(o, 'left of')} {place(o, 'above')}"
                         for o in objects)


def parse_plan(text: str) -> list[tuple[str, str, int, int]] | None:
  """[(colour, shape, column place, row place)] of a plan's text (`plan_text`'s form,
  leading space optional), or None when it is not in that form."""
  items = [_PLAN_ITEM.fullmatch(part) for part in text.strip().split(", ")]
  if not all(items):
    return None
  return [(m[1], m[2], int(m[3]), int(m[4])) for m in items]


def plan_canvas(plan: str, size: int) -> np.ndarray:
  """uint8 [size, size, 3]: a black canvas with a CANVAS_DOT-px square of each planned
  object's colour at its planned column and row places (`data.layout_canvas`: the places
  put where the image's patches are, for the DM head to draw on). A plan that does not
  parse gives the blank canvas, as do unknown colours."""
  canvas = np.zeros((size, size, 3), np.uint8)
  for color, _, col, row in parse_plan(plan) or []:
    if color not in PALETTE:
      continue
    x, y = (min(size - 1, p * PLACE_STEP + PLACE_STEP // 2) for p in (col, row))
    h = CANVAS_DOT // 2
    canvas[max(0, y - h):y + h + 1, max(0, x - h):x + h + 1] = PALETTE[color]
  return canvas


def drawing_canvas(plan: str, data_config) -> np.ndarray | None:
  """The canvas a run draws `plan` on: `plan_canvas` in [0, 1] (`mot.prompts`' scale)
  when config.data.layout_canvas, else None (no canvas block)."""
  if not data_config.layout_canvas:
    return None
  return plan_canvas(plan, data_config.image_size) / 255.0


def longest_plan(options: ShapesOptions, tokenizer) -> int:
  """Most tokens (`tokenizer`'s, no end token) a layout plan takes under `options`:
  max_objects objects of the longest names at the farthest place."""
  far = options.image_size - 1
  return max(len(tokenizer.encode(plan_text(
      [SceneObject(far, far, 1, 1, c, s)] * options.max_objects)))
      for c, s in options.all_types)


def trace_text(a: SceneObject, b: SceneObject, relation: str, answer: str) -> str:
  """"{a's colour and shape} {place}, {b's} {place}: {answer}"."""
  return (f"{' '.join(a.kind)} {place(a, relation)}, {' '.join(b.kind)} "
          f"{place(b, relation)}{SEPARATOR}{answer}")


def with_trace(qa: grammar.QA, scene: Scene) -> grammar.QA:
  """`qa` with its trained answer preceded by the trace when it is a relation question
  (objects (i, j) of `scene`, as `grammar.answer_question` names them); other questions
  unchanged. The accepted answers stay the grammar's: `final_answer` is what is scored."""
  if qa.qtype != "relation":
    return qa
  i, j = qa.objects
  text = trace_text(scene.objects[i], scene.objects[j], relation_of(qa.question), qa.answer)
  return dataclasses.replace(qa, answer=text)


def final_answer(text: str) -> str:
  """The answer a traced reply gives: the text after its last SEPARATOR (all of it when
  there is none, as in every untraced answer)."""
  return text.rsplit(SEPARATOR, 1)[-1].strip()


def parse_trace(text: str) -> tuple[int, int, str] | None:
  """(first place, second place, answer) of a reply in `trace_text`'s form, else None."""
  m = _TRACE.fullmatch(text.strip())
  return None if m is None else (int(m[2]), int(m[4]), m[5])


def implied_answer(first: int, second: int, relation: str) -> str:
  """The answer two places give: is the first object `relation` the second?"""
  before = first < second if relation in ("left of", "above") else first > second
  return "yes" if before else "no"


def longest_trace(options: ShapesOptions, tokenizer) -> int:
  """Most tokens (`tokenizer`'s, no EOS) a traced relation answer takes under `options`:
  the longest names at the farthest place, both answers."""
  far = SceneObject(options.image_size - 1, options.image_size - 1, 1, 1, "", "")
  longest = 0
  for (ca, sa), (cb, sb) in itertools.product(options.all_types, repeat=2):
    a = dataclasses.replace(far, color=ca, shape=sa)
    b = dataclasses.replace(far, color=cb, shape=sb)
    for answer in ("yes", "no"):
      longest = max(longest, len(tokenizer.encode(trace_text(a, b, "below", answer))))
  return longest
