"""Shapes (issue #39): deterministic training streams and fixed evaluation sets.

The scene contract lives in `shapes_scene` (palette, rasterisation, layout, options) and
the text in `shapes_grammar` (captions, questions, think-then-draw); this module decides
what each task sees:

- Training examples are pure functions of (seed, index): `training_scene`,
  `generation_example`, `vqa_example`, `caption_example`, `think_draw_example`,
  `text_example`. They draw training (colour, shape) types only, so no held-out pair
  appears in any training scene, caption, question, answer or drawn image.
- Evaluation sets are fixed (independent of the training seed): `prompt_set` (GenEval-style
  prompts per category), `vqa_set` (per question type), `caption_set`, `think_draw_set`,
  each "in_distribution" or "heldout" (every held-out item contains a held-out pair, and
  a held-out question is about such an object). Item i of a set does not depend on n, so a
  smaller set is a prefix of a larger one.
- Scenes are split by a hash of their key: `is_eval_scene` reserves 1/EVAL_SHARDS of all
  scenes for evaluation, and training never draws one, so no evaluation image is ever
  trained on (the finite caption grammar is shared, as GenEval's prompts are).

Usage:
  from mot.data import shapes, shapes_scene
  caption, scene = shapes.generation_example(seed=0, index=17)
  image = shapes_scene.render(scene)            # uint8 [32, 32, 3]
  for scene, qa in shapes.vqa_set("relation", "heldout", n=64): ...
"""
from __future__ import annotations

from collections.abc import Iterator
import dataclasses
import functools
import itertools
import zlib

import numpy as np

from mot import tokenizer as tokenizer_lib
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import DEFAULT_OPTIONS
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import ShapesOptions

SPLITS = ("in_distribution", "heldout")
EVAL_SHARDS = 8        # 1 scene in EVAL_SHARDS (by hash) is reserved for evaluation
DEFAULT_SET_SIZE = 64  # items per evaluation set unless the caller asks otherwise
# How often each scene kind is drawn for questions and think-then-draw contexts: mixed
# scenes make the counts and uniqueness questions varied, the others keep every
# question type (describe needs a captionable scene) well supplied.
KIND_WEIGHTS = {"single": 0.15, "count": 0.2, "pair": 0.25, "mixed": 0.4}
_KIND_CDF = np.cumsum(list(KIND_WEIGHTS.values()))
_MAX_DRAWS = 1000      # rejection-sampling bound; hitting it means impossible options
_TOKENIZER = tokenizer_lib.BYTE_TOKENIZER   # default for lengths: no tokenizer writes more ids


@dataclasses.dataclass(frozen=True)
class ThinkDraw:
  """Context scene, prompt, answer caption and a scene drawn to the answer."""
  context: Scene
  prompt: str
  answer: str
  scene: Scene


def is_eval_scene(scene: Scene) -> bool:
  """True for the 1/EVAL_SHARDS of scenes reserved for evaluation (by CRC-32 of the key)."""
  return zlib.crc32(scene.key().encode()) % EVAL_SHARDS == 0


def _check_split(split: str) -> bool:
  """True for "heldout"; a ValueError naming the choices for anything else."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}: use one of {SPLITS}")
  return split == "heldout"


def _draw_kind(rng: np.random.Generator) -> str:
  return tuple(KIND_WEIGHTS)[int(np.searchsorted(_KIND_CDF, rng.random() * _KIND_CDF[-1],
                                                 side="right"))]


def _scene(rng: np.random.Generator, kind: str, options: ShapesOptions,
           split: str | None) -> Scene:
  """A scene of `kind`: training (split None), in-distribution or held-out evaluation;
  training and in-distribution scenes fall on their side of `is_eval_scene`."""
  heldout = split == "heldout"
  for _ in range(_MAX_DRAWS):
    scene = shapes_scene.sample_scene(rng, kind, options, heldout)
    if heldout or is_eval_scene(scene) == (split == "in_distribution"):
      return scene
  raise ValueError(f"no {split or 'training'} scene of kind {kind!r} for {options}")


def scene_for(req: grammar.Requirement, rng: np.random.Generator,
              options: ShapesOptions = DEFAULT_OPTIONS, split: str | None = None) -> Scene:
  """A random scene that `req` captions (relation included), drawn from `rng`: a training
  scene (split None) or an evaluation one ("in_distribution", "heldout"), e.g. a
  reference image for a prompt."""
  for _ in range(_MAX_DRAWS):
    scene = shapes_scene.place(req.kinds, rng, options)
    on_side = split == "heldout" or is_eval_scene(scene) == (split == "in_distribution")
    if on_side and grammar.satisfies(scene, req):
      return scene
  raise ValueError(f"cannot draw {grammar.caption_text(req)!r} with {options}")


# -------------------------------------------------------------------------- training


def training_scene(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS) -> Scene:
  """Scene `index` of the endless training stream of `seed` (kind by KIND_WEIGHTS)."""
  rng = shapes_scene.rng_for("train/scene", seed, index)
  return _scene(rng, _draw_kind(rng), options, None)


def training_scene_of_kind(rng: np.random.Generator, kind: str,
                           options: ShapesOptions = DEFAULT_OPTIONS) -> Scene:
  """A training scene of `kind` (see `shapes_scene.sample_kinds`) drawn from `rng`."""
  return _scene(rng, kind, options, None)


def training_scenes(seed: int, options: ShapesOptions = DEFAULT_OPTIONS,
                    start: int = 0) -> Iterator[Scene]:
  """The endless stream training_scene(seed, start), training_scene(seed, start + 1), ..."""
  index = start
  while True:
    yield training_scene(seed, index, options)
    index += 1


@functools.lru_cache(maxsize=64)
def category_requirements(category: str, split: str | None,
                          options: ShapesOptions = DEFAULT_OPTIONS
                          ) -> tuple[grammar.Requirement, ...]:
  """Every requirement of `category` on one side: training types only (split None or
  "in_distribution"), or with at least one held-out pair ("heldout")."""
  if category not in grammar.CATEGORIES:
    raise ValueError(f"unknown category {category!r}: use one of {grammar.CATEGORIES}")
  heldout = split is not None and _check_split(split)
  types = options.all_types if heldout else options.training_types
  return tuple(r for r in grammar.all_requirements(types, options.max_objects)
               if r.category == category and r.is_heldout(options) == heldout)


def _caption_and_scene(rng: np.random.Generator, options: ShapesOptions
                       ) -> tuple[str, Scene]:
  categories = [c for c in grammar.CATEGORIES if category_requirements(c, None, options)]
  reqs = category_requirements(categories[int(rng.integers(len(categories)))], None, options)
  req = reqs[int(rng.integers(len(reqs)))]
  return grammar.caption_text(req), scene_for(req, rng, options, None)


def generation_example(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS
                       ) -> tuple[str, Scene]:
  """(caption, scene) for caption -> image: a category uniformly, a caption of it
  uniformly, then a scene it captions."""
  return _caption_and_scene(shapes_scene.rng_for("train/generation", seed, index), options)


def caption_example(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS
                    ) -> tuple[Scene, str]:
  """(scene, its canonical caption) for image -> caption ("Describe this image.");
  scenes drawn as for generation, so every caption category is equally common."""
  _, scene = _caption_and_scene(shapes_scene.rng_for("train/caption", seed, index), options)
  return scene, grammar.caption(scene)


def answer_space(qtype: str, options: ShapesOptions = DEFAULT_OPTIONS,
                 heldout: bool = False) -> tuple[str, ...] | None:
  """The answers a question of `qtype` can have (held-out: about a held-out object), over
  which training and evaluation draw uniformly; None for "describe" (a caption)."""
  types = options.heldout_types if heldout else options.training_types
  spaces = {
      "count": [str(n) for n in range(1, options.max_objects + 1)],
      "count_color": [str(n) for n in range(int(heldout), options.max_objects + 1)],
      "color": sorted({c for c, _ in types}, key=shapes_scene.COLORS.index),
      "shape": sorted({s for _, s in types}, key=shapes_scene.SHAPES.index),
      "relation": ["yes", "no"],
      "describe": None,
  }
  if qtype not in spaces:
    raise ValueError(f"unknown question type {qtype!r}: use one of {grammar.QTYPES}")
  return None if spaces[qtype] is None else tuple(spaces[qtype])


def _question(rng: np.random.Generator, qtype: str, options: ShapesOptions,
              split: str | None, target: str | None) -> tuple[Scene, grammar.QA]:
  """A scene with a question of `qtype` (held-out: about a held-out object) answered
  `target` (None: any answer)."""
  heldout = split == "heldout"
  for _ in range(_MAX_DRAWS):
    scene = _scene(rng, _draw_kind(rng), options, split)
    qas = [q for q in grammar.questions(scene, options.colors, (qtype,))
           if target in (None, q.answer)]
    if heldout:
      qas = _about_heldout(qas, scene, options)
    if qas:
      return scene, qas[int(rng.integers(len(qas)))]
  raise ValueError(f"no {qtype!r} question answered {target!r} for {options}")


def available_qtypes(options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[str, ...]:
  """The question types the options can ask (relations need two objects)."""
  return tuple(q for q in grammar.QTYPES if q != "relation" or options.max_objects > 1)


def _about_heldout(qas, scene: Scene, options: ShapesOptions):
  """The questions about (at least) one held-out object of `scene`."""
  return [q for q in qas if any(options.is_heldout(scene.objects[i].kind) for i in q.objects)]


def vqa_example(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS,
                qtype: str | None = None) -> tuple[Scene, grammar.QA]:
  """(scene, question) for image -> answer: of `qtype`, or (None) of a type drawn
  uniformly from `available_qtypes`. The answer is drawn uniformly from `answer_space`
  first (as CLEVR balances answers), so that no answer ("0" to a colour count, "2" to a
  count) wins by frequency alone."""
  rng = shapes_scene.rng_for("train/vqa", seed, index)
  if qtype is None:
    qtypes = available_qtypes(options)
    qtype = qtypes[int(rng.integers(len(qtypes)))]
  space = answer_space(qtype, options)
  target = None if space is None else space[int(rng.integers(len(space)))]
  return _question(rng, qtype, options, None, target)


def vqa_types(options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[str, ...]:
  """The one-word question types VQA examples ask ("describe" is the caption task's)."""
  return tuple(q for q in available_qtypes(options) if q != "describe")


def more_questions(seed: int, index: int, scene: Scene, first: grammar.QA, n: int,
                   options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[grammar.QA, ...]:
  """Up to `n` further questions about `scene` (a VQA example's, whose question is
  `first`), drawn by (seed, index), none repeating `first` or each other: a type drawn
  uniformly among the `vqa_types` the scene can still be asked, then a question of it
  uniformly. They let one image carry several answers; unlike the first, their answers
  are not balanced."""
  rng = shapes_scene.rng_for("train/vqa_more", seed, index)
  qtypes = vqa_types(options)
  asked, out = {first.question}, []
  pool = {q: list(grammar.questions(scene, options.colors, (q,))) for q in qtypes}
  while len(out) < n:
    open_types = [q for q in qtypes if any(a.question not in asked for a in pool[q])]
    if not open_types:
      break
    candidates = [a for a in pool[open_types[int(rng.integers(len(open_types)))]]
                  if a.question not in asked]
    qa = candidates[int(rng.integers(len(candidates)))]
    asked.add(qa.question)
    out.append(qa)
  return tuple(out)


def _think_draw(rng: np.random.Generator, options: ShapesOptions, split: str | None
                ) -> ThinkDraw:
  """A context scene and a prompt about it whose answer is (held-out split) or is not
  (otherwise) a held-out pair, and a scene drawn to the answer."""
  heldout = split == "heldout"
  for _ in range(_MAX_DRAWS):
    context = _scene(rng, _draw_kind(rng), options, split)
    draws = [d for d in grammar.draw_prompts(context, options.max_objects)
             if d.requirement.is_heldout(options) == heldout
             and all(c in options.colors and s in options.shapes for c, s, _ in
                     d.requirement.objects)]
    if draws:
      d = draws[int(rng.integers(len(draws)))]
      return ThinkDraw(context, d.prompt, d.answer, scene_for(d.requirement, rng, options,
                                                               split))
  raise ValueError(f"no think-then-draw prompt for {options}")


def think_draw_example(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS
                       ) -> ThinkDraw:
  """Context scene -> `draw ...:` prompt -> answer caption (AR) -> drawn scene (DM)."""
  return _think_draw(shapes_scene.rng_for("train/think_draw", seed, index), options, None)


def text_example(seed: int, index: int, options: ShapesOptions = DEFAULT_OPTIONS) -> str:
  """Text only: a relation caption and its converse, e.g. "a red square left of a blue
  circle means a blue circle right of a red square" (training types only)."""
  rng = shapes_scene.rng_for("train/text", seed, index)
  reqs = category_requirements("position", None, options)
  if not reqs:
    raise ValueError(f"no relation captions (two types needed) for {options}")
  return _converse_text(reqs[int(rng.integers(len(reqs)))])


def _converse_text(req: grammar.Requirement) -> str:
  flipped = grammar.Requirement(req.objects[::-1], grammar.CONVERSE[req.relation])
  return f"{grammar.caption_text(req)} means {grammar.caption_text(flipped)}"


# ------------------------------------------------------------------------ evaluation


@functools.lru_cache(maxsize=64)
def prompt_set(category: str, split: str, n: int = DEFAULT_SET_SIZE,
               options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[str, ...]:
  """n prompts of `category` for generation scoring: the category's distinct prompts in
  a fixed shuffled order, repeated in that order when there are fewer than n (so each
  appears n // k or n // k + 1 times); () when the options allow none."""
  reqs = category_requirements(category, split, options)
  if not reqs:
    return ()
  order = shapes_scene.rng_for("eval/prompts", category, split).permutation(len(reqs))
  return tuple(grammar.caption_text(reqs[order[i % len(reqs)]]) for i in range(n))


@functools.lru_cache(maxsize=64)
def vqa_set(qtype: str, split: str, n: int = DEFAULT_SET_SIZE,
            options: ShapesOptions = DEFAULT_OPTIONS
            ) -> tuple[tuple[Scene, grammar.QA], ...]:
  """n fixed (scene, question) items of question type `qtype` (see grammar.QTYPES), item
  i answered answer_space(qtype)[i % k], so every answer is equally common (+-1)."""
  if qtype not in grammar.QTYPES:
    raise ValueError(f"unknown question type {qtype!r}: use one of {grammar.QTYPES}")
  _check_split(split)
  space = answer_space(qtype, options, split == "heldout")
  return tuple(_question(shapes_scene.rng_for("eval/vqa", qtype, split, i), qtype, options,
                         split, None if space is None else space[i % len(space)])
               for i in range(n))


def caption_set(split: str, n: int = DEFAULT_SET_SIZE,
                options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[Scene, ...]:
  """n fixed captionable scenes for image -> caption (the scenes of vqa_set("describe"));
  score with grammar.captions(scene)."""
  return tuple(scene for scene, _ in vqa_set("describe", split, n, options))


@functools.lru_cache(maxsize=16)
def think_draw_set(split: str, n: int = DEFAULT_SET_SIZE,
                   options: ShapesOptions = DEFAULT_OPTIONS) -> tuple[ThinkDraw, ...]:
  """n fixed think-then-draw items; held-out ones have a held-out answer (e.g. "draw a
  circle in the color of the square:" over a yellow square)."""
  _check_split(split)
  return tuple(_think_draw(shapes_scene.rng_for("eval/think_draw", split, i), options, split)
               for i in range(n))


# ---------------------------------------------------------------------------- tokens


def max_text_tokens(options: ShapesOptions = DEFAULT_OPTIONS,
                    tokenizer: tokenizer_lib.Tokenizer = _TOKENIZER) -> dict[str, int]:
  """Longest token count (no BOS/EOS; `tokenizer`'s ids, bytes by default) of each kind
  of text the grammar writes, over every colour, shape, number and relation of `options`
  (for choosing seq_len): caption, question, answer (a caption answers "Describe this
  image."), draw_prompt, draw_answer and text (`text_example`)."""
  reqs = grammar.all_requirements(options.all_types, options.max_objects)
  captions = [grammar.caption_text(r) for r in reqs]
  c, s = options.colors, options.shapes
  questions = [grammar.COUNT_QUESTION, grammar.DESCRIBE_QUESTION]
  questions += [f"How many {x} objects are there?" for x in c]
  questions += [f"What color is the {x}?" for x in s]
  questions += [f"What shape is the {x} object?" for x in c]
  questions += [f"Is the {a} {b} {rel} the {x} {y}?" for (a, b), (x, y) in
                itertools.permutations(options.all_types, 2) for rel in grammar.RELATIONS]
  answers = [*c, *s, "yes", "no", *map(str, range(options.max_objects + 1)), *captions]
  draws = [f"draw the shape that is {x}:" for x in c]
  draws += [f"draw {w} of the shape that is {x}:" for n, w in grammar.NUMBER_WORDS.items()
            if n <= options.max_objects for x in c]
  draws += [f"draw a {a} in the color of the {b}:" for a in s for b in s if a != b]
  texts = {"caption": captions, "question": questions, "answer": answers,
           "draw_prompt": draws, "draw_answer": [grammar.caption_text(r) for r in reqs
                                                  if len(r.objects) == 1],
           "text": [_converse_text(r) for r in reqs if r.relation] or [""]}
  return {k: max(len(tokenizer.encode(t)) for t in v) for k, v in texts.items()}
