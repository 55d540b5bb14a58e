"""Checks of the options a user gives sampling (`mot.Pipeline`, sample.py): each bad value
is an `InputError` whose one line names the option and what it accepts."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mot import diffusion
from mot.data import moving_digits
from mot.errors import InputError


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def prompt_list(prompt: str | Sequence[str]) -> tuple[list[str], bool]:
  """(the prompts as a list, whether a single string was given); refuses empty ones."""
  single = isinstance(prompt, str)
  prompts = [prompt] if single else list(prompt)
  if not prompts:
    raise InputError("no prompt given")
  for p in prompts:
    if not isinstance(p, str):
      raise InputError(f"a prompt must be a string, got {type(p).__name__}")
    if not p.strip():
      raise InputError("empty prompt: give some text")
  return prompts, single


def check_shifts(shifts) -> None:
  """Test-time shifts for reading (`Pipeline.reason`): 0 (off), 1 or 2 pixels."""
  if not (_is_int(shifts) and 0 <= shifts <= 2):
    raise InputError(f"shifts={shifts!r} must be 0 (off), 1 or 2 pixels (--reason_shifts)")


def check_seed(seed) -> int:
  """The seed as an int in [0, 2**32)."""
  if not (_is_int(seed) and 0 <= seed < 2**32):
    raise InputError(f"seed={seed!r} must be an integer in [0, 2**32)")
  return int(seed)


def check_decoding(max_new_tokens, temperature, top_k, top_p) -> None:
  """AR decoding options: answer length and the sampling filters."""
  if not (_is_int(max_new_tokens) and max_new_tokens >= 1):
    raise InputError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
  if not (math.isfinite(temperature) and temperature >= 0):
    raise InputError(f"temperature={temperature!r} must be a finite number >= 0")
  if not (_is_int(top_k) and top_k >= 0):
    raise InputError(f"top_k={top_k!r} must be an integer >= 0 (0 = off)")
  if not (math.isfinite(top_p) and 0 < top_p <= 1):
    raise InputError(f"top_p={top_p!r} must be in (0, 1] (1 = off)")


def check_sampling(num_samples, steps, cfg_scale, sampler) -> tuple[int, float, str]:
  """DM sampling options (defaults already resolved) -> (steps, cfg_scale, sampler)."""
  if not (_is_int(num_samples) and num_samples >= 1):
    raise InputError(f"num_samples={num_samples!r} must be a positive integer")
  if not (_is_int(steps) and steps >= 1):
    raise InputError(f"steps={steps!r} must be a positive integer")
  if not math.isfinite(float(cfg_scale)):
    raise InputError(f"cfg_scale={cfg_scale!r} must be a finite number")
  if sampler not in diffusion.SAMPLERS:
    raise InputError(f"sampler={sampler!r} is unknown: use one of {sorted(diffusion.SAMPLERS)}")
  return int(steps), float(cfg_scale), sampler


def check_num_frames(num_frames) -> int:
  """Frames of a clip to generate: a positive integer."""
  if not (_is_int(num_frames) and num_frames >= 1):
    raise InputError(f"num_frames={num_frames!r} must be a positive integer")
  return int(num_frames)


def action_chunks(actions: Any, num_frames: int) -> np.ndarray:
  """float32 [N, K, 2] action chunks for N first frames, from a string
  ("right,right,up"), one chunk [K, 2] shared by every frame, or [N, K, 2]."""
  if isinstance(actions, str):
    actions = parse_actions(actions)
  actions = np.asarray(actions, np.float32)
  if actions.ndim == 2:
    actions = np.broadcast_to(actions, (num_frames, *actions.shape))
  if (actions.ndim != 3 or actions.shape[0] != num_frames or actions.shape[1] < 1
      or actions.shape[2] != 2):
    raise InputError(f"actions must be [K, 2] (dx, dy) steps, or [N, K, 2] for N first "
                     f"frames; got shape {actions.shape} for {num_frames} frames")
  if not np.all(np.isfinite(actions)):
    raise InputError("actions hold non-finite values")
  return actions


def parse_actions(spec: str) -> np.ndarray:
  """`mot.data.moving_digits.parse_actions`, its errors as InputError."""
  try:
    return moving_digits.parse_actions(spec)
  except ValueError as e:
    raise InputError(str(e)) from None
