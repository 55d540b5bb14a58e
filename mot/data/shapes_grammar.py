"""The Shapes grammar (issue #39): captions, questions and think-then-draw prompts.

Everything is lowercase except questions, which are written exactly as the issue gives
them. `{c}` is a palette colour, `{s}` a shape, `{n}` one of two/three/four.

Captions (a caption names every object of its scene, so which templates fit depends on
the scene; `captions(scene)` lists them all):
  a {c} {s}                            the scene is exactly one such object
  {n} {c} {s}s                         exactly n such objects, nothing else
  a {c} {s} and a {c} {s}              exactly these two objects, of different types
  a {c} {s} {rel} a {c} {s}            the same, and the relation holds between the box
                                       centres with >= MARGIN (3) px to spare on its axis
with {rel} one of RELATIONS: "A left of B" iff x_B - x_A >= 3, "A right of B" iff
x_A - x_B >= 3, "A above B" iff y_B - y_A >= 3, "A below B" iff y_A - y_B >= 3 (y grows
down). Two objects of the same (colour, shape) take the counting form ("two red squares"),
never "a red square and a red square". Several captions fit a two-object scene; the
canonical one (`caption(scene)`, the training answer to "Describe this image.") is
"L left of R" when that holds, else "T above B", else "L and R", where L is the object
with the smaller centre x (then smaller y) and T the one with the smaller y.

Prompt categories (GenEval's names): single_object (a {c} {s}), counting ({n} ...),
two_object ("and" with one colour), color_attr ("and" with two colours), position
(a relation).

Questions -> answers (each asked only where well-defined; see `answer_question`):
  count        How many objects are there?               1..4
  count_color  How many {c} objects are there?           0..4
  color        What color is the {s}?                    a colour (exactly one {s})
  shape        What shape is the {c} object?             a shape (exactly one {c} object)
  relation     Is the {c} {s} {rel} the {c} {s}?         yes / no (each type present
               exactly once, types differ, |centre difference| >= 3 on the axis:
               "no" means the opposite relation holds)
  describe     Describe this image.                      a caption (the scene has one)

Think-then-draw (a context scene, a prompt, an answer caption, then the drawn image):
  draw the shape that is {c}:               -> a {c} {s}        ({s}: the unique {c} object)
  draw {n} of the shape that is {c}:        -> {n} {c} {s}s
  draw a {s2} in the color of the {s}:      -> a {c} {s2}       ({c}: the unique {s}'s
                                                                 colour; s2 != s)
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import re

from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject

NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}
RELATIONS = ("left of", "right of", "above", "below")
CONVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
MARGIN = 3  # px of centre difference a relation needs on its axis
# Every word the templates write (captions, questions, answers, think-then-draw prompts,
# the text task's "means"): the "bytes+shapes" tokenizer (mot.tokenizer) gives each its
# own id, so an answer is one or a few tokens instead of one per letter.
WORDS = tuple(sorted({
    *shapes_scene.COLORS, *shapes_scene.SHAPES, *(s + "s" for s in shapes_scene.SHAPES),
    *NUMBER_WORDS.values(), *" ".join(RELATIONS).split(),
    *("a and means yes no How many objects are there What color is the shape object Is "
      "Describe this image draw of that in").split()}))
CATEGORIES = ("single_object", "two_object", "counting", "color_attr", "position")
QTYPES = ("count", "count_color", "color", "shape", "relation", "describe")
COUNT_QUESTION = "How many objects are there?"
DESCRIBE_QUESTION = "Describe this image."
UNKNOWN_SHAPE = shapes_scene.UNKNOWN_SHAPE

_C = "(" + "|".join(shapes_scene.COLORS) + ")"
_S = "(" + "|".join(shapes_scene.SHAPES) + ")"
_N = "(" + "|".join(NUMBER_WORDS.values()) + ")"
_R = "(" + "|".join(RELATIONS) + ")"
_WORD_NUMBERS = {w: n for n, w in NUMBER_WORDS.items()}
_CAPTION_FORMS = {
    "single": re.compile(f"a {_C} {_S}"),
    "count": re.compile(f"{_N} {_C} {_S}s"),
    "and": re.compile(f"a {_C} {_S} and a {_C} {_S}"),
    "relation": re.compile(f"a {_C} {_S} {_R} a {_C} {_S}"),
}
_QUESTION_FORMS = {
    "count": re.compile(re.escape(COUNT_QUESTION)),
    "count_color": re.compile(f"How many {_C} objects are there\\?"),
    "color": re.compile(f"What color is the {_S}\\?"),
    "shape": re.compile(f"What shape is the {_C} object\\?"),
    "relation": re.compile(f"Is the {_C} {_S} {_R} the {_C} {_S}\\?"),
    "describe": re.compile(re.escape(DESCRIBE_QUESTION)),
}
_DRAW_FORMS = {
    "shape_of": re.compile(f"draw the shape that is {_C}:"),
    "count_of": re.compile(f"draw {_N} of the shape that is {_C}:"),
    "color_of": re.compile(f"draw a {_S} in the color of the {_S}:"),
}


# -------------------------------------------------------------------------- captions


@dataclasses.dataclass(frozen=True)
class Requirement:
  """What a caption asks for: (colour, shape, count) per named type, in caption order,
  and the relation of the first type to the second (None: no relation)."""
  objects: tuple[tuple[str, str, int], ...]
  relation: str | None = None

  @property
  def category(self) -> str:
    """The GenEval-style category of the caption (see CATEGORIES)."""
    if self.relation:
      return "position"
    if len(self.objects) == 2:
      return "two_object" if self.objects[0][0] == self.objects[1][0] else "color_attr"
    return "counting" if self.objects[0][2] > 1 else "single_object"

  @property
  def kinds(self) -> list[tuple[str, str]]:
    """(colour, shape) per object the caption asks for, counts expanded."""
    return [(c, s) for c, s, n in self.objects for _ in range(n)]

  def is_heldout(self, options=shapes_scene.DEFAULT_OPTIONS) -> bool:
    return any(options.is_heldout((c, s)) for c, s, _ in self.objects)


def caption_text(req: Requirement) -> str:
  """The caption of a requirement (inverse of `parse_caption`)."""
  def one(c, s, n):
    return f"a {c} {s}" if n == 1 else f"{NUMBER_WORDS[n]} {c} {s}s"
  words = [one(*o) for o in req.objects]
  if len(words) == 1:
    return words[0]
  return f" {req.relation or 'and'} ".join(words)


def parse_caption(text: str) -> Requirement | None:
  """The requirement of a caption, or None when `text` is outside the grammar (then a
  generated image is scored on nothing). Surrounding whitespace is ignored."""
  text = text.strip()
  for form, pattern in _CAPTION_FORMS.items():
    m = pattern.fullmatch(text)
    if not m:
      continue
    g = m.groups()
    if form == "single":
      return Requirement(((g[0], g[1], 1),))
    if form == "count":
      return Requirement(((g[1], g[2], _WORD_NUMBERS[g[0]]),))
    a, b = (g[0], g[1], 1), (g[-2], g[-1], 1)
    if a == b:
      return None  # two of one type take the counting form
    return Requirement((a, b), g[2] if form == "relation" else None)
  return None


def relation_holds(a: SceneObject, b: SceneObject, relation: str) -> bool:
  """Whether "a {relation} b" holds between the centres with MARGIN px to spare."""
  (ax, ay), (bx, by) = a.center, b.center
  diff = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}
  return diff[relation] >= MARGIN


def satisfies(scene: Scene, req: Requirement) -> bool:
  """True when `caption_text(req)` is a correct caption of `scene`: exactly the objects
  it names (no other object, no unknown blob) and its relation, if any."""
  want = collections.Counter(req.kinds)
  if collections.Counter(o.kind for o in scene.objects) != want:
    return False
  if req.relation is None:
    return True
  (ca, sa, _), (cb, sb, _) = req.objects
  a = next(o for o in scene.objects if o.kind == (ca, sa))
  b = next(o for o in scene.objects if o.kind == (cb, sb))
  return relation_holds(a, b, req.relation)


def _pair_captions(a: SceneObject, b: SceneObject) -> list[str]:
  """Every caption of a scene of two objects of different types, canonical first."""
  (ax, ay), (bx, by) = a.center, b.center
  left, right = (a, b) if (ax, ay) <= (bx, by) else (b, a)
  top, bottom = (a, b) if (ay, ax) <= (by, bx) else (b, a)
  def text(x, rel, y):
    return caption_text(Requirement(((*x.kind, 1), (*y.kind, 1)), rel))
  out = []
  if relation_holds(left, right, "left of"):
    out += [text(left, "left of", right), text(right, "right of", left)]
  if relation_holds(top, bottom, "above"):
    out += [text(top, "above", bottom), text(bottom, "below", top)]
  out += [text(left, None, right), text(right, None, left)]
  return out


def captions(scene: Scene) -> tuple[str, ...]:
  """Every caption the grammar allows for `scene`, the canonical one first; () when
  none fits (mixed scenes of three or more objects, more than four objects, unknowns)."""
  objects = scene.objects
  if not objects or any(o.shape not in shapes_scene.SHAPES for o in objects):
    return ()
  kinds = collections.Counter(o.kind for o in objects)
  if len(kinds) == 1:
    n = len(objects)
    if n == 1:
      return (caption_text(Requirement(((*objects[0].kind, 1),))),)
    return (caption_text(Requirement(((*objects[0].kind, n),))),) if n in NUMBER_WORDS else ()
  if len(objects) == 2:
    first, *rest = _pair_captions(*objects)
    return (first, *sorted(rest))
  return ()


def caption(scene: Scene) -> str | None:
  """The canonical caption of `scene`, or None when no caption fits it."""
  texts = captions(scene)
  return texts[0] if texts else None


def all_requirements(types, max_objects: int = shapes_scene.MAX_OBJECTS
                     ) -> list[Requirement]:
  """Every requirement over (colour, shape) `types`, in a fixed order."""
  out = [Requirement(((c, s, 1),)) for c, s in types]
  out += [Requirement(((c, s, n),)) for n in NUMBER_WORDS if n <= max_objects
          for c, s in types]
  if max_objects >= 2:
    for a, b in itertools.permutations(types, 2):
      out += [Requirement(((*a, 1), (*b, 1)), rel) for rel in (None, *RELATIONS)]
  return out


# ------------------------------------------------------------------------- questions


@dataclasses.dataclass(frozen=True)
class QA:
  """One well-defined question about a scene.

  Attributes:
    qtype: one of QTYPES.
    question: the question text.
    answer: the canonical answer (the training target).
    accepted: every answer scored correct (`describe`: every caption of the scene).
    objects: indices into scene.objects of the objects the question is about.
  """
  qtype: str
  question: str
  answer: str
  accepted: tuple[str, ...]
  objects: tuple[int, ...]


def question_type(question: str) -> str | None:
  """The QTYPES entry whose template `question` matches, or None."""
  for qtype, pattern in _QUESTION_FORMS.items():
    if pattern.fullmatch(question.strip()):
      return qtype
  return None


def _unique(scene: Scene, **attrs) -> int | None:
  """Index of the only object with these attributes, or None (absent or several)."""
  hits = [i for i, o in enumerate(scene.objects)
          if all(getattr(o, k) == v for k, v in attrs.items())]
  return hits[0] if len(hits) == 1 else None


def _qa(qtype: str, question: str, answer: str, objects, accepted=None) -> QA:
  return QA(qtype, question, answer, tuple(accepted or (answer,)), tuple(objects))


def answer_question(question: str, scene: Scene) -> QA | None:
  """The answer to `question` about `scene`, or None when the question is outside the
  grammar or not well-defined for the scene (not asked in training or evaluation)."""
  question = question.strip()
  qtype = question_type(question)
  if qtype is None:
    return None
  g = _QUESTION_FORMS[qtype].fullmatch(question).groups()
  objs = scene.objects
  if qtype == "count":
    return _qa(qtype, question, str(len(objs)), range(len(objs))) if objs else None
  if qtype == "count_color":
    hits = [i for i, o in enumerate(objs) if o.color == g[0]]
    return _qa(qtype, question, str(len(hits)), hits)
  if qtype in ("color", "shape"):
    i = _unique(scene, shape=g[0]) if qtype == "color" else _unique(scene, color=g[0])
    if i is None or objs[i].shape == UNKNOWN_SHAPE:
      return None
    return _qa(qtype, question, objs[i].color if qtype == "color" else objs[i].shape, [i])
  if qtype == "relation":
    i, j = _unique(scene, color=g[0], shape=g[1]), _unique(scene, color=g[3], shape=g[4])
    if i is None or j is None or i == j:
      return None
    if relation_holds(objs[i], objs[j], g[2]):
      return _qa(qtype, question, "yes", [i, j])
    return _qa(qtype, question, "no", [i, j]) if relation_holds(
        objs[i], objs[j], CONVERSE[g[2]]) else None
  texts = captions(scene)
  return _qa(qtype, question, texts[0], range(len(objs)), texts) if texts else None


def question_texts(scene: Scene, colors=shapes_scene.COLORS, qtypes=QTYPES) -> list[str]:
  """Candidate questions of `qtypes` about `scene`: every template instance that can be
  defined for it (relations only between types present), colour counts over `colors`."""
  out = {q: [] for q in QTYPES}
  out["count"] = [COUNT_QUESTION]
  out["count_color"] = [f"How many {c} objects are there?" for c in colors]
  out["color"] = [f"What color is the {s}?" for s in shapes_scene.SHAPES]
  out["shape"] = [f"What shape is the {c} object?" for c in shapes_scene.COLORS]
  if "relation" in qtypes:
    present = sorted({o.kind for o in scene.objects if o.shape != UNKNOWN_SHAPE})
    for (ca, sa), (cb, sb) in itertools.permutations(present, 2):
      out["relation"] += [f"Is the {ca} {sa} {rel} the {cb} {sb}?" for rel in RELATIONS]
  out["describe"] = [DESCRIBE_QUESTION]
  return [text for q in qtypes for text in out[q]]


def questions(scene: Scene, colors=shapes_scene.COLORS, qtypes=QTYPES) -> tuple[QA, ...]:
  """Every well-defined question of `qtypes` about `scene` with its answer."""
  answers = (answer_question(q, scene) for q in question_texts(scene, colors, qtypes))
  return tuple(a for a in answers if a is not None)


# ------------------------------------------------------------------ think-then-draw


@dataclasses.dataclass(frozen=True)
class Draw:
  """A think-then-draw prompt about a context scene, its answer caption, what to draw."""
  prompt: str
  answer: str
  requirement: Requirement


def answer_draw(prompt: str, scene: Scene) -> Draw | None:
  """The answer to a think-then-draw `prompt` about the context `scene`, or None when
  the prompt is outside the grammar or the object it refers to is not unique."""
  prompt = prompt.strip()
  for form, pattern in _DRAW_FORMS.items():
    m = pattern.fullmatch(prompt)
    if not m:
      continue
    g = m.groups()
    if form == "color_of":
      i = _unique(scene, shape=g[1])
      if i is None or g[0] == g[1]:
        return None
      obj = (scene.objects[i].color, g[0], 1)
    else:
      i = _unique(scene, color=g[-1])
      if i is None or scene.objects[i].shape == UNKNOWN_SHAPE:
        return None
      n = 1 if form == "shape_of" else _WORD_NUMBERS[g[0]]
      obj = (*scene.objects[i].kind, n)
    req = Requirement((obj,))
    return Draw(prompt, caption_text(req), req)
  return None


def draw_prompts(scene: Scene, max_objects: int = shapes_scene.MAX_OBJECTS
                 ) -> tuple[Draw, ...]:
  """Every think-then-draw prompt defined for the context `scene`."""
  texts = []
  for c in shapes_scene.COLORS:
    texts.append(f"draw the shape that is {c}:")
    texts += [f"draw {w} of the shape that is {c}:" for n, w in NUMBER_WORDS.items()
              if n <= max_objects]
  texts += [f"draw a {s2} in the color of the {s}:"
            for s2, s in itertools.permutations(shapes_scene.SHAPES, 2)]
  draws = (answer_draw(t, scene) for t in texts)
  return tuple(d for d in draws if d is not None)
