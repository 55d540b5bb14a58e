"""Subprocess half of tests/test_sharding.py's cross-mesh restore, on 8 fake CPU devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/_restore_worker.py \
      WORKDIR '(2,2,2)' '(1,1,8)' '(8,1,1)' '(1,1,1)'

Trains 2 steps on the first mesh and checkpoints them as train.py does (state, rng and the
grain iterator, `mot.checkpoint`), then takes the 3rd step there (the reference). Every
other mesh ('(1,1,1)': one device) starts from scratch as a resumed run would: the state
born sharded for its own mesh, the checkpoint restored onto those shardings, one step.
Prints one JSON line; the test judges.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# First: importing the sharding worker sets the 8 fake devices (before JAX is imported).
from tests._sharding_worker import equality_config  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from mot import checkpoint as ckpt_lib  # noqa: E402
from mot import sharding, train_lib  # noqa: E402
from mot import step as step_lib  # noqa: E402

SAVED_STEP = 2


def start(mesh_shape: str, workdir: str):
  """(training, data iterator, manager, state, rng): resumed from `workdir` if it holds a
  checkpoint, as train_lib.train_and_evaluate resumes."""
  config = equality_config(mesh_shape)
  devices = jax.devices()[:1] if mesh_shape == "(1,1,1)" else jax.devices()
  t = step_lib.build_training(config, devices)
  data_iter = iter(train_lib.process_train_dataset(config, t.mesh))
  manager = ckpt_lib.make_manager(workdir, keep=2)
  state, rng = t.state, t.step_rng
  restored = ckpt_lib.restore_newest(manager, workdir, lambda step: None,
                                     ckpt_lib.abstract_like({"state": state, "rng": rng}),
                                     data_iter)
  if restored is not None:
    state, rng = restored["state"]["state"], restored["state"]["rng"]
  return config, t, data_iter, manager, state, rng


def step(config, t, data_iter, state, rng):
  with jax.set_mesh(t.mesh):
    batch = sharding.global_batch(t.mesh, next(data_iter), config.batch_size)
    state, metrics = t.p_train_step(state, batch, rng)
  return state, float(metrics["loss"])


def sharded_as_rules(state, shardings) -> bool:
  return all(a.sharding.is_equivalent_to(s, a.ndim)
             for a, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))


def main(workdir: str, first: str, others: list[str]):
  config, t, data_iter, manager, state, rng = start(first, workdir)
  losses = []
  for _ in range(SAVED_STEP):
    state, loss = step(config, t, data_iter, state, rng)
    losses.append(loss)
  saved_params = jax.device_get(state.params)
  ckpt_lib.save(manager, SAVED_STEP, {"state": state, "rng": rng}, data_iter,
                config.to_dict(), {"history": []})
  manager.wait_until_finished()
  manager.close()
  state, loss = step(config, t, data_iter, state, rng)
  report = {"losses": losses + [loss], "meshes": {}}
  for shape in others:
    config, t, data_iter, manager, state, rng = start(shape, workdir)
    manager.close()
    restored_step = int(state.step)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(saved_params)))
    on_rules = sharded_as_rules(state, t.state_shardings)
    devices = len(state.params["ar_head"]["unembed"]["kernel"].sharding.device_set)
    state, loss = step(config, t, data_iter, state, rng)
    report["meshes"][shape] = {"restored_step": restored_step, "params_max_abs_diff": diff,
                               "sharded_as_rules": on_rules, "devices": devices,
                               "next_loss": loss}
  print("RESULT " + json.dumps(report))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3:])
