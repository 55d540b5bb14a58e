"""The Shapes protocol (issue #39; docs/shapes.md) for a checkpoint of config.data.dataset
"shapes". Every set is fixed (`mot.data.shapes`), every judge is numpy / scikit-learn:

- generation (GenEval-style): `images_per_prompt` images for each of `eval_set_size`
  prompts per category (single_object, two_object, counting, color_attr, position), scored
  by the detector (`mot.shapes_metrics.geneval_scores`); "overall" is the mean over the
  categories; in-distribution prompts and prompts with a held-out pair apart;
- VQA: `eval_set_size` questions per type (count, count_color, color, shape, relation,
  describe) and split, answered greedily through `Pipeline.reason`, exact match
  (`vqa_scores`; "overall" the mean over the six types, "overall_short" over the five
  types with one-word answers);
- captioning: the "describe" answers as captions (`caption_scores`: any caption the
  grammar allows, and the canonical one);
- think-then-draw: `eval_set_size` items per split (context image, prompt): the answer
  (exact), the image drawn after it (detector, against the true answer) and both;
- Fréchet distance of the generated images in the features of a small classifier of
  the generator's labels, beside its real-vs-real floor (`mot.shapes_features`).

The record is flat where train.py logs scalars (`geneval_overall`, `vqa_overall`, ...) and
nested for the rest; `_images` and `_grid_rows` give evaluate.py the sample grid: one row
per (split, category), its first images.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from mot import shapes_features
from mot import shapes_metrics
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data import shapes_tasks
from mot.eval_digits import sampling_record

SPLITS = shapes.SPLITS
GRID_COLUMNS = 8           # images of each (split, category) row in the sample grid
SHORT_ANSWER_TOKENS = 10   # decode budget of the one-word answers (+ end token)


def to_uint8(images01: np.ndarray) -> np.ndarray:
  """float [..., H, W, 3] in [0, 1] (Pipeline.generate) -> uint8, as a PNG stores it."""
  return np.clip(np.round(np.asarray(images01) * 255.0), 0, 255).astype(np.uint8)


def generation_prompts(n: int, options) -> dict[str, dict[str, tuple[str, ...]]]:
  """{split: {category: n prompts}} (categories the options allow)."""
  return {split: {c: shapes.prompt_set(c, split, n, options) for c in grammar.CATEGORIES
                  if shapes.prompt_set(c, split, n, options)} for split in SPLITS}


def generation(pipe, n: int, per_prompt: int, steps, cfg_scale, sampler, seed, options
               ) -> tuple[dict[str, Any], list[str], np.ndarray]:
  """(GenEval-style scores, the prompt of each image, uint8 images [N, S, S, 3])."""
  sets = generation_prompts(n, options)
  prompts = [p for split in SPLITS for ps in sets[split].values() for p in ps]
  images = to_uint8(pipe.generate(prompts, num_samples=per_prompt, steps=steps,
                                  cfg_scale=cfg_scale, sampler=sampler, seed=seed))
  each = [p for p in prompts for _ in range(per_prompt)]
  return shapes_metrics.geneval_scores(each, images, options), each, images


def vqa(pipe, n: int, options) -> dict[str, Any]:
  """{"vqa": {split: vqa_scores}, "captioning": {split: caption_scores}}."""
  out = {"vqa": {}, "captioning": {}}
  qtypes = [q for q in grammar.QTYPES if q in shapes.available_qtypes(options)]
  for split in SPLITS:
    items = {q: shapes.vqa_set(q, split, n, options) for q in qtypes}
    answers = {}
    for q, pairs in items.items():
      # None: the run's default, which holds a whole caption or relation trace.
      long = q == "describe" or (q == "relation" and pipe.config.data.relation_trace)
      budget = None if long else SHORT_ANSWER_TOKENS
      answers[q] = pipe.reason([qa.question for _, qa in pairs], max_new_tokens=budget,
                               images=[shapes_scene.render(s) for s, _ in pairs])
    scores = shapes_metrics.vqa_scores(
        (qa.question, a, qa.accepted) for q in qtypes for (_, qa), a in
        zip(items[q], answers[q]))
    short = [scores[q] for q in qtypes if q != "describe" and scores[q] is not None]
    scores["overall_short"] = float(np.mean(short)) if short else None
    out["vqa"][split] = scores
    if "describe" in items:
      out["captioning"][split] = shapes_metrics.caption_scores(
          (a, s) for (s, _), a in zip(items["describe"], answers["describe"]))
  return out


def think_then_draw(pipe, n: int, steps, cfg_scale, sampler, seed, options
                    ) -> dict[str, Any]:
  """{split: think_draw_scores} of the fixed think-then-draw sets."""
  out = {}
  for split in SPLITS:
    items = shapes.think_draw_set(split, n, options)
    answers, images = pipe.think_then_draw(
        [t.prompt for t in items], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
        seed=seed, images=[shapes_scene.render(t.context) for t in items])
    out[split] = shapes_metrics.think_draw_scores(
        (a, image, t.answer) for a, image, t in zip(answers, to_uint8(images), items))
  return out


def grid_rows(prompts: list[str], images: np.ndarray, options) -> tuple[np.ndarray, list]:
  """(float [rows * GRID_COLUMNS, S, S, 3] in [0, 1], row labels): the first images of
  each (split, category), black where a row has fewer."""
  rows, labels = [], []
  for split in SPLITS:
    for category in grammar.CATEGORIES:
      picked = [i for i, p in enumerate(prompts)
                if (req := grammar.parse_caption(p)) is not None and req.category == category
                and req.is_heldout(options) == (split == "heldout")][:GRID_COLUMNS]
      if not picked:
        continue
      row = np.zeros((GRID_COLUMNS, *images.shape[1:]), np.float32)
      row[:len(picked)] = images[picked] / 255.0
      rows.append(row)
      labels.append({"split": split, "category": category,
                     "prompts": [prompts[i] for i in picked]})
  return np.concatenate(rows), labels


def headline(result: dict[str, Any]) -> dict[str, float | None]:
  """The flat scalars train.py logs (and format_result prints)."""
  gen, vqa_ = result["geneval"], result["vqa"]
  return {
      "geneval_overall": gen["in_distribution"]["overall"],
      "geneval_heldout_overall": gen["heldout"]["overall"],
      "vqa_overall": vqa_["in_distribution"]["overall"],
      "vqa_heldout_overall": vqa_["heldout"]["overall"],
      "caption_match": result["captioning"].get("in_distribution", {}).get("match"),
      "think_draw_both": result["think_then_draw"]["in_distribution"]["both"],
  }


def evaluate_shapes(pipe, samples_per_prompt: int = 1, steps=None, cfg_scale=None,
                    sampler=None, seed: int = 0, set_size: int | None = None
                    ) -> dict[str, Any]:
  """The Shapes protocol (module docstring) of one set of parameters and sampling
  settings; `set_size` items per set (None: config.eval_set_size)."""
  options = shapes_tasks.scene_options(pipe.config.data)
  n = int(pipe.config.eval_set_size if set_size is None else set_size)
  seconds, start = {}, time.perf_counter()
  geneval, prompts, images = generation(pipe, n, samples_per_prompt, steps, cfg_scale,
                                        sampler, seed, options)
  seconds["generation"], start = time.perf_counter() - start, time.perf_counter()
  answers = vqa(pipe, n, options)
  seconds["vqa"], start = time.perf_counter() - start, time.perf_counter()
  draws = think_then_draw(pipe, n, steps, cfg_scale, sampler, seed, options)
  seconds["think_then_draw"], start = time.perf_counter() - start, time.perf_counter()
  scorable = [i for i, p in enumerate(prompts) if grammar.parse_caption(p) is not None]
  frechet = shapes_features.frechet(images[scorable], [prompts[i] for i in scorable],
                                    options)
  seconds["frechet"] = time.perf_counter() - start
  grid, labels = grid_rows(prompts, images, options)
  result = {"step": pipe.step, "split": "held-out", "shapes": True,
            "geneval": geneval, **answers, "think_then_draw": draws, **frechet,
            "eval_set_size": n, "samples_per_prompt": samples_per_prompt,
            "sampling": sampling_record(pipe, steps, cfg_scale, sampler, seed),
            "seconds": seconds, "grid_rows": labels,
            "_images": grid, "_grid_rows": len(labels)}
  result.update(headline(result))
  return result


def format_line(r: dict[str, Any]) -> str:
  """One line of the headline figures (mot.evaluate.format_result)."""
  def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"
  return (f"step {r['step']}: GenEval overall {pct(r['geneval_overall'])} (held-out pairs "
          f"{pct(r['geneval_heldout_overall'])}) | VQA {pct(r['vqa_overall'])} (held-out "
          f"{pct(r['vqa_heldout_overall'])}) | captions {pct(r['caption_match'])} | "
          f"think-then-draw {pct(r['think_draw_both'])} | Fréchet {r['frechet']:.2f} vs "
          f"floor {r['frechet_floor']:.2f} ({r['frechet_ratio']:.2f}x)")
