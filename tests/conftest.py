"""Shared fixtures. Tests run on the CPU; multi-device tests start subprocesses with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX is imported)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def tiny_config():
  from configs import digits
  return digits.get_config("tiny")
