"""Shared fixtures. Tests run on the CPU; multi-device tests start subprocesses with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX is imported)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the whole session (set in the pytest-xdist
# controller before it starts its workers, so they share it; inherited by the training
# subprocesses): the same tiny programs are compiled once instead of once per process.
import tempfile  # noqa: E402
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # workers inherit the controller's
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="mot-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The suite compiles hundreds of small programs and runs each a few times: XLA's LLVM
# optimisations are most of its time on 2 cores and change no semantics (train.py and the
# benchmarks keep them). Inherited by the subprocesses too.
from tests._procs import with_fast_compile  # noqa: E402
os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS", ""))

import pytest  # noqa: E402


@pytest.fixture
def tiny_config():
  from configs import digits
  return digits.get_config("tiny")
