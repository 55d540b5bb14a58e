"""Benchmarks: figures, not tests (`python -m bench.NAME`; each prints one JSON line last)."""
from __future__ import annotations


def noise_times(times: str, examples: int, bench: str) -> list[float]:
  """The comma-separated noise times of a --times flag, checked with --examples; bad
  values exit with one line that starts with `bench` (the benchmark's name)."""
  import sys
  try:
    out = [float(t) for t in times.split(",")]
    if examples < 1 or not all(0.0 < t <= 1.0 for t in out):
      raise ValueError
  except ValueError:
    sys.exit(f"{bench}: --examples must be >= 1 and --times comma-separated numbers in "
             f"(0, 1], got {examples}, {times!r}")
  return out


def load_pipeline(workdir: str | None, variant: str = "", seed: int = 0):
  """The checkpoint's Pipeline, or one of configs/digits.py:variant with random weights
  (drawn from numpy: compiling `init` costs more than the benchmark on a CPU)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  from mot.pipeline import Pipeline
  if workdir:
    return Pipeline.from_workdir(workdir)
  from configs import digits
  from mot import step as step_lib
  from mot.model import inputs_from_batch
  shell = Pipeline(digits.get_config(variant), None)
  batch = jax.tree.map(jnp.asarray, step_lib.dummy_batch(shell.model_cfg, 8))
  shapes = nn.meta.unbox(jax.eval_shape(shell.model.init, jax.random.PRNGKey(0),
                                        inputs_from_batch(batch)))["params"]
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    if "scale" in jax.tree_util.keystr(path):
      return jnp.ones(leaf.shape, leaf.dtype)
    fan_in = leaf.shape[-2] if leaf.ndim >= 2 else leaf.shape[-1]
    return jnp.asarray(rng.standard_normal(leaf.shape) / np.sqrt(fan_in), leaf.dtype)

  return Pipeline(shell.config, jax.tree_util.tree_map_with_path(fill, shapes))


def load_shapes_pipeline(workdir: str, bench: str):
  """The Shapes checkpoint's Pipeline; a missing or broken checkpoint, or one trained on
  other data, exits with one line that starts with `bench` (the benchmark's name)."""
  import sys
  from mot import errors
  from mot.pipeline import Pipeline
  try:
    pipe = Pipeline.from_workdir(workdir)
  except (ValueError, errors.CheckpointError) as e:
    sys.exit(f"{bench}: {e}")
  if not pipe.is_shapes:
    sys.exit(f"{bench}: {workdir} is not a Shapes run: the bench draws Shapes scenes")
  return pipe
