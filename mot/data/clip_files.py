"""Clips in files: a GIF (or any multi-frame image Pillow reads), a folder of frame images
(sorted by name), or a video file (MP4 and the other containers ffmpeg reads, through
imageio and the ffmpeg that imageio-ffmpeg bundles: nothing to install).

Frames are decoded and fitted by `mot.data.preprocess`, the run's image preprocessing, so
a user's clip is read by sampling exactly as the training clips were. Every error is one
line naming the file and the fix (a ValueError; the callers turn it into theirs).

  header = clip_files.check_clip("clips/a.mp4")        # frames, size, gray: no decoding
  clip = clip_files.load_clip("clips/a.gif", options, num_frames=8)  # [8, H, W(, 3)] in [0, 1]
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
import numpy as np
from PIL import Image, ImageSequence

from mot import media
from mot.data import preprocess

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".webm", ".mkv")
_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, EOFError, IndexError,
           Image.DecompressionBombError)


@dataclasses.dataclass(frozen=True)
class ClipHeader:
  """What checking a clip file tells: its frame count, frame size and whether it is gray."""
  frames: int
  height: int
  width: int
  gray: bool


def is_video_file(path: str) -> bool:
  """Whether `path` is read through ffmpeg (by its extension)."""
  return os.fspath(path).lower().endswith(VIDEO_EXTENSIONS)


def _bad(name: str, what: str, e: BaseException) -> ValueError:
  first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return ValueError(f"{name}: cannot decode the {what} ({first[:120]}); re-save it (GIF, "
                    "MP4 or a folder of PNG frames) or remove it from the data")


def check_clip(path: str, name: str | None = None) -> ClipHeader:
  """Counts a clip's frames and reads its first frame's size and mode (a GIF's frames
  as `load_clip` counts them); a one-line ValueError for anything unreadable."""
  name = name or os.fspath(path)
  if os.path.isdir(path):
    try:
      frames = media.image_paths([path])
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from None
    header = preprocess.check_header(frames[0], f"{frames[0]} (a frame of {name})")
    return ClipHeader(len(frames), header.height, header.width, header.gray)
  if not os.path.isfile(path):
    raise ValueError(f"{name}: the clip does not exist")
  if is_video_file(path):
    first = _video_frames(path, name, limit=1)[0]
    return ClipHeader(_video_frame_count(path, name), first.shape[0], first.shape[1], False)
  try:
    with Image.open(path) as im:
      gray = preprocess.is_gray(im)
      durations = [f.info.get("duration") for f in ImageSequence.Iterator(im)]
      w, h = im.size
  except _ERRORS as e:
    raise _bad(name, "clip", e) from None
  return ClipHeader(sum(media.frame_repeats(durations)), h, w, gray)


def read_frames(path: str, channels: int, limit: int | None = None,
                name: str | None = None) -> list[np.ndarray]:
  """The first `limit` (None: all) frames of a clip, decoded (`preprocess.decode`, not yet
  resized): float32 [h, w] or [h, w, 3] in [0, 1] each."""
  name = name or os.fspath(path)
  if os.path.isdir(path):
    paths = media.image_paths([path])[:limit]
    return [_decode_file(p, channels) for p in paths]
  if is_video_file(path):
    return [preprocess.decode(Image.fromarray(f), channels)
            for f in _video_frames(path, name, limit)]
  try:
    with Image.open(path) as im:
      read = [(f.convert("RGBA"), f.info.get("duration")) for f in ImageSequence.Iterator(im)]
  except _ERRORS as e:
    raise _bad(name, "clip", e) from None
  frames, durations = zip(*read)
  out = []
  for frame, repeat in zip(frames, media.frame_repeats(list(durations))):
    out += [preprocess.decode(frame, channels)] * repeat
  return out[:limit]


def load_clip(path: str, options: preprocess.ImageOptions, num_frames: int | None = None,
              name: str | None = None) -> np.ndarray:
  """float32 [T, *options.shape] in [0, 1]: the first `num_frames` frames (None: all) of
  a clip, each through the run's preprocessing; fewer frames is a one-line ValueError."""
  name = name or os.fspath(path)
  frames = read_frames(path, options.channels, num_frames, name)
  if not frames or (num_frames is not None and len(frames) < num_frames):
    raise ValueError(f"{name} has {len(frames)} frame(s) but the run needs {num_frames} "
                     "(config.data.num_frames): give a longer clip")
  return np.stack([preprocess.fit(f, options) for f in frames])


def _decode_file(path: str, channels: int) -> np.ndarray:
  try:
    with Image.open(path) as im:
      return preprocess.decode(im, channels)
  except _ERRORS as e:
    raise _bad(path, "frame", e) from None


def _video_frames(path: str, name: str, limit: int | None) -> list[np.ndarray]:
  """uint8 [h, w, 3] frames of a video file, through imageio's ffmpeg plugin."""
  import imageio.v3 as iio  # lazy: imageio starts ffmpeg only for video files
  frames = []
  try:
    for frame in _quiet_fork(iio.imiter(path, plugin="FFMPEG")):
      frames.append(np.asarray(frame, np.uint8))
      if limit is not None and len(frames) >= limit:
        break
  except _ERRORS as e:
    raise _bad(name, "video", e) from None
  if not frames:
    raise ValueError(f"{name}: the video has no frames; re-encode it or remove it")
  return frames


def _video_frame_count(path: str, name: str) -> int:
  import imageio_ffmpeg  # lazy: as _video_frames
  try:
    with _fork_warning_off():
      return int(imageio_ffmpeg.count_frames_and_secs(path)[0])
  except _ERRORS as e:
    raise _bad(name, "video", e) from None


@contextlib.contextmanager
def _fork_warning_off():
  """JAX warns on every os.fork; imageio's fork execs ffmpeg at once (subprocess), which
  is safe in a threaded process, so the warning would only alarm."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                            category=RuntimeWarning)
    yield


def _quiet_fork(frames):
  """Iterates `frames` (a generator that may start ffmpeg) with `_fork_warning_off`."""
  with _fork_warning_off():
    yield from frames

