"""Subprocess helpers for the multi-device tests: fake CPU devices, timeouts, clean kills.

Each child gets its own session (process group), so a hung or failed run is killed with
everything it started; its stdout and stderr go to a log file whose tail the assertion
message quotes.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Same program, cheaper compiles: the equality tests compare runs compiled alike, and
# the backend's LLVM optimisations are most of a tiny model's compile time on 2 cores.
# conftest.py sets them for the whole suite.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def with_fast_compile(xla_flags: str) -> str:
  """`xla_flags` with FAST_COMPILE_FLAGS appended, unless they are already there."""
  if FAST_COMPILE_FLAGS in xla_flags:
    return xla_flags
  return f"{xla_flags} {FAST_COMPILE_FLAGS}".strip()


def cpu_env(num_devices: int) -> dict[str, str]:
  """Environment for a child that sees `num_devices` fake CPU devices (set before JAX is
  imported; the pytest process itself keeps its single device)."""
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = (f"{with_fast_compile(env.get('XLA_FLAGS', ''))} "
                      f"--xla_force_host_platform_device_count={num_devices}")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def tail(path: str, chars: int = 3000) -> str:
  try:
    with open(path, errors="replace") as f:
      text = f.read()
  except OSError as e:
    return f"<no log: {e}>"
  # The gloo rendezvous chatter says nothing useful.
  lines = [l for l in text.splitlines() if not l.startswith("[Gloo]")]
  return "\n".join(lines)[-chars:]


def _kill(proc: subprocess.Popen) -> None:
  if proc.poll() is None:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  proc.wait()


def run_all(commands: list[tuple[list[str], dict, str]], timeout: float, what: str) -> float:
  """Runs (argv, env, log_path) commands side by side; all must exit 0 within `timeout`
  seconds. On a failure or timeout every child is killed and the assertion message
  carries each log's tail. Returns the wall time."""
  start = time.monotonic()
  procs = []
  try:
    for argv, env, log_path in commands:
      with open(log_path, "w") as log:
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    failed = None
    while any(p.poll() is None for p in procs):
      failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
      if failed is not None or time.monotonic() - start > timeout:
        break
      time.sleep(0.2)
    timed_out = any(p.poll() is None for p in procs) and failed is None
  finally:
    for p in procs:
      _kill(p)
  codes = [p.returncode for p in procs]
  if timed_out or any(codes):
    reason = f"timed out after {timeout:.0f}s" if timed_out else f"exit codes {codes}"
    logs = "\n".join(f"--- {' '.join(argv[1:3])} ... (log {log_path}) ---\n{tail(log_path)}"
                     for argv, _, log_path in commands)
    raise AssertionError(f"{what}: {reason}\n{logs}")
  return time.monotonic() - start


def python() -> str:
  return sys.executable


def snapshot(path):
  """{relative path: bytes} of every file under path (to prove a workdir untouched)."""
  out = {}
  for dirpath, _, files in os.walk(path):
    for name in files:
      full = os.path.join(dirpath, name)
      with open(full, "rb") as f:
        out[os.path.relpath(full, path)] = f.read()
  return out
