"""Train-step time of Mixture-of-Transformers experts against the shared backbone.

  python -m bench.experts_step_time --config configs/digits.py --config.model.experts=mode

Both models have the same widths, so the same FLOPs per token (every token runs through
exactly one expert). Both jitted train steps run in this process on the same real
batches, alternating step by step, so that the load of a shared machine falls on both
alike. Prints one JSON line: median step times (of --steps steps each, after warm-up),
their ratio, and the median ratio of adjacent (shared, candidate) pairs, which is the
figure least moved by other processes (target: <= 1.15).
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
  config_flags.DEFINE_config_file("config", "configs/digits.py", "Config file (and overrides); "
                                  "--config.model.experts names the variant against shared.",
                                  lock_config=True)
  flags.DEFINE_integer("steps", 30, "Timed steps per variant (after warm-up).")
  flags.DEFINE_integer("warmup", 3, "Untimed steps per variant after compilation.")


def _variant(config, experts: str, batches):
  """(jitted step, state, rng) of `config` with `experts`, warmed up."""
  from mot import step as step_lib
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.model.experts = experts
  t = step_lib.build_training(config)
  state = t.state
  with jax.set_mesh(t.mesh):
    for b in batches[:1] * max(FLAGS.warmup, 1):
      state, _ = t.p_train_step(state, b, t.step_rng)
  jax.block_until_ready(state)
  return t.p_train_step, state, t.step_rng


def main(argv):
  del argv
  from mot import sharding, train_lib
  config = FLAGS.config
  candidate = config.model.experts if config.model.experts != "shared" else "mode"
  mesh = sharding.make_mesh(config)   # the variants' meshes equal it (same devices, axes)
  it = iter(train_lib.process_train_dataset(config, mesh))
  batches = [sharding.global_batch(mesh, next(it), config.batch_size) for _ in range(8)]
  noised = float(np.mean([np.mean(np.asarray(b["dm_mask"]) > 0) for b in batches]))

  variants = {name: list(_variant(config, name, batches))
              for name in ("shared", candidate)}
  times = {name: [] for name in variants}
  with jax.set_mesh(mesh):
    for i in range(FLAGS.steps):
      for name, v in variants.items():   # the same batch for both, back to back
        step, state, rng = v
        start = time.perf_counter()
        v[1], metrics = step(state, batches[i % len(batches)], rng)
        jax.block_until_ready(metrics["loss"])
        times[name].append(time.perf_counter() - start)
  median = {name: float(np.median(t)) for name, t in times.items()}
  paired = np.asarray(times[candidate]) / np.asarray(times["shared"])
  print(json.dumps({
      "bench": "experts_step_time", "config": config.variant, "experts": candidate,
      "expert_impl": config.model.expert_impl, "expert_tile": config.model.expert_tile,
      "batch_size": config.batch_size, "seq_len": config.data.seq_len,
      "noised_token_fraction": round(noised, 3), "steps_each": len(times["shared"]),
      "backend": jax.default_backend(),
      "shared_ms": round(1e3 * median["shared"], 2),
      f"{candidate}_ms": round(1e3 * median[candidate], 2),
      "ratio": round(median[candidate] / median["shared"], 3),
      "paired_ratio": round(float(np.median(paired)), 3),
      "paired_ratio_p25_p75": [round(float(q), 3) for q in np.quantile(paired, [0.25, 0.75])],
      "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
  define_flags()
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  cli.run(main)
