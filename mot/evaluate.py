"""The evaluation protocol (DESIGN §6) on the 297 held-out digits, from one checkpoint.

  python -m mot.evaluate --workdir runs/digits              # newest checkpoint, EMA weights
  python -m mot.evaluate --workdir runs/digits --samples_per_digit 50 --cfg_scale 1.5

- reasoning accuracy: exact AR answers to "What digit is this?" on the held-out images;
- generation accuracy: `samples_per_digit` images for "a handwritten digit k", k = 0..9,
  classified by an independent RBF SVM trained on the 1,500 training images only (its own
  held-out accuracy is reported beside);
- Fréchet distance in 64-d pixel space (0..16 scale) between the generated samples and
  the held-out digits, beside the floor: a random training subset of the same size
  against the held-out digits.

Writes DIR/eval.json (one record per evaluated step, newest last) and
DIR/samples/grid_step_N.png (one row per digit). train.py runs the same evaluation
every `eval_every_steps` and at the end, on the in-memory EMA parameters.
"""
from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import numpy as np

from mot import eval_metrics
from mot.data import digits, tasks

EVAL_FILE = "eval.json"
SAMPLES_DIR = "samples"


@functools.lru_cache(maxsize=1)
def _judge():
  """(classifier, its held-out accuracy, train pixels, held-out pixels, held-out labels)."""
  train_x, train_y, held_x, held_y = digits.load_digits_split()
  train_px, held_px = digits.to_pixels(train_x), digits.to_pixels(held_x)
  clf = eval_metrics.fit_digit_classifier(train_px, train_y)
  return clf, eval_metrics.classifier_accuracy(clf, held_px, held_y), train_px, held_px, held_y


def reasoning_accuracy(pipe, held_px: np.ndarray, labels: np.ndarray) -> tuple[float, list]:
  """Exact-match accuracy of the AR answers; also the answers themselves."""
  answers = pipe.reason(tasks.QUESTION, images=held_px)
  correct = [a.strip() == tasks.answer(int(y)) for a, y in zip(answers, labels)]
  return float(np.mean(correct)), answers


def generate_digits(pipe, samples_per_digit: int, steps=None, cfg_scale=None, sampler=None,
                    seed: int = 0) -> np.ndarray:
  """float32 [10 * samples_per_digit, 8, 8] in [0, 1], digit-major (0s, then 1s, ...)."""
  prompts = [tasks.caption(k) for k in range(10)]
  return pipe.generate(prompts, num_samples=samples_per_digit, steps=steps,
                       cfg_scale=cfg_scale, sampler=sampler, seed=seed)


def evaluate_pipeline(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                      sampler=None, seed: int = 0) -> dict[str, Any]:
  """All three figures for one set of parameters and sampling settings."""
  if pipe.config.data.dataset != "digits":
    raise ValueError(f"mot.evaluate measures the digits protocol; this checkpoint was "
                     f"trained on config.data.dataset={pipe.config.data.dataset!r}")
  clf, clf_acc, train_px, held_px, held_y = _judge()
  start = time.perf_counter()
  reason_acc, _ = reasoning_accuracy(pipe, held_px, held_y)
  reason_s = time.perf_counter() - start
  start = time.perf_counter()
  images = generate_digits(pipe, samples_per_digit, steps, cfg_scale, sampler, seed)
  generate_s = time.perf_counter() - start
  gen_px = images * digits.MAX_PIXEL
  wanted = np.repeat(np.arange(10), samples_per_digit)
  gen_acc = eval_metrics.classifier_accuracy(clf, gen_px, wanted)
  fd = eval_metrics.frechet_distance(gen_px.reshape(len(gen_px), -1),
                                     held_px.reshape(len(held_px), -1))
  floor = eval_metrics.frechet_floor(train_px, held_px, n=len(gen_px), seed=seed)
  return {
      "step": pipe.step,
      "reasoning_accuracy": reason_acc,
      "generation_accuracy": gen_acc,
      "frechet": fd,
      "frechet_floor": floor,
      "frechet_ratio": fd / floor,
      "classifier_heldout_accuracy": clf_acc,
      "samples_per_digit": samples_per_digit,
      "sampling": {"steps": steps or pipe.default_steps,
                   "cfg_scale": pipe.default_cfg_scale if cfg_scale is None else cfg_scale,
                   "sampler": sampler or pipe.default_sampler, "seed": seed},
      "seconds": {"reasoning": reason_s, "generation": generate_s},
      "_images": images,
  }


def write_results(workdir: str, result: dict[str, Any]) -> dict[str, Any]:
  """Appends the record to DIR/eval.json and writes the sample grid; returns the record."""
  from mot.pipeline import grid, save_png  # pylint: disable=g-import-not-at-top
  images = result.pop("_images")
  os.makedirs(os.path.join(workdir, SAMPLES_DIR), exist_ok=True)
  grid_path = os.path.join(workdir, SAMPLES_DIR, f"grid_step_{result['step']}.png")
  per_digit = result["samples_per_digit"]
  shown = images.reshape(10, per_digit, *images.shape[1:])[:, :min(per_digit, 10)]
  grid_image = grid(shown.reshape(-1, *images.shape[1:]), rows=10)
  save_png(grid_path, grid_image)
  result["grid"] = grid_path
  path = os.path.join(workdir, EVAL_FILE)
  history = []
  if os.path.exists(path):
    try:
      with open(path) as f:
        history = json.load(f)["evaluations"]
    except (ValueError, KeyError, TypeError):
      history = []  # a damaged file is replaced, not trusted
  history = [h for h in history if h.get("step") != result["step"]] + [result]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"latest": result, "evaluations": history}, f, indent=1)
  os.replace(tmp, path)
  result["_grid_image"] = grid_image
  return result


def format_result(r: dict[str, Any]) -> str:
  return (f"step {r['step']}: reasoning accuracy {100 * r['reasoning_accuracy']:.1f}% | "
          f"generation accuracy {100 * r['generation_accuracy']:.1f}% (judge: SVC, "
          f"{100 * r['classifier_heldout_accuracy']:.1f}% on held-out) | Fréchet "
          f"{r['frechet']:.1f} vs floor {r['frechet_floor']:.1f} "
          f"({r['frechet_ratio']:.2f}x)")


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from mot import checkpoint as ckpt_lib, cli  # pylint: disable=g-import-not-at-top
  from mot.pipeline import InputError, Pipeline  # pylint: disable=g-import-not-at-top
  FLAGS = flags.FLAGS
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  if FLAGS.samples_per_digit < 1:
    cli.fail(f"--samples_per_digit={FLAGS.samples_per_digit} must be >= 1")
  try:
    pipe = Pipeline.from_workdir(FLAGS.workdir, use_ema=not FLAGS.no_ema, step=FLAGS.step)
    result = evaluate_pipeline(pipe, FLAGS.samples_per_digit, FLAGS.steps, FLAGS.cfg_scale,
                               FLAGS.sampler, FLAGS.seed)
  except (ckpt_lib.CheckpointError, InputError, ValueError) as e:
    cli.fail(cli.one_line(e))
  result = write_results(FLAGS.workdir, result)
  result.pop("_grid_image")
  print(format_result(result))
  print(json.dumps(result))


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("workdir", None, "Training workdir whose checkpoint is evaluated.")
  flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")
  flags.DEFINE_integer("samples_per_digit", 20, "Generated images per digit 0..9.")
  flags.DEFINE_integer("steps", None, "Denoising steps (default: config.sample.steps).")
  flags.DEFINE_float("cfg_scale", None, "Guidance scale (default: config.sample.cfg_scale).")
  flags.DEFINE_enum("sampler", None, ["euler", "heun"], "ODE sampler (default: config).")
  flags.DEFINE_integer("seed", 0, "Sampling seed.")
  flags.DEFINE_bool("no_ema", False, "Evaluate the raw parameters instead of the EMA.")
  flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
  from mot import cli as _cli  # pylint: disable=g-import-not-at-top
  _define_flags()
  _cli.run(main)
