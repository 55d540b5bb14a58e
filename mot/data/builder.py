"""Builds one mixed text/media example as the numpy fields of docs/design.md §1.

The data pipeline and the sampler both use `SequenceBuilder`, so positions, block ids
and loss masks are computed in exactly one place. Positions follow Qwen2-VL's M-RoPE
(docs/design.md §2): text advances one index per token, a media block spans its grid on the
(t, h, w) axes from its start index, and whatever follows a block continues at the
block's largest position + 1.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from mot import modalities
from mot import tokenizer as tokenizer_lib

_FRAME_ROLES = ("given", "clean", "noised", "forced")  # see SequenceBuilder.add_video_frames
# Field name -> dtype of every array `build` returns (packing adds `segment_ids`).
FIELDS = {
    "tokens": np.int32,
    "patches": np.float32,
    "modality": np.int32,
    "positions": np.int32,
    "block_ids": np.int32,
    "ar_targets": np.int32,
    "ar_weights": np.float32,
    "dm_mask": np.float32,
    "cond_mask": np.float32,
}
# Per-token scalar columns kept while building ("loss": the token is an AR target).
_COLUMNS = ("tokens", "modality", "block_ids", "dm_mask", "cond_mask", "loss")


class SequenceBuilder:
  """Appends text and media to one example, then `build()`s its arrays.

  Media blocks (image, video, action chunk) are framed by their begin/end marker
  tokens, which are causal text tokens and never loss targets; each block gets its own
  block id 1, 2, ... so attention is bidirectional inside it (docs/design.md §1).
  Tokens accumulate in Python lists (examples are short, appends are many) and become
  arrays once, in `build`. `tokenizer` gives the markers' and PAD's ids and the range of
  valid ids (the byte tokenizer unless a run's `mot.tokenizer.from_config` is passed).
  """

  def __init__(self, patch_dim: int,
               tokenizer: tokenizer_lib.Tokenizer = tokenizer_lib.BYTE_TOKENIZER):
    if patch_dim < 1:
      raise ValueError(f"patch_dim must be positive, got {patch_dim}")
    self.patch_dim = patch_dim
    self.tokenizer = tokenizer
    self._columns: dict[str, list] = {k: [] for k in _COLUMNS}
    self._positions: list = []                       # (t, h, w) per token.
    self._patches: list[tuple[int, np.ndarray]] = []  # (first token index, rows [m, p]).
    self._next_position = 0
    self._num_blocks = 0

  def __len__(self) -> int:
    return len(self._positions)

  @property
  def next_position(self) -> int:
    """The M-RoPE index the next appended token (or block) starts at."""
    return self._next_position

  @property
  def num_blocks(self) -> int:
    """How many media blocks were added (the largest block id so far)."""
    return self._num_blocks

  def add_text(self, ids: list[int], loss: bool = False, cond: bool = False) -> None:
    """Appends causal text tokens.

    Args:
      ids: token ids, e.g. from `Tokenizer.encode` (list or int array [m]).
      loss: the tokens are next-token targets (the weight sits on the token before each).
      cond: the tokens are conditioning that classifier-free guidance may blank.
    """
    ids = [int(i) for i in ids]
    vocab = self.tokenizer.vocab_size
    if any(not 0 <= i < vocab for i in ids):
      raise ValueError(f"text ids must lie in [0, {vocab}), got {ids}")
    s = self._next_position
    self._append(ids, [(p, p, p) for p in range(s, s + len(ids))], loss=loss, cond=cond)
    self._next_position += len(ids)

  def add_image(self, patches: np.ndarray, noised: bool, cond: bool = False,
                begin_loss: bool = False) -> None:
    """Appends an image of float [hp, wp, p] patches (a grid hp x wp) as one block.

    `noised` marks every patch as a diffusion target (dm_mask); `cond` marks the image
    as classifier-free-guidance conditioning (e.g. the source image of an edit);
    `begin_loss` makes its begin marker a next-token target, so the AR head learns where
    the text before it ends (a sampled plan then stops on the marker, a special id).
    """
    patches = np.asarray(patches, np.float32)
    if patches.ndim != 3:
      raise ValueError(f"image patches must be [hp, wp, p], got shape {patches.shape}")
    hp, wp, _ = patches.shape
    self._add_block("image", patches.reshape(hp * wp, -1), _grid_offsets(1, hp, wp),
                    max(hp, wp), noised, cond, begin_loss)

  def add_video(self, frames: np.ndarray, noised: bool, cond: bool = False) -> None:
    """Appends a clip of float [T, hp, wp, p] patches (T frames) as one block."""
    frames = np.asarray(frames, np.float32)
    if frames.ndim != 4:
      raise ValueError(f"video patches must be [T, hp, wp, p], got shape {frames.shape}")
    t, hp, wp, _ = frames.shape
    self._add_block("video", frames.reshape(t * hp * wp, -1), _grid_offsets(t, hp, wp),
                    max(t, hp, wp), noised, cond)

  def add_video_frames(self, frames: np.ndarray, roles: Sequence[str],
                       weights: Sequence[float] | None = None) -> None:
    """Appends a clip of float [T, hp, wp, p] patches frame by frame: one block a frame.

    Positions are exactly `add_video`'s (frame k at t = start + k, h/w per patch, the
    next token at start + max(T, hp, wp)); only the blocks differ, so a frame reads the
    frames before it (causal in time) and a generated frame is one block of its own,
    which the sampler can draw after the frames before it (frame-autoregressive video).
    roles[k] says what frame k is:
      "given"   a clean block that later frames read, marked as conditioning that
                classifier-free guidance may blank (e.g. a world model's first frame);
      "clean"   a clean block that later frames read (e.g. frames drawn so far);
      "noised"  a diffusion target that no other token reads (docs/design.md §1);
      "forced"  teacher forcing: the frame noised, then the same frame clean at the same
                positions, so it is a target AND later frames read the true frame.
    weights[k] (default 1) is frame k's diffusion loss weight, stored as its noised
    tokens' dm_mask value (training weighs each noised token's error by it).
    One begin marker precedes the frames and one end marker follows them.
    """
    frames = np.asarray(frames, np.float32)
    if frames.ndim != 4:
      raise ValueError(f"video patches must be [T, hp, wp, p], got shape {frames.shape}")
    t, hp, wp, _ = frames.shape
    if len(roles) != t or any(r not in _FRAME_ROLES for r in roles):
      raise ValueError(f"roles {list(roles)} must give one of {_FRAME_ROLES} per frame "
                       f"({t} frames)")
    weights = [1.0] * t if weights is None else [float(w) for w in weights]
    if len(weights) != t or any(w <= 0 for w in weights):
      raise ValueError(f"weights {weights} must give one positive weight per frame ({t})")
    modality = modalities.get("video")
    self._check_rows("video", frames.reshape(-1, frames.shape[-1]))
    rows = frames.reshape(t, hp * wp, -1)
    self.add_text([self.tokenizer.begin(modality.name)])
    start = self._next_position
    grid = _grid_offsets(1, hp, wp)
    for k, role in enumerate(roles):
      positions = (start + grid + np.array([k, 0, 0])).tolist()
      copies = {"given": (False,), "clean": (False,), "noised": (True,),
                "forced": (True, False)}[role]
      for noised in copies:
        self._append_block(modality, rows[k], positions, noised, cond=role == "given",
                           weight=weights[k])
    self._next_position = start + max(t, hp, wp)
    self.add_text([self.tokenizer.end(modality.name)])

  def add_action(self, actions: np.ndarray, noised: bool, cond: bool = False) -> None:
    """Appends an action chunk of float [K, a] (K steps) as one block."""
    actions = np.asarray(actions, np.float32)
    if actions.ndim != 2:
      raise ValueError(f"actions must be [K, a], got shape {actions.shape}")
    k = actions.shape[0]
    step = np.arange(k)
    offsets = np.stack([step, np.zeros_like(step), np.zeros_like(step)], -1)
    self._add_block("action", actions, offsets, k, noised, cond)

  def build(self, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """The example's arrays, each [n, ...] (or [seq_len, ...] zero-padded); see FIELDS.

    ar_targets[i] = tokens[i + 1] and ar_weights[i] = 1 iff token i + 1 is a loss token,
    so the last token never has a target and packed examples never predict each other.
    """
    n = len(self)
    length = n if seq_len is None else seq_len
    if n > length:
      raise ValueError(f"example has {n} tokens but seq_len is {seq_len}: "
                       f"raise seq_len to at least {n}")
    out = {k: np.zeros((length, *shape), FIELDS[k]) for k, shape in
           (("patches", (self.patch_dim,)), ("positions", (3,)))}
    out["positions"][:n] = np.asarray(self._positions, np.int32).reshape(n, 3)
    for start, rows in self._patches:
      out["patches"][start:start + len(rows), :rows.shape[1]] = rows
    for k in _COLUMNS:
      out[k] = np.zeros(length, FIELDS.get(k, np.float32))
      out[k][:n] = self._columns[k]
    loss = out.pop("loss")
    last = max(n - 1, 0)
    out["ar_targets"] = np.zeros(length, np.int32)
    out["ar_targets"][:last] = out["tokens"][1:n]
    out["ar_weights"] = np.zeros(length, np.float32)
    out["ar_weights"][:last] = loss[1:n]
    return {k: out[k] for k in FIELDS}

  def _add_block(self, name: str, rows: np.ndarray, offsets: np.ndarray, span: int,
                 noised: bool, cond: bool, begin_loss: bool = False) -> None:
    """Appends begin marker (a next-token target if begin_loss), block rows [m, p] at
    start + offsets [m, 3], end marker."""
    modality = modalities.get(name)
    self._check_rows(name, rows)
    self.add_text([self.tokenizer.begin(name)], loss=begin_loss)
    start = self._next_position
    self._append_block(modality, rows, (start + offsets).tolist(), noised, cond)
    self._next_position = start + span
    self.add_text([self.tokenizer.end(name)])

  def _check_rows(self, name: str, rows: np.ndarray) -> None:
    if rows.shape[0] == 0:
      raise ValueError(f"empty {name} block")
    if rows.shape[1] > self.patch_dim:
      raise ValueError(f"{name} patch dim {rows.shape[1]} exceeds the builder's "
                       f"patch_dim {self.patch_dim}")

  def _append_block(self, modality, rows: np.ndarray, positions: list, noised: bool,
                    cond: bool, weight: float = 1.0) -> None:
    """Appends rows [m, p] as the next block id at the given positions (no markers);
    a noised block's dm_mask is its loss weight."""
    self._num_blocks += 1
    self._patches.append((len(self), rows))
    self._append([self.tokenizer.pad_id] * rows.shape[0], positions, modality=modality.id,
                 block=self._num_blocks, noised=noised, cond=cond, weight=weight)

  def _append(self, tokens: list[int], positions: list, modality: int = modalities.TEXT,
              block: int = 0, noised: bool = False, cond: bool = False,
              loss: bool = False, weight: float = 1.0) -> None:
    """Appends len(tokens) tokens sharing modality, block and flags."""
    m = len(tokens)
    c = self._columns
    c["tokens"].extend(tokens)
    c["modality"].extend([modality] * m)
    c["block_ids"].extend([block] * m)
    c["dm_mask"].extend([float(noised) * weight] * m)
    c["cond_mask"].extend([float(cond)] * m)
    c["loss"].extend([float(loss)] * m)
    self._positions.extend(positions)


@functools.lru_cache(maxsize=64)
def _grid_offsets(t: int, h: int, w: int) -> np.ndarray:
  """int [t*h*w, 3] (frame, row, col) of a t x h x w grid in row-major order (cached)."""
  grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"), -1)
  grid = grid.reshape(-1, 3)
  grid.setflags(write=False)
  return grid
