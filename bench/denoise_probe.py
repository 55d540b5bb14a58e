"""Can the DM head give back a scene it is shown? One-step clean estimates of noised scenes.

  python -m bench.denoise_probe --workdir runs/shapes [--examples 48] \
      [--times 0.05,0.1,0.2,0.3,0.5,0.7,0.9] [--seed 0]

For Shapes caption -> image examples (the run's fixed held-out-loss set of
in-distribution prompts, never trained on, as `bench.patch_coupling` uses), each scene
is noised to time t and the model's clean estimate x0_hat = x_t - t * v(x_t) is taken in
one step, as the sampler's last step takes it. Each estimate, as the uint8 image a sample
would be, goes to the exact detector (`mot.shapes_detector`):
- "exact": the detector finds the same scene in the estimate as in the rendered scene
  (every object's colour, shape and box);
- "unknown": the estimate holds a blob of no shape;
- "error": the mean absolute pixel error of the estimate, in 0-255 units.
At small t the scene is all but given, so "exact" there is a ceiling on what sampling can
draw: a head that cannot give back an almost clean scene cannot end a sample on an exact
one (docs/results.md §6). Prints a markdown table (one row per t), then one JSON line.
"""
from __future__ import annotations

import functools
import json

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import bench
from bench import patch_coupling
from mot import eval_shapes
from mot import patches
from mot import shapes_detector
from mot.data import shapes_scene

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Shapes training workdir (its newest checkpoint).")
  flags.DEFINE_integer("examples", 48, "Caption -> image examples per noise time.")
  flags.DEFINE_string("times", "0.05,0.1,0.2,0.3,0.5,0.7,0.9", "Comma-separated times t.")
  flags.DEFINE_integer("seed", 0, "Noise seed.")
  flags.mark_flag_as_required("workdir")


def estimate_fn(model):
  """Jitted (params, batch, noised, x_t, t) -> `patch_coupling.clean_estimate`."""
  return jax.jit(functools.partial(patch_coupling.clean_estimate, model))


def to_image(tokens: np.ndarray, patch_size: int) -> np.ndarray:
  """Model-scale RGB patches [N, >= p*p*3] of a square grid -> uint8 [S, S, 3], rounded
  as a sample's PNG is (`eval_shapes.to_uint8`)."""
  grid = int(round(np.sqrt(tokens.shape[0])))
  rgb = np.asarray(tokens)[:, :patch_size * patch_size * 3].reshape(grid, grid, -1)
  return eval_shapes.to_uint8((np.clip(patches.from_patches(rgb, patch_size, 3), -1.0, 1.0)
                               + 1.0) / 2.0)


def score(estimate: np.ndarray, truth: np.ndarray) -> dict[str, float]:
  """{"exact", "unknown", "error"} of one uint8 estimate against its uint8 scene."""
  found = shapes_detector.detect(estimate)
  return {"exact": float(found == shapes_detector.detect(truth)),
          "unknown": float(any(o.shape == shapes_scene.UNKNOWN_SHAPE for o in found.objects)),
          "error": float(np.abs(estimate.astype(np.float32) - truth).mean())}


def measure(pipe, n: int, times: list[float], seed: int) -> dict[float, dict[str, float]]:
  """{t: mean exact / unknown / error over n examples}."""
  p = int(pipe.config.data.patch_size)
  rng = np.random.default_rng(seed)
  estimate = estimate_fn(pipe.model)
  examples = patch_coupling.examples_for(pipe, n)
  result = {}
  for t in times:
    rows = []
    for example in examples:
      batch = patch_coupling.one_row_batch(example)
      noised = np.flatnonzero(example["dm_mask"] > 0)
      x0 = np.asarray(example["patches"])[noised]
      x_t = (1.0 - t) * x0 + t * rng.standard_normal(x0.shape).astype(np.float32)
      x0_hat = estimate(pipe.params, batch, jnp.asarray(noised), jnp.asarray(x_t),
                        jnp.float32(t))
      rows.append(score(to_image(np.asarray(x0_hat), p), to_image(x0, p)))
    result[t] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
  return result


def main(argv) -> None:
  del argv
  times = bench.noise_times(FLAGS.times, FLAGS.examples, "denoise_probe")
  pipe = bench.load_shapes_pipeline(FLAGS.workdir, "denoise_probe")
  result = measure(pipe, FLAGS.examples, times, FLAGS.seed)
  print("| t | exact scene | blob of no shape | mean pixel error (0-255) |")
  print("|---|---|---|---|")
  for t, r in result.items():
    print(f"| {t} | {100 * r['exact']:.1f} % | {100 * r['unknown']:.1f} % | {r['error']:.1f} |")
  print(json.dumps({"workdir": FLAGS.workdir, "examples": FLAGS.examples,
                    "probe": {str(t): r for t, r in result.items()}}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
