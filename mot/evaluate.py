"""Evaluate one checkpoint by its data set's protocol (docs/design.md §6).

  python -m mot.evaluate --workdir runs/digits              # newest checkpoint, EMA weights
  python -m mot.evaluate --workdir runs/digits --samples_per_digit 50 --cfg_scale 1.5

Digits checkpoints get the digits protocol (`mot.eval_digits`: reasoning accuracy,
generation accuracy by an independent judge, Fréchet distance beside its floor);
moving-digits checkpoints the video protocol (`mot.eval_video`); Shapes checkpoints the
Shapes protocol (`mot.eval_shapes`: GenEval-style generation scores by a detector, VQA
per question type, captioning, think-then-draw, Fréchet distance beside its floor);
Shapes video checkpoints `mot.eval_shapes_video` (the Shapes detector on every frame:
caption -> clip, clip QA, world model against the simulator, inverse dynamics); runs
on your own images or clips the user-data protocol (`mot.eval_user`: caption exact match
and similarity on the held-out pairs, real and drawn samples side by side).

Writes DIR/eval.json (one record per evaluated step, newest last) and
DIR/samples/grid_step_N.png (one row per digit; Shapes: one row per split and category;
video: one row per clip, one column per frame, plus clips_step_N.gif and
world_model_step_N.gif: real held-out clips over the world model's predictions from their
first frames and actions). train.py runs the same evaluation every `eval_every_steps` and
at the end, on the in-memory EMA parameters.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from absl import flags

from mot import cli, media
from mot.errors import InputError
from mot.eval_digits import evaluate_digits
from mot.eval_shapes import evaluate_shapes, format_line
from mot.eval_shapes_video import evaluate_shapes_video
from mot.eval_shapes_video import format_line as format_video_line
from mot.eval_user import evaluate_user
from mot.eval_video import evaluate_video

SET_PROTOCOLS = ("shapes", "shapes_video")   # fixed evaluation sets: --set_size applies
EVAL_FILE = "eval.json"
SAMPLES_DIR = "samples"
PROTOCOLS = {"digits": evaluate_digits, "moving_digits": evaluate_video,
             "shapes": evaluate_shapes, "shapes_video": evaluate_shapes_video,
             "image_folder": evaluate_user, "array_record": evaluate_user,
             "video_folder": evaluate_user}


def evaluate_pipeline(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                      sampler=None, seed: int = 0, reason_shifts: int | None = None,
                      set_size: int | None = None) -> dict[str, Any]:
  """The record of the protocol of the pipeline's data set (see PROTOCOLS); set_size:
  Shapes' items per evaluation set (None: config.eval_set_size)."""
  dataset = pipe.config.data.dataset
  if dataset not in PROTOCOLS:
    raise InputError(f"mot.evaluate has no protocol for config.data.dataset={dataset!r} "
                     f"(it has: {sorted(PROTOCOLS)})")
  if dataset in ("moving_digits", *SET_PROTOCOLS):
    if reason_shifts:
      raise InputError(f"--reason_shifts applies to the digits; this is a {dataset} "
                       "checkpoint: drop it")
    if dataset in SET_PROTOCOLS:  # samples_per_digit: images (clips) per prompt
      return PROTOCOLS[dataset](pipe, samples_per_digit, steps, cfg_scale, sampler, seed,
                                set_size)
    return evaluate_video(pipe, samples_per_digit, steps, cfg_scale, sampler, seed)
  if PROTOCOLS[dataset] is evaluate_user:
    if reason_shifts:
      raise InputError("--reason_shifts applies to the digits protocol; user data is read "
                       "as it trained: drop it")
    return evaluate_user(pipe, samples_per_digit, steps, cfg_scale, sampler, seed)
  return evaluate_digits(pipe, samples_per_digit, steps, cfg_scale, sampler, seed,
                         reason_shifts)


def _save_grid_gif(path: str, clips: np.ndarray) -> None:
  """Clips [N, T, H, W] in [0, 1] as one GIF: frame f shows every clip's frame f, in 2 rows."""
  media.save_gif(path, np.stack([media.grid(clips[:, f], rows=2, scale=1)
                                 for f in range(clips.shape[1])]), scale=8)


def read_evaluations(workdir: str) -> list[dict[str, Any]]:
  """The records of DIR/eval.json, oldest first; [] when it is missing or damaged (a
  damaged file is replaced by the next write, not trusted)."""
  try:
    with open(os.path.join(workdir, EVAL_FILE)) as f:
      history = json.load(f)["evaluations"]
  except (OSError, ValueError, KeyError, TypeError):
    return []
  return [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []


def write_sample_files(workdir: str, result: dict[str, Any]) -> np.ndarray:
  """Writes the record's samples (grid PNG, and GIFs for clips) under DIR/samples, adds
  their paths to the record and returns the grid image."""
  images = result.pop("_images")
  step = result["step"]
  samples = os.path.join(workdir, SAMPLES_DIR)
  os.makedirs(samples, exist_ok=True)
  result["grid"] = os.path.join(samples, f"grid_step_{step}.png")
  world_model = result.pop("_world_model_clips", None)
  if world_model is not None:  # top row the real clips, bottom row the predicted ones
    result["world_model_gif"] = os.path.join(samples, f"world_model_step_{step}.gif")
    _save_grid_gif(result["world_model_gif"], np.concatenate(world_model))
  if result.get("shapes_video"):  # clips [N, T, S, S, 3]: one row per clip, T columns
    grid_image = media.grid(images.reshape(-1, *images.shape[2:]), rows=len(images))
    result["gif"] = os.path.join(samples, f"clips_step_{step}.gif")
    _save_grid_gif(result["gif"], images)
    media.save_png(result["grid"], grid_image)
    return grid_image
  if result.get("shapes"):  # one row per (split, category), its first images
    grid_image = media.grid(images, rows=result.pop("_grid_rows"))
    media.save_png(result["grid"], grid_image)
    return grid_image
  per_digit = result["samples_per_digit"]
  grid_image = result.pop("_grid", None)   # the user-data protocol draws its own grid
  if grid_image is not None:
    pass
  elif result.get("video"):  # clips [N, T, H, W]: one row per digit (its first clip), T columns
    first = images.reshape(10, per_digit, *images.shape[1:])[:, 0]
    grid_image = media.grid(first.reshape(-1, *images.shape[2:]), rows=10)
    result["gif"] = os.path.join(samples, f"clips_step_{step}.gif")
    _save_grid_gif(result["gif"], first)
  else:
    shown = images.reshape(10, per_digit, *images.shape[1:])[:, :min(per_digit, 10)]
    grid_image = media.grid(shown.reshape(-1, *images.shape[1:]), rows=10)
  media.save_png(result["grid"], grid_image)
  return grid_image


def write_results(workdir: str, result: dict[str, Any]) -> dict[str, Any]:
  """Appends the record to DIR/eval.json (replacing one of the same step) and writes its
  samples; returns the record, with the grid image under "_grid_image"."""
  grid_image = write_sample_files(workdir, result)
  path = os.path.join(workdir, EVAL_FILE)
  history = [h for h in read_evaluations(workdir) if h.get("step") != result["step"]]
  history.append(result)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"latest": result, "evaluations": history}, f, indent=1)
  os.replace(tmp, path)
  result["_grid_image"] = grid_image
  return result


def format_result(r: dict[str, Any]) -> str:
  """One line of the figures; a validation-split run says so up front."""
  on = "" if r.get("split", "held-out") == "held-out" else " (validation split)"
  if r.get("shapes"):
    return format_line(r)
  if r.get("shapes_video"):
    return format_video_line(r)
  if r.get("protocol") == "user":
    return (f"step {r['step']}: caption exact match {100 * r['caption_exact_match']:.1f}% "
            f"(similarity {r['caption_similarity']:.2f}) on {r['heldout_pairs']} held-out "
            f"{'clips' if r['video'] else 'images'}")
  if r.get("video"):
    return (f"step {r['step']}{on}: video QA {100 * r['qa_accuracy']:.1f}% | identity "
            f"{100 * r['identity_accuracy']:.1f}% (real clips "
            f"{100 * r['real_clip_identity_accuracy']:.1f}%) | motion error "
            f"{r['motion_error_px']:.2f} px | world model {r['world_model_com_error_px']:.2f}"
            f" px, identity {100 * r['world_model_identity_accuracy']:.1f}% | inverse "
            f"dynamics {r['inverse_dynamics_mae_px']:.2f} px")
  where = "held-out" if r.get("split", "held-out") == "held-out" else "validation"
  single = r.get("reasoning_accuracy_single_view", r["reasoning_accuracy"])
  shifts = r.get("sampling", {}).get("reason_shifts", 0)
  view = f" ({shifts}-px shifts; single view {100 * single:.1f}%)" if shifts else ""
  return (f"step {r['step']}{on}: reasoning accuracy {100 * r['reasoning_accuracy']:.1f}%{view} | "
          f"generation accuracy {100 * r['generation_accuracy']:.1f}% (judge: SVC, "
          f"{100 * r['classifier_heldout_accuracy']:.1f}% on {where}) | Fréchet "
          f"{r['frechet']:.1f} vs floor {r['frechet_floor']:.1f} "
          f"({r['frechet_ratio']:.2f}x)")


def main(argv):
  from mot.pipeline import Pipeline  # here: --help and flag errors skip JAX's import
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  for name in ("samples_per_digit", "set_size"):
    if FLAGS[name].value is not None and FLAGS[name].value < 1:
      cli.fail(f"--{name}={FLAGS[name].value} must be >= 1")
  cli.configure_logging()
  with cli.clean_errors():
    pipe = Pipeline.from_workdir(FLAGS.workdir, use_ema=not FLAGS.no_ema, step=FLAGS.step)
    if FLAGS.set_size is not None and pipe.dataset not in SET_PROTOCOLS:
      raise InputError("--set_size sizes the Shapes sets; this checkpoint was trained on "
                       f"{pipe.config.data.dataset!r}: drop it")
    result = evaluate_pipeline(pipe, samples_per(pipe, FLAGS.samples_per_digit), FLAGS.steps,
                               FLAGS.cfg_scale, FLAGS.sampler, FLAGS.seed,
                               FLAGS.reason_shifts, FLAGS.set_size)
  result = write_results(FLAGS.workdir, result)
  result.pop("_grid_image")
  print(format_result(result))
  print(json.dumps(result))


def samples_per(pipe, flag: int | None) -> int:
  """--samples_per_digit, or its default: 20 per digit; for Shapes (video), the run's
  config.eval_samples_per_digit images (clips) per prompt (1 where 0 only turned the in-training
  protocol off)."""
  if flag is not None:
    return flag
  if pipe.dataset in SET_PROTOCOLS:
    return max(1, int(pipe.config.eval_samples_per_digit))
  return 20


FLAGS = flags.FLAGS


def define_flags():
  """The command's flags (defined only when run as a program, not on import)."""
  flags.DEFINE_string("workdir", None, "Training workdir whose checkpoint is evaluated.")
  flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")
  flags.DEFINE_integer("samples_per_digit", None, "Generated images per digit 0..9 (default "
                       "20); Shapes: per evaluation prompt (default: the run's "
                       "config.eval_samples_per_digit).")
  flags.DEFINE_integer("set_size", None, "Shapes: items per evaluation set (default: the "
                       "run's config.eval_set_size).")
  flags.DEFINE_integer("steps", None, "Denoising steps (default: config.sample.steps).")
  flags.DEFINE_float("cfg_scale", None, "Guidance scale (default: config.sample.cfg_scale).")
  flags.DEFINE_enum("sampler", None, ["euler", "heun"], "ODE sampler (default: config).")
  flags.DEFINE_integer("seed", 0, "Sampling seed.")
  flags.DEFINE_integer("reason_shifts", None, "Test-time shifts (pixels, 0-2) for reading "
                       "the held-out digits (default: config.sample.reason_shifts).")
  flags.DEFINE_bool("no_ema", False, "Evaluate the raw parameters instead of the EMA.")
  flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
  cli.tune_malloc()
  define_flags()
  cli.run(main)
