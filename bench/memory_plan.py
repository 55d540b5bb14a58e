"""Per-device memory of the sharded train step, from XLA before anything is allocated.

  python -m bench.memory_plan --config configs/scale.py:8b --mesh_shape "(1,64,1)"
  python -m bench.memory_plan --config configs/scale.py:0.6b --mesh_shape "(1,1,1)" \\
      --config.batch_size=1

It makes as many fake CPU devices as --mesh_shape has (XLA_FLAGS, set before JAX is
imported), builds what `mot.step.build_training` builds for train.py -- the model,
the optimizer, the state's shardings from the config's logical rules and the jitted train
step that donates the state -- and lowers and compiles that step on abstract inputs
(`jax.ShapeDtypeStruct`s carrying the shardings: nothing is initialised or allocated).
Then, per device (the largest shard; replicated leaves count whole):

  params     the parameters (their shards' bytes, from the shardings)
  optimizer  AdamW's mu and nu and its step counters
  ema        the EMA copy of the parameters
  inputs     the batch (config.batch_size rows of config.data.seq_len) and the rng
  temp       XLA's temporaries (`memory_analysis().temp_size_in_bytes`): gradients,
             activations kept for the backward pass, the step's scratch
  total      arguments + outputs - outputs aliased to donated arguments + temp: the
             step's peak as XLA's buffer assignment sees it

The step compiles twice, with config.model.remat_policy and with the other choice
("none" against "nothing_saveable"); the last line is one JSON object for the config as
given: {"num_params": N, "per_device_bytes": {"params", "optimizer", "ema", "inputs",
"temp", "total"}, ..., "other_remat": {...}}.

The figures are XLA:CPU's: its buffer assignment and fusion decisions, not a TPU's or a
GPU's (which fuse more and may rematerialise on their own), so `temp` is an estimate and
params / optimizer / ema are exact.
"""
from __future__ import annotations

import ast
import json
import math
import os

from absl import flags
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/scale.py:8b; override fields with "
      "--config.FIELD=VALUE.", lock_config=True)
  flags.DEFINE_string("mesh_shape", None, "Mesh sizes, e.g. '(1,64,1)' (data, fsdp, "
                      "tensor): that many fake CPU devices are made; it replaces "
                      "config.mesh_shape.", required=True)
  flags.DEFINE_bool("compare_remat", True, "Also compile with the other remat choice.")


OTHER_REMAT = {"none": "nothing_saveable"}   # any policy's alternative is "none"
GIB = 2 ** 30


def mesh_devices(mesh_shape: str) -> int:
  """The device count of an explicit mesh shape; ConfigError for -1 or a bad string."""
  from mot.config import ConfigError
  try:
    sizes = tuple(int(s) for s in ast.literal_eval(mesh_shape))
  except (ValueError, SyntaxError, TypeError):
    raise ConfigError(f"--mesh_shape={mesh_shape!r} is not a tuple of ints: write e.g. "
                      "'(1,64,1)'") from None
  if not sizes or any(s < 1 for s in sizes):
    raise ConfigError(f"--mesh_shape={mesh_shape!r}: give every axis a positive size (no "
                      "-1): the plan makes exactly that many fake devices")
  return math.prod(sizes)


def use_fake_devices(count: int) -> None:
  """XLA_FLAGS for `count` host devices; must run before JAX is imported."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={count}")


def shard_bytes(tree) -> int:
  """Bytes of one device's shard of every leaf (ShapeDtypeStructs with shardings)."""
  import jax  # imported only once XLA_FLAGS is set (fake devices)
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


def abstract_inputs(config, model, tx, mesh, rules):
  """(abstract state, batch and rng with their shardings, boxed state shapes)."""
  import flax.linen as nn  # imported only once XLA_FLAGS is set (fake devices)
  import jax
  import jax.numpy as jnp
  from mot import sharding
  from mot import step as step_lib
  init = step_lib.init_state_fn(model, tx, config.data.seq_len)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
  shardings = sharding.logical_shardings(boxed, mesh, rules, warn=False)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       nn.meta.unbox(boxed), shardings)
  rows = config.batch_size
  batch = {k: jax.ShapeDtypeStruct((rows,) + v.shape[1:], v.dtype,
                                   sharding=sharding.batch_sharding(mesh, v.ndim))
           for k, v in step_lib.dummy_batch(model.cfg, config.data.seq_len).items()}
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding.replicated(mesh))
  return state, batch, rng, boxed, shardings


def plan(config, devices=None) -> dict:
  """Compiles config's train step on abstract inputs; returns the per-device figures."""
  import jax  # imported only once XLA_FLAGS is set (fake devices)
  from mot import config as config_lib
  from mot import sharding
  from mot import step as step_lib
  from mot.model import MoT
  model_cfg = config_lib.validate(config)
  mesh = sharding.make_mesh(config, devices)
  if config.batch_size % sharding.batch_divisor(mesh):
    raise config_lib.ConfigError(
        f"config.batch_size={config.batch_size} is not divisible by the "
        f"{sharding.batch_divisor(mesh)} data-parallel devices of the mesh: set "
        "--config.batch_size to a multiple")
  rules = sharding.logical_rules(config)
  model, tx = MoT(model_cfg), step_lib.make_optimizer(config)
  state, batch, rng, _, shardings = abstract_inputs(config, model, tx, mesh, rules)
  step = step_lib.jit_train_step(model, tx, config, mesh, rules, shardings)
  with jax.set_mesh(mesh):
    compiled = step.lower(state, batch, rng).compile()
  xla = compiled.memory_analysis()
  params, ema = shard_bytes(state.params), shard_bytes(state.ema_params)
  optimizer = shard_bytes((state.opt_state, state.step, state.nonfinite_run))
  inputs = shard_bytes((batch, rng))
  total = (xla.argument_size_in_bytes + xla.output_size_in_bytes - xla.alias_size_in_bytes
           + xla.temp_size_in_bytes)
  return {
      "num_params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))),
      "per_device_bytes": {"params": params, "optimizer": optimizer, "ema": ema,
                           "inputs": inputs, "temp": int(xla.temp_size_in_bytes),
                           "total": int(total)},
      "xla": {"argument": int(xla.argument_size_in_bytes),
              "output": int(xla.output_size_in_bytes),
              "alias": int(xla.alias_size_in_bytes), "temp": int(xla.temp_size_in_bytes)},
      "remat_policy": model_cfg.remat_policy,
      "mesh_shape": dict(mesh.shape), "devices": mesh.size,
      "batch_size": config.batch_size, "seq_len": config.data.seq_len,
      "tokens_per_device": config.batch_size * config.data.seq_len // mesh.size,
      "experts": model_cfg.experts, "dtype": model_cfg.dtype,
      "param_dtype": model_cfg.param_dtype,
  }


def with_remat(config, policy: str):
  other = config.copy_and_resolve_references()
  with other.unlocked():
    other.model.remat_policy = policy
  return other


def describe(result: dict) -> str:
  b = result["per_device_bytes"]
  parts = ", ".join(f"{k} {b[k] / GIB:.2f}" for k in ("params", "optimizer", "ema",
                                                       "inputs", "temp"))
  return (f"remat {result['remat_policy']}: {parts}; total {b['total'] / GIB:.2f} GiB "
          "per device")


def main(argv):
  from mot import cli
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  with cli.clean_errors():
    count = mesh_devices(FLAGS.mesh_shape)
    use_fake_devices(count)
    config = FLAGS.config
    with config.unlocked():
      config.mesh_shape = FLAGS.mesh_shape
    result = plan(config)
    print(f"{config.get('variant', '')}: {result['num_params'] / 1e9:.3f}B parameters, "
          f"mesh {result['mesh_shape']}, {config.batch_size} rows x {config.data.seq_len} "
          f"tokens ({result['tokens_per_device']} tokens per device)")
    if FLAGS.compare_remat:
      policy = result["remat_policy"]
      other = plan(with_remat(config, OTHER_REMAT.get(policy, "none")))
      print("  " + describe(other))
      result["other_remat"] = {k: other[k] for k in ("remat_policy", "per_device_bytes")}
    print("  " + describe(result))
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  define_flags()
  from mot import cli
  cli.run(main)
