"""Your own (image, caption) pairs, through the same grain pipeline as the digits.

Two sources, chosen by `config.data.dataset`:

  "image_folder": `data.path` is a folder holding `captions.jsonl`, or any .jsonl file,
      one pair per line, image paths relative to the file's folder (or absolute):
        {"image": "cats/001.png", "caption": "a cat on a sofa"}
  "array_record": `data.path` is an ArrayRecord file or a glob of shards, written by
      `write_array_record` (or `python -m mot.data.user_data DIR OUT.array_record`).
      A record is one JSON header line, {"caption": ...}, then the encoded image bytes
      (PNG, JPEG, ...): no pickle, readable by anything.

Images of any size and colour mode become float32 [S, S] (S = `data.image_size`) in
[-1, 1]: grayscale (transparency composited onto white), cropped to a centred square
(`data.resize`: "crop", "pad" or "stretch"), resized with Pillow, 0..255 mapped to
-1..1. The digits have high ink on a low background; for dark ink on light paper set
`data.invert = True`.

Everything is checked when the dataset is built (every JSONL line parsed, every image
header opened once, every record's header read), so a bad input is one ValueError
naming the file, the line or record, and the fix, never a traceback from a grain
thread. The last `data.num_heldout` pairs (at most a tenth, at least one) are held out
for evaluation and never trained on; shuffle the file if its order means something.

Tasks (same names as the digits' so `task_weights` and evaluation carry over):
generation (caption -> image), reasoning (image -> caption) and text (the caption
alone).

  python -m mot.data.user_data my_folder/ data/train.array_record   # folder -> ArrayRecord
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import io
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from mot.data import digits
from mot.data import tasks
from mot.data.builder import SequenceBuilder
from mot.errors import field

CAPTIONS_FILE = "captions.jsonl"
QUESTION = "Describe this image."   # Reasoning prompt; the answer is the caption.
RESIZE_MODES = ("crop", "pad", "stretch")
TASK_NAMES = ("generation", "reasoning", "text")
DEFAULT_IMAGE_SIZE = 8              # The digits' resolution.
_SCAN_CHUNK = 1024                  # Records read at once when checking ArrayRecord files.
_LINE_EXAMPLE = '{"image": "a.png", "caption": "a red square"}'


# ----------------------------------------------------------------------------------------
# Images.
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ImageOptions:
  """How a file becomes a float32 [size, size] image in [-1, 1]."""
  size: int = DEFAULT_IMAGE_SIZE
  invert: bool = False      # True: dark ink on light paper becomes high values.
  resize: str = "crop"      # "crop" a centred square, "pad" to one, or "stretch".


def load_image(source: str | os.PathLike | bytes, options: ImageOptions,
               name: str | None = None) -> np.ndarray:
  """float32 [S, S] in [-1, 1] from an image file or its encoded bytes.

  `name` (default: the path) is what an error names, e.g. "shard-0.array_record record 7".
  """
  name = name or os.fspath(source)
  f = io.BytesIO(source) if isinstance(source, bytes) else source
  try:
    with Image.open(f) as im:
      im.draft("L", (options.size, options.size))  # JPEG: decode at a reduced scale.
      gray = _grayscale(ImageOps.exif_transpose(im))
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ValueError(f"{name}: cannot decode the image ({e}); re-save it as PNG or JPEG, "
                     "or remove it from the data") from None
  return to_model_range(gray, options)


def to_model_range(gray: np.ndarray, options: ImageOptions) -> np.ndarray:
  """float [H, W] grayscale in [0, 1] (0 = black) -> float32 [S, S] in [-1, 1]."""
  g = 1.0 - gray if options.invert else gray
  h, w = g.shape
  if options.resize == "crop":
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    g = g[top:top + side, left:left + side]
  elif options.resize == "pad":  # With the background: -1 once scaled.
    side = max(h, w)
    top, left = (side - h) // 2, (side - w) // 2
    g = np.pad(g, ((top, side - h - top), (left, side - w - left)))
  s = options.size
  # BOX averages the pixels each output pixel covers (no aliasing, no ringing) when
  # shrinking; BILINEAR when enlarging.
  resample = Image.Resampling.BOX if min(g.shape) >= s else Image.Resampling.BILINEAR
  small = np.asarray(Image.fromarray(np.ascontiguousarray(g, np.float32)).resize(
      (s, s), resample), np.float32)
  return np.clip(small, 0.0, 1.0) * 2.0 - 1.0


def _grayscale(im: Image.Image) -> np.ndarray:
  """float32 [H, W] in [0, 1] of any Pillow image (alpha composited onto white)."""
  if im.mode.startswith("I"):  # 16/32-bit integer grayscale (e.g. 16-bit PNG).
    return np.clip(np.asarray(im, np.float32) / 65535.0, 0.0, 1.0)
  if im.mode == "F":
    return np.clip(np.asarray(im, np.float32), 0.0, 1.0)
  if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info:
    rgba = im.convert("RGBA")
    im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
  return np.asarray(im.convert("L"), np.float32) / 255.0


def _check_header(source: str | bytes, name: str) -> None:
  """Opens the image header only (cheap); a one-line ValueError if it is not an image."""
  try:
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
      w, h = im.size
  except FileNotFoundError:
    raise ValueError(f"{name}: the image file does not exist") from None
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ValueError(f"{name}: not an image Pillow can read ({type(e).__name__}); "
                     "convert it to PNG or JPEG, or remove it from the data") from None
  if w < 1 or h < 1:
    raise ValueError(f"{name}: the image is empty ({w}x{h} pixels)")


# ----------------------------------------------------------------------------------------
# Sources: source[i] -> (image float32 [S, S], caption str), picklable for grain workers.
# ----------------------------------------------------------------------------------------
class FileSource:
  """Pairs of (image file, caption); the image is decoded when read."""

  def __init__(self, paths: Sequence[str], captions: Sequence[str], options: ImageOptions):
    self.paths, self.captions, self.options = list(paths), list(captions), options

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    return load_image(self.paths[i], self.options), self.captions[i]


class ArrayRecordSource:
  """Records of `encode_record` in ArrayRecord files, read with grain's data source."""

  def __init__(self, paths: Sequence[str], counts: Sequence[int], options: ImageOptions):
    import grain  # lazy: only ArrayRecord data needs grain's file source
    self.paths, self.counts, self.options = list(paths), list(counts), options
    # "path[0:n]" gives the counts we already have, so files are not opened again here.
    self._records = grain.sources.ArrayRecordDataSource(
        [f"{p}[0:{n}]" for p, n in zip(paths, counts)])

  def __len__(self) -> int:
    return sum(self.counts)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    name = self.record_name(i)
    caption, data = decode_record(self._records[i], name)
    return load_image(data, self.options, name), caption

  def record_name(self, i: int) -> str:
    """"FILE record K" of global record i, for error messages."""
    for path, n in zip(self.paths, self.counts):
      if i < n:
        return f"{path} record {i}"
      i -= n
    raise IndexError(i)


class _Range:
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
  train: Any               # source[i] -> (image float32 [S, S], caption)
  heldout: Any
  longest_caption: str     # by UTF-8 bytes, over all pairs: bounds the sequence length
  options: ImageOptions


# ----------------------------------------------------------------------------------------
# Opening and checking a dataset.
# ----------------------------------------------------------------------------------------
def image_options(data_config: Any) -> ImageOptions:
  """The ImageOptions of `config.data`, checked."""
  size = int(field(data_config, "image_size", "config.data"))
  resize = str(field(data_config, "resize", "config.data"))
  if size < 1:
    raise ValueError(f"config.data.image_size={size} must be positive")
  if resize not in RESIZE_MODES:
    raise ValueError(f"config.data.resize={resize!r} is unknown; known: {RESIZE_MODES}")
  return ImageOptions(size, bool(field(data_config, "invert", "config.data")), resize)


def open_user_data(data_config: Any) -> UserData:
  """Checks and splits the user dataset of `config.data` (cached while files are unchanged).

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
  num_heldout = int(field(data_config, "num_heldout", "config.data"))
  if num_heldout < 1:
    raise ValueError(f"config.data.num_heldout={num_heldout} must be at least 1 "
                     "(evaluation needs held-out pairs)")
  options = image_options(data_config)
  if dataset == "image_folder":
    jsonl = _captions_file(path)
    return _open_jsonl(jsonl, _stamp([jsonl]), options, num_heldout)
  if dataset == "array_record":
    files = _array_record_files(path)
    return _open_array_record(tuple(files), _stamp(files), options, num_heldout)
  raise ValueError(f"config.data.dataset={dataset!r} is not a user dataset")


def _stamp(files: Iterable[str]) -> tuple:
  """Changes when a file does: the cache key of a checked dataset."""
  return tuple((os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)


def _split(source, longest: str, options: ImageOptions, num_heldout: int,
           where: str) -> UserData:
  n = len(source)
  if n < 2:
    raise ValueError(f"{where} has {n} pair(s): at least 2 are needed (one is held out "
                     "for evaluation)")
  held = min(num_heldout, max(1, n // 10))
  logging.info("%s: %d pairs, %d for training, the last %d held out", where, n, n - held,
               held)
  return UserData(_Range(source, 0, n - held), _Range(source, n - held, n), longest, options)


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


@functools.lru_cache(maxsize=8)
def _open_jsonl(jsonl: str, stamp: tuple, options: ImageOptions,
                num_heldout: int) -> UserData:
  """Parses every line and opens every image header once."""
  del stamp  # Only part of the cache key.
  base = os.path.dirname(os.path.abspath(jsonl))
  paths, captions = [], []
  try:
    with open(jsonl, encoding="utf-8") as f:
      lines = f.readlines()
  except UnicodeDecodeError:
    raise ValueError(f"{jsonl}: not UTF-8 text; it must be a JSONL file, one "
                     f"{_LINE_EXAMPLE} per line") from None
  for lineno, line in enumerate(lines, 1):
    if not line.strip():
      continue
    where = f"{jsonl}:{lineno}"
    image, caption = _parse_line(line, where)
    image_path = image if os.path.isabs(image) else os.path.join(base, image)
    if not os.path.isfile(image_path):
      raise ValueError(f"{where}: image {image_path} does not exist (relative paths start "
                       f"at {base}); fix the path or remove the line")
    _check_header(image_path, f"{image_path} (from {where})")
    paths.append(image_path)
    captions.append(caption)
  if not paths:
    raise ValueError(f"{jsonl} has no pairs: write one line per image, e.g. {_LINE_EXAMPLE}")
  longest = max(captions, key=lambda c: len(c.encode("utf-8")))
  return _split(FileSource(paths, captions, options), longest, options, num_heldout, jsonl)


def _parse_line(line: str, where: str) -> tuple[str, str]:
  try:
    obj = json.loads(line.strip())
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); each line must "
                     f"be one object, e.g. {_LINE_EXAMPLE}") from None
  if not isinstance(obj, dict):
    raise ValueError(f"{where}: expected a JSON object like {_LINE_EXAMPLE}, "
                     f"got {type(obj).__name__}")
  missing = [k for k in ("image", "caption") if k not in obj]
  if missing:
    raise ValueError(f"{where}: missing field(s) {missing}; each line needs both, e.g. "
                     f"{_LINE_EXAMPLE}")
  for k in ("image", "caption"):
    if not isinstance(obj[k], str):
      raise ValueError(f"{where}: field {k!r} must be a string, got "
                       f"{type(obj[k]).__name__}")
  if not obj["image"]:
    raise ValueError(f"{where}: field 'image' is empty")
  return obj["image"], obj["caption"]


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
def _open_array_record(files: tuple[str, ...], stamp: tuple, options: ImageOptions,
                       num_heldout: int) -> UserData:
  """Reads every record once: its header must parse and its image header open."""
  from array_record.python import array_record_module  # lazy: ArrayRecord data only
  del stamp
  counts, longest = [], ""
  for path in files:
    not_array_record = ValueError(f"{path}: not an ArrayRecord file (or a corrupt one); "
                                  "write one with mot.data.user_data.write_array_record")
    reader = array_record_module.ArrayRecordReader(path)
    try:
      if not reader.ok():
        raise not_array_record
      n = reader.num_records()
      for start in range(0, n, _SCAN_CHUNK):
        for k, record in enumerate(reader.read(start, min(start + _SCAN_CHUNK, n))):
          name = f"{path} record {start + k}"
          caption, data = decode_record(record, name)
          _check_header(data, name)
          if len(caption.encode("utf-8")) > len(longest.encode("utf-8")):
            longest = caption
    except RuntimeError:  # Riegeli's errors on a damaged file.
      raise not_array_record from None
    finally:
      try:
        reader.close()
      except RuntimeError:  # Closing a reader of a non-ArrayRecord file raises too.
        pass
    counts.append(n)
  where = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more files)"
  return _split(ArrayRecordSource(files, counts, options), longest, options, num_heldout,
                where)


# ----------------------------------------------------------------------------------------
# ArrayRecord records.
# ----------------------------------------------------------------------------------------
def encode_record(image_bytes: bytes, caption: str) -> bytes:
  """One record: a JSON header line {"caption": ...} then the encoded image bytes."""
  # ensure_ascii: the header holds no raw newline, so the first b"\n" ends it.
  return json.dumps({"caption": caption}, ensure_ascii=True).encode("ascii") + b"\n" + \
      image_bytes


def decode_record(record: bytes, name: str = "record") -> tuple[str, bytes]:
  """(caption, image bytes) of an `encode_record` record; a ValueError naming it if not."""
  header, sep, data = record.partition(b"\n")
  try:
    obj = json.loads(header) if sep else None
  except (json.JSONDecodeError, UnicodeDecodeError):
    obj = None
  if not isinstance(obj, dict) or not isinstance(obj.get("caption"), str):
    raise ValueError(f"{name}: not a mot image record (a JSON line {{\"caption\": ...}} then "
                     "image bytes); write the file with mot.data.user_data.write_array_record")
  return obj["caption"], data


def write_array_record(path: str, images: Iterable[Any], captions: Iterable[str]) -> int:
  """Writes (image, caption) pairs to an ArrayRecord file; returns the record count.

  Args:
    path: the file to write (e.g. data/train-00000-of-00004.array_record).
    images: each a uint8 array [H, W], [H, W, 1], [H, W, 3] or [H, W, 4] (stored as PNG),
      a PIL image (stored as PNG), or a path to an image file (its bytes stored as is).
    captions: one string per image.
  """
  from array_record.python import array_record_module  # lazy: ArrayRecord data only
  images, captions = list(images), list(captions)
  if len(images) != len(captions):
    raise ValueError(f"write_array_record: {len(images)} images but {len(captions)} captions")
  # group_size:1 makes random access (grain's shuffled reads) cheap.
  writer = array_record_module.ArrayRecordWriter(os.fspath(path), "group_size:1")
  try:
    for i, (image, caption) in enumerate(zip(images, captions)):
      if not isinstance(caption, str):
        raise ValueError(f"write_array_record: caption {i} is a {type(caption).__name__}, "
                         "not a str")
      writer.write(encode_record(_image_bytes(image, i), caption))
  finally:
    writer.close()
  return len(images)


def _image_bytes(image: Any, i: int) -> bytes:
  if isinstance(image, (str, os.PathLike)):
    _check_header(os.fspath(image), f"write_array_record: image {i} ({image})")
    with open(image, "rb") as f:
      return f.read()
  if not isinstance(image, Image.Image):
    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and
                                                       a.shape[-1] not in (1, 3, 4)):
      raise ValueError(f"write_array_record: image {i} is {a.dtype} {a.shape}; pass uint8 "
                       "[H, W], [H, W, 1|3|4] (0..255), a PIL image or a file path")
    image = Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[-1] == 1 else a)
  buf = io.BytesIO()
  image.save(buf, format="PNG")
  return buf.getvalue()


# ----------------------------------------------------------------------------------------
# Tasks on (image, caption) pairs.
# ----------------------------------------------------------------------------------------
def generation_example(image: np.ndarray, caption: str,
                       options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Caption -> image: BOS, caption (target, CFG conditioning), noised image, EOS."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_text(tok.encode(caption), loss=True, cond=True)
  b.add_image(digits.patchify(image, options.patch_size), noised=True)
  b.add_text([tok.eos_id], loss=True)
  return b.build()


def reasoning_example(image: np.ndarray, caption: str,
                      options: tasks.TaskOptions) -> dict[str, np.ndarray]:
  """Image -> caption: BOS, clean image, QUESTION, caption (target), EOS (target)."""
  tok = options.tokenizer
  b = SequenceBuilder(options.patch_dim, tok)
  b.add_text([tok.bos_id])
  b.add_image(digits.patchify_window(image, options.patch_size, options.read_window),
              noised=False)
  b.add_text(tok.encode(QUESTION))
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
    image = tasks.random_shift(image, shift_pixels, rng)
  return _BUILDERS[name](image, caption, options)


def max_example_length(name: str, options: tasks.TaskOptions, image_size: int,
                       longest_caption: str) -> int:
  """Tokens of the longest example of `name` (lengths grow with the caption's bytes)."""
  check_task(name)
  blank = np.full((image_size, image_size), digits.BACKGROUND, np.float32)
  return len(_BUILDERS[name](blank, longest_caption, options)["tokens"])


# ----------------------------------------------------------------------------------------
# Command line: folder or JSONL -> ArrayRecord.
# ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m mot.data.user_data",
      description="Converts a folder with captions.jsonl (or a .jsonl file) to an "
                  "ArrayRecord file for config.data.dataset='array_record'.")
  parser.add_argument("source", help="folder with captions.jsonl, or a .jsonl file")
  parser.add_argument("out", help="ArrayRecord file to write, e.g. data/train.array_record")
  args = parser.parse_args(argv)
  try:
    jsonl = _captions_file(args.source)
    data = _open_jsonl(jsonl, _stamp([jsonl]), ImageOptions(), 1)
    files = data.train.source
    n = write_array_record(args.out, files.paths, files.captions)
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(f"wrote {n} records to {args.out}")


if __name__ == "__main__":
  main()
