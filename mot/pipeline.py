"""`Pipeline`: one checkpoint, both heads. Reason about images, generate them, or both.

  pipe = mot.Pipeline.from_workdir("runs/digits")            # newest checkpoint, EMA weights
  pipe.reason("What digit is this?", images=heldout)          # -> ["7", "2", ...]
  pipe.generate("a handwritten digit 7", num_samples=4)       # -> float32 [4, 8, 8] in [0, 1]
  pipe.think_then_draw("draw the digit after 3:")            # -> ("4", [1, 8, 8] image)

A moving-digits checkpoint (config.data.dataset="moving_digits") works on clips:

  video = mot.Pipeline.from_workdir("runs/moving")
  video.generate("a handwritten digit 3 moving right", num_frames=8)  # -> [1, 8, 16, 16]
  video.predict(first_frame, "right,right,up")      # world model -> [1, 4, 16, 16]
  video.infer_actions(clip)                         # inverse dynamics -> [1, T - 1, 2]
  video.reason("Which digit moves, and where?", video=clip)   # -> "3, right"

Prompts use the training layouts of `mot.data.tasks` (BOS, clean image, question for
reading; BOS, caption as conditioning, noised image for drawing), built by the same
`SequenceBuilder`. Images come in as arrays (digits scale [0, 16] or [0, 1]), paths or
PIL images of any size and colour mode, and go out in [0, 1] (1 = most ink). All heavy
work is batched and jitted in `mot.sampling`; `run_sample` is the whole of sample.py.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from mot import tokenizer as tokenizer_lib
from mot.data import digits
from mot.data.builder import SequenceBuilder

DEFAULT_QUESTION = "What digit is this?"   # = mot.data.tasks.QUESTION (not imported: cheap)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp",
                    ".pgm", ".ppm", ".pbm")
IMAGE_SIZES = {"digits": 8, "moving_digits": 16}  # config.data.dataset -> image side
VIDEO_QUESTION = "Which digit moves, and where?"  # = mot.data.moving_digits.QUESTION
GIF_SCALE = 8                             # GIF pixels per model pixel
GIF_FRAME_MS = 150                        # GIF frame duration
# Config files whose defaults fill fields an older checkpoint's saved config lacks.
_DEFAULT_CONFIGS = {"moving_digits": "configs.moving_digits",
                    "image_folder": "configs.image_folder",
                    "array_record": "configs.image_folder"}
MAX_DECODE_BATCH = 256                    # rows per jitted decode call
MAX_SAMPLE_BATCH = 128                    # samples per jitted denoise call (x2 with CFG)
_TOKENIZER = tokenizer_lib.Tokenizer()


class InputError(ValueError):
  """A bad prompt, image, option or output path; the message is one line naming it."""


# ----------------------------------------------------------------------------------------
# Images in and out.
# ----------------------------------------------------------------------------------------
def written_grid(folder: str) -> str | None:
  """The montage file that `write_samples` / `write_clips` put beside their samples (the
  "grid" of the folder's manifest.json), or None: a folder without such a manifest."""
  try:
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
      grid_name = json.load(f).get("grid")
  except (OSError, ValueError, AttributeError):
    return None
  return grid_name if isinstance(grid_name, str) else None


def image_paths(items: Sequence[str]) -> list[str]:
  """Files as given, folders expanded to their image files (sorted, not recursive).

  A folder that sample.py wrote (its manifest.json names a grid) is read without that
  grid: it is a montage of the samples beside it, not one more image of them. Named as a
  file, a grid is read like any image."""
  out = []
  for item in items:
    if not os.path.exists(item):
      raise InputError(f"image {item} does not exist")
    if os.path.isdir(item):
      grid_name = written_grid(item)
      found = sorted(os.path.join(item, f) for f in os.listdir(item)
                     if f.lower().endswith(IMAGE_EXTENSIONS) and f != grid_name
                     and os.path.isfile(os.path.join(item, f)))
      if not found:
        raise InputError(f"folder {item} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
      out.extend(found)
    else:
      out.append(item)
  return out


def load_image(source: Any, size: int | None) -> np.ndarray:
  """float32 [size, size] in [0, 1] (1 = ink) from a path or PIL image.

  Any mode is made grayscale (transparency composited onto white), any size resampled
  (area-averaged when shrinking; `size=None` keeps the file's size). Dark ink on a light background (a bright border, as on
  paper) is inverted, so ink is always the bright value, as in the digits data.
  """
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  if isinstance(source, Image.Image):
    img, name = source, "PIL image"
  else:
    name = os.fspath(source)
    if not os.path.isfile(name):
      raise InputError(f"image {name} does not exist or is not a file")
    try:
      with Image.open(name) as opened:
        opened.load()
        img = opened.copy()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
      raise InputError(f"{name} is not an image Pillow can read ({type(e).__name__})"
                       ) from None
  if img.width < 1 or img.height < 1:
    raise InputError(f"{name} is an empty image")
  if img.mode in ("I", "F") or img.mode.startswith("I;16"):
    arr = np.asarray(img, np.float32)
    top = arr.max(initial=0.0)
    arr = arr / (1.0 if top <= 1.0 else 255.0 if top <= 255.0 else 65535.0)
  else:
    if "A" in img.getbands() or "transparency" in img.info:
      rgba = img.convert("RGBA")
      white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
      img = Image.alpha_composite(white, rgba)
    arr = np.asarray(img.convert("L"), np.float32) / 255.0
  if not np.all(np.isfinite(arr)):
    raise InputError(f"{name} has non-finite pixel values")
  arr = np.clip(arr, 0.0, 1.0)
  border = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]])
  if np.median(border) > 0.5:
    arr = 1.0 - arr
  return arr.astype(np.float32) if size is None else _resize(arr, size)


def _resize(arr: np.ndarray, size: int) -> np.ndarray:
  if arr.shape == (size, size):
    return arr.astype(np.float32)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  shrink = arr.shape[0] >= size and arr.shape[1] >= size
  method = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
  out = Image.fromarray(arr.astype(np.float32), mode="F").resize((size, size), method)
  return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def to_unit_images(images: Any, size: int) -> tuple[np.ndarray, bool]:
  """(float32 [N, size, size] in [0, 1], whether a single image was given).

  Arrays: [H, W] or [N, H, W]; uint8 is read as 0..255, floats with a maximum above 1
  as the digits scale 0..16, other floats as 0..1. Paths and PIL images go through
  `load_image`; a list may mix them.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if isinstance(images, (str, os.PathLike, Image.Image)):
    return load_image(images, size)[None], True
  if isinstance(images, (list, tuple)):
    if not images:
      raise InputError("images is an empty list")
    out = [to_unit_images(x, size)[0] for x in images]
    return np.concatenate(out), False
  arr = np.asarray(images)
  if arr.ndim not in (2, 3) or arr.size == 0:
    raise InputError(f"images must be an array [H, W] or [N, H, W], got shape {arr.shape}")
  single = arr.ndim == 2
  arr = arr[None] if single else arr
  if arr.dtype == np.uint8:
    arr = arr.astype(np.float32) / 255.0
  else:
    arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
      raise InputError("images hold non-finite values")
    if arr.min() < 0:
      raise InputError(f"images must be in [0, 16] (digits) or [0, 1], got a minimum of "
                       f"{arr.min():g}")
    if arr.max() > digits.MAX_PIXEL:
      raise InputError(f"images must be in [0, 16] (digits) or [0, 1], got a maximum of "
                       f"{arr.max():g}")
    if arr.max() > 1.0:
      arr = arr / digits.MAX_PIXEL
  return np.stack([_resize(x, size) for x in arr]), single


def to_model_scale(unit: np.ndarray) -> np.ndarray:
  """[0, 1] pixels -> the model's [-1, 1] scale (digits' 0..16 scaled as in training)."""
  return (np.asarray(unit, np.float32) * 2.0 - 1.0).astype(np.float32)


def save_png(path: str, image01: np.ndarray, scale: int = 1) -> None:
  """Writes float [H, W] in [0, 1] as 8-bit grayscale (ink bright), upscaled by `scale`."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.round(np.clip(image01, 0, 1) * 255).astype(np.uint8)
  img = Image.fromarray(pixels, mode="L")
  if scale > 1:
    img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
  img.save(path)


def save_gif(path: str, frames01: np.ndarray, scale: int = GIF_SCALE,
             duration_ms: int = GIF_FRAME_MS) -> None:
  """Writes float [T, H, W] in [0, 1] as a looping grayscale GIF, upscaled by `scale`.

  Pillow merges consecutive identical frames into one frame shown that much longer (a
  digit that stays still); `load_clip` counts such a frame once per `duration_ms`, so
  the clip reads back with all T frames.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.round(np.clip(frames01, 0, 1) * 255).astype(np.uint8)
  pixels = np.repeat(np.repeat(pixels, scale, axis=1), scale, axis=2)
  images = [Image.fromarray(f, mode="L") for f in pixels]
  images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms,
                 loop=0)


def load_clip(source: str, size: int | None) -> np.ndarray:
  """float32 [T, size, size] in [0, 1]: the frames of a GIF (or other multi-frame image)
  or of a folder's image files (sorted by name), each read as `load_image` reads one."""
  from PIL import Image, ImageSequence, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  name = os.fspath(source)
  if os.path.isdir(name):
    return np.stack([load_image(p, size) for p in image_paths([name])])
  if not os.path.isfile(name):
    raise InputError(f"clip {name} does not exist")
  try:
    with Image.open(name) as opened:
      read = [(f.convert("RGBA").copy(), f.info.get("duration"))
              for f in ImageSequence.Iterator(opened)]
  except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
    raise InputError(f"{name} is not an image Pillow can read ({type(e).__name__})"
                     ) from None
  frames, durations = zip(*read)
  if size is None:
    size = frames[0].height
  clip = np.stack([load_image(f, size) for f in frames])
  return np.repeat(clip, frame_repeats(list(durations)), axis=0)


def frame_repeats(durations: list) -> list[int]:
  """How many time steps each GIF frame stands for, from the frames' durations (ms).

  GIF writers (Pillow among them, see `save_gif`) store a run of identical frames as one
  frame shown k times as long. When every duration is a whole multiple of the shortest,
  a frame k times the shortest counts k times; otherwise (hand-timed GIFs, missing
  durations) every frame counts once.
  """
  if not durations or any(not isinstance(d, (int, float)) or d <= 0 for d in durations):
    return [1] * len(durations)
  shortest = min(durations)
  repeats = [d / shortest for d in durations]
  if any(abs(r - round(r)) > 1e-6 for r in repeats):
    return [1] * len(durations)
  return [int(round(r)) for r in repeats]


def grid(images: np.ndarray, rows: int, gap: int = 1, scale: int = 8) -> np.ndarray:
  """float [rows * cols, H, W] -> one [R, C] mosaic image, cells upscaled by `scale`."""
  n, h, w = images.shape
  cols = math.ceil(n / rows)
  images = np.repeat(np.repeat(images, scale, axis=1), scale, axis=2)
  h, w = h * scale, w * scale
  out = np.full((rows * (h + gap) + gap, cols * (w + gap) + gap), 0.35, np.float32)
  for k in range(n):
    r, c = divmod(k, cols)
    out[gap + r * (h + gap):gap + r * (h + gap) + h,
        gap + c * (w + gap):gap + c * (w + gap) + w] = images[k]
  return out


# ----------------------------------------------------------------------------------------
# The pipeline.
# ----------------------------------------------------------------------------------------
# Fields whose default changed: a checkpoint saved without them ran the old behaviour.
_SAVED_BEFORE = {"data": {"video_layout": "clip"}}


def complete_config(saved: dict) -> Any:
  """ConfigDict of a checkpoint's saved config, with fields added to configs/digits.py
  (configs/moving_digits.py for a moving-digits run, configs/image_folder.py for one on
  your own images) since it was saved filled in from that file's defaults (for its saved
  variant)."""
  import importlib  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  dataset = (saved.get("data") or {}).get("dataset")
  try:
    default_config = importlib.import_module(_DEFAULT_CONFIGS.get(dataset, "configs.digits"))
    base = default_config.get_config(saved.get("variant") or "").to_dict()
  except Exception:  # pylint: disable=broad-except  (not run from the repo: saved as is)
    base = {}

  def merge(defaults, values):
    out = dict(defaults)
    for k, v in values.items():
      out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out

  return ml_collections.ConfigDict(merge(merge(base, _SAVED_BEFORE), saved))


def _as_list(prompt: str | Sequence[str]) -> tuple[list[str], bool]:
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


def _check_shifts(shifts) -> None:
  """Test-time shifts for reading (`Pipeline.reason`): 0 (off), 1 or 2 pixels."""
  if not (isinstance(shifts, (int, np.integer)) and 0 <= shifts <= 2):
    raise InputError(f"shifts={shifts!r} must be 0 (off), 1 or 2 pixels (--reason_shifts)")


def _check_seed(seed) -> int:
  if not (isinstance(seed, (int, np.integer)) and 0 <= seed < 2**32):
    raise InputError(f"seed={seed!r} must be an integer in [0, 2**32)")
  return int(seed)


def _chunks(n: int, max_batch: int) -> list[tuple[int, int, int]]:
  """(start, stop, padded batch) of near-equal chunks, padded to a multiple of 8."""
  from mot.sampling import round_up  # pylint: disable=g-import-not-at-top
  count = max(1, math.ceil(n / max_batch))
  per = math.ceil(n / count)
  return [(s, min(s + per, n), round_up(per, 8)) for s in range(0, n, per)]


class Pipeline:
  """A model, its parameters and its config: reasoning and generation from one checkpoint.

  Build it with `Pipeline.from_workdir(workdir)` or, for parameters already in memory
  (e.g. during training), `Pipeline(config, params)`.
  """

  def __init__(self, config: Any, params: Any, step: int | None = None):
    import ml_collections  # pylint: disable=g-import-not-at-top
    from mot import config as config_lib  # pylint: disable=g-import-not-at-top
    from mot.model import MoT  # pylint: disable=g-import-not-at-top
    if not isinstance(config, ml_collections.ConfigDict):
      config = ml_collections.ConfigDict(config)
    self.config = config
    # Validation may warn about packing training rows; sampling packs nothing.
    logging.disable(logging.WARNING)
    try:
      self.model_cfg = config_lib.validate(config)
    finally:
      logging.disable(logging.NOTSET)
    self.model = MoT(self.model_cfg)
    self.params = params
    self.step = step
    self.patch_size = int(config.data.patch_size)
    self.read_window = int(config.data.get("read_window", 0))  # as the reading task trained
    self.is_video = config.data.dataset == "moving_digits"
    self.image_size = int(config.data.get(
        "canvas_size" if self.is_video else "image_size",
        IMAGE_SIZES.get(config.data.dataset, 8)))
    self.num_frames = int(config.data.get("num_frames", 8))
    self.video_layout = str(config.data.get("video_layout", "clip"))
    sample = config.get("sample") or {}
    # Positions restart at 0 in every packed example, so the training row's length does
    # not bound what the model reads: sample.context_length may allow more.
    self.context_length = max(int(config.data.seq_len), int(sample.get("context_length", 0)))
    self.default_steps = int(sample.get("steps", 32))
    self.default_sampler = str(sample.get("sampler", "euler"))
    self.default_cfg_scale = float(sample.get("cfg_scale", 1.0))
    self.time_shift = float(sample.get("shift", 1.0))
    self.default_reason_shifts = int(sample.get("reason_shifts", 0))

  @classmethod
  def from_workdir(cls, workdir: str, use_ema: bool = True, step: int | None = None
                   ) -> "Pipeline":
    """Loads the newest (or `step`'s) checkpoint of a training workdir once.

    The config comes from the JSON saved beside the checkpoint and is validated again;
    only the parameters (EMA when present and `use_ema`) are read. Raises
    `mot.checkpoint.CheckpointError` (one line) for a missing workdir, no checkpoint, or
    no readable checkpoint.
    """
    from mot import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
    from mot import config as config_lib  # pylint: disable=g-import-not-at-top
    params, saved, restored_step = ckpt_lib.restore_params(workdir, step, use_ema)
    try:
      return cls(complete_config(saved), params, restored_step)
    except config_lib.ConfigError as e:
      raise ckpt_lib.CheckpointError(
          f"the config saved with checkpoint {restored_step} in {workdir} is not valid: {e}"
      ) from None

  # -------------------------------------------------------------------------- prompts ---
  def _encode(self, text: str) -> list[int]:
    return _TOKENIZER.encode(text)

  def _check_length(self, n: int, extra: int, what: str) -> None:
    if n + extra > self.context_length:
      raise InputError(
          f"{what} needs {n + extra} tokens but the model's context is "
          f"{self.context_length} (the larger of config.data.seq_len and "
          "config.sample.context_length): shorten the prompt")

  def reasoning_prompt(self, text: str, image: np.ndarray | None = None,
                       video: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BOS, [clean image], [clean video], text: the reading layout up to its answer."""
    b = SequenceBuilder(self.model_cfg.patch_dim)
    b.add_text([tokenizer_lib.BOS])
    if image is not None:
      b.add_image(digits.patchify_window(to_model_scale(image), self.patch_size,
                                         self.read_window), noised=False)
    if video is not None:
      b.add_video(digits.patchify(to_model_scale(video), self.patch_size), noised=False)
    b.add_text(self._encode(text))
    return b.build()

  def generation_example(self, text: str, answer_ids: Sequence[int] = ()
                         ) -> dict[str, np.ndarray]:
    """BOS, text (+ answer ids) as conditioning, a noised image block: the drawing layout."""
    b = SequenceBuilder(self.model_cfg.patch_dim)
    b.add_text([tokenizer_lib.BOS])
    b.add_text(self._encode(text), cond=True)
    if answer_ids:
      b.add_text(list(answer_ids), cond=True)
    side = self.image_size
    b.add_image(digits.patchify(np.zeros((side, side), np.float32), self.patch_size),
                noised=True)
    return b.build()

  def _blank_frames(self, n: int) -> np.ndarray:
    side = self.image_size
    return digits.patchify(np.zeros((n, side, side), np.float32), self.patch_size)

  def _add_frames_to_draw(self, b: SequenceBuilder, num_frames: int,
                          drawn: np.ndarray | None, given: np.ndarray | None = None) -> None:
    """Appends the frames to generate. Layout "clip": num_frames noised frames, one
    block. Layout "frames": the `given` first frame [1, H, W] (if any, as conditioning)
    and the frames drawn so far (float [k, H, W] in [0, 1]) clean, then the next frame
    noised: the example that draws frame k (`_draw_clips`)."""
    if self.video_layout == "clip":
      b.add_video(self._blank_frames(num_frames), noised=True)
      return
    side = self.image_size
    empty = np.zeros((0, side, side), np.float32)
    given = empty if given is None else np.asarray(given, np.float32)
    drawn = empty if drawn is None else np.asarray(drawn, np.float32)
    known = np.concatenate([given, drawn])
    patches = np.concatenate([digits.patchify(to_model_scale(known), self.patch_size),
                              self._blank_frames(1)])
    b.add_video_frames(patches, ["given"] * len(given) + ["clean"] * len(drawn) + ["noised"])

  def video_generation_example(self, text: str, num_frames: int,
                               drawn: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BOS, text as conditioning, the clip to draw (caption -> clip; see
    `_add_frames_to_draw` for `drawn`)."""
    b = SequenceBuilder(self.model_cfg.patch_dim)
    b.add_text([tokenizer_lib.BOS])
    b.add_text(self._encode(text), cond=True)
    self._add_frames_to_draw(b, num_frames, drawn)
    return b.build()

  def world_model_example(self, first_frame: np.ndarray, actions: np.ndarray,
                          drawn: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The world-model layout (mot.data.moving_digits): first frame [H, W] in [0, 1],
    actions [K, 2], the K frames to draw (`_add_frames_to_draw` for `drawn`)."""
    b = SequenceBuilder(self.model_cfg.patch_dim)
    b.add_text([tokenizer_lib.BOS])
    if self.video_layout == "clip":
      b.add_video(digits.patchify(to_model_scale(first_frame[None]), self.patch_size),
                  noised=False, cond=True)
      b.add_action(np.asarray(actions, np.float32), noised=False, cond=True)
      self._add_frames_to_draw(b, len(actions), None)
    else:  # as mot.data.moving_digits.world_model_example: the first frame opens the clip
      b.add_action(np.asarray(actions, np.float32), noised=False, cond=True)
      self._add_frames_to_draw(b, len(actions), drawn, given=first_frame[None])
    return b.build()

  def _draw_clips(self, make_example, rows: int, num_frames: int, steps, cfg_scale, sampler,
                  seed) -> np.ndarray:
    """float32 [rows, num_frames, H, W] in [0, 1]; make_example(row, drawn) -> example.

    Layout "clip" denoises all frames in one block. Layout "frames" rolls out: frame k
    of every row is drawn from the row's frames 0..k-1 (as drawn, clipped to [0, 1]),
    with its own noise stream (seed, row, k + 1), so it is as reproducible as an image.
    """
    if self.video_layout == "clip":
      x0 = self._denoise([make_example(r, None) for r in range(rows)], 1, steps, cfg_scale,
                         sampler, seed)
      return self._to_clips(x0, num_frames)
    side = self.image_size
    clips = np.zeros((rows, 0, side, side), np.float32)
    for k in range(num_frames):
      examples = [make_example(r, clips[r]) for r in range(rows)]
      x0 = self._denoise(examples, 1, steps, cfg_scale, sampler, seed, stream=k + 1)
      clips = np.concatenate([clips, self._to_images(x0)[:, None]], axis=1)
    return clips

  def inverse_dynamics_example(self, clip: np.ndarray) -> dict[str, np.ndarray]:
    """BOS, [clip [T, H, W] in [0, 1]], "actions:", T - 1 noised actions."""
    b = SequenceBuilder(self.model_cfg.patch_dim)
    b.add_text([tokenizer_lib.BOS])
    b.add_video(digits.patchify(to_model_scale(clip), self.patch_size), noised=False,
                cond=True)
    b.add_text(self._encode("actions:"))  # = mot.data.moving_digits.ACTIONS_PROMPT
    b.add_action(np.zeros((len(clip) - 1, self.model_cfg.modality_patch_dims[3]),
                          np.float32), noised=True)
    return b.build()

  def _require_video(self, what: str) -> None:
    if not self.is_video:
      raise InputError(f"{what} needs a video checkpoint (config.data.dataset="
                       f"'moving_digits'); this one was trained on "
                       f"{self.config.data.dataset!r}")

  def _frames_arg(self, num_frames) -> int:
    num_frames = self.num_frames if num_frames is None else num_frames
    if not (isinstance(num_frames, (int, np.integer)) and num_frames >= 1):
      raise InputError(f"num_frames={num_frames!r} must be a positive integer")
    return int(num_frames)

  def _clips(self, video: Any) -> np.ndarray:
    """float32 [N, T, S, S] in [0, 1] from frames [T, H, W] / clips [N, T, H, W] (digits
    scale 0..16 or 0..1), or a GIF path / folder of frames (or a list of them)."""
    if isinstance(video, (str, os.PathLike)):
      return load_clip(video, self.image_size)[None]
    if isinstance(video, (list, tuple)) and video and isinstance(video[0], (str, os.PathLike)):
      clips = [load_clip(v, self.image_size) for v in video]
      if len({len(c) for c in clips}) != 1:
        raise InputError(f"clips have different frame counts {[len(c) for c in clips]}: "
                         "give clips of one length per call")
      return np.stack(clips)
    arr = np.asarray(video, np.float32)
    if arr.ndim == 3:
      arr = arr[None]
    if arr.ndim != 4 or arr.size == 0:
      raise InputError(f"video must be frames [T, H, W] or clips [N, T, H, W], got shape "
                       f"{arr.shape}")
    n, t = arr.shape[:2]
    frames = to_unit_images(arr.reshape(n * t, *arr.shape[2:]), self.image_size)[0]
    return frames.reshape(n, t, self.image_size, self.image_size)

  # -------------------------------------------------------------------------- reason ----
  def reason(self, prompt: str | Sequence[str] | None = None, images: Any = None,
             video: Any = None, max_new_tokens: int = 16, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             shifts: int | None = None) -> str | list[str]:
    """Answers prompts with the AR head, in one batched jitted decode (chunked if large).

    Args:
      prompt: a string or a list of strings; None asks the checkpoint's own question
        ("What digit is this?", or "Which digit moves, and where?" for clips).
      images: None; an array [H, W] / [N, H, W] (digits scale 0..16, or 0..1); a path,
        PIL image, or a list of them. With N images and one prompt, one answer per image;
        with N prompts, image i goes with prompt i.
      video: None; frames [T, H, W] (same scales), one clip for every prompt; clips
        [N, T, H, W] (or GIF paths / frame folders), one answer per clip as for images.
      max_new_tokens: most tokens per answer; decoding stops at EOS.
      temperature: 0 is greedy; otherwise top_k (0 = off) and top_p (1 = off) filter.
      seed: sampling seed (row i always draws from the same stream).
      shifts: test-time augmentation for images: each image is read in the (2s+1)^2
        views moved by -s..s pixels per axis (background-filled, as the training shifts)
        and one answer is decoded from the views' mean log-probabilities
        (`sampling.decode(views=...)`). 0 reads the image as given; None takes
        config.sample.reason_shifts. Needs images.
    Returns:
      The answer (str) for one prompt and at most one image, else a list of answers.
    """
    if prompt is None:
      prompt = VIDEO_QUESTION if self.is_video else DEFAULT_QUESTION
    prompts, single = _as_list(prompt)
    self._check_decoding(max_new_tokens, temperature, top_k, top_p)
    seed = _check_seed(seed)
    unit, single_image = (None, True) if images is None else to_unit_images(
        images, self.image_size)
    clips = None if video is None else self._clips(video)
    if clips is not None and unit is not None:
      raise InputError("give images or a video, not both")
    if clips is not None and len(clips) > 1:
      unit, single_image = None, False
      if len(prompts) not in (1, len(clips)):
        raise InputError(f"{len(prompts)} prompts for {len(clips)} clips: give one "
                         "prompt, or one per clip")
    if unit is not None and len(prompts) not in (1, len(unit)):
      raise InputError(f"{len(prompts)} prompts for {len(unit)} images: give one prompt, "
                       "or one per image")
    from mot.data.tasks import shift_image  # pylint: disable=g-import-not-at-top
    views = self._shift_views(shifts, unit is not None)
    n = len(prompts) if unit is None else len(unit)
    if clips is not None and len(clips) > 1:
      n = len(clips)
    examples = []
    for i in range(n):
      text = prompts[i if len(prompts) > 1 else 0]
      clip = None if clips is None else clips[i if len(clips) > 1 else 0]
      for dy, dx in views:
        image = None if unit is None else shift_image(unit[i], dy, dx, background=0.0)
        ex = self.reasoning_prompt(text, image, clip)
        self._check_length(len(ex["tokens"]), max_new_tokens, "prompt plus answer")
        examples.append(ex)
    ids = self._decode(examples, max_new_tokens, temperature, top_k, top_p, seed,
                       views=len(views))
    answers = [_TOKENIZER.decode(row).strip() for row in ids]
    return answers[0] if single and single_image and n == 1 else answers

  def _shift_views(self, shifts: int | None, has_images: bool) -> list[tuple[int, int]]:
    """The (dy, dx) views `reason` reads each image in: [(0, 0)] without test-time shifts."""
    if shifts is None:
      shifts = self.default_reason_shifts if has_images else 0
    _check_shifts(shifts)
    if shifts and not has_images:
      raise InputError(f"shifts={shifts} moves images, but no image was given: use shifts=0")
    r = range(-int(shifts), int(shifts) + 1)
    return [(dy, dx) for dy in r for dx in r]

  def _check_decoding(self, max_new_tokens, temperature, top_k, top_p) -> None:
    if not (isinstance(max_new_tokens, (int, np.integer)) and max_new_tokens >= 1):
      raise InputError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    if not (math.isfinite(temperature) and temperature >= 0):
      raise InputError(f"temperature={temperature!r} must be a finite number >= 0")
    if not (isinstance(top_k, (int, np.integer)) and top_k >= 0):
      raise InputError(f"top_k={top_k!r} must be an integer >= 0 (0 = off)")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
      raise InputError(f"top_p={top_p!r} must be in (0, 1] (1 = off)")

  def _decode(self, examples, max_new_tokens, temperature, top_k, top_p, seed, views=1
              ) -> list[list[int]]:
    """Answer ids (up to, without, the stop token) of each example, or of each group of
    `views` consecutive examples decoded as one ensemble (`sampling.decode`)."""
    from mot import sampling  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    rng = jax.random.PRNGKey(seed)
    length = sampling.length_bucket(max(len(ex["tokens"]) for ex in examples))
    stop = sampling.stop_mask()
    out = []
    groups = len(examples) // views
    for start, stop_i, batch in _chunks(groups, max(1, MAX_DECODE_BATCH // views)):
      rows = (stop_i - start) * views
      padded = sampling.pad_left(examples[start * views:stop_i * views], length,
                                 batch * views, row_ids=range(start * views, stop_i * views))
      tokens, _ = sampling.decode(self.model, self.params, padded, max_new_tokens, rng,
                                  temperature, top_k, top_p, views=views)
      for row in tokens[:rows:views]:
        ends = np.flatnonzero(stop[row])
        out.append([int(t) for t in row[:ends[0] if ends.size else len(row)]])
    return out

  # -------------------------------------------------------------------------- generate --
  def _check_sampling(self, num_samples, steps, cfg_scale, sampler):
    from mot import diffusion  # pylint: disable=g-import-not-at-top
    steps = self.default_steps if steps is None else steps
    cfg_scale = self.default_cfg_scale if cfg_scale is None else cfg_scale
    sampler = self.default_sampler if sampler is None else sampler
    if not (isinstance(num_samples, (int, np.integer)) and num_samples >= 1):
      raise InputError(f"num_samples={num_samples!r} must be a positive integer")
    if not (isinstance(steps, (int, np.integer)) and steps >= 1):
      raise InputError(f"steps={steps!r} must be a positive integer")
    if not math.isfinite(float(cfg_scale)):
      raise InputError(f"cfg_scale={cfg_scale!r} must be a finite number")
    if sampler not in diffusion.SAMPLERS:
      raise InputError(f"sampler={sampler!r} is unknown: use one of "
                       f"{sorted(diffusion.SAMPLERS)}")
    return int(steps), float(cfg_scale), sampler

  def generate(self, prompt: str | Sequence[str], num_samples: int = 1,
               steps: int | None = None, cfg_scale: float | None = None,
               sampler: str | None = None, seed: int = 0,
               num_frames: int | None = None) -> np.ndarray:
    """Draws images with the DM head: float32 [len(prompts) * num_samples, H, W] in [0, 1].

    Samples are prompt-major (all of prompt 0's, then prompt 1's, ...). `steps`,
    `cfg_scale` and `sampler` default to `config.sample`. Sample k's starting noise
    depends only on (seed, k): a fixed seed reproduces the output exactly.
    A video checkpoint draws clips instead: float32 [N, num_frames, H, W] (num_frames
    defaults to config.data.num_frames, the length it trained on).
    """
    prompts, _ = _as_list(prompt)
    steps, cfg_scale, sampler = self._check_sampling(num_samples, steps, cfg_scale, sampler)
    seed = _check_seed(seed)
    if not self.is_video:
      if num_frames is not None:
        self._require_video("num_frames")
      examples = [self.generation_example(p) for p in prompts]
      return self._draw(examples, num_samples, steps, cfg_scale, sampler, seed)
    t = self._frames_arg(num_frames)
    rows = [p for p in prompts for _ in range(num_samples)]
    return self._draw_clips(lambda r, drawn: self.video_generation_example(rows[r], t, drawn),
                            len(rows), t, steps, cfg_scale, sampler, seed)

  def predict(self, first_frames: Any, actions: Any, num_samples: int = 1,
              steps: int | None = None, cfg_scale: float | None = None,
              sampler: str | None = None, seed: int = 0) -> np.ndarray:
    """World model: first frame(s) + an action chunk -> the clip that follows.

    Args:
      first_frames: an image [H, W] / images [N, H, W] (digits scale 0..16, or 0..1), a
        path or a list of them (as `reason`'s images).
      actions: float [K, 2] (dx, dy) per step in pixels, or a string such as
        "right,right,up" (`mot.data.moving_digits.parse_actions`), shared by every frame;
        or [N, K, 2], one chunk per first frame.
    Returns:
      float32 [N * num_samples, K + 1, H, W] in [0, 1]: the given first frame, then the
      K predicted frames (frame-major per first frame, as `generate` is prompt-major).
    """
    from mot.data import moving_digits  # pylint: disable=g-import-not-at-top
    self._require_video("predict")
    steps, cfg_scale, sampler = self._check_sampling(num_samples, steps, cfg_scale, sampler)
    seed = _check_seed(seed)
    if isinstance(actions, str):
      try:
        actions = moving_digits.parse_actions(actions)
      except ValueError as e:
        raise InputError(str(e)) from None
    actions = np.asarray(actions, np.float32)
    frames, _ = to_unit_images(first_frames, self.image_size)
    if actions.ndim == 2:
      actions = np.broadcast_to(actions, (len(frames), *actions.shape))
    if (actions.ndim != 3 or actions.shape[0] != len(frames) or actions.shape[1] < 1
        or actions.shape[2] != 2):
      raise InputError(f"actions must be [K, 2] (dx, dy) steps, or [N, K, 2] for N first "
                       f"frames; got shape {actions.shape} for {len(frames)} frames")
    if not np.all(np.isfinite(actions)):
      raise InputError("actions hold non-finite values")
    rows = [(f, a) for f, a in zip(frames, actions) for _ in range(num_samples)]
    predicted = self._draw_clips(
        lambda r, drawn: self.world_model_example(*rows[r], drawn), len(rows),
        actions.shape[1], steps, cfg_scale, sampler, seed)
    first = np.repeat(frames, num_samples, axis=0)[:, None]
    return np.concatenate([first, predicted], axis=1)

  def infer_actions(self, video: Any, steps: int | None = None, sampler: str | None = None,
                    seed: int = 0) -> np.ndarray:
    """Inverse dynamics: clip(s) [T, H, W] / [N, T, H, W] (or GIF paths) -> float32
    [N, T - 1, 2] (dx, dy) actions drawn by the DM head (no guidance)."""
    self._require_video("infer_actions")
    steps, _, sampler = self._check_sampling(1, steps, 1.0, sampler)
    seed = _check_seed(seed)
    clips = self._clips(video)
    if clips.shape[1] < 2:
      raise InputError("a clip needs at least 2 frames to have actions")
    examples = [self.inverse_dynamics_example(c) for c in clips]
    x0 = self._denoise(examples, 1, steps, 1.0, sampler, seed)
    return x0[..., :self.model_cfg.modality_patch_dims[3]].astype(np.float32)

  def _draw(self, examples, num_samples, steps, cfg_scale, sampler, seed) -> np.ndarray:
    return self._to_images(self._denoise(examples, num_samples, steps, cfg_scale, sampler,
                                         seed))

  def _denoise(self, examples, num_samples, steps, cfg_scale, sampler, seed,
               stream: int | None = None) -> np.ndarray:
    """float32 [len(examples) * num_samples, M, P]: each example's dm_mask block drawn.
    Row i starts from the noise of (seed, i) (or (seed, i, stream))."""
    from mot import sampling  # pylint: disable=g-import-not-at-top
    prefixes, blocks = [], []
    for ex in examples:
      self._check_length(len(ex["tokens"]), 1, "prompt plus generated block")  # + EOS
      prefix, block = sampling.split_block(ex)
      prefixes += [prefix] * num_samples
      blocks += [block] * num_samples
    length = sampling.length_bucket(max(len(p["tokens"]) for p in prefixes))
    m, p = blocks[0]["tokens"].shape[0], self.model_cfg.patch_dim
    out = []
    for start, stop, batch in _chunks(len(prefixes), MAX_SAMPLE_BATCH):
      prefix = sampling.pad_left(prefixes[start:stop], length, batch)
      block = sampling.block_arrays(blocks[start:stop], batch)
      ids = np.arange(start, start + batch)  # padding rows draw their own (unused) noise
      noise = sampling.initial_noise(seed, ids, (m, p), stream)
      x0 = sampling.denoise(self.model, self.params, prefix, block, noise, steps,
                            cfg_scale, sampler, self.time_shift)
      out.append(x0[:stop - start])
    return np.concatenate(out)

  def _to_clips(self, patches: np.ndarray, num_frames: int) -> np.ndarray:
    """[N, T * g * g, P] model-scale patches -> float32 [N, T, H, W] in [0, 1]."""
    n = len(patches)
    frames = self._to_images(patches.reshape(n * num_frames, -1, patches.shape[-1]))
    return frames.reshape(n, num_frames, *frames.shape[1:])

  def _to_images(self, patches: np.ndarray) -> np.ndarray:
    """[N, M, P] model-scale patches -> float32 [N, H, W] in [0, 1]."""
    side, ps = self.image_size, self.patch_size
    grid_side = side // ps
    x = patches[..., :ps * ps].reshape(-1, grid_side, grid_side, ps * ps)
    return np.clip((digits.unpatchify(x, ps) + 1.0) / 2.0, 0.0, 1.0).astype(np.float32)

  # -------------------------------------------------------------------------- both ------
  def think_then_draw(self, prompt: str | Sequence[str], num_samples: int = 1,
                      max_new_tokens: int = 8, steps: int | None = None,
                      cfg_scale: float | None = None, sampler: str | None = None,
                      seed: int = 0, temperature: float = 0.0, top_k: int = 0,
                      top_p: float = 1.0) -> tuple[str | list[str], np.ndarray]:
    """The AR head answers, then the DM head draws the answer in the same sequence.

    E.g. "draw the digit after 3:" (the training template of the interleaved task) ->
    "4" -> an image of a 4. The sequence is BOS, prompt, answer (both conditioning),
    image. Returns (answer or list of answers, float32 [len(prompts) * num_samples, H, W]).
    """
    prompts, single = _as_list(prompt)
    if self.is_video:
      raise InputError("think_then_draw draws images; this is a video checkpoint: use "
                       "generate, predict or reason")
    self._check_decoding(max_new_tokens, temperature, top_k, top_p)
    steps, cfg_scale, sampler = self._check_sampling(num_samples, steps, cfg_scale, sampler)
    seed = _check_seed(seed)
    m = (self.image_size // self.patch_size) ** 2
    asks = []
    for p in prompts:
      ex = self.reasoning_prompt(p)
      self._check_length(len(ex["tokens"]), max_new_tokens + m + 3, "prompt, answer and image")
      asks.append(ex)
    answer_ids = self._decode(asks, max_new_tokens, temperature, top_k, top_p, seed)
    examples = [self.generation_example(p, ids) for p, ids in zip(prompts, answer_ids)]
    images = self._draw(examples, num_samples, steps, cfg_scale, sampler, seed)
    answers = [_TOKENIZER.decode(ids).strip() for ids in answer_ids]
    return (answers[0] if single else answers), images


# ----------------------------------------------------------------------------------------
# sample.py
# ----------------------------------------------------------------------------------------
MODES = ("reason", "generate", "think_then_draw")


def check_out_dir(out: str | None, mode: str) -> None:
  if mode == "reason":
    return
  if not out:
    raise InputError(f"--mode {mode} writes images: give --out DIR")
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--out {out} is a file, not a directory")


def write_samples(out: str, images: np.ndarray, records: list[dict], rows: int,
                  settings: dict) -> list[dict]:
  """One PNG per sample, grid.png (one row per prompt) and manifest.json in `out`."""
  os.makedirs(out, exist_ok=True)
  for image, record in zip(images, records):
    save_png(os.path.join(out, record["file"]), image)
  save_png(os.path.join(out, "grid.png"), grid(images, rows))
  manifest = dict(settings, grid="grid.png", samples=records)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
  return records


def write_clips(out: str, clips: np.ndarray, records: list[dict], settings: dict
                ) -> list[dict]:
  """One GIF per clip [T, H, W], grid.png (one row per clip, one column per frame) and
  manifest.json in `out`."""
  os.makedirs(out, exist_ok=True)
  for clip, record in zip(clips, records):
    save_gif(os.path.join(out, record["file"]), clip)
  n, t = clips.shape[:2]
  save_png(os.path.join(out, "grid.png"), grid(clips.reshape(n * t, *clips.shape[2:]), n))
  manifest = dict(settings, grid="grid.png", samples=records)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
  return records


def _parse_actions(actions: str) -> np.ndarray:
  from mot.data import moving_digits  # pylint: disable=g-import-not-at-top
  try:
    return moving_digits.parse_actions(actions)
  except ValueError as e:
    raise InputError(str(e)) from None


def run_sample(workdir: str, mode: str, images: Sequence[str] = (),
               prompts: Sequence[str] = (), as_json: bool = False, num_samples: int = 1,
               out: str | None = None, steps: int | None = None,
               cfg_scale: float | None = None, sampler: str | None = None, seed: int = 0,
               stdout=None, actions: str | None = None,
               num_frames: int | None = None, reason_shifts: int | None = None) -> None:
  """sample.py: validates every input, loads the checkpoint, samples, then writes.

  Nothing is written (files or stdout) before all inputs are checked and all sampling
  has succeeded; every user error is an InputError / CheckpointError with one line.
  Video checkpoints: --mode generate writes one GIF per clip (caption -> clip, or with
  `actions` and --images FIRST_FRAME the world model's prediction); --mode reason reads
  each --images item (a GIF or a folder of frames) as one clip.
  """
  stdout = stdout or sys.stdout
  # ---- Inputs first: cheap checks before the checkpoint is read. ----
  if mode not in MODES:
    raise InputError(f"--mode {mode!r} is unknown: use one of {MODES}")
  if reason_shifts is not None and mode != "reason":
    raise InputError(f"--reason_shifts is for --mode reason, not --mode {mode}: drop it")
  if reason_shifts is not None:
    _check_shifts(reason_shifts)
  action_array = None
  if actions is not None:
    if mode != "generate":
      raise InputError(f"--actions is for --mode generate (with --images FIRST_FRAME), "
                       f"not {mode}")
    action_array = _parse_actions(actions)
    if not images:
      raise InputError("--actions needs the first frame(s): give --images FIRST_FRAME.png")
    if prompts:
      raise InputError("--actions predicts from a first frame, not a --prompt: drop --prompt")
  if num_frames is not None and (mode != "generate" or actions is not None):
    raise InputError("--num_frames is for --mode generate from a --prompt (with --actions "
                     "the clip has one frame per action plus the first)")
  if num_frames is not None and num_frames < 1:
    raise InputError(f"--num_frames={num_frames} must be >= 1")
  prompts = list(prompts)
  if not prompts and mode != "reason" and action_array is None:
    raise InputError(f"--mode {mode} needs --prompt")
  if prompts:
    _as_list(prompts)
  _check_seed(seed)
  if images and mode != "reason" and action_array is None:
    raise InputError(f"--images is for --mode reason (or --mode generate with --actions), "
                     f"not {mode}")
  if mode != "reason":
    if num_samples < 1:
      raise InputError(f"--num_samples={num_samples} must be >= 1")
    if steps is not None and steps < 1:
      raise InputError(f"--steps={steps} must be >= 1")
    if cfg_scale is not None and not math.isfinite(cfg_scale):
      raise InputError(f"--cfg_scale={cfg_scale} must be a finite number")
  check_out_dir(out, mode)
  paths = image_paths(images)
  pixels = [load_image(p, None) for p in paths]  # Every file is read (and checked) here.

  # ---- Model. ----
  pipe = Pipeline.from_workdir(workdir)
  if not pipe.is_video and (action_array is not None or num_frames is not None):
    pipe._require_video("--actions" if action_array is not None else "--num_frames")  # pylint: disable=protected-access
  settings = {"workdir": os.path.abspath(workdir), "checkpoint_step": pipe.step,
              "mode": mode, "seed": seed}
  if pipe.is_video and reason_shifts:
    raise InputError("--reason_shifts moves still images; this is a video checkpoint: drop it")
  if pipe.is_video:
    return _run_video(pipe, settings, mode, images, prompts, as_json, num_samples, out,
                      steps, cfg_scale, sampler, seed, stdout, action_array, num_frames)
  prompts = prompts or [DEFAULT_QUESTION]

  if mode == "reason":
    if paths:
      pairs = [(path, p) for path in paths for p in prompts]
      answers = pipe.reason([p for _, p in pairs], seed=seed,
                            images=[x for x in pixels for _ in prompts],
                            shifts=reason_shifts)
    else:
      pairs = [(None, p) for p in prompts]
      answers = pipe.reason(list(prompts), seed=seed, shifts=reason_shifts)
    _print_answers(pairs, answers, as_json, stdout, "image")
    return

  steps, cfg_scale, sampler = pipe._check_sampling(num_samples, steps, cfg_scale, sampler)  # pylint: disable=protected-access
  settings.update(steps=steps, cfg_scale=cfg_scale, sampler=sampler)
  answers = None
  if mode == "generate":
    images_out = pipe.generate(prompts, num_samples, steps, cfg_scale, sampler, seed)
  else:
    answers, images_out = pipe.think_then_draw(prompts, num_samples, steps=steps,
                                               cfg_scale=cfg_scale, sampler=sampler,
                                               seed=seed)
  records = []
  for k in range(len(images_out)):
    i, s = divmod(k, num_samples)
    record = {"file": f"sample_{k:04d}.png", "prompt": prompts[i], "prompt_index": i,
              "sample_index": s}
    if answers is not None:
      record["answer"] = answers[i]
    records.append(record)
  write_samples(out, images_out, records, len(prompts), settings)
  _print_records(out, records, as_json, stdout)
  if not as_json:
    if answers is not None:
      for p, a in zip(prompts, answers):
        print(f"{p}\t{a}", file=stdout)
    print(f"wrote {len(records)} samples, grid.png and manifest.json to {out}", file=stdout)


def _print_answers(pairs, answers, as_json, stdout, key) -> None:
  for (path, p), a in zip(pairs, answers):
    if as_json:
      print(json.dumps({key: path, "prompt": p, "answer": a}), file=stdout)
    else:
      print(f"{path if path is not None else p}\t{a}", file=stdout)


def _print_records(out, records, as_json, stdout) -> None:
  for record in records:
    if as_json:
      print(json.dumps(dict(record, file=os.path.join(out, record["file"]))), file=stdout)


def _run_video(pipe: Pipeline, settings, mode, items, prompts, as_json, num_samples, out,
               steps, cfg_scale, sampler, seed, stdout, actions, num_frames) -> None:
  """run_sample for a video checkpoint (inputs already checked; `settings` is the
  manifest's record of the run, filled in further here)."""
  if mode == "think_then_draw":
    raise InputError("--mode think_then_draw draws images; this is a video checkpoint: "
                     "use --mode generate or --mode reason")
  if mode == "reason":
    prompts = prompts or [VIDEO_QUESTION]
    clips = [load_clip(item, pipe.image_size) for item in items]  # each item: one clip
    if clips:
      pairs = [(item, p) for item in items for p in prompts]
      answers = []
      for clip in clips:  # clips may differ in length: one batched call per clip
        answers += pipe.reason(list(prompts), video=clip, seed=seed)
    else:
      pairs = [(None, p) for p in prompts]
      answers = pipe.reason(list(prompts), seed=seed)
    _print_answers(pairs, answers, as_json, stdout, "clip")
    return
  steps, cfg_scale, sampler = pipe._check_sampling(num_samples, steps, cfg_scale, sampler)  # pylint: disable=protected-access
  settings.update(steps=steps, cfg_scale=cfg_scale, sampler=sampler)
  records = []
  if actions is not None:
    paths = image_paths(items)
    first = [load_image(p, pipe.image_size) for p in paths]
    clips = pipe.predict(np.stack(first), actions, num_samples, steps, cfg_scale, sampler,
                         seed)
    settings["actions"] = actions.tolist()
    for k in range(len(clips)):
      i, s = divmod(k, num_samples)
      records.append({"file": f"clip_{k:04d}.gif", "first_frame": paths[i],
                      "first_frame_index": i, "sample_index": s})
  else:
    clips = pipe.generate(prompts, num_samples, steps, cfg_scale, sampler, seed,
                          num_frames=num_frames)
    for k in range(len(clips)):
      i, s = divmod(k, num_samples)
      records.append({"file": f"clip_{k:04d}.gif", "prompt": prompts[i], "prompt_index": i,
                      "sample_index": s})
  settings["num_frames"] = int(clips.shape[1])
  write_clips(out, clips, records, settings)
  _print_records(out, records, as_json, stdout)
  if not as_json:
    print(f"wrote {len(records)} clips (GIF), grid.png and manifest.json to {out}",
          file=stdout)
