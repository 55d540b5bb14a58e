"""Does a clip's first generated frame depend on the caption's digit? (docs/results.md §4.)

  python -m bench.caption_probe --workdir runs/moving [--clips 80]

For held-out clips of held-out digits (starting where the checkpoint's caption -> clip
training clips did: config.data.generation_start), noises the true first frame at t in TIMES (one
fixed noise per clip) and measures the model's x0-prediction error for frame 0 of
caption -> clip under every caption that differs in one word: the 10 digits (direction
kept) and the 4 directions (digit kept). If the model draws frame 0 from the caption, the
true caption predicts the true frame best: `digit_top1[t]` (chance 0.10) and
`direction_top1[t]` (chance 0.25) are how often it does; `digit_margin[t]` is the median
error of the true caption minus the best wrong one (negative: the caption helps).
Only for frame-by-frame checkpoints (config.data.video_layout='frames'). Prints one
JSON line.
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """Flags only when run as a script: tests import probe() next to other bench modules
  that define the same names."""
  flags.DEFINE_string("workdir", None, "Moving-digits training workdir (newest checkpoint, EMA).")
  flags.DEFINE_integer("clips", 80, "Held-out clips probed (one per held-out digit, in order).")
  flags.DEFINE_integer("seed", 0, "Seed of the clips' start positions and of the noise.")

TIMES = (0.3, 0.6, 0.9)  # noise levels probed: x_t = (1 - t) x0 + t noise


def first_frame_errors(pipe, first_frame: np.ndarray, captions: list[str],
                       noise: np.ndarray, times=TIMES) -> np.ndarray:
  """float [len(times), len(captions)]: mean squared error of the model's x0 prediction
  of `first_frame` ([H, W], model scale [-1, 1]) as frame 0 of each caption's clip.

  noise: float [hp * wp, patch_dim], shared by every caption (only the caption differs).
  """
  from mot import sampling
  from mot.data import digits
  p, dims = pipe.patch_size, pipe.patch_size ** 2
  examples = [pipe.prompts.video_generation_example(text, pipe.num_frames) for text in captions]
  split = [sampling.split_block(e) for e in examples]
  longest = max(len(prefix["tokens"]) for prefix, _ in split)
  prefix = sampling.pad_left([s[0] for s in split], sampling.length_bucket(longest))
  block = sampling.block_arrays([s[1] for s in split])
  x0 = np.zeros((len(captions), *noise.shape), np.float32)
  x0[..., :dims] = digits.patchify(first_frame, p).reshape(-1, dims)
  errors = []
  for t in times:
    x_t = (1 - t) * x0 + t * noise[None]
    v = np.asarray(_velocity(pipe.model, pipe.params, prefix, block, x_t, np.float32(t)))
    errors.append(np.mean(((x_t - t * v) - x0)[..., :dims] ** 2, axis=(1, 2)))
  return np.stack(errors)


@functools.partial(jax.jit, static_argnums=0)
def _velocity(model, params, prefix, block, x_t, t):
  """The block's velocity at (x_t, t) after each row's prefix (all of it kept)."""
  from mot import sampling
  keep = jnp.ones(prefix["tokens"].shape, bool)
  return sampling.cached_block_velocity(model, params, prefix, block, keep)(x_t, t)


def probe(pipe, num_clips: int, seed: int = 0) -> dict:
  """The module doc's figures over the first `num_clips` held-out digits."""
  from mot.data import digits, moving_digits
  _, _, held_x, held_y = digits.load_digits_split()
  rng = np.random.default_rng(seed)
  names = moving_digits.DIRECTION_NAMES
  # Clips start where the checkpoint's caption -> clip training clips did.
  on_grid = pipe.config.data.get("generation_start", "any") == "grid"
  grid = pipe.patch_size if on_grid else 1
  digit_top1, direction_top1 = np.zeros(len(TIMES)), np.zeros(len(TIMES))
  margins = []
  num_clips = min(num_clips, len(held_x))
  for i in range(num_clips):
    label, direction = int(held_y[i]), names[i % len(names)]
    clip = moving_digits.constant_clip(held_x[i], direction, rng, pipe.num_frames,
                                       pipe.image_size, grid)
    noise = rng.standard_normal(
        ((pipe.image_size // pipe.patch_size) ** 2, pipe.model_cfg.patch_dim)).astype(np.float32)
    noise[:, pipe.patch_size ** 2:] = 0
    by_digit = first_frame_errors(pipe, clip.frames[0], [
        moving_digits.caption(k, direction) for k in range(10)], noise)
    by_direction = first_frame_errors(pipe, clip.frames[0], [
        moving_digits.caption(label, d) for d in names], noise)
    digit_top1 += by_digit.argmin(axis=1) == label
    direction_top1 += by_direction.argmin(axis=1) == i % len(names)
    margins.append(by_digit[:, label] - np.delete(by_digit, label, axis=1).min(axis=1))
  key = lambda t: f"{t:g}"
  return {"clips": num_clips,
          "digit_top1": {key(t): float(v / num_clips) for t, v in zip(TIMES, digit_top1)},
          "direction_top1": {key(t): float(v / num_clips)
                             for t, v in zip(TIMES, direction_top1)},
          "digit_margin": {key(t): float(m) for t, m in zip(TIMES, np.median(margins, 0))}}


def main(argv):
  del argv
  from mot import cli
  from mot.checkpoint import CheckpointError
  from mot.errors import InputError
  from mot.pipeline import Pipeline
  if FLAGS.clips < 1:
    cli.fail(f"--clips={FLAGS.clips} must be >= 1")
  try:
    pipe = Pipeline.from_workdir(FLAGS.workdir)
    pipe.require_video("bench.caption_probe")
    if pipe.video_layout != "frames":
      raise InputError("bench.caption_probe probes frame-by-frame checkpoints "
                       "(config.data.video_layout='frames'); this one draws whole clips")
  except (CheckpointError, InputError) as e:
    cli.fail(cli.one_line(e))
  print(json.dumps(probe(pipe, FLAGS.clips, FLAGS.seed)))


if __name__ == "__main__":
  from mot import cli as _cli
  _cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  _define_flags()
  flags.mark_flag_as_required("workdir")
  app.run(main)
