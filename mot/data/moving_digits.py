"""Moving digits: clips of one bundled digit translating on a larger canvas (docs/design.md §5).

A clip is T frames (default 8) of one 8x8 digit from `mot.data.digits` (same split: the
first 1,500 train, the last 297 are held out and never trained on) pasted on a 16x16
canvas of background (-1), plus the per-step action (dx, dy) in pixels that moved it:
action k takes frame k to frame k + 1, so a clip of T frames has T - 1 actions. x grows to
the right (columns), y grows DOWN (rows, as in an image): "up" is (0, -1).

Motion, and why nothing ever bounces or clamps: every step moves the digit by exactly one
pixel in one of DIRECTIONS, and a clip's start position is drawn so that the whole path
stays on the canvas. The action is therefore always the true displacement of the digit
(inverse dynamics is well posed), which bouncing or clamping at a wall would break.
  - `constant_clip`: one direction for the whole clip (captions, QA, evaluation);
    start drawn uniformly among positions that keep the path on the canvas.
  - `random_walk_clip`: each step a direction drawn uniformly among those that keep the
    digit on the canvas (world-model and inverse-dynamics tasks see varied actions).
Both are deterministic given the numpy Generator.

Tokens: each frame is cut by `digits.patchify` (patch_size 4 -> a 4x4 grid of 16-pixel
patches per frame, 16 tokens a frame, 128 for a clip of 8): short sequences on a CPU.
Frames are one video block with (t, h, w) M-RoPE positions (t = start + frame); an action
chunk is one action block (t = start + step, h = w = start), see `SequenceBuilder`.

The task layouts:
  video_generation  BOS, caption (cond, AR target), [noised clip], EOS
  video_first_frame the same cut after frame 0 (several examples a row)
  video_qa          BOS, [clip], QUESTION, answer (AR target), EOS
  video_frame_qa    BOS, [frame 0], FRAME_QUESTION, "3" (AR target), EOS (several a row)
  world_model       BOS, [first frame] (cond), [actions] (cond), [noised frames 1..T-1], EOS
                    (layout "frames": BOS, [actions] (cond), [frame 0 (cond), frames 1..], EOS)
  inverse_dynamics  BOS, [clip], ACTIONS_PROMPT, [noised actions], EOS

Generated frames come in one of two layouts (config.data.video_layout):
  "frames" (default)  one block a frame, teacher forced: frame k noised, then frame k
      clean at the same positions ([f0~][f0][f1~][f1]...[fT-1~]); a noised frame reads
      the clean frames before it and nothing reads a noised frame, so training matches
      sampling, which draws frame k after the frames 0..k-1 it has drawn. Each step is
      "move the last frame by the action", the same operator at every frame.
  "clip"  the T frames as one noised block drawn together. With 4-pixel patches and
      1-pixel motion this must copy the first frame's content shifted by k pixels, a
      different sub-patch permutation for every k mod 4: trained so (docs/results.md),
      frames shifted by whole patches come out sharp and the rest as strokes at the right place
      that are no longer the digit. (Kept for checkpoints trained with it.)
Positions are the same in both (`SequenceBuilder.add_video_frames`).
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from mot import tokenizer as tokenizer_lib
from mot.data import digits
from mot.data.builder import SequenceBuilder

CANVAS = 16          # canvas side in pixels
NUM_FRAMES = 8       # frames per clip
DIGIT = 8            # side of a bundled digit
ACTION_DIM = 2       # (dx, dy) per step
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "up": (0, -1), "down": (0, 1)}
DIRECTION_NAMES = tuple(DIRECTIONS)
QUESTION = "Which digit moves, and where?"
FRAME_QUESTION = "Which digit is this?"  # video_frame_qa: one frame, the digit alone
ACTIONS_PROMPT = "actions:"
# How generated frames are laid out: "clip" = one block of T frames denoised together;
# "frames" = one block a frame, each drawn after the frames before it (see module doc).
VIDEO_LAYOUTS = ("clip", "frames")
# Where caption -> clip training clips start (config.data.generation_start): "any" on-canvas
# position, or "grid": on the patch grid (multiples of patch_size on each axis), so frame
# 0 is a digit cut into whole patches, as in the image task; the other tasks start anywhere.
GENERATION_STARTS = ("any", "grid")
Tokenizer = tokenizer_lib.Tokenizer
BYTES = tokenizer_lib.BYTE_TOKENIZER


def caption(label: int, direction: str) -> str:
  """E.g. "a handwritten digit 3 moving right"."""
  return f"a handwritten digit {int(label)} moving {direction}"


def answer(label: int, direction: str) -> str:
  """Answer to QUESTION, e.g. "3, right"."""
  return f"{int(label)}, {direction}"


@dataclasses.dataclass(frozen=True)
class Clip:
  """One moving-digit clip.

  Attributes:
    frames: float32 [T, canvas, canvas] in [-1, 1] (background -1).
    actions: float32 [T - 1, 2] per-step (dx, dy) in pixels.
    offsets: int [T, 2] (row, col) of the digit's 8x8 box's top-left corner per frame.
    direction: the constant direction's name, or None for a random walk.
  """
  frames: np.ndarray
  actions: np.ndarray
  offsets: np.ndarray
  direction: str | None = None


def render(image: np.ndarray, offsets: np.ndarray, canvas: int = CANVAS) -> np.ndarray:
  """float32 [T, canvas, canvas]: `image` [h, w] pasted at each (row, col) of offsets."""
  image = np.asarray(image, np.float32)
  h, w = image.shape
  offsets = np.asarray(offsets, np.int64)
  if offsets.min(initial=0) < 0 or offsets[:, 0].max() + h > canvas or (
      offsets[:, 1].max() + w > canvas):
    raise ValueError(f"digit offsets {offsets.tolist()} leave the {canvas}x{canvas} canvas")
  frames = np.full((len(offsets), canvas, canvas), digits.BACKGROUND, np.float32)
  for f, (r, c) in enumerate(offsets):
    frames[f, r:r + h, c:c + w] = image
  return frames


def offsets_from_actions(start: tuple[int, int], actions: np.ndarray) -> np.ndarray:
  """int [K + 1, 2] (row, col) per frame: start, then each (dx, dy) added in turn."""
  steps = np.asarray(actions, np.float64).reshape(-1, 2)
  moves = np.round(steps[:, ::-1]).astype(np.int64)  # (dx, dy) -> (drow, dcol)
  return np.concatenate([np.asarray([start], np.int64),
                         np.asarray(start, np.int64) + np.cumsum(moves, axis=0)])


def clip_from_actions(image: np.ndarray, start: tuple[int, int], actions: np.ndarray,
                      canvas: int = CANVAS, direction: str | None = None) -> Clip:
  """The clip of `image` starting at (row, col) `start` and moved by `actions` [K, 2]."""
  actions = np.asarray(actions, np.float32).reshape(-1, ACTION_DIM)
  offsets = offsets_from_actions(start, actions)
  return Clip(render(image, offsets, canvas), actions, offsets, direction)


def constant_clip(image: np.ndarray, direction: str, rng: np.random.Generator,
                  num_frames: int = NUM_FRAMES, canvas: int = CANVAS, grid: int = 1) -> Clip:
  """One pixel per frame in `direction`; start uniform among on-canvas paths.

  grid > 1 draws the start among those on multiples of `grid` pixels on each axis (the
  patch grid, see GENERATION_STARTS), where the range holds one; else the whole range.
  """
  dx, dy = DIRECTIONS[direction]
  span = canvas - image.shape[0]          # largest top-left offset on each axis
  travel = num_frames - 1
  if travel > span:
    raise ValueError(f"{num_frames} frames move the digit {travel} px but the "
                     f"{canvas}x{canvas} canvas leaves only {span}: fewer frames or a "
                     f"larger canvas")

  def start(d):  # a start along one axis for a motion of sign d
    low, high = {1: (0, span - travel), -1: (travel, span), 0: (0, span)}[d]
    on_grid = [x for x in range(low, high + 1) if x % grid == 0]
    if grid > 1 and on_grid:
      return on_grid[int(rng.integers(len(on_grid)))]
    return int(rng.integers(low, high + 1))

  col, row = start(dx), start(dy)
  actions = np.tile(np.asarray([dx, dy], np.float32), (travel, 1))
  return clip_from_actions(image, (row, col), actions, canvas, direction)


def random_walk_clip(image: np.ndarray, rng: np.random.Generator,
                     num_frames: int = NUM_FRAMES, canvas: int = CANVAS) -> Clip:
  """Each step one pixel in a direction drawn among those that stay on the canvas."""
  span = canvas - image.shape[0]
  row, col = (int(x) for x in rng.integers(0, span + 1, size=2))
  start, actions = (row, col), []
  for _ in range(num_frames - 1):
    valid = [(dx, dy) for dx, dy in DIRECTIONS.values()
             if 0 <= row + dy <= span and 0 <= col + dx <= span]
    dx, dy = valid[int(rng.integers(len(valid)))]
    actions.append((dx, dy))
    row, col = row + dy, col + dx
  return clip_from_actions(image, start, np.asarray(actions, np.float32).reshape(-1, 2),
                           canvas)


def random_clip(image: np.ndarray, rng: np.random.Generator, num_frames: int = NUM_FRAMES,
                canvas: int = CANVAS, walk_prob: float = 0.0, grid: int = 1) -> Clip:
  """A constant-direction clip (direction uniform; start as `constant_clip`'s grid
  says), or with walk_prob a random walk."""
  if walk_prob > 0 and rng.random() < walk_prob:
    return random_walk_clip(image, rng, num_frames, canvas)
  direction = DIRECTION_NAMES[int(rng.integers(len(DIRECTION_NAMES)))]
  return constant_clip(image, direction, rng, num_frames, canvas, grid)


def blank_clip(num_frames: int = NUM_FRAMES, canvas: int = CANVAS) -> Clip:
  """An empty clip of the given shape (for length bounds and sampling layouts)."""
  frames = np.full((num_frames, canvas, canvas), digits.BACKGROUND, np.float32)
  return Clip(frames, np.zeros((num_frames - 1, ACTION_DIM), np.float32),
              np.zeros((num_frames, 2), np.int64), "right")


# ----------------------------------------------------------------------------------------
# Actions given by a user (sample.py --actions).
# ----------------------------------------------------------------------------------------
def parse_actions(spec: str) -> np.ndarray:
  """float32 [K, 2] (dx, dy) actions from a user string.

  Accepted: comma-separated direction names ("right,right,up,down"; "stay" is (0, 0)),
  or a path to a .json file ([[dx, dy], ...]) or a .npy file (float [K, 2]). Raises a
  one-line ValueError otherwise.
  """
  spec = str(spec).strip()
  if not spec:
    raise ValueError("--actions is empty: give e.g. right,right,up or a .json/.npy file")
  if spec.lower().endswith((".json", ".npy")):
    if not os.path.isfile(spec):
      raise ValueError(f"--actions file {spec} does not exist")
    try:
      if spec.lower().endswith(".json"):
        with open(spec) as f:
          arr = np.asarray(json.load(f), np.float32)
      else:
        arr = np.asarray(np.load(spec, allow_pickle=False), np.float32)
    except (ValueError, TypeError, OSError) as e:
      raise ValueError(f"--actions file {spec} is not a list of [dx, dy] pairs "
                       f"({type(e).__name__})") from None
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != ACTION_DIM:
      raise ValueError(f"--actions file {spec} must hold [K, 2] (dx, dy) pairs, got "
                       f"shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"--actions file {spec} holds non-finite values")
    return arr
  names = dict(DIRECTIONS, stay=(0, 0))
  out = []
  for word in spec.split(","):
    word = word.strip().lower()
    if word not in names:
      raise ValueError(f"--actions: {word!r} is not a direction; use comma-separated "
                       f"{', '.join(names)} or a .json/.npy file of [dx, dy] pairs")
    out.append(names[word])
  return np.asarray(out, np.float32).reshape(-1, ACTION_DIM)


# ----------------------------------------------------------------------------------------
# Task layouts.
# ----------------------------------------------------------------------------------------
def frame_patches(frames: np.ndarray, patch_size: int) -> np.ndarray:
  """[T, H, W] model-scale frames -> [T, H/p, W/p, p*p] video patches."""
  return digits.patchify(np.asarray(frames, np.float32), patch_size)


def forced_roles(num_frames: int) -> list[str]:
  """Training roles of a frame-by-frame clip: every frame a target the later frames read
  clean (teacher forcing), the last one only noised (nothing reads it)."""
  return ["forced"] * (num_frames - 1) + ["noised"]


def add_frames(b: SequenceBuilder, patches: np.ndarray, layout: str,
               first_frame_weight: float = 1.0) -> None:
  """Appends training clip patches [T, hp, wp, p] as diffusion targets in `layout`:
  "clip" one block of T frames drawn together, "frames" one block a frame, teacher forced
  (`forced_roles`), so that the sampler draws frame k after frames 0..k-1; there frame
  0's loss weighs `first_frame_weight` (the other frames 1)."""
  if layout == "clip":
    b.add_video(patches, noised=True)
  elif layout == "frames":
    b.add_video_frames(patches, forced_roles(len(patches)),
                       [first_frame_weight] + [1.0] * (len(patches) - 1))
  else:
    raise ValueError(f"video layout {layout!r} is not one of {VIDEO_LAYOUTS}")


def video_generation_example(clip: Clip, label: int, patch_size: int, patch_dim: int,
                             layout: str = "frames", first_frame_weight: float = 1.0,
                             tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Caption -> clip: BOS, caption (AR target, CFG conditioning), noised clip, EOS.

  Frame by frame, only frame 0 is drawn from the caption alone (every later frame moves
  the one before it), so `first_frame_weight` can weigh its loss up
  (config.data.first_frame_weight; docs/results.md compares it with more examples).
  """
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_text(tokenizer.encode(caption(label, clip.direction)), loss=True, cond=True)
  add_frames(b, frame_patches(clip.frames, patch_size), layout, first_frame_weight)
  b.add_text([tokenizer.eos_id], loss=True)
  return b.build()


def first_frame_example(clip: Clip, label: int, patch_size: int, patch_dim: int,
                        layout: str = "frames", tokenizer: Tokenizer = BYTES
                        ) -> dict[str, np.ndarray]:
  """Caption -> the clip's first frame alone: caption -> clip cut after frame 0 (same
  caption, positions and block as that frame there, so the sampler's first step is this
  example). Frame by frame, frame 0 is the one frame drawn from the caption alone;
  short (~55 tokens), so several share a row (the task's `per_row`)."""
  first = Clip(clip.frames[:1], clip.actions[:0], clip.offsets[:1], clip.direction)
  return video_generation_example(first, label, patch_size, patch_dim, layout,
                                  tokenizer=tokenizer)


def video_qa_example(clip: Clip, label: int, patch_size: int, patch_dim: int,
                     tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Clip -> answer: BOS, clean clip, QUESTION, "3, right" (AR target), EOS (target)."""
  return _reading_example(frame_patches(clip.frames, patch_size), QUESTION,
                          answer(label, clip.direction), patch_dim, tokenizer)


def frame_qa_example(clip: Clip, label: int, patch_size: int, patch_dim: int,
                     tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """One frame -> the digit: BOS, [frame 0] (a one-frame clip), FRAME_QUESTION, "3"
  (AR target), EOS (target).

  Video QA has one answer per ~170-token clip example, one example a row: the reading
  head sees few answers. This reads the same frame tokens (same patches, same video
  modality) ~6 to a row, so it trains reading the digit on the clips' own tokenization.
  """
  return _reading_example(frame_patches(clip.frames[:1], patch_size), FRAME_QUESTION,
                          str(int(label)), patch_dim, tokenizer)


def _reading_example(patches: np.ndarray, question: str, reply: str, patch_dim: int,
                     tokenizer: Tokenizer) -> dict[str, np.ndarray]:
  """BOS, clean frames [T, N, P], question, reply (AR target), EOS (target)."""
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_video(patches, noised=False)
  b.add_text(tokenizer.encode(question))
  b.add_text(tokenizer.encode(reply) + [tokenizer.eos_id], loss=True)
  return b.build()


def world_model_example(clip: Clip, patch_size: int, patch_dim: int, layout: str = "frames",
                        tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """First frame + actions -> the rest. Layout "clip": BOS, [frame 0] (cond), [actions]
  (cond), [frames 1..T-1] (noised, one block), EOS (target). Layout "frames": BOS,
  [actions] (cond), then the clip frame by frame: frame 0 given (cond), frames 1..T-1
  teacher forced, EOS: frame 0 -> 1 is then the same step, at the same relative
  positions, as every later frame -> the next."""
  patches = frame_patches(clip.frames, patch_size)
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  if layout == "frames":
    b.add_action(clip.actions, noised=False, cond=True)
    b.add_video_frames(patches, ["given"] + forced_roles(len(patches) - 1))
  else:  # "clip" (add_frames refuses any other layout)
    b.add_video(patches[:1], noised=False, cond=True)
    b.add_action(clip.actions, noised=False, cond=True)
    add_frames(b, patches[1:], layout)
  b.add_text([tokenizer.eos_id], loss=True)
  return b.build()


def inverse_dynamics_example(clip: Clip, patch_size: int, patch_dim: int,
                             tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Clip -> actions: BOS, [clip] (cond), ACTIONS_PROMPT, [actions] (noised), EOS."""
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_video(frame_patches(clip.frames, patch_size), noised=False, cond=True)
  b.add_text(tokenizer.encode(ACTIONS_PROMPT))
  b.add_action(clip.actions, noised=True)
  b.add_text([tokenizer.eos_id], loss=True)
  return b.build()


# Which tasks see random-walk actions (the rest need a constant direction to name).
WALK_PROB = {"world_model": 0.5, "inverse_dynamics": 0.5}
# The image tasks' names that train_lib's held-out losses ask for -> their video twins.
HELDOUT_ALIASES = {"generation": "video_generation", "reasoning": "video_qa"}
