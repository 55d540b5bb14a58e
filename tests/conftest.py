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
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="mot-jax-cache-"))
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


# The modules that take longest, heaviest first (`--durations` on one core at fed1fec:
# 115, 123, 106, 105, 76, 58, 54, 54, 50 s). pytest-xdist's `--dist loadscope` hands
# modules to the two workers in collection order, so when these came alphabetically
# late, one worker ran test_sharding or test_warm_start while the other sat idle.
# Running them first lets the many short modules fill in at the end.
HEAVY_MODULES = ("test_multihost.py", "test_sharding.py", "test_bench.py",
                 "test_reliability.py", "test_evaluate.py", "test_warm_start.py",
                 "test_video.py", "test_train.py", "test_user_runs.py")


def pytest_collection_modifyitems(session, config, items):
  """Heavy modules first (stable: every other module, and every test, keeps its order)."""
  del session, config
  rank = {name: i for i, name in enumerate(HEAVY_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_MODULES)))
