"""The training input pipeline (grain) and the held-out evaluation examples.

Every step is a `grain.MapDataset` transformation whose randomness is seeded by the
element's index (epoch-wise `shuffle`, index-seeded `random_map`), so a batch is a pure
function of (seed, batch index): iterators are deterministic and their state is one
integer, which makes checkpoint/resume exact.

  image index (shuffled per epoch, repeated forever)
    -> example (task drawn from task_weights; variant and augmentation from the same rng)
    -> row (examples_per_row examples packed into seq_len)
    -> batch [batch_size, seq_len, ...]
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from mot.data import digits
from mot.data import packing
from mot.data import tasks

DATASETS = ("digits",)


def make_train_dataset(data_config: Any, seed: int, batch_size: int,
                       shard_index: int = 0, shard_count: int = 1) -> grain.IterDataset:
  """Infinite, deterministic, resumable batches of packed training rows.

  Args:
    data_config: `config.data` (attributes: dataset, seq_len, examples_per_row,
      patch_size, patch_dim, task_weights, shift_pixels; optional: num_threads and
      prefetch for the reading threads (default 1 and 2), workers for as many
      worker processes (default 0: none), which give the same batches faster).
    seed: data seed, in [0, 2**32).
    batch_size: rows per batch on this process.
    shard_index, shard_count: this process's share of rows (multi-host: process
      index and count); shards are disjoint and each is deterministic.
  Returns:
    IterDataset of dicts: every `SequenceBuilder` field plus `segment_ids`, numpy
    arrays [batch_size, seq_len, ...] (`patches` float32 [B, L, patch_dim],
    `positions` int32 [B, L, 3], the rest [B, L]).
  """
  options = validate(data_config)
  names, probs = _task_mixture(data_config)
  images, labels = _train_pairs(data_config)
  shuffle_seed, map_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(2))
  ds = grain.MapDataset.range(len(images)).shuffle(seed=shuffle_seed).repeat(None)
  ds = ds.random_map(
      _MakeExample(images, labels, names, probs, options, int(data_config.shift_pixels)),
      seed=map_seed)
  ds = ds.batch(int(data_config.examples_per_row), batch_fn=_PackRow(data_config.seq_len))
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  ds = ds.batch(batch_size)
  read_options = grain.ReadOptions(
      num_threads=int(getattr(data_config, "num_threads", 1)),
      prefetch_buffer_size=int(getattr(data_config, "prefetch", 2)))
  it_ds = ds.to_iter_dataset(read_options)
  workers = int(getattr(data_config, "workers", 0))
  if workers > 0:  # Worker i makes batches i, i + workers, ...: same batches, in order.
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return it_ds


def heldout_examples(data_config: Any, task: str) -> list[dict[str, np.ndarray]]:
  """Unpadded examples of `task` for every held-out image, in `heldout_labels` order.

  Never augmented; a task's text variant is drawn from an rng seeded by the image's
  held-out index, so the list is the same on every call.
  """
  options = validate(data_config, task_names=(task,))
  images, labels = _heldout_pairs(data_config)
  return [tasks.build_example(task, image, label, options, np.random.default_rng(i))
          for i, (image, label) in enumerate(zip(images, labels))]


def heldout_labels(data_config: Any) -> np.ndarray:
  """int [297] labels of the held-out images (never trained on)."""
  return _heldout_pairs(data_config)[1]


def heldout_images(data_config: Any) -> np.ndarray:
  """float32 [297, 8, 8] held-out images in [-1, 1]."""
  return _heldout_pairs(data_config)[0]


def describe_batch(batch: Mapping[str, np.ndarray]) -> dict[str, int | float]:
  """Counts for logging: tokens/s should count real (non-padding) tokens only."""
  seg = np.asarray(batch["segment_ids"])
  real = int((seg > 0).sum())
  return {
      "real_tokens": real,
      "padding_fraction": 1.0 - real / seg.size,
      "examples": int(seg.max(axis=-1).sum()),  # Segments are numbered 1..k per row.
      "ar_tokens": int(np.asarray(batch["ar_weights"]).sum()),
      "dm_tokens": int(np.asarray(batch["dm_mask"]).sum()),
  }


def validate(data_config: Any, task_names: tuple[str, ...] | None = None) -> tasks.TaskOptions:
  """Checks data_config; returns the TaskOptions. Errors are one line naming the field."""
  dataset = data_config.dataset
  if dataset not in DATASETS:
    raise ValueError(f"config.data.dataset={dataset!r} is unknown; known: {DATASETS}")
  p, patch_dim = int(data_config.patch_size), int(data_config.patch_dim)
  if p < 1 or 8 % p:
    raise ValueError(f"config.data.patch_size={p} must divide the 8x8 digit images")
  if patch_dim < p * p:
    raise ValueError(f"config.data.patch_dim={patch_dim} is smaller than patch_size**2 "
                     f"= {p * p}")
  options = tasks.TaskOptions(patch_size=p, patch_dim=patch_dim)
  if task_names is None:
    task_names = _task_mixture(data_config)[0]
  lengths = {name: tasks.max_example_length(name, options) for name in task_names}
  longest = max(lengths, key=lengths.get)
  seq_len = int(data_config.seq_len)
  if seq_len < lengths[longest]:
    raise ValueError(f"config.data.seq_len={seq_len} cannot hold one {longest!r} example: "
                     f"the minimum needed is {lengths[longest]}")
  per_row = int(getattr(data_config, "examples_per_row", 1))
  if per_row * lengths[longest] > seq_len:
    logging.warning("config.data.seq_len=%d < examples_per_row=%d x %d tokens: some "
                    "examples will be dropped when packing", seq_len, per_row,
                    lengths[longest])
  return options


class _MakeExample:
  """random_map transform: image index -> one example of a task drawn from the mix."""

  def __init__(self, images, labels, names, probs, options, shift_pixels):
    self.images, self.labels = images, labels
    self.names, self.cum_probs = names, np.cumsum(probs)
    self.options, self.shift_pixels = options, shift_pixels

  def __call__(self, index: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Inverse-CDF draw: same law as rng.choice(p=...), several times cheaper.
    task = min(int(np.searchsorted(self.cum_probs, rng.random(), side="right")),
               len(self.names) - 1)
    name = self.names[task]
    return tasks.build_example(name, self.images[index], self.labels[index], self.options,
                               rng, self.shift_pixels)


class _PackRow:
  """batch_fn: a group of examples -> one packed row (overflowing examples dropped)."""

  def __init__(self, seq_len: int):
    self.seq_len = int(seq_len)

  def __call__(self, examples) -> dict[str, np.ndarray]:
    return packing.pack_examples(list(examples), self.seq_len)[0]


def _task_mixture(data_config: Any) -> tuple[tuple[str, ...], np.ndarray]:
  """(task names, probabilities) of the tasks with positive weight."""
  weights = dict(data_config.task_weights)
  for name, w in weights.items():
    tasks.get_task(name)  # Unknown names raise, listing the known ones.
    if w < 0:
      raise ValueError(f"config.data.task_weights[{name!r}]={w} is negative")
  names = tuple(sorted(n for n, w in weights.items() if w > 0))
  if not names:
    raise ValueError("config.data.task_weights has no positive weight")
  probs = np.array([weights[n] for n in names], np.float64)
  return names, probs / probs.sum()


def _train_pairs(data_config: Any) -> tuple[np.ndarray, np.ndarray]:
  """(images [N, H, W], labels [N]) the model trains on."""
  if data_config.dataset == "digits":
    images, labels, _, _ = digits.load_digits_split()
    return images, labels
  raise ValueError(f"config.data.dataset={data_config.dataset!r} is unknown; "
                   f"known: {DATASETS}")


def _heldout_pairs(data_config: Any) -> tuple[np.ndarray, np.ndarray]:
  """(images [M, H, W], labels [M]) kept for evaluation only."""
  if data_config.dataset == "digits":
    _, _, images, labels = digits.load_digits_split()
    return images, labels
  raise ValueError(f"config.data.dataset={data_config.dataset!r} is unknown; "
                   f"known: {DATASETS}")

