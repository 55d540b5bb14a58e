"""Shapes scorers (issue #39): GenEval-style generation scores, VQA, captioning.

Generation: a prompt is parsed by the caption grammar into its requirements
(`shapes_grammar.parse_caption`); a prompt outside the grammar is "unscorable": the caller
still generates for it, and it is counted, never scored. A generated image is correct
when the prompt is a correct caption of the detected scene (`shapes_grammar.satisfies`):
exactly the objects it names with their colours, shapes and counts, nothing else (no
extra or "unknown" object; specks under the detector's min_area do not count), and its
relation with >= 3 px to spare. Per split (in-distribution, held-out pairs: a prompt is
held-out when it names a held-out pair), each category's accuracy is the fraction of its
images that are correct, and "overall" is, as in GenEval, the mean over the categories
present of their accuracies.

VQA: an answer is correct when, stripped of surrounding whitespace, it equals one of the
accepted answers (`QA.accepted`; a `Describe this image.` answer may be any caption the
grammar allows for the scene). Accuracy per question type, and "overall" the mean over
the types present.

Captioning (image -> caption): "match" counts a caption correct when it is one of the
captions the grammar allows for the scene (several fit a two-object scene); "canonical"
counts only the canonical one (`shapes_grammar.caption`), the training target.
"""
from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence

import numpy as np

from mot import shapes_detector
from mot.data import shapes_grammar as grammar
from mot.data.shapes_scene import DEFAULT_OPTIONS
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import ShapesOptions

SPLITS = ("in_distribution", "heldout")


def _mean(values: Iterable[float]) -> float | None:
  values = list(values)
  return float(np.mean(values)) if values else None


def score_scene(prompt: str, scene: Scene) -> bool | None:
  """Whether `scene` fulfils `prompt`; None when the prompt is outside the grammar."""
  req = grammar.parse_caption(prompt)
  return None if req is None else grammar.satisfies(scene, req)


def score_image(prompt: str, image: np.ndarray, **detect_kwargs) -> bool | None:
  """Whether the generated `image` (uint8 RGB [H, W, 3]) fulfils `prompt`, by the
  detector; None when the prompt is unscorable."""
  req = grammar.parse_caption(prompt)
  if req is None:
    return None
  return grammar.satisfies(shapes_detector.detect(image, **detect_kwargs), req)


def geneval_scores_from_scenes(prompts: Sequence[str], scenes: Sequence[Scene],
                               options: ShapesOptions = DEFAULT_OPTIONS) -> dict:
  """GenEval-style scores of (prompt, detected scene) pairs, one pair per image:
  {"in_distribution": {category: accuracy | None, "overall": ..., "num_images":
  {category: n}}, "heldout": {...}, "unscorable": number of unscorable prompts}."""
  if len(prompts) != len(scenes):
    raise ValueError(f"{len(prompts)} prompts but {len(scenes)} images: give one prompt "
                     "per image")
  hits = {split: {c: [] for c in grammar.CATEGORIES} for split in SPLITS}
  unscorable = 0
  for prompt, scene in zip(prompts, scenes, strict=True):
    req = grammar.parse_caption(prompt)
    if req is None:
      unscorable += 1
      continue
    split = "heldout" if req.is_heldout(options) else "in_distribution"
    hits[split][req.category].append(float(grammar.satisfies(scene, req)))
  out = {"unscorable": unscorable}
  for split, per_category in hits.items():
    accuracy = {c: _mean(v) for c, v in per_category.items()}
    out[split] = {**accuracy,
                  "overall": _mean(a for a in accuracy.values() if a is not None),
                  "num_images": {c: len(v) for c, v in per_category.items()}}
  return out


def geneval_scores(prompts: Sequence[str], images: Sequence[np.ndarray],
                   options: ShapesOptions = DEFAULT_OPTIONS, **detect_kwargs) -> dict:
  """`geneval_scores_from_scenes` of generated uint8 images, detected first."""
  scenes = [shapes_detector.detect(image, **detect_kwargs) for image in images]
  return geneval_scores_from_scenes(prompts, scenes, options)


def _accepted(truth: str | Sequence[str]) -> tuple[str, ...]:
  return (truth,) if isinstance(truth, str) else tuple(truth)


def vqa_scores(items: Iterable[tuple[str, str, str | Sequence[str]]]) -> dict:
  """Accuracy per question type of (question, answer, truth) items, truth one string or
  the accepted strings (QA.accepted): {qtype: accuracy | None, "overall": mean over
  the types present, "num_questions": {qtype: n}, "unscorable": questions of no type}."""
  hits = {q: [] for q in grammar.QTYPES}
  unscorable = 0
  for question, answer, truth in items:
    qtype = grammar.question_type(question)
    if qtype is None:
      unscorable += 1
      continue
    hits[qtype].append(float(answer.strip() in _accepted(truth)))
  accuracy = {q: _mean(v) for q, v in hits.items()}
  return {**accuracy, "overall": _mean(a for a in accuracy.values() if a is not None),
          "num_questions": {q: len(v) for q, v in hits.items()}, "unscorable": unscorable}


def caption_scores(items: Iterable[tuple[str, Scene]]) -> dict:
  """{"match": fraction of (caption, scene) items whose caption is one the grammar
  allows for the scene, "canonical": fraction equal to the canonical caption, "num"}."""
  match, canonical = [], []
  for text, scene in items:
    allowed = grammar.captions(scene)
    match.append(float(text.strip() in allowed))
    canonical.append(float(bool(allowed) and text.strip() == allowed[0]))
  return {"match": _mean(match), "canonical": _mean(canonical), "num": len(match)}


def think_draw_scores(items: Iterable[tuple[str, np.ndarray, str]], **detect_kwargs
                      ) -> dict:
  """Think-then-draw scores of (generated answer, generated image, true answer) items:
  {"answer": exact answers, "image": images fulfilling the TRUE answer, "both", "num"}."""
  answers, images, both = [], [], []
  for generated, image, truth in items:
    a = float(generated.strip() == truth)
    i = float(bool(score_image(truth, image, **detect_kwargs)))
    answers.append(a)
    images.append(i)
    both.append(a * i)
  return {"answer": _mean(answers), "image": _mean(images), "both": _mean(both),
          "num": len(answers)}
