"""Plain-numpy reference for Qwen2-VL M-RoPE (and the Qwen3-VL interleaved layout).

Written independently of ``mot.rope`` from the Hugging Face ``transformers`` code so that the
model's rotation can be checked against it:

* ``Qwen2VLRotaryEmbedding.forward`` (``models/qwen2_vl/modeling_qwen2_vl.py``)::

      inv_freq = 1 / theta ** (arange(0, dim, 2) / dim)            # float32, [dim/2]
      freqs = position_ids[..., None] * inv_freq                    # [3, B, L, dim/2]
      emb = cat(freqs, freqs, -1); cos, sin = emb.cos(), emb.sin()  # [3, B, L, dim]

* ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section)``::

      mrope_section = mrope_section * 2                 # e.g. [8,12,12,8,12,12]
      cos = cat([m[i % 3] for i, m in enumerate(cos.split(mrope_section, -1))], -1)
      (same for sin)
      q_embed = q * cos + rotate_half(q) * sin          # rotate_half(x) = cat(-x2, x1)

* Qwen3-VL (``Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope``) instead picks the axis per
  *frequency* before the cat, in a t,h,w,t,h,w,... pattern::

      freqs_t = freqs[0]
      for axis, offset in ((1, 1), (2, 2)):                       # h, w
          idx = slice(offset, mrope_section[axis] * 3, 3)
          freqs_t[..., idx] = freqs[axis, ..., idx]
      emb = cat(freqs_t, freqs_t, -1)

  (The slice is truncated at dim/2: with sections (8, 12, 12) and dim 64, h gets 11 and w 10
  of the 32 frequencies, exactly as in transformers.)

Like transformers, frequencies and angles are computed in float32; the rotation itself is
done in float64 and cast back to the input dtype (use float32 inputs for comparisons).

Also :func:`reference_positions`, the (t, h, w) positions of a packed layout (docs/design.md §2).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = [
    "inv_freq",
    "rotate_half",
    "reference_rope_1d",
    "reference_mrope_cos_sin",
    "reference_mrope",
    "reference_positions",
]


def inv_freq(dim: int, theta: float) -> np.ndarray:
    """``1 / theta ** (arange(0, dim, 2) / dim)`` in float32, shape [dim // 2]."""
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``cat(-x2, x1)`` over the last axis (the rotate-half / GPT-NeoX layout)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [B, L, H, D] with cos/sin [B, L, D] -> x * cos + rotate_half(x) * sin."""
    xf = np.asarray(x, dtype=np.float64)
    c = cos.astype(np.float64)[:, :, None, :]
    s = sin.astype(np.float64)[:, :, None, :]
    return xf * c + rotate_half(xf) * s


def reference_rope_1d(x: np.ndarray, positions_1d: np.ndarray, theta: float = 10000.0
                      ) -> np.ndarray:
    """Ordinary 1-D RoPE (Llama / GPT-NeoX, rotate-half layout).

    Args:
      x: [B, L, H, D] float.
      positions_1d: int [B, L].
      theta: RoPE base.

    Returns:
      float64 [B, L, H, D].
    """
    x = np.asarray(x)
    d = x.shape[-1]
    pos = np.asarray(positions_1d).astype(np.float32)
    freqs = pos[..., None] * inv_freq(d, theta)[None, None, :]  # [B, L, D/2] float32
    emb = np.concatenate([freqs, freqs], axis=-1)
    return _rotate(x, np.cos(emb), np.sin(emb))


def reference_mrope_cos_sin(
    positions: np.ndarray,
    dim: int,
    sections: Sequence[int],
    theta: float = 10000.0,
    interleaved: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [B, L, dim] of M-RoPE, as transformers builds them.

    Args:
      positions: int [B, L, 3] (t, h, w).
      dim: head dim D (even).
      sections: three ints summing to D // 2 (the rotary frequencies given to t, h, w).
      theta: RoPE base.
      interleaved: False = Qwen2-VL / Qwen2.5-VL contiguous sections; True = Qwen3-VL
        interleaved layout.
    """
    sections = [int(s) for s in sections]
    if len(sections) != 3 or sum(sections) != dim // 2:
        raise ValueError(f"sections {sections} must be 3 ints summing to dim // 2 = {dim // 2}")
    pos = np.asarray(positions)
    if pos.ndim != 3 or pos.shape[-1] != 3:
        raise ValueError(f"positions must be [B, L, 3], got {pos.shape}")
    # position_ids in transformers' layout: [3, B, L].
    pos3 = np.moveaxis(pos, -1, 0).astype(np.float32)
    freqs = pos3[..., None] * inv_freq(dim, theta)  # [3, B, L, dim/2] float32

    if interleaved:
        freqs_t = freqs[0].copy()
        for axis, offset in ((1, 1), (2, 2)):
            idx = slice(offset, sections[axis] * 3, 3)
            freqs_t[..., idx] = freqs[axis, ..., idx]
        emb = np.concatenate([freqs_t, freqs_t], axis=-1)  # [B, L, dim]
        return np.cos(emb), np.sin(emb)

    emb = np.concatenate([freqs, freqs], axis=-1)  # [3, B, L, dim]
    cos_all, sin_all = np.cos(emb), np.sin(emb)
    split_points = np.cumsum(sections * 2)[:-1]  # mrope_section * 2
    cos = np.concatenate(
        [m[i % 3] for i, m in enumerate(np.split(cos_all, split_points, axis=-1))], axis=-1
    )
    sin = np.concatenate(
        [m[i % 3] for i, m in enumerate(np.split(sin_all, split_points, axis=-1))], axis=-1
    )
    return cos, sin


def reference_mrope(
    x: np.ndarray,
    positions: np.ndarray,
    sections: Sequence[int] = (8, 12, 12),
    theta: float = 10000.0,
    interleaved: bool = False,
) -> np.ndarray:
    """M-RoPE of x [B, L, H, D] at positions int [B, L, 3] -> float64 [B, L, H, D]."""
    x = np.asarray(x)
    cos, sin = reference_mrope_cos_sin(positions, x.shape[-1], sections, theta, interleaved)
    return _rotate(x, cos, sin)


def reference_positions(layout) -> np.ndarray:
    """(t, h, w) positions of a packed layout, docs/design.md §2 / Qwen2-VL ``get_rope_index``.

    ``layout`` is a list of segments, each one of
      * ``("text", n)``: n tokens, t = h = w = running index;
      * ``("image", (hp, wp))``: hp x wp patches in row-major order starting at index s:
        t = s, h = s + row, w = s + col;
      * ``("video", (T, hp, wp))``: T frames of hp x wp patches, frame-major: t = s + frame,
        h = s + row, w = s + col;
      * ``("action", K)``: K steps, t = s + step, h = w = s.
    After a block the running index continues at (largest position in the block) + 1, e.g.
    s + max(hp, wp) after an image.

    Returns:
      int32 [n_tokens, 3].
    """
    rows = []
    s = 0
    for kind, spec in layout:
        if kind == "text":
            n = int(spec)
            idx = np.arange(s, s + n)
            rows.append(np.stack([idx, idx, idx], axis=-1))
            s += n
            continue
        if kind == "image":
            hp, wp = (int(v) for v in spec)
            nt = 1
        elif kind == "video":
            nt, hp, wp = (int(v) for v in spec)
        elif kind == "action":
            k = int(spec)
            steps = np.arange(k)
            block = np.stack([s + steps, np.full(k, s), np.full(k, s)], axis=-1)
            rows.append(block)
            s = int(block.max()) + 1 if k else s
            continue
        else:
            raise ValueError(f"unknown segment kind {kind!r}")
        f, r, c = np.meshgrid(np.arange(nt), np.arange(hp), np.arange(wp), indexing="ij")
        block = np.stack([s + f, s + r, s + c], axis=-1).reshape(-1, 3)
        rows.append(block)
        if block.size:
            s = int(block.max()) + 1
    if not rows:
        return np.zeros((0, 3), np.int32)
    return np.concatenate(rows, axis=0).astype(np.int32)
