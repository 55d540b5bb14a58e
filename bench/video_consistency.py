"""Frame-to-frame consistency of generated moving-digit clips (docs/results.md §4).

  python -m bench.video_consistency --workdir runs/moving [--clips_per_digit 3]

Generates `--clips_per_digit` clips of "a handwritten digit k moving right" for k = 0..9
and, for each lag k = 1..T-1, the mean correlation between frame f and frame f + k shifted
back k pixels. A real clip scores 1.00 at every lag (the digit only moves). A model that
copies whole-patch shifts but not sub-patch ones scores ~1 only at multiples of the patch
size (4 with 4-px patches). Prints one line per lag, then one JSON line.
"""
from __future__ import annotations

import json

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  flags.DEFINE_string("workdir", None, "Moving-digits training workdir (newest checkpoint, EMA).")
  flags.DEFINE_integer("clips_per_digit", 3, "Clips generated per digit 0..9.")
  flags.DEFINE_integer("seed", 0, "Sampling seed.")


def shifted_frame_correlation(clips: np.ndarray) -> dict[int, float]:
  """{lag: mean correlation of frame f with frame f + lag moved back lag px to the left}.

  clips: float [N, T, H, W] of digits moving right one pixel a frame.
  """
  clips = np.asarray(clips, np.float64)
  n, t, _, w = clips.shape
  out = {}
  for lag in range(1, t):
    a = clips[:, :t - lag, :, :w - lag].reshape(n * (t - lag), -1)
    b = clips[:, lag:, :, lag:].reshape(n * (t - lag), -1)
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    corr = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1) + 1e-12)
    out[lag] = float(corr.mean())
  return out


def main(argv):
  del argv
  from mot import cli
  from mot.checkpoint import CheckpointError
  from mot.data import digits, moving_digits
  from mot.errors import InputError
  from mot.pipeline import Pipeline
  if FLAGS.clips_per_digit < 1:
    cli.fail(f"--clips_per_digit={FLAGS.clips_per_digit} must be >= 1")
  try:
    pipe = Pipeline.from_workdir(FLAGS.workdir)
    pipe.require_video("bench.video_consistency")
    labels = np.repeat(np.arange(10), FLAGS.clips_per_digit)
    clips = pipe.generate([moving_digits.caption(int(k), "right") for k in labels],
                          seed=FLAGS.seed)
  except (CheckpointError, InputError) as e:
    cli.fail(cli.one_line(e))
  rng = np.random.default_rng(FLAGS.seed)
  held_x = digits.load_digits_split()[2][:len(labels)]
  real = np.stack([(moving_digits.constant_clip(x, "right", rng, pipe.num_frames,
                                                pipe.image_size).frames + 1) / 2
                   for x in held_x])
  generated, reference = shifted_frame_correlation(clips), shifted_frame_correlation(real)
  for lag in generated:
    print(f"frame f vs f+{lag} moved back {lag} px: generated {generated[lag]:.2f}, "
          f"real {reference[lag]:.2f}")
  print(json.dumps({"generated": generated, "real": reference, "clips": len(labels)}))


if __name__ == "__main__":
  define_flags()
  from mot import cli as _cli
  _cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  flags.mark_flag_as_required("workdir")
  app.run(main)
