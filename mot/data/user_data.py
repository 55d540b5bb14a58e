"""Your own (image, caption) pairs, through the same grain pipeline as the digits.

Two sources, chosen by `config.data.dataset`:

  "image_folder": `data.path` is a folder holding `captions.jsonl`, or any .jsonl file,
      one pair per line, image paths relative to the file's folder (or absolute):
        {"image": "cats/001.png", "caption": "a cat on a sofa"}
  "array_record": `data.path` is an ArrayRecord file or a glob of shards, written by
      `write_array_record` (or `python -m mot.data.user_data DIR OUT.array_record`).
      A record is one JSON header line, {"caption": ...}, then the encoded image bytes
      (PNG, JPEG, ...): no pickle, readable by anything.

Images of any size and colour mode become float32 [H, W] (grayscale, `data.channels` 1)
or [H, W, 3] (RGB) in [-1, 1] through `mot.data.preprocess` (size `data.image_size`,
`data.resize` "crop" / "pad" / "stretch", `data.invert`): the function sampling applies
to a user's files too. `configs/image_folder.py` leaves the size and channels to the
data (`mot.data.auto_config`: the most common size; RGB unless every image is gray).

Everything is checked when the dataset is built (every JSONL line parsed, every image
header opened once, every record's header read), so a bad input is one ValueError
naming the file, the line or record, and the fix, never a traceback from a grain
thread. The last `data.num_heldout` pairs (at most a tenth, at least one) are held out
for evaluation and never trained on; shuffle the file if its order means something.

Tasks (same names as the digits' so `task_weights` and evaluation carry over):
generation (caption -> image), reasoning (image + `data.question` -> caption) and text
(the caption alone).

  python -m mot.data.user_data my_folder/ data/train.array_record   # folder -> ArrayRecord
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import glob
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from mot import patches
from mot.data import array_records, digits
from mot.data import latent_cache
from mot.data import tasks
from mot.data.builder import SequenceBuilder
from mot.data.array_records import (ArrayRecordSource, decode_record,  # noqa: F401
                                    encode_record, write_array_record)
from mot.data.preprocess import (RESIZE_MODES, Header, ImageOptions, check_header,  # noqa: F401
                                 image_options, load_image)
from mot.errors import field

CAPTIONS_FILE = "captions.jsonl"
QUESTION = "Describe this image."   # configs/image_folder.py's data.question (v1 runs asked it)
TASK_NAMES = ("generation", "reasoning", "text")
DEFAULT_IMAGE_SIZE = 8              # The digits' resolution.
_LINE_EXAMPLE = '{"image": "a.png", "caption": "a red square"}'


# ----------------------------------------------------------------------------------------
# Sources: source[i] -> (image float32 [H, W(, C)], caption), picklable for grain workers.
# ----------------------------------------------------------------------------------------
class FileSource:
  """Pairs of (image file, caption); the image is decoded when read."""

  def __init__(self, paths: Sequence[str], captions: Sequence[str], options: ImageOptions):
    self.paths, self.captions, self.options = list(paths), list(captions), options

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    return load_image(self.paths[i], self.options), self.captions[i]


class Range:
  """source[start:stop] without copying: the train or held-out part of a source."""

  def __init__(self, source, start: int, stop: int):
    self.source, self.start, self.stop = source, start, stop

  def __len__(self) -> int:
    return self.stop - self.start

  def __getitem__(self, i: int):
    if not 0 <= i < len(self):
      raise IndexError(i)
    return self.source[self.start + i]


@dataclasses.dataclass(frozen=True)
class UserData:
  """A checked user dataset: train and held-out sources and the longest caption."""
  train: Any               # source[i] -> (image float32 options.shape, caption)
  heldout: Any
  longest_caption: str     # by UTF-8 bytes, over all pairs: bounds the sequence length
  options: ImageOptions
  num_frames: int = 0      # clips (mot.data.user_video): frames a pair's clip has
  latent_shape: tuple[int, ...] = ()  # a latent cache's (h, w, C): what sources return

  @property
  def item_shape(self) -> tuple[int, ...]:
    """Shape of the array a source returns: (H, W), (H, W, C), a latent's (h, w, C), or
    clips (T, H, W(, C))."""
    if self.latent_shape:
      return self.latent_shape
    return ((self.num_frames,) if self.num_frames else ()) + self.options.shape


@dataclasses.dataclass(frozen=True)
class Scan:
  """What checking a dataset's files found, before any image is decoded."""
  where: str                      # the captions file or the ArrayRecord file(s): messages
  files: tuple[str, ...]          # one image file a pair, or the ArrayRecord files
  counts: tuple[int, ...]         # ArrayRecord: records per file; image files: ()
  captions: tuple[str, ...]
  headers: tuple[Header, ...]     # one a pair

  @property
  def longest_caption(self) -> str:
    """The longest caption by UTF-8 bytes (the first of equals)."""
    return max(self.captions, key=lambda c: len(c.encode("utf-8")))

  def size_counts(self) -> collections.Counter:
    """{(H, W): number of images of that size}."""
    return collections.Counter((h.height, h.width) for h in self.headers)

  @property
  def all_gray(self) -> bool:
    return all(h.gray for h in self.headers)

  def most_common_size(self) -> tuple[int, int]:
    """The (H, W) most images have; a ValueError when sizes tie for the most."""
    counts = self.size_counts().most_common()
    top = [size for size, n in counts if n == counts[0][1]]
    if len(top) > 1:
      listed = ", ".join(f"{n} of {h}x{w}" for (h, w), n in counts[:4])
      raise ValueError(f"{self.where}: config.data.image_size is unset and no image size is "
                       f"the most common ({listed}{', ...' if len(counts) > 4 else ''}): "
                       "set --config.data.image_size='(H, W)' (other sizes are resized to "
                       "it, config.data.resize)")
    return top[0]

  def keys(self) -> list[str]:
    """One id a pair: its image file, or "SHARD#k" for record k of an ArrayRecord shard."""
    if not self.counts:
      return [os.path.abspath(f) for f in self.files]
    return [f"{os.path.abspath(f)}#{k}" for f, n in zip(self.files, self.counts)
            for k in range(n)]


# ----------------------------------------------------------------------------------------
# Opening and checking a dataset.
# ----------------------------------------------------------------------------------------
def scan_user_data(data_config: Any) -> Scan:
  """Checks every file of the user dataset of `config.data` once (cached while the files
  are unchanged): its pairs, captions, image sizes and modes.

  Raises:
    ValueError: one line naming the field, file, line or record at fault, and the fix.
  """
  path = str(field(data_config, "path", "config.data") or "")
  dataset = data_config.dataset
  if not path:
    raise ValueError(f"config.data.path is empty: dataset {dataset!r} needs "
                     f"--config.data.path=" + ("/path/to/folder (with captions.jsonl) or "
                     "a .jsonl file" if dataset == "image_folder"
                     else "/path/to/file.array_record (or a glob of shards)"))
  if dataset == "image_folder":
    jsonl = _captions_file(path)
    return _scan_jsonl(jsonl, _stamp([jsonl]))
  if dataset == "array_record":
    files = _array_record_files(path)
    return _scan_array_record(tuple(files), _stamp(files))
  raise ValueError(f"config.data.dataset={dataset!r} is not a user dataset")


def open_user_data(data_config: Any) -> UserData:
  """The checked, split user dataset of `config.data` (`scan_user_data`, then sources
  that decode with the run's `preprocess.image_options`).

  Raises:
    ValueError: one line naming the field, file, line or record at fault, and the fix.
  """
  scan = scan_user_data(data_config)
  num_heldout = int(field(data_config, "num_heldout", "config.data"))
  if num_heldout < 1:
    raise ValueError(f"config.data.num_heldout={num_heldout} must be at least 1 "
                     "(evaluation needs held-out pairs)")
  cache = latent_dir(data_config)
  stamp = os.stat(os.path.join(cache, latent_cache.CACHE_FILE)).st_mtime_ns if (
      cache and os.path.isfile(os.path.join(cache, latent_cache.CACHE_FILE))) else 0
  return _split(scan, image_options(data_config), num_heldout, cache, stamp)


def latent_dir(data_config: Any) -> str:
  """config.data.latent_cache: "" (images) or a latent cache folder (`latent_cache`)."""
  return str(field(data_config, "latent_cache", "config.data") or "")


def model_space(data_config: Any) -> tuple[tuple[int, int], int]:
  """((h, w), channels) of the arrays the model reads: the images', or with a latent
  cache, their latents'."""
  cache = latent_dir(data_config)
  if not cache:
    return image_options(data_config).size, int(field(data_config, "channels", "config.data"))
  h, w, c = latent_cache.read_meta(cache)["latent_shape"]
  return (h, w), c


def _stamp(files: Iterable[str]) -> tuple:
  """Changes when a file does: the cache key of a checked dataset."""
  return tuple((os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)


@functools.lru_cache(maxsize=8)
def _split(scan: Scan, options: ImageOptions, num_heldout: int, cache: str = "",
           cache_stamp: int = 0) -> UserData:
  del cache_stamp  # Only part of the cache key: a rewritten latent cache is read again.
  latent_shape = ()
  if cache:  # latents encoded once (mot.data.latent_cache), checked against the pairs
    meta = latent_cache.read_meta(cache)
    latent_cache.check_meta(cache, meta, scan.keys(), scan.captions, options)
    source = latent_cache.LatentSource(cache, scan.captions)
    latent_shape = tuple(meta["latent_shape"])
  elif scan.counts:
    source = ArrayRecordSource(scan.files, scan.counts, options)
  else:
    source = FileSource(scan.files, scan.captions, options)
  n = len(source)
  if n < 2:
    raise ValueError(f"{scan.where} has {n} pair(s): at least 2 are needed (one is held "
                     "out for evaluation)")
  held = min(num_heldout, max(1, n // 10))
  logging.info("%s: %d pairs, %d for training, the last %d held out", scan.where, n,
               n - held, held)
  return UserData(Range(source, 0, n - held), Range(source, n - held, n),
                  scan.longest_caption, options, latent_shape=latent_shape)


def _captions_file(path: str) -> str:
  if os.path.isdir(path):
    jsonl = os.path.join(path, CAPTIONS_FILE)
    if not os.path.isfile(jsonl):
      raise ValueError(f"{path} has no {CAPTIONS_FILE}: write one line per image, e.g. "
                       f"{_LINE_EXAMPLE} (paths relative to the folder)")
    return jsonl
  if not os.path.exists(path):
    raise ValueError(f"config.data.path={path} does not exist: pass a folder with "
                     f"{CAPTIONS_FILE} or a .jsonl file")
  return path


def read_jsonl(jsonl: str, key: str, example: str) -> list[tuple[str, str, str]]:
  """[(absolute media path, caption, "FILE:LINE")] of a captions file whose lines are
  {key: path, "caption": text}; every line parsed, every path checked to exist."""
  base = os.path.dirname(os.path.abspath(jsonl))
  try:
    with open(jsonl, encoding="utf-8") as f:
      lines = f.readlines()
  except UnicodeDecodeError:
    raise ValueError(f"{jsonl}: not UTF-8 text; it must be a JSONL file, one "
                     f"{example} per line") from None
  out = []
  for lineno, line in enumerate(lines, 1):
    if not line.strip():
      continue
    where = f"{jsonl}:{lineno}"
    media, caption = _parse_line(line, where, key, example)
    media_path = media if os.path.isabs(media) else os.path.join(base, media)
    if not os.path.exists(media_path):
      raise ValueError(f"{where}: {'image' if key == 'image' else key} {media_path} does "
                       f"not exist (relative paths start at {base}); fix the path or "
                       "remove the line")
    out.append((media_path, caption, where))
  if not out:
    raise ValueError(f"{jsonl} has no pairs: write one line per {key}, e.g. {example}")
  return out


@functools.lru_cache(maxsize=8)
def _scan_jsonl(jsonl: str, stamp: tuple) -> Scan:
  """Parses every line and opens every image header once."""
  del stamp  # Only part of the cache key.
  paths, captions, headers = [], [], []
  for image_path, caption, where in read_jsonl(jsonl, "image", _LINE_EXAMPLE):
    if not os.path.isfile(image_path):
      raise ValueError(f"{where}: image {image_path} is not a file; fix the path or remove "
                       "the line")
    headers.append(check_header(image_path, f"{image_path} (from {where})"))
    paths.append(image_path)
    captions.append(caption)
  return Scan(jsonl, tuple(paths), (), tuple(captions), tuple(headers))


def _parse_line(line: str, where: str, key: str, example: str) -> tuple[str, str]:
  try:
    obj = json.loads(line.strip())
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); each line must "
                     f"be one object, e.g. {example}") from None
  if not isinstance(obj, dict):
    raise ValueError(f"{where}: expected a JSON object like {example}, "
                     f"got {type(obj).__name__}")
  missing = [k for k in (key, "caption") if k not in obj]
  if missing:
    raise ValueError(f"{where}: missing field(s) {missing}; each line needs both, e.g. "
                     f"{example}")
  for k in (key, "caption"):
    if not isinstance(obj[k], str):
      raise ValueError(f"{where}: field {k!r} must be a string, got "
                       f"{type(obj[k]).__name__}")
  if not obj[key]:
    raise ValueError(f"{where}: field {key!r} is empty")
  return obj[key], obj["caption"]


def _array_record_files(pattern: str) -> list[str]:
  files = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
  if not files:
    raise ValueError(f"config.data.path={pattern} matches no file")
  for f in files:
    if not os.path.isfile(f):
      raise ValueError(f"config.data.path: {f} does not exist (or is not a file); pass an "
                       "ArrayRecord file or a glob of them")
  return files


@functools.lru_cache(maxsize=8)
def _scan_array_record(files: tuple[str, ...], stamp: tuple) -> Scan:
  """Reads every record once: its header must parse and its image header open."""
  del stamp
  counts, captions, headers = [], [], []
  for path in files:
    for caption, header in array_records.scan_records(path):
      captions.append(caption)
      headers.append(header)
    counts.append(len(captions) - sum(counts))
  where = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more files)"
  return Scan(where, files, tuple(counts), tuple(captions), tuple(headers))


# ----------------------------------------------------------------------------------------
# Tasks on (image, caption) pairs.
# ----------------------------------------------------------------------------------------
def image_patches(image: np.ndarray, options: tasks.TaskOptions,
                  read_window: int = 0) -> np.ndarray:
  """Patches [hp, wp, P'] of a model-scale image [H, W] (grayscale: `read_window` may
  widen them, `mot.data.digits.patchify_window`) or [H, W, C]."""
  if options.channels == 1:
    return digits.patchify_window(image, options.patch_size, read_window)
  return patches.to_patches(image, options.patch_size, options.channels)


def generation_example(image: np.ndarray, caption: str,
                       options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Caption -> image: BOS, caption (target, CFG conditioning), noised image, EOS."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_text(tok.encode(caption), loss=True, cond=True)
  b.add_image(image_patches(image, options), noised=True)
  b.add_text([tok.eos_id], loss=True)
  return b.build()


def reasoning_example(image: np.ndarray, caption: str,
                      options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Image -> caption: BOS, clean image, the question (`data.question`), caption
  (target), EOS (target)."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_image(image_patches(image, options, options.read_window), noised=False)
  b.add_text(tok.encode(options.question))
  b.add_text(tok.encode(caption) + [tok.eos_id], loss=True)
  return b.build()


def text_example(caption: str, options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Caption language modelling: BOS, caption (target), EOS (target)."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_text(tok.encode(caption) + [tok.eos_id], loss=True)
  return b.build()


_BUILDERS = {
    "generation": generation_example,
    "reasoning": reasoning_example,
    "text": lambda image, caption, options: text_example(caption, options),
}


def check_task(name: str) -> None:
  """A ValueError unless user data can make examples of task `name`."""
  if name not in _BUILDERS:
    tasks.get_task(name)  # Unknown anywhere: the digits' error lists every task.
    raise ValueError(f"task {name!r} needs digit labels; user data supports "
                     f"{list(TASK_NAMES)}: set its config.data.task_weights to 0")


def build_example(name: str, image: np.ndarray, caption: str, options: tasks.TaskOptions,
                  rng: np.random.Generator, shift_pixels: int = 0) -> dict[str, np.ndarray]:
  """One example of task `name`; like `tasks.build_example`, reasoning may be shifted."""
  check_task(name)
  if name == "reasoning" and shift_pixels > 0:
    if image.ndim == 3:  # [H, W, C]: shift the spatial axes, channels alike
      image = np.moveaxis(tasks.random_shift(np.moveaxis(image, -1, 0), shift_pixels, rng),
                          0, -1)
    else:
      image = tasks.random_shift(image, shift_pixels, rng)
  return _BUILDERS[name](image, caption, options)


def max_example_length(name: str, options: tasks.TaskOptions, shape: int | Sequence[int],
                       longest_caption: str) -> int:
  """Tokens of the longest example of `name` for images of `shape` ((H, W), (H, W, C), or
  an int S: S x S; lengths grow with the caption's bytes)."""
  check_task(name)
  shape = (shape, shape) if isinstance(shape, int) else tuple(shape)
  blank = np.full(shape, digits.BACKGROUND, np.float32)
  return len(_BUILDERS[name](blank, longest_caption, options)["tokens"])


# ----------------------------------------------------------------------------------------
# Command line: folder or JSONL -> ArrayRecord.
# ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m mot.data.user_data",
      description="Converts a folder with captions.jsonl (or a .jsonl file) to an "
                  "ArrayRecord file for config.data.dataset='array_record'; with --vae, "
                  "encodes every image of a folder, .jsonl or ArrayRecord set once into a "
                  "latent cache folder for config.data.latent_cache (docs/design.md §9).")
  parser.add_argument("source", help="folder with captions.jsonl or a .jsonl file (with "
                      "--vae also an ArrayRecord file or glob)")
  parser.add_argument("out", help="ArrayRecord file to write (with --vae: the cache folder)")
  parser.add_argument("--vae", help="diffusers AutoencoderKL folder: write a latent cache")
  parser.add_argument("--image_size", type=int, nargs="+", metavar="N", help="--vae: H W "
                      "(or S) images are resized to (default: the most common size)")
  parser.add_argument("--resize", choices=RESIZE_MODES, default="crop", help="--vae: aspect "
                      "fit (config.data.resize)")
  parser.add_argument("--invert", action="store_true", help="--vae: config.data.invert")
  args = parser.parse_args(argv)
  try:
    if args.vae:
      meta = _write_latents(args)
      print(f"wrote {meta['pairs']} latents {tuple(meta['latent_shape'])} of "
            f"{tuple(meta['image_size'])} images to {args.out}")
      return
    jsonl = _captions_file(args.source)
    scan = _scan_jsonl(jsonl, _stamp([jsonl]))
    n = write_array_record(args.out, scan.files, scan.captions)
  except ValueError as e:
    sys.exit(f"error: {' '.join(str(e).split())}")
  print(f"wrote {n} records to {args.out}")


def _write_latents(args) -> dict:
  """`main --vae`: the source's images encoded once into the cache folder args.out."""
  from mot import vae as vae_lib  # lazy: only --vae needs JAX and the VAE
  is_records = args.source.endswith(".array_record") or glob.has_magic(args.source)
  if is_records:
    files = _array_record_files(args.source)
    scan = _scan_array_record(tuple(files), _stamp(files))
  else:
    jsonl = _captions_file(args.source)
    scan = _scan_jsonl(jsonl, _stamp([jsonl]))
  if args.image_size and len(args.image_size) > 2:
    raise ValueError(f"--image_size takes H W or S, not {args.image_size}")
  vae = vae_lib.load_diffusers(args.vae)
  options = ImageOptions(tuple(args.image_size) if args.image_size
                         else scan.most_common_size(), args.invert, args.resize,
                         vae.config.in_channels)
  images = _RecordImages(scan) if is_records else scan.files
  return latent_cache.write_cache(args.out, images, scan.keys(), scan.captions, scan.where,
                                  options, vae, args.vae)


class _RecordImages:
  """images[i] -> the encoded image bytes of record i of a scanned ArrayRecord set."""

  def __init__(self, scan: Scan):
    self.source = ArrayRecordSource(scan.files, scan.counts, ImageOptions())

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[k] for k in range(*i.indices(len(self)))]
    return decode_record(self.source.records[i], self.source.record_name(i))[1]


if __name__ == "__main__":
  main()
