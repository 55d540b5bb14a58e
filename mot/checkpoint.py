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
         config: dict | None = None, force: bool = False) -> bool:
  items = {"state": ocp.args.StandardSave(state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  if config is not None:
    items["config"] = ocp.args.JsonSave(config)
  return manager.save(step, args=ocp.args.Composite(**items), force=force)


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) describing `tree`, the target of a restore."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: Any, data_iter=None):
  """Restores (state, config dict) at `step`; the data iterator is restored in place."""
  items = {"state": ocp.args.StandardRestore(abstract_state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return restored["state"]


def saved_config(workdir: str, step: int) -> dict:
  """The config JSON stored beside a checkpoint (read without orbax: it is plain JSON)."""
  path = os.path.join(checkpoint_dir(workdir), str(step), "config", "metadata")
  with open(path) as f:
    return json.load(f)
