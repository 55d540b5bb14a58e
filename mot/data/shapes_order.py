"""Order questions: a training-only curriculum for the Shapes relation questions.

"Is the red circle left of the blue square?" needs two named objects found and their
places compared; trained on its own, the answer stays at chance (docs/results.md §6,
`bench.relation_flip`). An order question asks for that comparison with a named answer:

  Which is left of the other, the red circle or the blue square?   red circle

Its answer names the object that the relation puts first, so every training answer
carries which of the two named objects is where, not one yes / no bit. A relation
question is then whether that object is the one named first. The form is outside the
issue's grammar (no evaluation asks it); the scenes are training scenes, so no held-out
pair appears in them.
"""
from __future__ import annotations

import itertools

from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject
from mot.data.shapes_scene import ShapesOptions

TEMPLATE = "Which is {relation} the other, the {a} or the {b}?"
SCENE_KINDS = ("pair", "mixed")   # shapes_scene kinds with two or more objects
MAX_DRAWS = 1000                  # scenes tried for one with a question (rejection bound)


def question_text(relation: str, a: tuple[str, str], b: tuple[str, str]) -> str:
  """The order question naming (colour, shape) kinds a then b."""
  return TEMPLATE.format(relation=relation, a=" ".join(a), b=" ".join(b))


def first_of(x: SceneObject, y: SceneObject, relation: str) -> SceneObject | None:
  """The one of x, y that `relation` puts first ("x left of y": x), or None when the
  relation holds neither way with the grammar's margin."""
  if grammar.relation_holds(x, y, relation):
    return x
  return y if grammar.relation_holds(y, x, relation) else None


def order_questions(scene: Scene) -> tuple[grammar.QA, ...]:
  """Every order question about `scene` with its answer: both named objects unique in
  their (colour, shape) kind, and the relation holding between them with the grammar's
  margin one way or the other."""
  kinds = [o.kind for o in scene.objects]
  unique = [(i, o) for i, o in enumerate(scene.objects)
            if o.shape != grammar.UNKNOWN_SHAPE and kinds.count(o.kind) == 1]
  out = []
  for (i, x), (j, y) in itertools.permutations(unique, 2):
    for relation in grammar.RELATIONS:
      first = first_of(x, y, relation)
      if first is not None:
        out.append(grammar.QA("order", question_text(relation, x.kind, y.kind),
                              " ".join(first.kind), (" ".join(first.kind),), (i, j)))
  return tuple(out)


def order_example(seed: int, index: int, n: int,
                  options: ShapesOptions = shapes_scene.DEFAULT_OPTIONS
                  ) -> tuple[Scene, tuple[grammar.QA, ...]]:
  """(training scene, up to n distinct order questions about it), a pure function of
  (seed, index): a scene of two or more objects with at least one order question, then
  questions drawn uniformly without repeats."""
  rng = shapes_scene.rng_for("train/order", seed, index)
  for _ in range(MAX_DRAWS):
    kind = SCENE_KINDS[int(rng.integers(len(SCENE_KINDS)))]
    scene = shapes.training_scene_of_kind(rng, kind, options)
    qas = order_questions(scene)
    if qas:
      pick = rng.permutation(len(qas))[:n]
      return scene, tuple(qas[int(k)] for k in pick)
  raise ValueError(f"no order question (two objects apart) for {options}")


def longest_question(options: ShapesOptions, tokenizer) -> int:
  """Most tokens an order question of `options` takes with `tokenizer`."""
  return max(len(tokenizer.encode(question_text(r, a, b))) for r in grammar.RELATIONS
             for a, b in itertools.permutations(options.all_types, 2))


def longest_answer(options: ShapesOptions, tokenizer) -> int:
  """Most tokens an order answer ("red circle") takes with `tokenizer`."""
  return max(len(tokenizer.encode(" ".join(k))) for k in options.all_types)
