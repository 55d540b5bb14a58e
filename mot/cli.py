"""Shared plumbing of the entry points: clean one-line errors and multi-host set-up."""
from __future__ import annotations

import contextlib
import os
import sys

from mot.config import ConfigError


def fail(message: str, code: int = 1):
  """Prints `error: message` on stderr and exits non-zero, without a traceback."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def _expected_errors():
  from mot.checkpoint import CheckpointError
  from mot.train_lib import TrainingError
  return (ConfigError, CheckpointError, TrainingError)


@contextlib.contextmanager
def clean_errors():
  """Turns the errors a user can fix (bad config, missing checkpoint, ...) into one line."""
  try:
    yield
  except _expected_errors() as e:
    fail(str(e))
  except KeyboardInterrupt:
    fail("interrupted", code=130)


class _QuietLibraries:
  """absl handler filter: library INFO chatter (orbax, grain) hidden, warnings kept."""
  NOISY = ("orbax", "grain", "tensorstore")

  def filter(self, record) -> bool:
    import logging as py_logging
    if record.levelno >= py_logging.WARNING:
      return True
    return not any(name in record.pathname for name in self.NOISY)


def configure_logging() -> None:
  """INFO for mot's own messages; third-party INFO logs filtered out."""
  from absl import logging
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_QuietLibraries())


def maybe_initialize_distributed(coordinator_address=None, num_processes=None,
                                 process_id=None) -> None:
  """Calls jax.distributed.initialize when flags or JAX_* environment variables ask."""
  address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if address is None and num_processes is None:
    return
  import jax
  jax.distributed.initialize(coordinator_address=address, num_processes=num_processes,
                             process_id=process_id)
