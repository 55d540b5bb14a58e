"""TensorBoard summaries of a run, in DIR/tensorboard/ (view: tensorboard --logdir DIR).

Writes through tensorboardX, a maintained event writer that needs no TensorFlow:

  writer = SummaryWriter(workdir, enabled=jax.process_index() == 0)
  writer.scalars(step, {"loss": 0.41, "learning_rate": 1e-3})
  writer.image(step, "samples", grid)   # float [H, W] or [H, W, C] in [0, 1]
  writer.close()

`read_events` reads the files back (tests, notebooks) without TensorBoard installed.
"""
from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

SUBDIR = "tensorboard"


class SummaryWriter:
  """Scalars and images for TensorBoard; a no-op when not `enabled` (processes > 0)."""

  def __init__(self, workdir: str, enabled: bool = True, flush_secs: int = 30):
    self.logdir = os.path.join(workdir, SUBDIR)
    self._writer = None
    if enabled:
      import tensorboardX  # lazy: slow to import, and only process 0 writes
      self._writer = tensorboardX.SummaryWriter(logdir=self.logdir, flush_secs=flush_secs)

  @property
  def enabled(self) -> bool:
    return self._writer is not None

  def scalars(self, step: int, values: Mapping[str, Any]) -> None:
    """One point per tag at `step`, e.g. {"loss": 0.4, "eval/ar_loss": 1.2}.

    Use "/" in tags to group them in TensorBoard; a "step" key is skipped, so a
    metrics.jsonl record can be passed as is.
    """
    if self._writer is None:
      return
    for tag, value in values.items():
      if tag != "step":
        self._writer.add_scalar(tag, float(value), global_step=int(step))

  def image(self, step: int, name: str, array: Any) -> None:
    """An image: float [H, W] (grayscale) or [H, W, C] (C = 1, 3 or 4) in [0, 1]."""
    if self._writer is None:
      return
    a = np.asarray(array, np.float32)
    if a.ndim == 3 and a.shape[-1] == 1:
      a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
      raise ValueError(f"image {name!r}: expected [H, W] or [H, W, 1|3|4], got {a.shape}")
    pixels = np.round(np.clip(np.nan_to_num(a), 0.0, 1.0) * 255).astype(np.uint8)
    self._writer.add_image(name, pixels, global_step=int(step),
                           dataformats="HW" if a.ndim == 2 else "HWC")

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> "SummaryWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_events(logdir: str) -> Iterator[Any]:
  """Every `Event` proto in logdir's event files, file by file, checksums verified."""
  from tensorboardX.proto import event_pb2  # lazy: slow, read by tests and tools only
  from tensorboardX.record_writer import masked_crc32c  # lazy: as the line above
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):  # TFRecord: len u64, crc(len) u32, payload, crc(payload) u32.
      header = data[pos:pos + 8]
      (length,) = struct.unpack("<Q", header)
      (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
      payload = data[pos + 12:pos + 12 + length]
      (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
      if length_crc != masked_crc32c(header) or payload_crc != masked_crc32c(payload):
        raise ValueError(f"{path}: corrupt record at byte {pos}")
      yield event_pb2.Event.FromString(payload)
      pos += 16 + length


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every scalar in logdir."""
  out: dict[str, list[tuple[int, float]]] = {}
  for event in read_events(logdir):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out
