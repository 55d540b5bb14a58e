"""bench/memory_plan.py on configs/scale.py:tiny over 2 fake devices: its JSON agrees with
the parameter count and the mesh, and rematerialisation lowers the temporaries."""
import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np

from configs import scale
from mot import config as config_lib
from mot import step as step_lib
from mot.model import MoT
from tests import _procs

FSDP = 2   # the mesh (1, 2, 1): weights split over fsdp where the rules say so


def run_plan(*args):
  env = dict(os.environ, PYTHONPATH=_procs.ROOT)
  return subprocess.run([sys.executable, "-m", "bench.memory_plan", *args], cwd=_procs.ROOT,
                        env=env, capture_output=True, text=True, timeout=300)


def expected_param_bytes(config) -> tuple[int, int]:
  """(parameters, bytes of one device's shards) from the logical names and the rules
  table, on a (1, FSDP, 1) mesh: a dim whose name maps to fsdp is split when it divides."""
  model, tx = MoT(config_lib.validate(config)), step_lib.make_optimizer(config)
  boxed = jax.eval_shape(step_lib.init_state_fn(model, tx, 8), jax.random.PRNGKey(0)).params
  rules = dict(config.logical_axis_rules)
  count, per_device = 0, 0
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    shape, split = leaf.value.shape, 1
    for name, dim in zip(leaf.names, shape):
      axes = rules.get(name)
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      if "fsdp" in axes and dim % FSDP == 0:
        split = FSDP
    count += math.prod(shape)
    per_device += math.prod(shape) * leaf.value.dtype.itemsize // split
  return count, per_device


def test_memory_plan_prints_per_device_bytes_and_remat_lowers_temp():
  proc = run_plan("--config", "configs/scale.py:tiny", "--mesh_shape", f"(1,{FSDP},1)")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  b = result["per_device_bytes"]
  assert {"params", "optimizer", "temp", "total"} <= set(b), b
  config = scale.get_config("tiny")
  count, per_device = expected_param_bytes(config)
  assert result["num_params"] == count
  assert b["params"] == per_device
  assert count * 4 / FSDP <= b["params"] < count * 4   # float32, mostly split
  # AdamW: mu and nu like the parameters, plus a few int32 step counters.
  assert 0 <= b["optimizer"] - 2 * b["params"] <= 64, (b["optimizer"], b["params"])
  assert b["ema"] == b["params"]
  # The batch is split over the fsdp devices: rows / FSDP per device.
  rows = config.batch_size // FSDP
  assert b["inputs"] > rows * config.data.seq_len * 4
  # XLA's arguments are exactly the state, the batch and the rng.
  assert result["xla"]["argument"] == sum(b[k] for k in ("params", "optimizer", "ema",
                                                           "inputs"))
  assert b["total"] >= b["params"] + b["optimizer"] + b["ema"] + b["temp"]
  assert result["remat_policy"] == "nothing_saveable"
  other = result["other_remat"]
  assert other["remat_policy"] == "none"
  assert b["temp"] < other["per_device_bytes"]["temp"], (b["temp"], other)
  assert np.isclose(other["per_device_bytes"]["params"], b["params"])


def test_memory_plan_refuses_a_mesh_without_sizes():
  proc = run_plan("--config", "configs/scale.py:tiny", "--mesh_shape", "(1,-1,1)")
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith("error: --mesh_shape") and "Traceback" not in proc.stderr, \
      proc.stderr[-2000:]
