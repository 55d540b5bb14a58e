"""Your own (clip, caption) pairs: config.data.dataset = "video_folder".

`data.path` is a folder holding `captions.jsonl` (or any .jsonl file), one clip a line,
paths relative to the file's folder (or absolute):
  {"video": "clips/001.gif", "caption": "a red ball rolls left"}
A clip is a GIF (or other multi-frame image), a folder of frame images (sorted by name),
or an MP4 (or another container ffmpeg reads: `mot.data.clip_files`). The run trains on
each clip's first `data.num_frames` frames, each read by the run's image preprocessing
(`mot.data.preprocess`: `data.image_size`, `data.channels`, crop / pad / stretch, invert;
the size and channels come from the data unless set, as for image folders).

Tasks, trained and sampled like the moving digits' (`mot.data.moving_digits`):
  video_generation  BOS, caption (AR target, CFG conditioning), the clip (noised; frame
                    by frame, teacher forced, with `data.video_layout="frames"`), EOS
  video_qa          BOS, [clip] (clean), `data.question`, caption (AR target), EOS

Every clip is checked when the dataset is built (readable, at least num_frames frames),
so a bad one is one ValueError naming the file and the fix. The last `data.num_heldout`
pairs (at most a tenth, at least one) are held out for evaluation.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from mot import patches
from mot.data import clip_files, digits, moving_digits, preprocess, tasks, user_data
from mot.data.builder import SequenceBuilder
from mot.errors import field

DATASET = "video_folder"
QUESTION = "Describe this clip."     # configs/video_folder.py's data.question
TASK_NAMES = ("video_generation", "video_qa")
_LINE_EXAMPLE = '{"video": "clips/a.gif", "caption": "a red ball rolls left"}'


class ClipSource:
  """Pairs of (clip file, caption); the clip's first num_frames frames are decoded when
  read: source[i] -> (float32 [T, H, W(, C)] in [-1, 1], caption)."""

  def __init__(self, paths: Sequence[str], captions: Sequence[str],
               options: preprocess.ImageOptions, num_frames: int):
    self.paths, self.captions = list(paths), list(captions)
    self.options, self.num_frames = options, num_frames

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    clip = clip_files.load_clip(self.paths[i], self.options, self.num_frames)
    return preprocess.to_model_range(clip), self.captions[i]


def scan_user_video(data_config: Any) -> user_data.Scan:
  """Checks every line and clip of the dataset once (cached while the captions file is
  unchanged): readable clips, their frame counts, sizes and modes."""
  path = str(field(data_config, "path", "config.data") or "")
  if not path:
    raise ValueError("config.data.path is empty: dataset 'video_folder' needs "
                     "--config.data.path=/path/to/folder (with captions.jsonl) or a .jsonl "
                     "file")
  if os.path.isdir(path):
    jsonl = os.path.join(path, user_data.CAPTIONS_FILE)
    if not os.path.isfile(jsonl):
      raise ValueError(f"{path} has no {user_data.CAPTIONS_FILE}: write one line per clip, "
                       f"e.g. {_LINE_EXAMPLE} (paths relative to the folder)")
  elif os.path.exists(path):
    jsonl = path
  else:
    raise ValueError(f"config.data.path={path} does not exist: pass a folder with "
                     f"{user_data.CAPTIONS_FILE} or a .jsonl file")
  return _scan(jsonl, os.stat(jsonl).st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _scan(jsonl: str, stamp: int) -> user_data.Scan:
  del stamp  # Only part of the cache key.
  paths, captions, headers = [], [], []
  for clip_path, caption, where in user_data.read_jsonl(jsonl, "video", _LINE_EXAMPLE):
    headers.append(clip_files.check_clip(clip_path, f"{clip_path} (from {where})"))
    paths.append(clip_path)
    captions.append(caption)
  return user_data.Scan(jsonl, tuple(paths), (), tuple(captions), tuple(headers))


def open_user_video(data_config: Any) -> user_data.UserData:
  """The checked, split clip dataset of `config.data`; a clip shorter than
  data.num_frames is a one-line ValueError."""
  scan = scan_user_video(data_config)
  num_frames = int(field(data_config, "num_frames", "config.data"))
  for path, header in zip(scan.files, scan.headers):
    if header.frames < num_frames:
      raise ValueError(f"{path} has {header.frames} frame(s) but config.data.num_frames="
                       f"{num_frames}: give clips of at least {num_frames} frames (longer "
                       "ones are cut), lower num_frames, or remove it from the data")
  num_heldout = int(field(data_config, "num_heldout", "config.data"))
  if num_heldout < 1:
    raise ValueError(f"config.data.num_heldout={num_heldout} must be at least 1 "
                     "(evaluation needs held-out pairs)")
  return _split(scan, preprocess.image_options(data_config), num_frames, num_heldout)


@functools.lru_cache(maxsize=8)
def _split(scan: user_data.Scan, options: preprocess.ImageOptions, num_frames: int,
           num_heldout: int) -> user_data.UserData:
  source = ClipSource(scan.files, scan.captions, options, num_frames)
  n = len(source)
  if n < 2:
    raise ValueError(f"{scan.where} has {n} clip(s): at least 2 are needed (one is held "
                     "out for evaluation)")
  held = min(num_heldout, max(1, n // 10))
  return user_data.UserData(user_data.Range(source, 0, n - held),
                            user_data.Range(source, n - held, n), scan.longest_caption,
                            options, num_frames)


# ----------------------------------------------------------------------------------------
# Tasks on (clip, caption) pairs.
# ----------------------------------------------------------------------------------------
def clip_patches(clip: np.ndarray, options: tasks.TaskOptions) -> np.ndarray:
  """[T, H/p, W/p, P'] patches of a model-scale clip [T, H, W(, C)]."""
  return patches.to_patches(clip, options.patch_size, options.channels)


def generation_example(clip: np.ndarray, caption: str,
                       options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Caption -> clip: BOS, caption (AR target, CFG conditioning), noised clip, EOS."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_text(tok.encode(caption), loss=True, cond=True)
  moving_digits.add_frames(b, clip_patches(clip, options), options.video_layout,
                           options.first_frame_weight)
  b.add_text([tok.eos_id], loss=True)
  return b.build()


def qa_example(clip: np.ndarray, caption: str,
               options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Clip -> caption: BOS, clean clip, the question, caption (AR target), EOS (target)."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_video(clip_patches(clip, options), noised=False)
  b.add_text(tok.encode(options.question))
  b.add_text(tok.encode(caption) + [tok.eos_id], loss=True)
  return b.build()


_BUILDERS = {"video_generation": generation_example, "video_qa": qa_example}


def check_task(name: str) -> None:
  """A ValueError unless clip data can make examples of task `name`."""
  if name not in _BUILDERS:
    tasks.get_task(name)  # Unknown anywhere: the digits' error lists every task.
    raise ValueError(f"task {name!r} cannot be made from captioned clips; "
                     f"dataset 'video_folder' trains {list(TASK_NAMES)}: set its "
                     "config.data.task_weights to 0")


def build_example(name: str, clip: np.ndarray, caption: str, options: tasks.TaskOptions,
                  rng: np.random.Generator, shift_pixels: int = 0) -> dict[str, np.ndarray]:
  """One example of task `name` (the signature of `tasks.build_example`; clips are not
  augmented)."""
  del rng, shift_pixels
  name = moving_digits.HELDOUT_ALIASES.get(name, name)
  check_task(name)
  return _BUILDERS[name](clip, caption, options)


def max_example_length(name: str, options: tasks.TaskOptions, shape: Sequence[int],
                       longest_caption: str) -> int:
  """Tokens of the longest example of `name` for clips of `shape` (T, H, W(, C))."""
  check_task(name)
  blank = np.full(tuple(shape), digits.BACKGROUND, np.float32)
  return len(_BUILDERS[name](blank, longest_caption, options)["tokens"])
