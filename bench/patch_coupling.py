"""How much the DM head's clean-image estimate of one patch reads the other patches.

  python -m bench.patch_coupling --workdir runs/shapes [--examples 8] [--times 0.95,0.8,0.5,0.2]

For Shapes caption -> image examples (the run's fixed held-out-loss set of
in-distribution prompts, `shapes_tasks.heldout_examples`), each image is noised to time
t and the model's clean estimate x0_hat = x_t - t * v(x_t) is differentiated with
respect to x_t. The Jacobian block d x0_hat[i] / d x_t[j] between image patches i and j
is summarised by its Frobenius norm: "self" is i = j, "neighbour" a patch sharing an
edge with i, "far" every other patch. A denoiser that draws one object across several
patches must read its neighbours; a head whose neighbour norms are far below its self
norms paints each patch from its own noise, and its objects break at the patch borders
(docs/results.md §6).
Prints a markdown table (one row per t), then one JSON line with every figure.
"""
from __future__ import annotations

import json

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import bench
from mot.data import shapes_tasks
from mot.model import inputs_from_batch

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Shapes training workdir (its newest checkpoint).")
  flags.DEFINE_integer("examples", 8, "Caption -> image examples averaged over.")
  flags.DEFINE_string("times", "0.95,0.8,0.5,0.2", "Comma-separated noise times t.")
  flags.DEFINE_integer("seed", 0, "Noise seed.")
  flags.mark_flag_as_required("workdir")


def coupling_blocks(model, params, example: dict, t: float, noise: np.ndarray,
                    jacobian=None) -> np.ndarray:
  """float [N, N]: Frobenius norm of d x0_hat[i] / d x_t[j] over the N noised patches.

  `jacobian` is `jacobian_fn(model)`'s function, to reuse its compilations across calls."""
  batch = one_row_batch(example)
  noised = jnp.asarray(np.flatnonzero(example["dm_mask"] > 0))
  x_t = (1.0 - t) * batch["patches"][0, noised] + t * jnp.asarray(noise)
  jac = (jacobian or jacobian_fn(model))(params, batch, noised, x_t, jnp.float32(t))
  return np.sqrt(np.asarray(jnp.sum(jnp.square(jac), axis=(1, 3))))


def one_row_batch(example: dict) -> dict:
  """One example as a batch of one row (its own segment), as the model takes it."""
  batch = {k: jnp.asarray(v)[None] for k, v in example.items()}
  batch["segment_ids"] = jnp.ones_like(batch["tokens"])
  return batch


def clean_estimate(model, params, batch, noised, x_t, t):
  """x0_hat = x_t - t * v(x_t) [N, P] at the noised tokens `noised` of the one-row
  `batch`, its image patches set to x_t and noised to time t (traceable)."""
  times = jnp.where(batch["dm_mask"] > 0, t, 0.0)
  patches = batch["patches"].at[0, noised].set(x_t)
  _, velocity, _ = model.apply({"params": params},
                               inputs_from_batch(batch, patches=patches, timesteps=times))
  return x_t - t * velocity[0, noised]


def jacobian_fn(model):
  """Jitted (params, batch, noised, x_t, t) -> d x0_hat / d x_t [N, P, N, P] of
  `clean_estimate`."""
  @jax.jit
  def jacobian(params, batch, noised, x_t, t):
    return jax.jacrev(lambda x: clean_estimate(model, params, batch, noised, x, t))(x_t)
  return jacobian


def summarise(blocks: np.ndarray, grid: int) -> dict[str, float]:
  """Mean self / neighbour / far norms of [N, N] blocks of a grid x grid image."""
  rows, cols = np.divmod(np.arange(grid * grid), grid)
  distance = np.abs(rows[:, None] - rows[None]) + np.abs(cols[:, None] - cols[None])
  return {"self": float(blocks[distance == 0].mean()),
          "neighbour": float(blocks[distance == 1].mean()),
          "far": float(blocks[distance > 1].mean())}


def examples_for(pipe, n: int) -> list[dict]:
  """n in-distribution caption -> image examples in the run's options and tokens (the
  fixed set of its held-out losses, `shapes_tasks.heldout_examples`: never trained on)."""
  options = shapes_tasks.validate(pipe.config.data, pipe.tokenizer)
  return shapes_tasks.heldout_examples("shapes_generation", options, n)


def measure(pipe, n: int, times: list[float], seed: int) -> dict[float, dict[str, float]]:
  """{t: mean self / neighbour / far norms over n examples}."""
  grid = int(pipe.config.data.image_size) // int(pipe.config.data.patch_size)
  rng = np.random.default_rng(seed)
  jacobian = jacobian_fn(pipe.model)
  examples = examples_for(pipe, n)
  result = {}
  for t in times:
    rows = []
    for example in examples:
      noised = int((example["dm_mask"] > 0).sum())
      noise = rng.standard_normal((noised, example["patches"].shape[1])).astype(np.float32)
      blocks = coupling_blocks(pipe.model, pipe.params, example, t, noise, jacobian)
      rows.append(summarise(blocks, grid))
    result[t] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
  return result


def main(argv) -> None:
  del argv
  times = bench.noise_times(FLAGS.times, FLAGS.examples, "patch_coupling")
  pipe = bench.load_shapes_pipeline(FLAGS.workdir, "patch_coupling")
  result = measure(pipe, FLAGS.examples, times, FLAGS.seed)
  print("| t | self | neighbour | far | self / neighbour |")
  print("|---|---|---|---|---|")
  for t, r in result.items():
    print(f"| {t} | {r['self']:.3f} | {r['neighbour']:.3f} | {r['far']:.3f} | "
          f"{r['self'] / max(r['neighbour'], 1e-12):.1f} |")
  print(json.dumps({"workdir": FLAGS.workdir, "examples": FLAGS.examples,
                    "coupling": {str(t): r for t, r in result.items()}}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
