"""Multimodal rotary position embeddings (M-RoPE), exactly as Qwen2-VL.

Every token has a 3-D position (t, h, w). The rotary frequencies of a head (head_dim // 2
of them, rotate-half layout) are split into `sections` = (n_t, n_h, n_w): the first n_t
frequencies rotate by t, the next n_h by h, the last n_w by w (Qwen2-VL), or the three
axes are interleaved frequency by frequency (Qwen3-VL, `interleaved=True`). Text tokens
have t = h = w, so pure text is ordinary 1-D RoPE. Positions are built on the host
(`mot.data.builder`), never learned.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def axis_of_frequency(sections: tuple[int, int, int], interleaved: bool = False) -> np.ndarray:
  """int [head_dim // 2]: which position axis (0=t, 1=h, 2=w) drives each frequency."""
  n = sum(sections)
  if not interleaved:
    return np.repeat(np.arange(3), sections)
  # Qwen3-VL: start from t everywhere, then h at 1, 4, 7, ... and w at 2, 5, 8, ...
  axes = np.zeros(n, dtype=np.int64)
  for axis, offset in ((1, 1), (2, 2)):
    axes[offset:sections[axis] * 3:3] = axis
  return axes


def mrope_angles(positions, head_dim: int, sections, theta: float, interleaved: bool = False):
  """Rotation angles float32 [B, L, head_dim // 2] for int positions [B, L, 3]."""
  half = head_dim // 2
  if sum(sections) != half:
    raise ValueError(f"rope sections {tuple(sections)} must sum to head_dim // 2 = {half}")
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  axes = axis_of_frequency(tuple(sections), interleaved)
  # Select, for every frequency, the position of its axis: [B, L, half].
  pos = jnp.take(positions.astype(jnp.float32), jnp.asarray(axes), axis=-1)
  return pos * jnp.asarray(inv_freq, jnp.float32)


def rotary_tables(positions, head_dim: int, sections, theta: float,
                  interleaved: bool = False):
  """(cos, sin), each float32 [B, L, head_dim // 2], of `mrope_angles`: made once per
  forward pass and read by every layer's queries and keys.

  Why they pass through an identity matmul: XLA fuses an elementwise producer into each of
  its consumers, so with unrolled layers the sine and cosine were recomputed inside every
  layer's RoPE fusion (and its gradient) for every element of q and k — heads x 2 times
  the table — at ~3 ns a sine on a CPU core; XLA:CPU drops `optimization_barrier` before
  fusing, and a dot is not fused into elementwise code, so it fences the tables into one
  buffer each. x @ I is exact (each entry times 1, plus zeros, at highest precision) and
  costs 2 x B x L x head_dim^2 FLOPs once, nothing beside the layers' matmuls, and gives
  the same bits (docs/performance.md has the step times). Under `nn.scan` the loop
  boundary already did this.
  """
  angles = mrope_angles(positions, head_dim, sections, theta, interleaved)
  both = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)      # [B, L, D]
  both = jnp.einsum("bld,de->ble", both, jnp.eye(head_dim, dtype=both.dtype),
                    precision=jax.lax.Precision.HIGHEST)
  return both[..., :head_dim // 2], both[..., head_dim // 2:]


def rotate(x, cos, sin):
  """Rotate-half RoPE of x [B, L, H, D] by the tables cos, sin [B, L, D // 2] of
  `rotary_tables`; keeps x's dtype."""
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def apply_mrope(x, positions, sections=(8, 12, 12), theta: float = 10000.0,
                interleaved: bool = False):
  """Applies M-RoPE.

  Args:
    x: float [B, L, H, D] queries or keys.
    positions: int [B, L, 3] (t, h, w) positions.
    sections: frequencies per axis, summing to D // 2.
    theta: RoPE base.
    interleaved: Qwen3-VL frequency layout instead of Qwen2-VL's contiguous sections.
  Returns:
    float [B, L, H, D], same dtype as x.
  """
  return rotate(x, *rotary_tables(positions, x.shape[-1], sections, theta, interleaved))
