"""Mesh, logical axis rules, parameter and batch shardings, multi-host input.

Mesh axes and rules come from the config; layer code only ever names logical axes.

  mesh = make_mesh(config)                      # Auto axis types, "(-1,1,1)" style shapes
  rules = logical_rules(config)
  shardings = logical_shardings(eval_shape_tree, mesh, rules)
  index, count = data_shard(mesh, config.batch_size)   # this process's rows of each batch
  batch = global_batch(mesh, local_rows, config.batch_size)

Multi-host input: global batch j is the same rows for any number of processes (the data
pipeline's block j); each process loads only the rows its devices hold — on CPU and GPU
meshes (devices ordered by process) rows [p*B/P, (p+1)*B/P) — and
`jax.make_array_from_process_local_data` assembles the global array without moving data
between hosts.
"""
from __future__ import annotations

import ast
import contextlib
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from mot.config import ConfigError

BATCH_AXES = ("data", "fsdp")


# ----------------------------------------------------------------------------------------
# Mesh and rules.
# ----------------------------------------------------------------------------------------
def parse_mesh_shape(mesh_shape: str | tuple, axes: tuple[str, ...], num_devices: int
                     ) -> tuple[int, ...]:
  """"(-1,1,1)" -> concrete sizes whose product is num_devices (one -1 takes the rest)."""
  try:
    shape = ast.literal_eval(mesh_shape) if isinstance(mesh_shape, str) else mesh_shape
    shape = tuple(int(s) for s in shape)
  except (ValueError, SyntaxError, TypeError):
    raise ConfigError(f"config.mesh_shape={mesh_shape!r} is not a tuple of ints: "
                      "write e.g. '(-1,1,1)'") from None
  if len(shape) != len(axes):
    raise ConfigError(f"config.mesh_shape={mesh_shape!r} has {len(shape)} entries but "
                      f"config.mesh_axes={tuple(axes)} has {len(axes)}")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ConfigError(f"config.mesh_shape={mesh_shape!r}: sizes must be positive, "
                      "with at most one -1")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ConfigError(f"config.mesh_shape={mesh_shape!r} does not divide the "
                        f"{num_devices} devices")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ConfigError(f"config.mesh_shape={mesh_shape!r} needs {math.prod(shape)} devices "
                      f"but {num_devices} are available: use -1 on one axis")
  return shape


def make_mesh(config: Any, devices=None) -> jax.sharding.Mesh:
  """Mesh with Auto axis types (linen's logical constraints reject Explicit axes).

  Use it with `jax.set_mesh(mesh)`: the old `with mesh:` silently drops linen's
  activation constraints in this JAX.
  """
  devices = jax.devices() if devices is None else devices
  axes = tuple(config.mesh_axes)
  shape = parse_mesh_shape(config.mesh_shape, axes, len(devices))
  return jax.make_mesh(shape, axes, axis_types=(jax.sharding.AxisType.Auto,) * len(axes),
                       devices=devices)


def logical_rules(config: Any) -> tuple[tuple[str, Any], ...]:
  return tuple((name, tuple(axis) if isinstance(axis, list) else axis)
               for name, axis in config.logical_axis_rules)


# ----------------------------------------------------------------------------------------
# Parameter and optimizer-state shardings.
# ----------------------------------------------------------------------------------------
def _as_tuple(axes) -> tuple[str, ...]:
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def mesh_spec(names: tuple[str | None, ...], shape: tuple[int, ...], mesh, rules
              ) -> tuple[P, list[str]]:
  """The rules' PartitionSpec for an array with logical `names`, and what was dropped.

  jit refuses shardings that do not divide a dimension (e.g. 2 KV heads on tensor=4):
  such a dimension keeps the longest prefix of its mesh axes that divides it (often
  none: replicated), and the dropped axes are returned for a warning.
  """
  spec = nn.logical_to_mesh_axes(names, rules)
  entries, dropped = [], []
  for dim, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * len(shape))):
    axes = _as_tuple(axes)
    keep = len(axes)
    while keep and size % math.prod(mesh.shape[a] for a in axes[:keep]):
      keep -= 1
    if keep < len(axes):
      dropped.append(f"dim {dim} ({names[dim]}={size}) not split over "
                     f"{'x'.join(axes[keep:])}")
    entries.append(None if keep == 0 else axes[0] if keep == 1 else axes[:keep])
  return P(*entries), dropped


def logical_shardings(boxed_tree, mesh, rules, warn: bool = True):
  """NamedShardings for a tree (usually from `jax.eval_shape`) with nn.Partitioned leaves.

  Logically named leaves follow `rules` (see `mesh_spec`); unnamed leaves (step counters,
  rngs) are replicated. The optimizer state must come from `tx.init` on the *boxed*
  parameters, so Adam's mu and nu carry the parameters' names and are sharded like them.
  """
  warnings = {}  # one line per parameter, not again for its EMA and Adam copies

  def leaf_sharding(path, leaf):
    if not isinstance(leaf, nn.Partitioned):
      return NamedSharding(mesh, P())
    shape = leaf.value.shape
    if isinstance(leaf, nn.LogicallyPartitioned):
      spec, dropped = mesh_spec(tuple(leaf.names), shape, mesh, rules)
    else:  # nn.Partitioned names mesh axes directly
      spec, dropped = P(*leaf.names), []
    name = "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
    warnings.update({f"{name}: {d}": None for d in dropped})
    return NamedSharding(mesh, spec)

  out = jax.tree_util.tree_map_with_path(
      leaf_sharding, boxed_tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  if warn and warnings:
    logging.warning("Mesh %s does not divide %d parameter dimension(s); they are "
                    "replicated instead: %s", dict(mesh.shape), len(warnings),
                    "; ".join(list(warnings)[:6]))
  return out


def batch_shards(batch: int) -> int:
  """Into how many blocks of rows the logical rules split a batch of `batch` rows under
  the mesh of the current trace (`jax.set_mesh`): the product of the mesh axes that
  "activation_batch" maps to (the prefix that divides `batch`, as `mesh_spec`); 1 without
  a mesh or rules. Layer code asks this instead of naming mesh axes (`mot.experts`)."""
  mesh = jax.sharding.get_abstract_mesh()
  rules = nn.get_logical_axis_rules()
  if mesh.empty or not rules:
    return 1
  spec, _ = mesh_spec(("activation_batch",), (batch,), mesh, rules)
  return math.prod(mesh.shape[a] for a in _as_tuple(spec[0]))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# ----------------------------------------------------------------------------------------
# Batches (multi-host input).
# ----------------------------------------------------------------------------------------
def batch_sharding(mesh, ndim: int = 2) -> NamedSharding:
  """Leading batch axis split over data and fsdp; everything else replicated."""
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  return NamedSharding(mesh, P(axes, *([None] * (ndim - 1))))


def batch_divisor(mesh) -> int:
  """The global batch must be a multiple of the data-parallel device count."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.axis_names)


def process_rows(mesh, batch_size: int) -> tuple[int, int]:
  """[start, stop): the rows of every global batch that this process's devices hold.

  With one process, or a mesh whose batch axes do not cross processes, that is all rows.
  """
  indices = batch_sharding(mesh, 1).addressable_devices_indices_map((batch_size,))
  spans = sorted({idx[0].indices(batch_size)[:2] for idx in indices.values()})
  start, stop = spans[0][0], spans[-1][1]
  if sum(b - a for a, b in spans) != stop - start:
    raise ConfigError(f"this process's devices hold rows {spans} of the batch, not one "
                      "block: order the mesh devices by process (jax.make_mesh does)")
  return start, stop


def data_shard(mesh, batch_size: int) -> tuple[int, int]:
  """(shard_index, shard_count) for the data pipeline: global batch j split into
  shard_count blocks of batch_size // shard_count rows, of which this process loads
  block shard_index (`process_rows`)."""
  start, stop = process_rows(mesh, batch_size)
  rows = stop - start
  if batch_size % rows or start % rows:
    raise ConfigError(f"rows [{start}, {stop}) of a batch of {batch_size} are not one of "
                      "equal blocks: check config.mesh_shape against the process count")
  return start // rows, batch_size // rows


def global_batch(mesh, batch: dict[str, np.ndarray], batch_size: int | None = None
                 ) -> dict[str, jax.Array]:
  """Sharded global arrays [batch_size, ...] from numpy rows on this process.

  `batch` holds either this process's rows (`process_rows`) or the whole global batch
  (then each device takes its own rows of it). batch_size=None means the rows are
  this process's share of a uniformly split batch.
  """
  def put(v):
    shape = None if batch_size is None else (batch_size, *v.shape[1:])
    return jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v, shape)
  return {k: put(v) for k, v in batch.items()}


def put_rows(mesh, tree):
  """Host arrays [B, ...] (one process) onto `mesh`: rows split over the batch axes
  where B divides, else replicated; scalars replicated. Sampling's batches."""
  def put(x):
    x = np.asarray(x)
    split = x.ndim and x.shape[0] % batch_divisor(mesh) == 0
    return jax.device_put(x, batch_sharding(mesh, x.ndim) if split else replicated(mesh))
  return jax.tree.map(put, tree)


@contextlib.contextmanager
def on_mesh(mesh, rules):
  """The context a jitted function is traced in to run on `mesh`: the mesh itself (for
  linen's activation constraints: `jax.set_mesh`, not `with mesh:`) and the rules."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def replicate(mesh, tree):
  """Host-local arrays that are equal on every process (seeds, rngs) as global replicated
  arrays: orbax refuses to save host-local arrays when there are several processes."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      replicated(mesh), np.asarray(x), np.shape(x)), tree)
