"""Meshes, sharding rules and sharded training on 8 fake CPU devices.

The 8-device runs happen in one subprocess (tests/_sharding_worker.py): the device count
must be set before JAX is imported, and this pytest process keeps its single device.
"""
import collections
import json

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from mot import sharding
from mot.config import ConfigError
from tests import _procs

# Data with fsdp, all three axes, tensor alone. Pure data parallelism, (8,1,1), is left
# out: it is (2,4,1)'s data axis at another size, and a mesh's compiles cost the suite
# ~10 s (docs/performance.md §6).
MESHES = ("(2,4,1)", "(2,2,2)", "(1,1,8)")
AXES = ("data", "fsdp", "tensor")


def abstract_mesh(shape):
  return AbstractMesh(shape, AXES)


@pytest.mark.parametrize("text, devices, want", [
    ("(-1,1,1)", 8, (8, 1, 1)), ("(2,-1,2)", 8, (2, 2, 2)), ("(1,1,1)", 1, (1, 1, 1))])
def test_parse_mesh_shape(text, devices, want):
  assert sharding.parse_mesh_shape(text, AXES, devices) == want


@pytest.mark.parametrize("text, match", [
    ("(3,1,1)", "needs 3 devices"), ("(-1,-1,1)", "at most one -1"), ("(2,2)", "3"),
    ("2x2", "not a tuple"), ("(-1,3,1)", "does not divide")])
def test_parse_mesh_shape_errors_name_the_field(text, match):
  with pytest.raises(ConfigError, match=match):
    sharding.parse_mesh_shape(text, AXES, 8)


def test_mesh_spec_follows_the_rules(tiny_config):
  rules = sharding.logical_rules(tiny_config)
  mesh = abstract_mesh((2, 2, 2))
  spec, dropped = sharding.mesh_spec(("layers", "embed", "mlp_pair", "mlp"), (2, 64, 2, 128),
                                     mesh, rules)
  assert spec == P(None, "fsdp", None, "tensor") and not dropped
  spec, _ = sharding.mesh_spec(("vocab", "embed"), (272, 64), mesh, rules)
  assert spec == P("tensor", "fsdp")


def test_mesh_spec_replicates_what_the_mesh_does_not_divide(tiny_config):
  """jit rejects uneven shardings: 1 KV head on tensor=4 is replicated, and said so."""
  rules = sharding.logical_rules(tiny_config)
  spec, dropped = sharding.mesh_spec(("layers", "embed", "kv_pair", "kv_heads", "kv"),
                                     (2, 64, 2, 1, 32), abstract_mesh((1, 2, 4)), rules)
  assert spec == P(None, "fsdp", None, None, None)
  assert dropped == ["dim 3 (kv_heads=1) not split over tensor"]
  # A dim on several mesh axes keeps the longest prefix that divides it.
  spec, _ = sharding.mesh_spec(("activation_batch",), (6,), abstract_mesh((2, 4, 1)), rules)
  assert spec == P("data")


def test_logical_shardings_warn_once_per_parameter(tiny_config, caplog):
  import flax.linen as nn
  rules = sharding.logical_rules(tiny_config)
  names = ("layers", "embed", "kv_pair", "kv_heads", "kv")
  box = lambda: nn.LogicallyPartitioned(jax.ShapeDtypeStruct((2, 64, 2, 1, 32), np.float32),
                                        names)
  state = collections.namedtuple("State", "params mu step")  # as TrainState and Adam's
  tree = state({"kv": box()}, {"kv": box()}, jax.ShapeDtypeStruct((), np.int32))
  with caplog.at_level("WARNING"):
    out = sharding.logical_shardings(tree, abstract_mesh((1, 2, 4)), rules)
  assert out.params["kv"].spec == out.mu["kv"].spec == P(None, "fsdp", None, None, None)
  assert out.step.spec == P()
  assert caplog.text.count("kv: dim 3 (kv_heads=1) not split over tensor") == 1, caplog.text


def test_single_process_loads_every_row(tiny_config):
  tiny_config.mesh_shape = "(1,1,1)"
  mesh = sharding.make_mesh(tiny_config, jax.devices()[:1])
  assert sharding.process_rows(mesh, 8) == (0, 8)
  assert sharding.data_shard(mesh, 8) == (0, 1)
  rows = {"tokens": np.arange(16, dtype=np.int32).reshape(8, 2)}
  batch = sharding.global_batch(mesh, rows, 8)
  np.testing.assert_array_equal(batch["tokens"], rows["tokens"])
  assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
  rng = sharding.replicate(mesh, jax.random.PRNGKey(0))
  assert rng.sharding.is_fully_replicated


def test_adam_state_carries_the_parameter_names(tiny_config):
  """mu and nu from tx.init on the *boxed* parameters carry the parameters' names."""
  import flax.linen as nn
  from mot import config as config_lib
  from mot import step as step_lib
  from mot.model import MoT
  tiny_config.mesh_shape = "(1,1,1)"
  model = MoT(config_lib.validate(tiny_config))
  tx = step_lib.make_optimizer(tiny_config)
  rules = sharding.logical_rules(tiny_config)
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(step_lib.init_state_fn(model, tx, 16), jax.random.PRNGKey(0))
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  names = lambda tree: [x.names for x in jax.tree.leaves(tree, is_leaf=is_box)]
  adam = boxed.opt_state[1][0]
  assert names(adam.mu) == names(adam.nu) == names(boxed.params) == names(boxed.ema_params)
  assert all(is_box(x) for x in jax.tree.leaves(boxed.params, is_leaf=is_box)), \
      "every parameter must carry logical axis names"


def test_sharded_training_equals_one_device(tmp_path):
  """Loss and updated parameters (and Adam's mu, nu) after 3 steps on each mesh equal the
  single-device run; parameters and optimizer state are born sharded as the rules say,
  and the step donates the state."""
  log = str(tmp_path / "worker.log")
  _procs.run_all([([_procs.python(), "tests/_sharding_worker.py", *MESHES],
                   _procs.cpu_env(8), log)], timeout=240, what="8-device sharding worker")
  with open(log) as f:
    line = next((l for l in f if l.startswith("RESULT ")), None)
  assert line, f"the worker printed no RESULT line:\n{_procs.tail(log)}"
  report = json.loads(line[len("RESULT "):])
  # XLA says so when a sharding can only be reached by gathering a whole array on every
  # device (it did for the embedding lookup and the timestep embedding's gradient).
  forced = [l for l in _procs.tail(log, 10**7).splitlines()
            if "Involuntary full rematerialization" in l]
  assert not forced, "XLA replicated an array to reshard it:\n" + "\n".join(forced[:3])
  ref = report["reference_losses"]
  assert len(ref) == 3 and all(np.isfinite(ref)), ref
  for mesh in MESHES:
    r = report["meshes"][mesh]
    np.testing.assert_allclose(r["losses"], ref, rtol=1e-5, err_msg=f"mesh {mesh} losses")
    for key in ("params_max_rel_diff", "mu_max_rel_diff", "nu_max_rel_diff"):
      assert r[key] < 2e-4, f"mesh {mesh}: {key}={r[key]:.2e} (relative to each leaf's max)"
    assert not r["sharding_errors"], f"mesh {mesh}:\n" + "\n".join(r["sharding_errors"][:20])
    # 21 parameters, each in params, ema_params, mu and nu.
    assert r["named_leaves"] == 84, r["named_leaves"]
    assert r["donated"], f"mesh {mesh}: the train step did not donate the old state"
    assert r["activation_constraints"] > 0, f"mesh {mesh}: no activation constraint " \
        "reached the program (a `with mesh:` instead of jax.set_mesh drops them)"
    # The held-out step too: jitted under the rules, it gives the single-device loss.
    np.testing.assert_allclose(r["eval_loss"], report["reference_eval_loss"], rtol=1e-5,
                               err_msg=f"mesh {mesh} held-out loss")
    assert r["eval_activation_constraints"] > 0, f"mesh {mesh}: eval_step without rules"
  # bf16 matmul operands (the default configs'): equal up to bf16 rounding flips (measured
  # 1e-4 relative in the losses, < 1 % in the weights after 3 Adam steps).
  b = report["bf16_2x2x2"]
  np.testing.assert_allclose(b["losses"], b["reference_losses"], rtol=1e-3,
                             err_msg="bf16 matmuls on mesh (2,2,2): losses")
  assert b["params_max_rel_diff"] < 3e-2, b["params_max_rel_diff"]
  assert not b["sharding_errors"], "\n".join(b["sharding_errors"][:20])


def _worker_report(log: str, args: list[str], what: str) -> dict:
  _procs.run_all([([_procs.python(), "tests/_sharding_worker.py", *args], _procs.cpu_env(8),
                   log)], timeout=240, what=what)
  with open(log) as f:
    line = next((l for l in f if l.startswith("RESULT ")), None)
  assert line, f"the worker printed no RESULT line:\n{_procs.tail(log)}"
  return json.loads(line[len("RESULT "):])


def test_experts_on_a_mesh_equal_one_device(tmp_path):
  """MoT experts train on a (2,2,2) mesh with the single-device losses; the expert
  weights shard by the rules (the expert axis unsplit, the rest as the shared weights);
  tokens are grouped per data shard, so no activation is replicated or sent all-to-all.
  "mode" only: "modality" runs the same grouped path with other group ids (its grouping
  is tested on one device in tests/test_experts.py), and a second 8-device worker
  doubled this test's share of the suite's budget."""
  experts = "mode"
  log = str(tmp_path / "worker.log")
  report = _worker_report(log, ["--experts", experts, "(2,2,2)"], f"experts={experts} worker")
  forced = [l for l in _procs.tail(log, 10**7).splitlines()
            if "Involuntary full rematerialization" in l]
  assert not forced, "XLA replicated an array to reshard it:\n" + "\n".join(forced[:3])
  ref = report["reference_losses"]
  r = report["meshes"]["(2,2,2)"]
  assert len(ref) == 2 and all(np.isfinite(ref)), ref
  np.testing.assert_allclose(r["losses"], ref, rtol=1e-5, err_msg="mesh (2,2,2) losses")
  assert r["params_max_rel_diff"] < 2e-4, r["params_max_rel_diff"]
  assert not r["sharding_errors"], "\n".join(r["sharding_errors"][:20])
  assert r["named_leaves"] == 84, r["named_leaves"]
  specs = r["expert_specs"]   # [layers, expert, ...]: split like the shared weights
  wi = "['backbone']['layers']['block']['mlp']['wi']['kernel']"
  assert specs[wi] == "P(None, None, 'fsdp', None, 'tensor')", specs[wi]
  assert all(spec.startswith("P(None, None") for spec in specs.values()), specs
  assert r["collectives"]["all-to-all"] == 0, r["collectives"]


def test_checkpoint_restores_on_another_mesh_and_on_one_device(tmp_path):
  """2 steps on (2,2,2), checkpointed as train.py does; restored onto (1,1,8) and onto
  one device, the parameters are the saved ones, sharded by the new mesh's rules, and
  the next step's loss is the one the original mesh computes. Meshes of MESHES, whose
  programs test_sharded_training_equals_one_device has put in the session's compilation
  cache (conftest.py): a mesh of its own cost this test ~8 s of CPU in compiles."""
  log = str(tmp_path / "worker.log")
  _procs.run_all([([_procs.python(), "tests/_restore_worker.py", str(tmp_path / "run"),
                    "(2,2,2)", "(1,1,8)", "(1,1,1)"], _procs.cpu_env(8), log)],
                 timeout=300, what="cross-mesh restore worker")
  with open(log) as f:
    line = next((l for l in f if l.startswith("RESULT ")), None)
  assert line, f"the worker printed no RESULT line:\n{_procs.tail(log)}"
  report = json.loads(line[len("RESULT "):])
  reference = report["losses"][2]
  assert np.isfinite(reference)
  for mesh, devices in (("(1,1,8)", 8), ("(1,1,1)", 1)):
    r = report["meshes"][mesh]
    assert r["restored_step"] == 2, r
    assert r["params_max_abs_diff"] == 0.0, r
    assert r["sharded_as_rules"] and r["devices"] == devices, r
    np.testing.assert_allclose(r["next_loss"], reference, rtol=1e-5, err_msg=mesh)
