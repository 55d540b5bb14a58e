"""Subprocess half of tests/test_sharding.py: 3 train steps per mesh on 8 fake CPU devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/_sharding_worker.py \
      '(8,1,1)' '(2,4,1)' '(2,2,2)' '(1,1,8)'
  ... python tests/_sharding_worker.py --experts mode '(2,2,2)'    # MoT experts

Runs the single-device reference and then every mesh in one process (meshes over the
same 8 devices), and prints one JSON object: per mesh, the largest differences from the
reference (losses, parameters, Adam mu/nu) and every leaf whose sharding is not what the
config's logical rules say. The test judges; this script only measures.
"""
import functools
import json
import math
import os
import re
import sys
import time

if "jax" in sys.modules:
  raise RuntimeError("import this worker before jax: it sets XLA_FLAGS")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from configs import digits  # noqa: E402
from mot import config as config_lib, sharding  # noqa: E402
from mot import step as step_lib  # noqa: E402
from mot.data import input_pipeline  # noqa: E402
from mot.model import MoT  # noqa: E402

NUM_STEPS = 3


def equality_config(mesh_shape: str, matmul_dtype: str = "same", experts: str = "shared"):
  """The tiny config with every tensor-sharded dim divisible by 8 (heads, KV heads, MLP,
  vocab 272) and embed (64) divisible by 8 for fsdp. Float32 matmul operands by default:
  the meshes must equal one device to float32 rounding, and with bf16 operands a
  last-bit difference in a sharded partial sum can round an operand to the neighbouring
  bf16 value (2^-8 relative), which Adam's normalised updates then carry into the weights."""
  c = digits.get_config("tiny")
  c.mesh_shape = mesh_shape
  c.model.matmul_dtype = matmul_dtype
  c.model.num_heads = 8
  c.model.num_kv_heads = 8
  c.data.seq_len = 96
  c.data.examples_per_row = 2
  c.model.experts = experts
  return c


def expected_spec(names, rules, mesh):
  """PartitionSpec straight from the rules table (independent of flax's helper)."""
  table = dict(rules)
  entries = []
  for name in names:
    axes = table.get(name)
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    axes = tuple(a for a in axes if mesh.shape[a] > 1)
    entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*entries)


def sharding_mismatches(boxed, state, mesh, rules):
  """Leaves of params, ema, mu, nu whose sharding differs from the rules (or is
  replicated where the rules split it)."""
  bad = []
  flat_boxed = jax.tree_util.tree_flatten_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  flat_state = jax.tree.leaves(state)
  assert len(flat_boxed) == len(flat_state)
  named = 0
  for (path, box), leaf in zip(flat_boxed, flat_state):
    if not isinstance(box, nn.LogicallyPartitioned):
      if not leaf.sharding.is_fully_replicated:
        bad.append(f"{jax.tree_util.keystr(path)}: unnamed leaf not replicated")
      continue
    named += 1
    want = NamedSharding(mesh, expected_spec(box.names, rules, mesh))
    if not leaf.sharding.is_equivalent_to(want, leaf.ndim):
      bad.append(f"{jax.tree_util.keystr(path)}: {leaf.sharding.spec} != rules {want.spec}")
    shards = math.prod(leaf.shape) // math.prod(leaf.addressable_shards[0].data.shape)
    splits = math.prod(mesh.shape[a] for e in want.spec if e
                       for a in ((e,) if isinstance(e, str) else e))
    if shards != splits:
      bad.append(f"{jax.tree_util.keystr(path)}: {shards} shards, rules say {splits}")
  return bad, named


@functools.cache
def boxed_state(experts: str = "shared"):
  """The train state's shapes with their logical names (the same for every mesh)."""
  c = equality_config("(1,1,1)", experts=experts)
  model, tx = MoT(config_lib.validate(c)), step_lib.make_optimizer(c)
  init = step_lib.init_state_fn(model, tx, c.data.seq_len)
  with nn.logical_axis_rules(sharding.logical_rules(c)):
    return jax.eval_shape(init, jax.random.PRNGKey(0))


def run(mesh_shape: str, devices, batches, matmul_dtype: str = "same",
        experts: str = "shared", evaluate: bool = True):
  c = equality_config(mesh_shape, matmul_dtype, experts)
  t = step_lib.build_training(c, devices)     # as train.py builds it
  mesh, rules, state, step_rng, step = t.mesh, t.rules, t.state, t.step_rng, t.p_train_step
  eval_step, eval_rng = t.p_eval_step, t.eval_rng
  del t
  boxed = boxed_state(experts)
  born_bad, named = sharding_mismatches(boxed, state, mesh, rules)
  losses, donated = [], True
  with jax.set_mesh(mesh):
    batches = [sharding.global_batch(mesh, b, c.batch_size) for b in batches]
    lowered = step.lower(state, batches[0], step_rng)
    # Linen's activation constraints reach the program only under jax.set_mesh.
    constraints = lowered.as_text().count("sharding_constraint")
    step = lowered.compile()
    collectives = collective_counts(step.as_text())
    for batch in batches:
      old = jax.tree.leaves(state.params)[0]
      state, metrics = step(state, batch, step_rng)
      donated &= old.is_deleted()
      losses.append(float(metrics["loss"]))
    eval_loss = eval_constraints = None
    if evaluate:
      eval_lowered = eval_step.lower(state.ema_params, batches[0], eval_rng)
      eval_constraints = eval_lowered.as_text().count("sharding_constraint")
      eval_loss = float(eval_lowered.compile()(state.ema_params, batches[0],
                                               eval_rng)["loss"])
  after_bad, _ = sharding_mismatches(boxed, state, mesh, rules)
  adam = state.opt_state[1][0]
  return {"losses": losses, "params": jax.device_get(state.params),
          "mu": jax.device_get(adam.mu), "nu": jax.device_get(adam.nu),
          "sharding_errors": born_bad + [f"after steps: {e}" for e in after_bad],
          "named_leaves": named, "donated": bool(donated),
          "activation_constraints": constraints, "eval_loss": eval_loss,
          "collectives": collectives, "expert_specs": expert_specs(state.params),
          "eval_activation_constraints": eval_constraints}


def collective_counts(hlo: str) -> dict[str, int]:
  """How many of each cross-device operation the compiled step runs."""
  ops = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")
  return {op: len(re.findall(rf"= \S+ {op}(-start)?\(", hlo)) for op in ops}


def expert_specs(params) -> dict[str, str]:
  """PartitionSpec of every block weight with an expert axis (after the layers axis)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = jax.tree_util.keystr(path)
    if "backbone" in name:
      out[name] = str(leaf.sharding.spec)
  return out


def max_rel_diff(a, b):
  """Largest |a - b| / (max|b| + tiny) over leaves, per leaf scale."""
  return max(float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main(mesh_shapes):
  t0 = time.perf_counter()
  devices = jax.devices()
  assert len(devices) == 8, f"expected 8 fake CPU devices, got {devices}"
  c = equality_config("(1,1,1)")
  it = iter(input_pipeline.make_train_dataset(c.data, c.seed, c.batch_size))
  batches = [next(it) for _ in range(NUM_STEPS)]
  ref = run("(1,1,1)", devices[:1], batches)
  report = {"reference_losses": ref["losses"], "reference_eval_loss": ref["eval_loss"],
            "meshes": {}}
  for shape in mesh_shapes:
    t = time.perf_counter()
    out = run(shape, devices, batches)
    report["meshes"][shape] = {
        "losses": out["losses"],
        "loss_max_abs_diff": float(np.max(np.abs(np.subtract(out["losses"], ref["losses"])))),
        "params_max_rel_diff": max_rel_diff(out["params"], ref["params"]),
        "mu_max_rel_diff": max_rel_diff(out["mu"], ref["mu"]),
        "nu_max_rel_diff": max_rel_diff(out["nu"], ref["nu"]),
        "sharding_errors": out["sharding_errors"], "named_leaves": out["named_leaves"],
        "donated": out["donated"], "activation_constraints": out["activation_constraints"],
        "eval_loss": out["eval_loss"],
        "eval_activation_constraints": out["eval_activation_constraints"],
        "seconds": round(time.perf_counter() - t, 1)}
  # The default configs' bf16 matmul operands on a mesh that splits batch, fsdp and
  # tensor at once: the same training up to bf16 rounding flips. No held-out step: the
  # float32 meshes check it, and its two compiles cost ~2.6 s of CPU.
  bf16_ref = run("(1,1,1)", devices[:1], batches, "bfloat16", evaluate=False)
  bf16 = run("(2,2,2)", devices, batches, "bfloat16", evaluate=False)
  report["bf16_2x2x2"] = {
      "losses": bf16["losses"], "reference_losses": bf16_ref["losses"],
      "params_max_rel_diff": max_rel_diff(bf16["params"], bf16_ref["params"]),
      "sharding_errors": bf16["sharding_errors"]}
  report["seconds"] = round(time.perf_counter() - t0, 1)
  print("RESULT " + json.dumps(report))


def main_experts(mode: str, mesh_shapes, num_steps: int = 2):
  """One expert mode: the single-device reference and each mesh (float32 operands, no
  held-out step: the train step is what grouping changes)."""
  devices = jax.devices()
  c = equality_config("(1,1,1)")
  it = iter(input_pipeline.make_train_dataset(c.data, c.seed, c.batch_size))
  batches = [next(it) for _ in range(num_steps)]
  ref = run("(1,1,1)", devices[:1], batches, experts=mode, evaluate=False)
  report = {"reference_losses": ref["losses"], "meshes": {}}
  for shape in mesh_shapes:
    out = run(shape, devices, batches, experts=mode, evaluate=False)
    report["meshes"][shape] = {
        "losses": out["losses"], "params_max_rel_diff": max_rel_diff(out["params"],
                                                                     ref["params"]),
        "sharding_errors": out["sharding_errors"], "named_leaves": out["named_leaves"],
        "collectives": out["collectives"], "expert_specs": out["expert_specs"]}
  print("RESULT " + json.dumps(report))


if __name__ == "__main__":
  if sys.argv[1:2] == ["--experts"]:   # --experts MODE MESH...
    main_experts(sys.argv[2], sys.argv[3:])
  else:
    main(sys.argv[1:] or ["(8,1,1)", "(2,4,1)", "(2,2,2)", "(1,1,8)"])
