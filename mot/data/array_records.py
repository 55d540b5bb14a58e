"""ArrayRecord files of (image, caption) pairs: the record format, writing, checking, and
the grain source that reads them (config.data.dataset="array_record",
`mot.data.user_data`).

A record is one JSON header line, {"caption": ...}, then the encoded image bytes (PNG,
JPEG, ...): no pickle, readable by anything.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from mot.data.preprocess import Header, ImageOptions, check_header, load_image

_SCAN_CHUNK = 1024                  # Records read at once when checking ArrayRecord files.


class ArrayRecordSource:
  """Records of `encode_record` in ArrayRecord files, read with grain's data source."""

  def __init__(self, paths: Sequence[str], counts: Sequence[int], options: ImageOptions):
    import grain  # lazy: only ArrayRecord data needs grain's file source
    self.paths, self.counts, self.options = list(paths), list(counts), options
    # "path[0:n]" gives the counts we already have, so files are not opened again here.
    self.records = grain.sources.ArrayRecordDataSource(
        [f"{p}[0:{n}]" for p, n in zip(paths, counts)])

  def __len__(self) -> int:
    return sum(self.counts)

  def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
    name = self.record_name(i)
    caption, data = decode_record(self.records[i], name)
    return load_image(data, self.options, name), caption

  def record_name(self, i: int) -> str:
    """"FILE record K" of global record i, for error messages."""
    for path, n in zip(self.paths, self.counts):
      if i < n:
        return f"{path} record {i}"
      i -= n
    raise IndexError(i)


def scan_records(path: str) -> list[tuple[str, Header]]:
  """(caption, image header) of every record of one ArrayRecord file."""
  from array_record.python import array_record_module  # lazy: ArrayRecord data only
  not_array_record = ValueError(f"{path}: not an ArrayRecord file (or a corrupt one); "
                                "write one with mot.data.user_data.write_array_record")
  reader = array_record_module.ArrayRecordReader(path)
  out = []
  try:
    if not reader.ok():
      raise not_array_record
    n = reader.num_records()
    for start in range(0, n, _SCAN_CHUNK):
      for k, record in enumerate(reader.read(start, min(start + _SCAN_CHUNK, n))):
        name = f"{path} record {start + k}"
        caption, data = decode_record(record, name)
        out.append((caption, check_header(data, name)))
  except RuntimeError:  # Riegeli's errors on a damaged file.
    raise not_array_record from None
  finally:
    try:
      reader.close()
    except RuntimeError:  # Closing a reader of a non-ArrayRecord file raises too.
      pass
  return out


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
      writer.write(encode_record(image_bytes(image, i), caption))
  finally:
    writer.close()
  return len(images)


def image_bytes(image: Any, i: int) -> bytes:
  """The bytes `write_array_record` stores for image `i` (see there)."""
  if isinstance(image, (str, os.PathLike)):
    check_header(os.fspath(image), f"write_array_record: image {i} ({image})")
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
