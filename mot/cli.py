"""Shared plumbing of the entry points: clean one-line errors and multi-host set-up."""
from __future__ import annotations

import contextlib
import ctypes
import logging as py_logging
import os
import sys

from absl import app, flags
from absl import logging

from mot import errors

# Nothing here imports JAX at module level: the entry points call tune_malloc() right
# after importing this module, before JAX (and its threads and allocations) start.

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_malloc_mode = "default"   # what tune_malloc() did in this process


def tune_malloc() -> str:
  """Keeps glibc malloc from returning XLA's per-step scratch memory to the kernel.

  XLA's CPU runtime allocates a step's temporaries at the start of every step and frees
  them at its end. glibc serves large blocks with mmap and gives them back with munmap
  (and trims the heap above its trim threshold), so every step page-faults fresh memory
  again: a large share of a CPU step's wall time goes to the kernel. With one arena, no
  mmap and no trimming, freed blocks stay in the heap and the next step reuses them, as
  tcmalloc does. Returns what it did: "glibc-tuned"; "tcmalloc" when tcmalloc is
  preloaded (it keeps memory itself); "default" on other platforms or MOT_MALLOC=default.
  """
  global _malloc_mode
  _malloc_mode = _tune_malloc()
  return _malloc_mode


def malloc_mode() -> str:
  """What `tune_malloc` did in this process ("default" if it was not called)."""
  return _malloc_mode


def _tune_malloc() -> str:
  if "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
    return "tcmalloc"
  if os.environ.get("MOT_MALLOC") == "default" or not sys.platform.startswith("linux"):
    return "default"
  try:
    mallopt = ctypes.CDLL("libc.so.6").mallopt
  except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
    return "default"
  ok = all(mallopt(param, value) == 1 for param, value in (
      (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)))
  return "glibc-tuned" if ok else "default"


def fail(message: str, code: int = 1):
  """Prints `error: message` on stderr and exits non-zero, without a traceback."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def one_line(message: str) -> str:
  """Collapses a multi-line library message into one line."""
  return " ".join(str(message).split())


def _config_file_arg(argv) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def parse_flags(argv):
  """absl flags parser whose failures are one `error:` line and exit status 2.

  Also forces ml_collections to load the --config file now, so that a missing file, a
  syntax error in it, a bad variant or an unknown --config.FIELD fails here, cleanly.
  """
  FLAGS = flags.FLAGS
  try:
    rest = FLAGS(argv)
    if "config" in FLAGS and FLAGS["config"].present:
      FLAGS.config.keys()
    return rest
  except flags.IllegalFlagValueError as e:
    text = str(e)
    if "Traceback" in text:  # an exception raised inside the config file: keep its last line
      text = text.split("--config")[0] + "--config: " + text.strip().splitlines()[-1]
    fail(one_line(text), code=2)
  except flags.Error as e:
    fail(f"{one_line(e)} (see --help)", code=2)
  except (OSError, SyntaxError) as e:
    fail(f"cannot load --config {_config_file_arg(argv)}: "
         f"{one_line(str(e).splitlines()[-1])}", code=2)
  except (AttributeError, KeyError) as e:
    fail(f"a --config.FIELD override names no field of the config: {one_line(e)}", code=2)
  except (ValueError, TypeError) as e:
    fail(f"bad --config: {one_line(e)}", code=2)


def run(main):
  """app.run with clean flag errors."""
  app.run(main, flags_parser=parse_flags)


@contextlib.contextmanager
def clean_errors():
  """Turns the errors a user can fix (bad config, missing checkpoint, ...) into one line."""
  try:
    yield
  except errors.USER_ERRORS as e:
    fail(one_line(e))
  except KeyboardInterrupt:
    fail("interrupted", code=130)


class _QuietLibraries:
  """absl handler filter: library INFO chatter (orbax, grain) hidden, warnings kept."""
  NOISY = ("orbax", "grain", "tensorstore", "xla_bridge")

  def filter(self, record) -> bool:
    if record.levelno >= py_logging.WARNING:
      return True
    return not any(name in record.pathname for name in self.NOISY)


def configure_logging() -> None:
  """INFO for mot's own messages; third-party INFO logs filtered out."""
  import jax  # lazy: entry points tune malloc before JAX loads (tune_malloc)
  logging.get_absl_handler().addFilter(_QuietLibraries())  # before JAX starts its backends
  # Processes other than 0 would only repeat process 0's lines.
  logging.set_verbosity(logging.INFO if jax.process_index() == 0 else logging.WARNING)


def maybe_initialize_distributed(coordinator_address=None, num_processes=None,
                                 process_id=None) -> None:
  """Calls jax.distributed.initialize when flags or JAX_* environment variables ask."""
  address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and os.environ.get("JAX_PROCESS_ID"):
    process_id = int(os.environ["JAX_PROCESS_ID"])
  if address is None and num_processes is None:
    return
  import jax  # lazy: entry points tune malloc before JAX loads (tune_malloc)
  jax.distributed.initialize(coordinator_address=address, num_processes=num_processes,
                             process_id=process_id)
