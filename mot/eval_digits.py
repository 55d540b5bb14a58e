"""The digits protocol (docs/design.md §6) on the 297 held-out digits.

- reasoning accuracy: exact AR answers to "What digit is this?" on the held-out images,
  read as config.sample.reason_shifts says (1: one answer from the nine 1-pixel shifts of
  the image, the training augmentation, see `Pipeline.reason`), and beside it the
  accuracy of reading each image once, as given (`reasoning_accuracy_single_view`);
- generation accuracy: `samples_per_digit` images for "a handwritten digit k", k = 0..9,
  classified by an independent RBF SVM trained on the 1,500 training images only (its own
  held-out accuracy is reported beside);
- Fréchet distance in 64-d pixel space (0..16 scale) between the generated samples and
  the held-out digits, beside the floor: a random training subset of the same size
  against the held-out digits.

A run with config.data.validation_size = N > 0 (for choosing settings) trained without the
last N training digits and is measured on them instead, judge and floor included; its
records say so ("split") and the 297 held-out digits are not read at all.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from mot import eval_metrics
from mot.data import digits, tasks


@functools.lru_cache(maxsize=2)
def judge(validation: int = 0):
  """(classifier, its held-out accuracy, train pixels, held-out pixels, held-out labels).

  validation > 0: the split `digits.load_digits_split(validation)` gives, so a tuning run
  is scored (and its judge trained) without the 297 held-out digits.
  """
  train_x, train_y, held_x, held_y = digits.load_digits_split(validation)
  train_px, held_px = digits.to_pixels(train_x), digits.to_pixels(held_x)
  clf = eval_metrics.fit_digit_classifier(train_px, train_y)
  return clf, eval_metrics.classifier_accuracy(clf, held_px, held_y), train_px, held_px, held_y


def split_name(validation: int) -> str:
  """What the figures were measured on, for eval.json and the printed line."""
  return (f"validation (last {validation} training digits, not trained on)" if validation
          else "held-out")


def sampling_record(pipe, steps, cfg_scale, sampler, seed) -> dict[str, Any]:
  """The sampling settings an evaluation used, config defaults resolved."""
  return {"steps": steps or pipe.default_steps,
          "cfg_scale": pipe.default_cfg_scale if cfg_scale is None else cfg_scale,
          "sampler": sampler or pipe.default_sampler, "seed": seed}


def reasoning_accuracy(pipe, held_px: np.ndarray, labels: np.ndarray,
                       shifts: int | None = None) -> tuple[float, list]:
  """Exact-match accuracy of the AR answers; also the answers themselves. `shifts`:
  test-time shifts (`Pipeline.reason`; None: config.sample.reason_shifts)."""
  answers = pipe.reason(tasks.QUESTION, images=held_px, shifts=shifts)
  return (len(labels) - len(misreadings(answers, labels))) / len(labels), answers


def misreadings(answers: list[str], labels: np.ndarray) -> list[dict[str, Any]]:
  """[{index, label, answer}] of the held-out digits read wrongly: which digits a
  checkpoint misses, to set beside other checkpoints' and the pixel judge's misses."""
  return [{"index": i, "label": int(y), "answer": a.strip()}
          for i, (a, y) in enumerate(zip(answers, labels)) if a.strip() != tasks.answer(int(y))]


def generate_digits(pipe, samples_per_digit: int, steps=None, cfg_scale=None, sampler=None,
                    seed: int = 0) -> np.ndarray:
  """float32 [10 * samples_per_digit, 8, 8] in [0, 1], digit-major (0s, then 1s, ...)."""
  prompts = [tasks.caption(k) for k in range(10)]
  return pipe.generate(prompts, num_samples=samples_per_digit, steps=steps,
                       cfg_scale=cfg_scale, sampler=sampler, seed=seed)



def evaluate_digits(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                    sampler=None, seed: int = 0, reason_shifts: int | None = None
                    ) -> dict[str, Any]:
  """All three figures for one set of parameters and sampling settings."""
  validation = digits.validation_size(pipe.config.data)
  clf, clf_acc, train_px, held_px, held_y = judge(validation)
  start = time.perf_counter()
  shifts = pipe.default_reason_shifts if reason_shifts is None else reason_shifts
  reason_acc, answers = reasoning_accuracy(pipe, held_px, held_y, shifts)
  single_acc = (reasoning_accuracy(pipe, held_px, held_y, 0)[0] if shifts else reason_acc)
  reason_s = time.perf_counter() - start
  start = time.perf_counter()
  images = generate_digits(pipe, samples_per_digit, steps, cfg_scale, sampler, seed)
  generate_s = time.perf_counter() - start
  gen_px = images * digits.MAX_PIXEL
  wanted = np.repeat(np.arange(10), samples_per_digit)
  fd = eval_metrics.frechet_distance(gen_px.reshape(len(gen_px), -1),
                                     held_px.reshape(len(held_px), -1))
  floor = eval_metrics.frechet_floor(train_px, held_px, n=len(gen_px), seed=seed)
  return {
      "step": pipe.step,
      "split": split_name(validation),
      "reasoning_accuracy": reason_acc,
      "reasoning_accuracy_single_view": single_acc,
      "generation_accuracy": eval_metrics.classifier_accuracy(clf, gen_px, wanted),
      "frechet": fd,
      "frechet_floor": floor,
      "frechet_ratio": fd / floor,
      "classifier_heldout_accuracy": clf_acc,
      "reasoning_misread": misreadings(answers, held_y),
      "classifier_misread": [int(i) for i in np.flatnonzero(
          clf.predict(held_px.reshape(len(held_px), -1)) != held_y)],
      "samples_per_digit": samples_per_digit,
      "sampling": dict(sampling_record(pipe, steps, cfg_scale, sampler, seed),
                       reason_shifts=shifts),
      "seconds": {"reasoning": reason_s, "generation": generate_s},
      "_images": images,
  }
