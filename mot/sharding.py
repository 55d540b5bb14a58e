"""Mesh, logical axis rules and multi-host set-up. Mesh axes and rules come from the
config; layer code only ever names logical axes."""
from __future__ import annotations

import ast
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mot.config import ConfigError

BATCH_AXES = ("data", "fsdp")


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
  """Mesh with Auto axis types (linen's logical constraints reject Explicit axes)."""
  devices = jax.devices() if devices is None else devices
  axes = tuple(config.mesh_axes)
  shape = parse_mesh_shape(config.mesh_shape, axes, len(devices))
  return jax.make_mesh(shape, axes, axis_types=(jax.sharding.AxisType.Auto,) * len(axes),
                       devices=devices)


def logical_rules(config: Any) -> tuple[tuple[str, Any], ...]:
  return tuple((name, tuple(axis) if isinstance(axis, list) else axis)
               for name, axis in config.logical_axis_rules)


def logical_shardings(boxed_tree, mesh, rules):
  """NamedShardings for a tree of (possibly) LogicallyPartitioned leaves."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh, ndim: int = 2) -> NamedSharding:
  """Leading batch axis split over data and fsdp; everything else replicated."""
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  return NamedSharding(mesh, P(axes, *([None] * (ndim - 1))))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(mesh, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Assembles this process's rows of the global batch into sharded global arrays."""
  return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v)
          for k, v in local_batch.items()}


def batch_divisor(mesh) -> int:
  """The global batch must be a multiple of the data-parallel device count."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.axis_names)
