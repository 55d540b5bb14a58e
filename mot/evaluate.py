"""The evaluation protocol (DESIGN §6) on the 297 held-out digits, from one checkpoint.

  python -m mot.evaluate --workdir runs/digits              # newest checkpoint, EMA weights
  python -m mot.evaluate --workdir runs/digits --samples_per_digit 50 --cfg_scale 1.5

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

Video checkpoints (configs/moving_digits.py) get the video protocol instead
(`evaluate_video`), every judge the same independent SVC applied to the 8x8 crop around
the digit (`crop_digits`):
- video QA accuracy: "Which digit moves, and where?" on one held-out clip per held-out
  digit (directions cycling right/left/up/down), exact match ("3, right"), and its digit
  and direction halves;
- identity accuracy of generated clips: `samples_per_digit` clips for "a handwritten
  digit k moving d" (d cycling), each clip's identity the majority vote of its frames;
- motion error: the digit's measured displacement (centre of mass, frame t minus frame 0)
  against the requested one (1 px a frame in d), in pixels, mean over frames;
- world model: from a held-out first frame and its clip's actions, the predicted frames'
  centre-of-mass error against the true frames (pixels) and their identity accuracy;
- inverse dynamics: mean absolute error (pixels) of the actions drawn from held-out clips;
- the judges on real held-out clips (identity accuracy; motion error is 0 by design).

A run with config.data.validation_size = N > 0 (for choosing settings) trained without the
last N training digits and is measured on them instead, judge and floor included; its
records say so ("split") and the 297 held-out digits are not read at all.

Writes DIR/eval.json (one record per evaluated step, newest last) and
DIR/samples/grid_step_N.png (one row per digit; video: one row per clip, one column per
frame, plus clips_step_N.gif and world_model_step_N.gif: real held-out clips over the
world model's predictions from their first frames and actions). train.py runs the same evaluation
every `eval_every_steps` and at the end, on the in-memory EMA parameters.
"""
from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a re-exec would pay them twice
  from mot import cli as _cli  # pylint: disable=g-import-not-at-top
  _cli.maybe_reexec_with_tcmalloc()  # as train.py

import functools  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import os
import time
from typing import Any

import numpy as np

from mot import eval_metrics
from mot.data import digits, moving_digits, tasks

EVAL_FILE = "eval.json"
SAMPLES_DIR = "samples"


@functools.lru_cache(maxsize=2)
def _judge(validation: int = 0):
  """(classifier, its held-out accuracy, train pixels, held-out pixels, held-out labels).

  validation > 0: the split `digits.load_digits_split(validation)` gives, so a tuning run
  is scored (and its judge trained) without the 297 held-out digits.
  """
  train_x, train_y, held_x, held_y = digits.load_digits_split(validation)
  train_px, held_px = digits.to_pixels(train_x), digits.to_pixels(held_x)
  clf = eval_metrics.fit_digit_classifier(train_px, train_y)
  return clf, eval_metrics.classifier_accuracy(clf, held_px, held_y), train_px, held_px, held_y


def _split_name(validation: int) -> str:
  """What the figures were measured on, for eval.json and the printed line."""
  return (f"validation (last {validation} training digits, not trained on)" if validation
          else "held-out")


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


def evaluate_pipeline(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                      sampler=None, seed: int = 0, reason_shifts: int | None = None
                      ) -> dict[str, Any]:
  """All three figures for one set of parameters and sampling settings."""
  if getattr(pipe, "is_video", False):
    return evaluate_video(pipe, samples_per_digit, steps, cfg_scale, sampler, seed)
  if pipe.config.data.dataset != "digits":
    raise ValueError(f"mot.evaluate measures the digits protocol; this checkpoint was "
                     f"trained on config.data.dataset={pipe.config.data.dataset!r}")
  validation = digits.validation_size(pipe.config.data)
  clf, clf_acc, train_px, held_px, held_y = _judge(validation)
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
  gen_acc = eval_metrics.classifier_accuracy(clf, gen_px, wanted)
  fd = eval_metrics.frechet_distance(gen_px.reshape(len(gen_px), -1),
                                     held_px.reshape(len(held_px), -1))
  floor = eval_metrics.frechet_floor(train_px, held_px, n=len(gen_px), seed=seed)
  return {
      "step": pipe.step,
      "split": _split_name(validation),
      "reasoning_accuracy": reason_acc,
      "reasoning_accuracy_single_view": single_acc,
      "generation_accuracy": gen_acc,
      "frechet": fd,
      "frechet_floor": floor,
      "frechet_ratio": fd / floor,
      "classifier_heldout_accuracy": clf_acc,
      "reasoning_misread": misreadings(answers, held_y),
      "classifier_misread": [int(i) for i in np.flatnonzero(
          clf.predict(held_px.reshape(len(held_px), -1)) != held_y)],
      "samples_per_digit": samples_per_digit,
      "sampling": {"steps": steps or pipe.default_steps,
                   "cfg_scale": pipe.default_cfg_scale if cfg_scale is None else cfg_scale,
                   "sampler": sampler or pipe.default_sampler, "seed": seed,
                   "reason_shifts": shifts},
      "seconds": {"reasoning": reason_s, "generation": generate_s},
      "_images": images,
  }


# ----------------------------------------------------------------------------------------
# Video protocol.
# ----------------------------------------------------------------------------------------
def centre_of_mass(frames_px: np.ndarray) -> np.ndarray:
  """float [..., 2] (row, col) ink centre of mass of frames [..., H, W] in [0, 16]; the
  frame's centre where a frame has no ink."""
  x = np.asarray(frames_px, np.float64)
  h, w = x.shape[-2:]
  mass = x.sum(axis=(-1, -2))
  rows = (x.sum(axis=-1) * np.arange(h)).sum(axis=-1)
  cols = (x.sum(axis=-2) * np.arange(w)).sum(axis=-1)
  safe = np.where(mass > 0, mass, 1.0)
  com = np.stack([rows / safe, cols / safe], -1)
  return np.where((mass > 0)[..., None], com, [(h - 1) / 2, (w - 1) / 2])


@functools.lru_cache(maxsize=1)
def _digit_com() -> tuple[float, float]:
  """Mean ink centre of mass of the training digits inside their 8x8 box."""
  train_x = digits.load_digits_split()[0]
  return tuple(float(v) for v in centre_of_mass(digits.to_pixels(train_x)).mean(axis=0))


def crop_digits(frames_px: np.ndarray, size: int = moving_digits.DIGIT) -> np.ndarray:
  """[..., size, size] crops of frames [..., H, W] around the digit.

  The crop is the size x size window holding the most ink; among windows that tie (a
  digit with a blank edge column fits in two), the one nearest to where the ink's centre
  of mass puts a training digit's box. On real held-out clips the judge then scores
  about as on the bare digits (94% vs 95%; a crop from the centre of mass alone: 80%).
  """
  frames = np.asarray(frames_px, np.float64)
  h, w = frames.shape[-2:]
  flat = frames.reshape(-1, h, w)
  estimates = centre_of_mass(flat) - np.asarray(_digit_com())
  crops = []
  for f, est in zip(flat, estimates):
    c = np.cumsum(np.cumsum(np.pad(f, ((1, 0), (1, 0))), 0), 1)
    ink = c[size:, size:] - c[:-size, size:] - c[size:, :-size] + c[:-size, :-size]
    cand = np.argwhere(ink >= ink.max() - 1e-3 * max(ink.max(), 1.0))
    r, col = cand[np.argmin(np.linalg.norm(cand - est, axis=1))]
    crops.append(f[r:r + size, col:col + size])
  return np.stack(crops).astype(np.float32).reshape(*frames.shape[:-2], size, size)


def clip_identity(clf, clips_px: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(int [N] majority-vote digit of each clip [N, T, H, W], int [N, T] per frame)."""
  n, t = clips_px.shape[:2]
  per_frame = clf.predict(crop_digits(clips_px).reshape(n * t, -1)).reshape(n, t)
  votes = np.array([np.bincount(row, minlength=10).argmax() for row in per_frame])
  return votes, per_frame


def motion_error(clips_px: np.ndarray, actions: np.ndarray) -> float:
  """Mean |measured - requested| displacement (pixels) over clips and frames 1..T-1.

  clips_px [N, T, H, W]; actions [N, T - 1, 2] (dx, dy) steps. Measured: the ink's centre
  of mass at frame t minus at frame 0; requested: the actions' running sum.
  """
  com = centre_of_mass(clips_px)                         # [N, T, 2] (row, col)
  measured = com[:, 1:] - com[:, :1]
  wanted = np.cumsum(np.asarray(actions, np.float64)[..., ::-1], axis=1)  # (dy, dx)
  return float(np.mean(np.linalg.norm(measured - wanted, axis=-1)))


def heldout_clips(num_frames: int, canvas: int, walk_prob: float = 0.0,
                  validation: int = 0):
  """Clips of every held-out digit (clip i seeded by i; constant directions cycle
  right/left/up/down) and their labels; validation > 0: of the validation digits."""
  held_x, held_y = digits.load_digits_split(validation)[2:]
  clips = []
  for i, image in enumerate(held_x):
    rng = np.random.default_rng(i)
    if walk_prob and rng.random() < walk_prob:
      clips.append(moving_digits.random_walk_clip(image, rng, num_frames, canvas))
    else:
      direction = moving_digits.DIRECTION_NAMES[i % len(moving_digits.DIRECTION_NAMES)]
      clips.append(moving_digits.constant_clip(image, direction, rng, num_frames, canvas))
  return clips, held_y


def evaluate_video(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                   sampler=None, seed: int = 0) -> dict[str, Any]:
  """The video protocol (module docstring) for a moving-digits checkpoint."""
  validation = digits.validation_size(pipe.config.data)
  clf, clf_acc = _judge(validation)[:2]
  t, canvas = pipe.num_frames, pipe.image_size
  dirs = moving_digits.DIRECTION_NAMES
  seconds = {}

  def unit(clip_list):
    return np.stack([(c.frames + 1) / 2 for c in clip_list]).astype(np.float32)

  # ---- Video QA on every held-out digit. ----
  start = time.perf_counter()
  clips, labels = heldout_clips(t, canvas, validation=validation)
  answers = pipe.reason(moving_digits.QUESTION, video=unit(clips))
  wanted = [moving_digits.answer(y, c.direction) for c, y in zip(clips, labels)]
  split = [(a.split(",")[0].strip(), a.split(",")[-1].strip()) for a in answers]
  qa = {"qa_accuracy": float(np.mean([a.strip() == w for a, w in zip(answers, wanted)])),
        "qa_digit_accuracy": float(np.mean([d == str(int(y))
                                            for (d, _), y in zip(split, labels)])),
        "qa_direction_accuracy": float(np.mean([m == c.direction
                                                for (_, m), c in zip(split, clips)]))}
  real_px = np.stack([digits.to_pixels(c.frames) for c in clips])
  real_identity = float(np.mean(clip_identity(clf, real_px)[0] == labels))
  seconds["qa"] = time.perf_counter() - start

  # ---- Caption -> clip: identity and motion. ----
  start = time.perf_counter()
  gen_labels = np.repeat(np.arange(10), samples_per_digit)
  gen_dirs = [dirs[s % len(dirs)] for _ in range(10) for s in range(samples_per_digit)]
  prompts = [moving_digits.caption(k, d) for k, d in zip(gen_labels, gen_dirs)]
  gen = pipe.generate(prompts, num_samples=1, steps=steps, cfg_scale=cfg_scale,
                      sampler=sampler, seed=seed, num_frames=t)
  gen_px = gen * digits.MAX_PIXEL
  votes, per_frame = clip_identity(clf, gen_px)
  requested = np.stack([np.tile(moving_digits.DIRECTIONS[d], (t - 1, 1)) for d in gen_dirs])
  com = centre_of_mass(gen_px)
  net = com[:, -1] - com[:, 0]                               # (drow, dcol)
  want = requested.sum(axis=1)[:, ::-1]
  seconds["generation"] = time.perf_counter() - start

  # ---- World model and inverse dynamics on held-out clips (half random walks). ----
  start = time.perf_counter()
  wm_clips, wm_labels = heldout_clips(t, canvas, walk_prob=0.5, validation=validation)
  n_wm = min(len(wm_clips), 10 * samples_per_digit)
  wm_clips, wm_labels = wm_clips[:n_wm], wm_labels[:n_wm]
  wm_true = unit(wm_clips)
  pred = pipe.predict(wm_true[:, 0], np.stack([c.actions for c in wm_clips]), steps=steps,
                      cfg_scale=cfg_scale, sampler=sampler, seed=seed)
  pred_px, true_px = pred * digits.MAX_PIXEL, wm_true * digits.MAX_PIXEL
  wm_err = float(np.mean(np.linalg.norm(centre_of_mass(pred_px[:, 1:])
                                        - centre_of_mass(true_px[:, 1:]), axis=-1)))
  wm_identity = float(np.mean(clip_identity(clf, pred_px[:, 1:])[0] == wm_labels))
  seconds["world_model"] = time.perf_counter() - start
  start = time.perf_counter()
  inferred = pipe.infer_actions(wm_true, steps=steps, sampler=sampler, seed=seed)
  true_actions = np.stack([c.actions for c in wm_clips])
  inv_err = float(np.mean(np.abs(inferred - true_actions)))
  inv_acc = float(np.mean(np.all(np.round(inferred) == true_actions, axis=-1)))
  seconds["inverse_dynamics"] = time.perf_counter() - start

  return {
      "step": pipe.step,
      "split": _split_name(validation),
      "video": True,
      **qa,
      "identity_accuracy": float(np.mean(votes == gen_labels)),
      "identity_frame_accuracy": float(np.mean(per_frame == gen_labels[:, None])),
      "motion_error_px": motion_error(gen_px, requested),
      "direction_accuracy": float(np.mean(
          (np.argmax(np.abs(net), axis=1) == np.argmax(np.abs(want), axis=1))
          & (np.sign(net[np.arange(len(net)), np.argmax(np.abs(want), axis=1)])
             == np.sign(want.sum(axis=1))))),
      "world_model_com_error_px": wm_err,
      "world_model_identity_accuracy": wm_identity,
      "inverse_dynamics_mae_px": inv_err,
      "inverse_dynamics_step_accuracy": inv_acc,
      "real_clip_identity_accuracy": real_identity,
      "classifier_heldout_accuracy": clf_acc,
      "samples_per_digit": samples_per_digit,
      "num_frames": t,
      "sampling": {"steps": steps or pipe.default_steps,
                   "cfg_scale": pipe.default_cfg_scale if cfg_scale is None else cfg_scale,
                   "sampler": sampler or pipe.default_sampler, "seed": seed},
      "seconds": seconds,
      "_images": gen,
      "_world_model_clips": (wm_true[:10], pred[:10]),  # real, predicted: for the GIF
  }


def _save_grid_gif(path: str, clips: np.ndarray) -> None:
  """Clips [N, T, H, W] in [0, 1] as one GIF: frame f shows every clip's frame f, in 2 rows."""
  from mot.pipeline import grid, save_gif  # pylint: disable=g-import-not-at-top
  save_gif(path, np.stack([grid(clips[:, f], rows=2, scale=1)
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


def write_results(workdir: str, result: dict[str, Any]) -> dict[str, Any]:
  """Appends the record to DIR/eval.json and writes the sample grid; returns the record."""
  from mot.pipeline import grid, save_png  # pylint: disable=g-import-not-at-top
  images = result.pop("_images")
  os.makedirs(os.path.join(workdir, SAMPLES_DIR), exist_ok=True)
  grid_path = os.path.join(workdir, SAMPLES_DIR, f"grid_step_{result['step']}.png")
  per_digit = result["samples_per_digit"]
  world_model = result.pop("_world_model_clips", None)
  if world_model is not None:  # top row the real clips, bottom row the predicted ones
    real, predicted = world_model
    wm_path = os.path.join(workdir, SAMPLES_DIR, f"world_model_step_{result['step']}.gif")
    _save_grid_gif(wm_path, np.concatenate([real, predicted]))
    result["world_model_gif"] = wm_path
  if images.ndim == 4:  # clips [N, T, H, W]: one row per digit (its first clip), T columns
    first = images.reshape(10, per_digit, *images.shape[1:])[:, 0]
    grid_image = grid(first.reshape(-1, *images.shape[2:]), rows=10)
    gif_path = os.path.join(workdir, SAMPLES_DIR, f"clips_step_{result['step']}.gif")
    _save_grid_gif(gif_path, first)
    result["gif"] = gif_path
  else:
    shown = images.reshape(10, per_digit, *images.shape[1:])[:, :min(per_digit, 10)]
    grid_image = grid(shown.reshape(-1, *images.shape[1:]), rows=10)
  save_png(grid_path, grid_image)
  result["grid"] = grid_path
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
    if pipe.is_video and FLAGS.reason_shifts:
      cli.fail("--reason_shifts reads still images; this is a video checkpoint: drop it")
    result = evaluate_pipeline(pipe, FLAGS.samples_per_digit, FLAGS.steps, FLAGS.cfg_scale,
                               FLAGS.sampler, FLAGS.seed, FLAGS.reason_shifts)
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
  flags.DEFINE_integer("reason_shifts", None, "Test-time shifts (pixels, 0-2) for reading "
                       "the held-out digits (default: config.sample.reason_shifts).")
  flags.DEFINE_bool("no_ema", False, "Evaluate the raw parameters instead of the EMA.")
  flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
  _define_flags()
  _cli.run(main)
