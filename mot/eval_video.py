"""The video protocol (docs/design.md §6) for a moving-digits checkpoint.

Every judge is the digits protocol's independent SVC applied to the 8x8 crop around the
digit (`crop_digits`):
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
"""
from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from mot.data import digits, moving_digits
from mot.eval_digits import judge, sampling_record, split_name


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
  of mass puts a training digit's box, so that the judge sees the digit framed as in
  its training images (a crop from the centre of mass alone often cuts a stroke off).
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



def _unit(clip_list) -> np.ndarray:
  """float32 [N, T, H, W] in [0, 1] of `moving_digits.Clip`s (frames in [-1, 1])."""
  return np.stack([(c.frames + 1) / 2 for c in clip_list]).astype(np.float32)


def video_qa(pipe, clf, validation: int) -> dict[str, float]:
  """QA accuracy (whole answer, digit, direction) on one held-out clip per digit, and
  the judge's identity accuracy on those real clips."""
  clips, labels = heldout_clips(pipe.num_frames, pipe.image_size, validation=validation)
  answers = pipe.reason(moving_digits.QUESTION, video=_unit(clips))
  wanted = [moving_digits.answer(y, c.direction) for c, y in zip(clips, labels)]
  split = [(a.split(",")[0].strip(), a.split(",")[-1].strip()) for a in answers]
  real_px = np.stack([digits.to_pixels(c.frames) for c in clips])
  return {
      "qa_accuracy": float(np.mean([a.strip() == w for a, w in zip(answers, wanted)])),
      "qa_digit_accuracy": float(np.mean([d == str(int(y))
                                          for (d, _), y in zip(split, labels)])),
      "qa_direction_accuracy": float(np.mean([m == c.direction
                                              for (_, m), c in zip(split, clips)])),
      "real_clip_identity_accuracy": float(np.mean(clip_identity(clf, real_px)[0] == labels)),
  }


def direction_accuracy(clips_px: np.ndarray, requested: np.ndarray) -> float:
  """Fraction of clips whose net displacement (last frame minus first) is largest along
  the requested axis and has the requested sign; requested [N, T - 1, 2] (dx, dy)."""
  com = centre_of_mass(clips_px)
  net = com[:, -1] - com[:, 0]                               # (drow, dcol)
  want = requested.sum(axis=1)[:, ::-1]
  axis = np.argmax(np.abs(want), axis=1)
  return float(np.mean((np.argmax(np.abs(net), axis=1) == axis)
                       & (np.sign(net[np.arange(len(net)), axis]) == np.sign(want.sum(axis=1)))))


def caption_to_clip(pipe, clf, samples_per_digit, steps, cfg_scale, sampler, seed):
  """(figures, clips) of captions "a handwritten digit k moving d": identity and motion."""
  t, dirs = pipe.num_frames, moving_digits.DIRECTION_NAMES
  gen_labels = np.repeat(np.arange(10), samples_per_digit)
  gen_dirs = [dirs[s % len(dirs)] for _ in range(10) for s in range(samples_per_digit)]
  prompts = [moving_digits.caption(k, d) for k, d in zip(gen_labels, gen_dirs)]
  gen = pipe.generate(prompts, num_samples=1, steps=steps, cfg_scale=cfg_scale,
                      sampler=sampler, seed=seed, num_frames=t)
  gen_px = gen * digits.MAX_PIXEL
  votes, per_frame = clip_identity(clf, gen_px)
  requested = np.stack([np.tile(moving_digits.DIRECTIONS[d], (t - 1, 1)) for d in gen_dirs])
  return {"identity_accuracy": float(np.mean(votes == gen_labels)),
          "identity_frame_accuracy": float(np.mean(per_frame == gen_labels[:, None])),
          "motion_error_px": motion_error(gen_px, requested),
          "direction_accuracy": direction_accuracy(gen_px, requested)}, gen


def world_model(pipe, clf, validation, samples_per_digit, steps, cfg_scale, sampler, seed):
  """(figures, (real, predicted) clips) of the world model and inverse dynamics on
  held-out clips, half of them random walks."""
  clips, labels = heldout_clips(pipe.num_frames, pipe.image_size, walk_prob=0.5,
                                validation=validation)
  n = min(len(clips), 10 * samples_per_digit)
  clips, labels = clips[:n], labels[:n]
  true = _unit(clips)
  actions = np.stack([c.actions for c in clips])
  pred = pipe.predict(true[:, 0], actions, steps=steps, cfg_scale=cfg_scale,
                      sampler=sampler, seed=seed)
  pred_px, true_px = pred * digits.MAX_PIXEL, true * digits.MAX_PIXEL
  inferred = pipe.infer_actions(true, steps=steps, sampler=sampler, seed=seed)
  return {
      "world_model_com_error_px": float(np.mean(np.linalg.norm(
          centre_of_mass(pred_px[:, 1:]) - centre_of_mass(true_px[:, 1:]), axis=-1))),
      "world_model_identity_accuracy": float(np.mean(
          clip_identity(clf, pred_px[:, 1:])[0] == labels)),
      "inverse_dynamics_mae_px": float(np.mean(np.abs(inferred - actions))),
      "inverse_dynamics_step_accuracy": float(np.mean(
          np.all(np.round(inferred) == actions, axis=-1))),
  }, (true[:10], pred[:10])


def evaluate_video(pipe, samples_per_digit: int = 20, steps=None, cfg_scale=None,
                   sampler=None, seed: int = 0) -> dict[str, Any]:
  """The video protocol (module docstring) for a moving-digits checkpoint."""
  validation = digits.validation_size(pipe.config.data)
  clf, clf_acc = judge(validation)[:2]
  seconds, start = {}, time.perf_counter()
  qa = video_qa(pipe, clf, validation)
  seconds["qa"], start = time.perf_counter() - start, time.perf_counter()
  generation, gen = caption_to_clip(pipe, clf, samples_per_digit, steps, cfg_scale,
                                    sampler, seed)
  seconds["generation"], start = time.perf_counter() - start, time.perf_counter()
  dynamics, wm_clips = world_model(pipe, clf, validation, samples_per_digit, steps,
                                   cfg_scale, sampler, seed)
  seconds["world_model"] = time.perf_counter() - start
  return {
      "step": pipe.step, "split": split_name(validation), "video": True,
      **qa, **generation, **dynamics,
      "classifier_heldout_accuracy": clf_acc,
      "samples_per_digit": samples_per_digit,
      "num_frames": pipe.num_frames,
      "sampling": sampling_record(pipe, steps, cfg_scale, sampler, seed),
      "seconds": seconds,
      "_images": gen,
      "_world_model_clips": wm_clips,  # real, predicted: for the GIF
  }
