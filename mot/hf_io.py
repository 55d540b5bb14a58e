"""Reading and writing Hugging Face checkpoint folders: config.json and safetensors files.

`SafetensorsReader` opens `model.safetensors` or the shards that
`model.safetensors.index.json` lists, checks every file with the `safetensors` package's
`safe_open` (a truncated or damaged file fails here, before anything is converted), and
reads one tensor at a time, in chunks of rows, straight into a float32 destination view,
so a conversion holds the parameters once plus a few MB. The bytes are read from the
offsets in the file's header because the package's numpy API has no bfloat16, the dtype
most models are published in (ml_dtypes provides it to numpy).

`write_safetensors` streams tensors into one file the same way, one tensor in memory at
a time.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np
from safetensors import safe_open

from mot.checkpoint import CheckpointError
from mot.config import ConfigError

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
CHUNK_BYTES = 32 << 20   # bytes read per chunk: bounds the conversion's extra memory

DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64)}
EXPORT_DTYPES = {"float32": "F32", "bfloat16": "BF16"}


def read_json(path: str, what: str) -> dict:
  """A JSON object from `path`; ConfigError (one line) when missing or malformed."""
  if not os.path.isfile(path):
    raise ConfigError(f"{path} does not exist: {what}")
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"{path} is not valid JSON ({' '.join(str(e).split())})") from None
  if not isinstance(value, dict):
    raise ConfigError(f"{path} must hold a JSON object, not {type(value).__name__}")
  return value


def read_config(hf_dir: str) -> dict:
  """The config.json of a Hugging Face model folder."""
  if not os.path.isdir(hf_dir):
    raise ConfigError(f"--hf_dir {hf_dir} is not a directory: pass a Hugging Face model "
                      "folder (config.json, model.safetensors, tokenizer.json)")
  return read_json(os.path.join(hf_dir, CONFIG),
                   "pass a Hugging Face model folder (config.json, model.safetensors, "
                   "tokenizer.json)")


def _header(path: str) -> tuple[int, dict]:
  """(offset of the data, header dict) of a safetensors file: an 8-byte little-endian
  header length, the JSON header, then the data."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  header.pop("__metadata__", None)
  return 8 + n, header


class SafetensorsReader:
  """The tensors of a folder's safetensors file(s): names, shapes, and reads into arrays."""

  def __init__(self, hf_dir: str):
    self.entries: dict[str, tuple[str, int, dict]] = {}   # name -> (file, data start, info)
    for path in self._files(hf_dir):
      self._open(path)

  @staticmethod
  def _files(hf_dir: str) -> list[str]:
    index = os.path.join(hf_dir, INDEX)
    if os.path.isfile(index):
      weight_map = read_json(index, "").get("weight_map")
      if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map: re-download the checkpoint")
      files = sorted(set(weight_map.values()))
      return [os.path.join(hf_dir, f) for f in files]
    single = os.path.join(hf_dir, SINGLE)
    if os.path.isfile(single):
      return [single]
    raise CheckpointError(f"{hf_dir} has neither {SINGLE} nor {INDEX}: pass a folder with "
                          "the model's safetensors weights")

  def _open(self, path: str) -> None:
    if not os.path.isfile(path):
      raise CheckpointError(f"{path} is missing (named in {INDEX}): re-download it")
    try:  # checks the header and that the data covers every tensor (a truncated file)
      with safe_open(path, framework="numpy") as f:
        names = list(f.keys())
      start, header = _header(path)
    except Exception as e:  # the package raises its own SafetensorError and OSErrors
      raise CheckpointError(f"{path} is not a readable safetensors file "
                            f"({' '.join(str(e).split())}): re-download it") from None
    for name in names:
      info = header[name]
      if info["dtype"] not in DTYPES:
        raise CheckpointError(f"tensor {name} in {path} has dtype {info['dtype']}: only "
                              f"{sorted(DTYPES)} weights can be converted")
      if name in self.entries:
        raise CheckpointError(f"tensor {name} is in both {self.entries[name][0]} and {path}")
      self.entries[name] = (path, start, info)

  def names(self) -> set[str]:
    return set(self.entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.entries[name][2]["shape"])

  def chunks(self, name: str, per_chunk: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) of tensor `name` in its stored dtype, `per_chunk` rows (default:
    CHUNK_BYTES of them) at a time: a whole tensor never sits in memory."""
    path, start, info = self.entries[name]
    dtype, shape = DTYPES[info["dtype"]], tuple(info["shape"])
    begin, _ = info["data_offsets"]
    if not shape:
      raise CheckpointError(f"tensor {name} is a scalar: no weight of the model is")
    rows, row_items = shape[0], int(np.prod(shape[1:]))
    per_chunk = per_chunk or max(1, CHUNK_BYTES // max(1, row_items * dtype.itemsize))
    with open(path, "rb") as f:
      for r0 in range(0, rows, per_chunk):
        r1 = min(rows, r0 + per_chunk)
        f.seek(start + begin + r0 * row_items * dtype.itemsize)
        count = (r1 - r0) * row_items
        buf = f.read(count * dtype.itemsize)
        if len(buf) != count * dtype.itemsize:
          raise CheckpointError(f"{path} ends inside tensor {name}: re-download it")
        yield r0, np.frombuffer(buf, dtype).reshape((r1 - r0,) + shape[1:])

  def dtype(self, name: str) -> np.dtype:
    return DTYPES[self.entries[name][2]["dtype"]]

  def read_into(self, name: str, dst: np.ndarray) -> None:
    """Copies tensor `name` into `dst` (same shape, any float dtype, possibly a strided
    view), CHUNK_BYTES of rows at a time."""
    if dst.shape != self.shape(name):
      raise CheckpointError(f"tensor {name} has shape {list(self.shape(name))}, expected "
                            f"{list(dst.shape)}")
    for r0, rows in self.chunks(name):
      dst[r0:r0 + len(rows)] = rows

  def read(self, name: str) -> np.ndarray:
    """Tensor `name` as a new float32 array."""
    out = np.empty(self.shape(name), np.float32)
    self.read_into(name, out)
    return out


def write_safetensors(path: str, tensors: Iterable[tuple[str, tuple[int, ...],
                                                        Callable[[], np.ndarray]]],
                      dtype: str = "float32") -> None:
  """Writes a safetensors file from (name, shape, make) triples, calling `make()` (an
  array of that shape) for one tensor at a time; values are stored in `dtype`."""
  tensors = list(tensors)
  code = EXPORT_DTYPES[dtype]
  itemsize = DTYPES[code].itemsize
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name, shape, _ in tensors:
    size = int(np.prod(shape)) * itemsize
    header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
    offset += size
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)   # the format aligns the data on 8 bytes
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for name, shape, make in tensors:
      value = np.ascontiguousarray(make(), dtype=DTYPES[code])
      assert value.shape == tuple(shape), (name, value.shape, shape)
      value.tofile(f)
