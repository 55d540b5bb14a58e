"""Orbax checkpoints of the train state, the grain iterator state and the config.

Saves are asynchronous (training does not wait); `close()` waits for the last one.
Orbax writes each step into a temporary directory and renames it when complete, so a
save interrupted by a crash never damages an older checkpoint.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import grain
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from mot.errors import CheckpointError, ConfigError  # noqa: F401  (also mot.checkpoint's name)
from etils import epath

CHECKPOINT_DIR = "checkpoints"
CHUNK_BYTES = 64 << 20   # storage chunks of `save_host_state`: bounds its write buffers


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


def save_host_state(workdir: str, step: int, state: Any, config: dict, log: dict,
                    concurrent_gb: int = 1) -> None:
  """Saves a state of host (numpy) arrays synchronously, in `save`'s layout (`restore`
  reads it), without copying them: orbax deep-copies host arrays before an asynchronous
  write, which for a converted model's parameters, EMA and zero moments (views of one
  another) is several times their memory. At most `concurrent_gb` GB are written at a
  time, in storage chunks of CHUNK_BYTES."""
  registry = ocp.type_handlers.create_type_handler_registry(
      (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
      (np.number, ocp.type_handlers.ScalarHandler()))
  # Without OCDBT: with it, more of the written bytes stayed in memory until the commit.
  handlers = {"state": ocp.PyTreeCheckpointHandler(save_concurrent_gb=concurrent_gb,
                                                   use_ocdbt=False,
                                                   type_handler_registry=registry),
              "config": ocp.JsonCheckpointHandler(), "log": ocp.JsonCheckpointHandler()}
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  with ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                             item_handlers=handlers) as manager:
    chunks = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), state)
    manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state, chunks),
                                               config=ocp.args.JsonSave(config),
                                               log=ocp.args.JsonSave(log)))
    manager.wait_until_finished()


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


# ----------------------------------------------------------------------------------------
# Read-only access for sampling and evaluation.
# ----------------------------------------------------------------------------------------
def available_steps(workdir: str) -> list[int]:
  """Steps of the complete checkpoints in `workdir`, oldest first.

  Raises CheckpointError (one line) for a missing workdir, a workdir that is a file, or
  a workdir without any checkpoint.
  """
  if not os.path.exists(workdir):
    raise CheckpointError(f"workdir {workdir} does not exist")
  if not os.path.isdir(workdir):
    raise CheckpointError(f"workdir {workdir} is a file, not a directory")
  steps = []
  if os.path.isdir(checkpoint_dir(workdir)):  # Finalized steps only (no *-tmp-* saves).
    steps = ocp.utils.checkpoint_steps(checkpoint_dir(workdir))
  if not steps:
    raise CheckpointError(f"no checkpoint in workdir {workdir}: train first, e.g. "
                          f"python train.py --config configs/digits.py --workdir {workdir}")
  return sorted(int(s) for s in steps)


def restore_params(workdir: str, step: int | None = None, use_ema: bool = True,
                   device=None, shardings: Callable[[dict], Any] | None = None
                   ) -> tuple[Any, dict, int]:
  """(params, saved config dict, step) of one checkpoint, without the optimizer state.

  Reads only the parameter subtree (the EMA parameters when `use_ema` and present) onto
  one device, or, with `shardings` (saved config dict -> a tree of ShapeDtypeStructs
  carrying NamedShardings, shaped as the parameters), straight into those shardings:
  each device reads its own shards, no device ever holds a whole parameter it does not
  keep. With `step=None` the newest checkpoint is used; one that cannot be read is
  skipped with a warning naming it when an older one exists. Every failure is a
  CheckpointError with a one-line message.
  """
  steps = available_steps(workdir)
  if step is not None:
    if int(step) not in steps:
      raise CheckpointError(f"no checkpoint at step {step} in workdir {workdir}; "
                            f"available steps: {steps}")
    candidates = [int(step)]
  else:
    candidates = steps[::-1]
  errors = []
  for s in candidates:
    try:
      params, config = _restore_params_at(workdir, s, use_ema, device, shardings)
    except (CheckpointError, ConfigError):
      raise   # from `shardings`: the config or the mesh, not a damaged checkpoint
    except Exception as e:  # pylint: disable=broad-except  (any damage: try the next)
      reason = " ".join(str(e).split())[:200] or type(e).__name__
      errors.append(f"step {s}: {reason}")
      if s != candidates[-1]:
        logging.warning("checkpoint %s cannot be read (%s); trying an older one",
                        os.path.join(checkpoint_dir(workdir), str(s)), reason)
      continue
    return params, config, s
  raise CheckpointError(f"no readable checkpoint in workdir {workdir} ({'; '.join(errors)})")


def _restore_params_at(workdir: str, step: int, use_ema: bool, device, shardings
                       ) -> tuple[Any, dict]:
  config = saved_config(workdir, step)
  if not isinstance(config, dict) or "model" not in config:
    raise ValueError("its config JSON has no model section")
  path = epath.Path(os.path.join(checkpoint_dir(workdir), str(step), "state"))
  handler = ocp.PyTreeCheckpointHandler()
  tree = handler.metadata(path).tree
  # The train state sits at the top of the item or under "state" (beside e.g. the rng).
  prefix = ()
  if "params" not in tree and isinstance(tree.get("state"), dict):
    prefix, tree = ("state",), tree["state"]
  key = "ema_params" if use_ema and "ema_params" in tree else "params"
  if key not in tree:
    raise ValueError("its state holds no params")
  if shardings is not None:
    abstract = shardings(config)
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
  else:
    # Read as host arrays, then put them on the device uncommitted (like any jnp array),
    # so jitted samplers compiled for in-memory parameters are reused for restored ones.
    abstract = jax.tree.map(lambda m: np.zeros((), m.dtype), tree[key])
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
  item, restore_args = {key: abstract}, {key: restore_args}
  for name in reversed(prefix):
    item, restore_args = {name: item}, {name: restore_args}
  restored = handler.restore(path, args=ocp.args.PyTreeRestore(
      item=item, restore_args=restore_args, partial_restore=True))
  for name in prefix:
    restored = restored[name]
  if shardings is not None:
    return restored[key], config
  put = (lambda x: jax.device_put(x, device)) if device is not None else jnp.asarray
  return jax.tree.map(put, restored[key]), config
