"""Forward + backward time with the SwiGLU custom gradient against plain autodiff.

  python -m bench.swiglu_gradient --config configs/bench.py:d512 --steps 12
  python -m bench.swiglu_gradient --config configs/bench.py:peer --steps 40

`mot.layers.swiglu` writes d(gate, up) as one stacked array; autodiff of the two slices
of the fused gate/up output builds it from two zero-padded halves and their sum. Both
versions are jitted in this process (the plain one by swapping the function in while
tracing) and timed on the same batch, alternating call by call, so the load of a shared
machine falls on both alike. Prints one JSON line: median times, the median ratio of
adjacent (custom, autodiff) pairs, the largest difference between their gradients, and
whether the two traced programs differ (they must, or the comparison is void).
"""
import json
import os
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  config_flags.DEFINE_config_file("config", "configs/bench.py:d512", "Config file (and "
                                  "overrides).", lock_config=True)
  flags.DEFINE_integer("steps", 12, "Timed calls per version (after one warm-up call).")


def main(argv):
  del argv
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from mot import layers, sharding, train_lib  # pylint: disable=g-import-not-at-top
  from mot import step as step_lib
  config = FLAGS.config
  t = step_lib.build_training(config)
  model, mesh, rules, state, rng = t.model, t.mesh, t.rules, t.state, t.step_rng
  batch = sharding.global_batch(
      mesh, next(iter(train_lib.process_train_dataset(config, mesh))), config.batch_size)

  def make_loss_and_grad():
    # A new function object per version: jax.jit caches traces by function identity.
    def loss_and_grad(params, batch, rng):
      return jax.value_and_grad(step_lib.compute_losses, has_aux=True)(
          params, batch, rng, model, config)
    return jax.jit(loss_and_grad)

  custom = layers.swiglu
  fns, programs = {}, {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for name, fn in (("custom", custom), ("autodiff", layers.swiglu_autodiff)):
      layers.swiglu = fn                       # read when the jit below traces
      try:
        fns[name] = make_loss_and_grad()
        programs[name] = fns[name].lower(state.params, batch, rng).as_text()
        jax.block_until_ready(fns[name](state.params, batch, rng))
      finally:
        layers.swiglu = custom
    times = {name: [] for name in fns}
    for _ in range(FLAGS.steps):
      for name, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(state.params, batch, rng))
        times[name].append(time.perf_counter() - start)
    grads = {name: fn(state.params, batch, rng)[1] for name, fn in fns.items()}
  grad_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(jax.tree.leaves(grads["custom"]),
                                  jax.tree.leaves(grads["autodiff"])))
  paired = np.asarray(times["custom"]) / np.asarray(times["autodiff"])
  print(json.dumps({
      "bench": "swiglu_gradient", "config": config.variant, "backend": jax.default_backend(),
      "steps_each": FLAGS.steps,
      "custom_ms": round(1e3 * float(np.median(times["custom"])), 2),
      "autodiff_ms": round(1e3 * float(np.median(times["autodiff"])), 2),
      "paired_ratio": round(float(np.median(paired)), 3),
      "max_grad_difference": grad_diff,
      "distinct_programs": programs["custom"] != programs["autodiff"],
      "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
  define_flags()
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  cli.run(main)
