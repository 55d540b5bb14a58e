"""Orbax checkpoints of the train state, the grain iterator state and the config.

Saves are asynchronous (training does not wait); `close()` waits for the last one.
Orbax writes each step into a temporary directory and renames it when complete, so a
save interrupted by a crash never damages an older checkpoint.
"""
from __future__ import annotations

import json
import os
from typing import Any

import grain
from absl import logging
import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
  """A workdir without a usable checkpoint; the message says what to do."""


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def make_manager(workdir: str, keep: int = 3, read_only: bool = False
                 ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                         enable_async_checkpointing=not read_only,
                                         read_only=read_only)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any, data_iter=None,
         config: dict | None = None, log: dict | None = None, force: bool = False) -> bool:
  """Starts an asynchronous save of `state` (any pytree of arrays) and its companions."""
  items = {"state": ocp.args.StandardSave(state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  if config is not None:
    items["config"] = ocp.args.JsonSave(config)
  if log is not None:
    items["log"] = ocp.args.JsonSave(log)
  return manager.save(step, args=ocp.args.Composite(**items), force=force)


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) describing `tree`, the target of a restore."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: Any, data_iter=None,
            with_log: bool = False) -> dict:
  """Restores {"state": ..., ["log": ...]} at `step`; the data iterator in place."""
  items = {"state": ocp.args.StandardRestore(abstract_state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  if with_log:
    items["log"] = ocp.args.JsonRestore()
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return {k: restored[k] for k in items if k != "data"}


def restore_newest(manager: ocp.CheckpointManager, workdir: str, check_step,
                   abstract_state: Any, data_iter=None, with_log: bool = True):
  """Restores the newest checkpoint that reads back whole; None when there is none.

  A damaged newest checkpoint (a crash mid-save on a filesystem without atomic renames,
  a truncated copy, a disk error) is skipped with a warning naming it, and the next
  older one is tried; when none restores, CheckpointError says so. `check_step(step)`
  may raise CheckpointError to refuse an incompatible checkpoint outright.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  failures = []
  for step in steps:
    check_step(step)
    try:
      return restore(manager, step, abstract_state, data_iter, with_log)
    except Exception as e:  # orbax/tensorstore raise many types for damaged files
      path = os.path.join(checkpoint_dir(workdir), str(step))
      failures.append(f"{path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
      logging.warning("Skipping damaged checkpoint %s (%s)", path, failures[-1])
  if failures:
    raise CheckpointError(f"no checkpoint in {checkpoint_dir(workdir)} could be read "
                          f"(newest: {failures[0]}): delete the damaged step directories or "
                          "use a new --workdir")
  return None


def saved_config(workdir: str, step: int) -> dict:
  """The config JSON stored beside a checkpoint (read without orbax: it is plain JSON)."""
  path = os.path.join(checkpoint_dir(workdir), str(step), "config", "metadata")
  with open(path) as f:
    return json.load(f)
