"""The training input pipeline (grain) and the held-out evaluation examples.

Every step is a `grain.MapDataset` transformation whose randomness is seeded by the
element's index (epoch-wise `shuffle`, index-seeded `random_map`), so a batch is a pure
function of (seed, batch index): iterators are deterministic and their state is one
integer, which makes checkpoint/resume exact.

  image index (shuffled per epoch, repeated forever)
    -> example (task drawn from task_weights; variant and augmentation from the same rng;
       a short task's per_row examples, the others' pairs drawn from that rng)
    -> row (examples_per_row such groups packed into seq_len)
    -> batch [batch_size, seq_len, ...]

`config.data.dataset` picks the pairs: "digits" (image, label), "moving_digits" (the same
digits, each example a clip of it moving, drawn from the example's rng: see
`mot.data.moving_digits`; video tasks only), "shapes" (procedural RGB scenes, each example
drawn from the example's rng: see `mot.data.shapes_tasks`; shapes tasks only),
"shapes_video" (the same scenes moving, with an agent: `mot.data.shapes_video_tasks`), your own
(image, caption) pairs, "image_folder" and "array_record" (see `mot.data.user_data`), or
(clip, caption) pairs, "video_folder" (`mot.data.user_video`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from mot.data import digits
from mot.data import moving_digits
from mot.data import packing
from mot.data import shapes_tasks
from mot.data import shapes_video_tasks
from mot.data import tasks
from mot.data import user_data
from mot.data import user_video
from mot.errors import field
from mot.tokenizer import BYTE_TOKENIZER as BYTES
from mot.tokenizer import Tokenizer

EPOCHS = 10**12 // 2000  # ~5e8 epochs of the digits: more than any run consumes
DATASETS = ("digits", "moving_digits", "shapes", "shapes_video", "image_folder",
            "array_record", "video_folder")
DIGIT_DATASETS = ("digits", "moving_digits")  # labelled bundled digits, fixed split
# Scenes drawn per example, not read: dataset -> its task module (DATASET, MEDIA,
# validate, build_example, max_example_length, heldout_examples, HELDOUT_ALIASES).
PROCEDURAL = {shapes_tasks.DATASET: shapes_tasks, shapes_video_tasks.DATASET: shapes_video_tasks}
PROCEDURAL_DATASETS = tuple(PROCEDURAL)
# Your own files: mot.data.user_data (images), mot.data.user_video (clips).
USER_DATASETS = ("image_folder", "array_record", user_video.DATASET)
VIDEO_DATASETS = ("moving_digits", user_video.DATASET)   # clips: video tasks only
CLIP_DATASETS = (*VIDEO_DATASETS, shapes_video_tasks.DATASET)  # Pipeline draws / reads clips
# The kind of example (Task.media) each dataset makes; the others make "image" examples.
DATASET_MEDIA = {**{name: "video" for name in VIDEO_DATASETS},
                 **{name: module.MEDIA for name, module in PROCEDURAL.items()}}


def make_train_dataset(data_config: Any, seed: int, batch_size: int,
                       shard_index: int = 0, shard_count: int = 1,
                       tokenizer: Tokenizer = BYTES) -> grain.IterDataset:
  """Infinite, deterministic, resumable batches of packed training rows.

  Args:
    data_config: `config.data` (dataset, seq_len, examples_per_row, patch_size,
      patch_dim, task_weights, shift_pixels, the dataset's own fields, and num_threads,
      prefetch and workers: reading threads, batches read ahead, and worker processes,
      which give the same batches faster).
    seed: data seed, in [0, 2**32).
    batch_size: rows per batch on this process.
    shard_index, shard_count: this process's share of rows (multi-host: process
      index and count): block shard_index of the global batch of
      batch_size * shard_count rows, which does not depend on shard_count.
    tokenizer: the run's (`mot.tokenizer.from_config(config)`); the byte tokenizer of
      the bundled configs by default.
  Returns:
    IterDataset of dicts: every `SequenceBuilder` field plus `segment_ids`, numpy
    arrays [batch_size, seq_len, ...] (`patches` float32 [B, L, patch_dim],
    `positions` int32 [B, L, 3], the rest [B, L]).
  """
  options = validate(data_config, tokenizer=tokenizer)
  names, probs = _task_mixture(data_config)
  pairs = train_pairs(data_config)
  shuffle_seed, map_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(2))
  # A finite but practically endless repeat: grain's `repeat(None)` length (sys.maxsize)
  # overflows `batch(1)`, i.e. examples_per_row = 1.
  ds = grain.MapDataset.range(len(pairs)).shuffle(seed=shuffle_seed).repeat(EPOCHS)
  ds = ds.random_map(
      _MakeExample(pairs, _build_fn(data_config), names, probs, options,
                   int(data_config.shift_pixels)),
      seed=map_seed)
  ds = ds.batch(int(data_config.examples_per_row), batch_fn=_PackRow(data_config.seq_len))
  # Global batch j is rows [j*B, (j+1)*B) whatever the shard count (B = batch_size *
  # shard_count); shard i loads its block [i*batch_size, (i+1)*batch_size) of it.
  ds = ds.batch(batch_size)
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  read_options = grain.ReadOptions(num_threads=int(data_config.num_threads),
                                   prefetch_buffer_size=int(data_config.prefetch))
  it_ds = ds.to_iter_dataset(read_options)
  workers = int(data_config.workers)
  if workers > 0:  # Worker i makes batches i, i + workers, ...: same batches, in order.
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return it_ds


def heldout_examples(data_config: Any, task: str, tokenizer: Tokenizer = BYTES
                     ) -> list[dict[str, np.ndarray]]:
  """Unpadded examples of `task` for every held-out image, in `heldout_labels` order.

  Never augmented; a task's text variant is drawn from an rng seeded by the image's
  held-out index, so the list is the same on every call.
  """
  if data_config.dataset in VIDEO_DATASETS:  # train_lib asks for the image tasks' names
    task = moving_digits.HELDOUT_ALIASES.get(task, task)
  if data_config.dataset in PROCEDURAL_DATASETS:  # fixed evaluation sets, no pairs
    module = PROCEDURAL[data_config.dataset]
    task = module.HELDOUT_ALIASES.get(task, task)
    return module.heldout_examples(
        task, validate(data_config, task_names=(task,), tokenizer=tokenizer))
  options = validate(data_config, task_names=(task,), tokenizer=tokenizer)
  pairs, build = heldout_pairs(data_config), _build_fn(data_config)
  examples = []
  for i in range(len(pairs)):
    image, label = pairs[i]
    examples.append(build(task, image, label, options, np.random.default_rng(i)))
  return examples


def heldout_labels(data_config: Any) -> np.ndarray:
  """int [297] labels of the held-out digits (never trained on); user data: its captions."""
  pairs = heldout_pairs(data_config)
  if isinstance(pairs, _ArrayPairs):
    return pairs.labels
  return np.array([pairs[i][1] for i in range(len(pairs))])


def heldout_images(data_config: Any) -> np.ndarray:
  """float32 [297, 8, 8] held-out digits in [-1, 1]; user data: [M, H, W(, C)] (clips:
  [M, T, H, W(, C)])."""
  pairs = heldout_pairs(data_config)
  if isinstance(pairs, _ArrayPairs):
    return pairs.images
  return np.stack([pairs[i][0] for i in range(len(pairs))])


def describe_batch(batch: Mapping[str, np.ndarray]) -> dict[str, int | float]:
  """Counts for logging: tokens/s should count real (non-padding) tokens only."""
  seg = np.asarray(batch["segment_ids"])
  real = int((seg > 0).sum())
  return {
      "real_tokens": real,
      "padding_fraction": 1.0 - real / seg.size,
      "examples": int(seg.max(axis=-1).sum()),  # Segments are numbered 1..k per row.
      "ar_tokens": int(np.asarray(batch["ar_weights"]).sum()),
      "dm_tokens": int((np.asarray(batch["dm_mask"]) > 0).sum()),
  }


def _f(data_config: Any, name: str):
  return field(data_config, name, "config.data")


def _image_shape(data_config: Any) -> tuple[int, int]:
  """(H, W) of the dataset's images (video: of the canvas its clips are drawn on)."""
  dataset = data_config.dataset
  if dataset == "moving_digits":
    side = int(_f(data_config, "canvas_size"))
    return side, side
  if dataset == "digits":
    size = _f(data_config, "image_size")
    if size != digits.SIDE:
      raise ValueError(f"config.data.image_size={size}: the bundled digits are "
                       f"{digits.SIDE}x{digits.SIDE}; set it to {digits.SIDE}")
    return size, size
  return user_data.model_space(data_config)[0]   # images, or their cached latents


def _check_video(data_config: Any, size: int) -> dict[str, Any]:
  """The video fields of a moving-digits config, checked, as TaskOptions keywords."""
  num_frames = int(_f(data_config, "num_frames"))
  if not 2 <= num_frames <= size - moving_digits.DIGIT + 1:
    raise ValueError(f"config.data.num_frames={num_frames} must be in [2, "
                     f"{size - moving_digits.DIGIT + 1}]: a digit moves one pixel a "
                     f"frame and must stay on the {size}x{size} canvas "
                     "(config.data.canvas_size)")
  layout = str(_f(data_config, "video_layout"))
  if layout not in moving_digits.VIDEO_LAYOUTS:
    raise ValueError(f"config.data.video_layout={layout!r} must be one of "
                     f"{moving_digits.VIDEO_LAYOUTS}")
  start = str(_f(data_config, "generation_start"))
  if start not in moving_digits.GENERATION_STARTS:
    raise ValueError(f"config.data.generation_start={start!r} must be one of "
                     f"{moving_digits.GENERATION_STARTS}")
  first_weight = float(_f(data_config, "first_frame_weight"))
  if not 0 < first_weight <= 100 or (layout != "frames" and first_weight != 1):
    raise ValueError(f"config.data.first_frame_weight={first_weight} must be in (0, 100] "
                     "and weighs a frame only with video_layout='frames' (else use 1)")
  return dict(num_frames=num_frames, canvas=size, video_layout=layout,
              generation_start=start, first_frame_weight=first_weight)


def _check_augmentation(data_config: Any, size: int) -> dict[str, Any]:
  """The reading augmentations, checked, as TaskOptions keywords."""
  rotate = float(_f(data_config, "rotate_degrees"))
  scale = float(_f(data_config, "scale_jitter"))
  if not 0 <= rotate <= 45 or not 0 <= scale < 0.5:
    raise ValueError(f"config.data.rotate_degrees={rotate} / scale_jitter={scale} out of "
                     "range: use 0..45 degrees and 0..0.5")
  cutout, cutout_prob = _f(data_config, "cutout_size"), float(_f(data_config, "cutout_prob"))
  if not isinstance(cutout, int) or not 0 <= cutout < size or not 0 <= cutout_prob <= 1:
    raise ValueError(f"config.data.cutout_size={cutout!r} / cutout_prob={cutout_prob} out of "
                     f"range: use an integer side 0..{size - 1} (0: off) and a probability 0..1")
  elastic = float(_f(data_config, "elastic_alpha"))
  sigma, prob = float(_f(data_config, "elastic_sigma")), float(_f(data_config, "elastic_prob"))
  if not 0 <= elastic <= 2 or not 0.5 <= sigma <= size or not 0 <= prob <= 1:
    raise ValueError(f"config.data.elastic_alpha={elastic} / elastic_sigma={sigma} / "
                     f"elastic_prob={prob} out of range: use 0..2 pixels (0: off), a "
                     f"smoothing of 0.5..{size} pixels and a probability 0..1")
  return dict(rotate_degrees=rotate, scale_jitter=scale, cutout_size=cutout,
              cutout_prob=cutout_prob, elastic_alpha=elastic, elastic_sigma=sigma,
              elastic_prob=prob)


def _check_patches(data_config: Any, shape: tuple[int, int]) -> tuple[int, int, int]:
  """(patch_size, patch_dim, channels of what is cut into patches: the image's, or its
  cached latent's), checked against the shape."""
  p, patch_dim = int(_f(data_config, "patch_size")), int(_f(data_config, "patch_dim"))
  channels = _f(data_config, "channels")
  if channels not in (1, 3) or (channels != 1 and data_config.dataset in DIGIT_DATASETS):
    raise ValueError(f"config.data.channels={channels!r} must be 1 (grayscale) or 3 (RGB); "
                     "the bundled digits are grayscale (1)")
  if data_config.dataset not in DIGIT_DATASETS:
    channels = user_data.model_space(data_config)[1]
  h, w = shape
  if p < 1 or h % p or w % p:
    where = {"digits": "", "moving_digits": " (config.data.canvas_size)"}.get(
        data_config.dataset, " (config.data.image_size)")
    raise ValueError(f"config.data.patch_size={p} must divide the {h}x{w} images{where}")
  if patch_dim < p * p * channels:
    raise ValueError(f"config.data.patch_dim={patch_dim} is smaller than patch_size**2 * "
                     f"channels = {p * p * channels}")
  return p, patch_dim, channels


def _check_read_window(data_config: Any, size: int, p: int, patch_dim: int) -> int:
  """config.data.read_window (image datasets: the reading task's patch neighbourhood);
  `size` is the image's shorter side."""
  window = _f(data_config, "read_window")
  if window and data_config.channels != 1:
    raise ValueError(f"config.data.read_window={window} reads grayscale patch neighbourhoods; "
                     "set it to 0 for RGB images (config.data.channels=3)")
  if not isinstance(window, int) or (window and (window <= p or (window - p) % 2 or window
                                                 > size or window * window > patch_dim)):
    raise ValueError(f"config.data.read_window={window!r} must be 0 (off) or a square centred "
                     f"on the {p}x{p} patch (larger by an even number, at most {size}) whose "
                     f"window**2 pixels fit config.data.patch_dim={patch_dim}")
  return window


def validate(data_config: Any, task_names: tuple[str, ...] | None = None,
             tokenizer: Tokenizer = BYTES) -> tasks.TaskOptions:
  """Checks data_config; returns the TaskOptions (which carry `tokenizer`, the run's).
  Errors are one line naming the field."""
  dataset = _f(data_config, "dataset")
  if dataset not in DATASETS:
    raise ValueError(f"config.data.dataset={dataset!r} is unknown; known: {DATASETS}")
  if digits.validation_size(data_config) and dataset not in DIGIT_DATASETS:
    raise ValueError(f"config.data.validation_size applies to the bundled digits; "
                     f"dataset={dataset!r} holds out its own " +
                     ("scenes (fixed evaluation sets): leave validation_size at 0"
                      if dataset in PROCEDURAL_DATASETS else
                      "pairs: set config.data.num_heldout instead and leave "
                      "validation_size at 0"))
  if dataset in PROCEDURAL_DATASETS:
    options = PROCEDURAL[dataset].validate(data_config, tokenizer)
    task_names = _check_media(data_config, task_names)
    _check_lengths(data_config, options, task_names)
    _check_drawable(PROCEDURAL[dataset], options, task_names)
    return options
  shape = _image_shape(data_config)
  p, patch_dim, channels = _check_patches(data_config, shape)
  size = min(shape)
  if dataset == "moving_digits":  # clips: no reading augmentation, no reading window
    media = _check_video(data_config, size)
  elif dataset == user_video.DATASET:
    media = _check_user_video(data_config)
  else:
    media = dict(canvas=size, read_window=_check_read_window(data_config, size, p, patch_dim),
                 **_check_augmentation(data_config, size))
  if dataset not in DIGIT_DATASETS:
    _check_latent_cache(data_config)
    media.update(channels=channels, question=_question(data_config))
  options = tasks.TaskOptions(patch_size=p, patch_dim=patch_dim, tokenizer=tokenizer, **media)
  task_names = _check_media(data_config, task_names)
  _check_lengths(data_config, options, task_names)
  return options


def _check_media(data_config: Any, task_names: tuple[str, ...] | None) -> tuple[str, ...]:
  """Refuses a task whose examples the dataset cannot make; returns the task names
  (None: those of the mix)."""
  if task_names is None:
    task_names = _task_mixture(data_config)[0]
  dataset = data_config.dataset
  wanted = DATASET_MEDIA.get(dataset, "image")
  needs = {"video": f"dataset in {VIDEO_DATASETS}",
           **{m.MEDIA: f"dataset={m.DATASET!r}" for m in PROCEDURAL.values()}}
  for name in task_names:
    media = tasks.get_task(name).media
    if media != wanted:
      raise ValueError(f"task {name!r} makes {media} examples, which "
                       f"config.data.dataset={dataset!r} cannot: set its "
                       "config.data.task_weights to 0" +
                       (f" ({media} tasks need {needs[media]})" if media in needs else ""))
  return task_names


def _check_drawable(module, options, task_names) -> None:
  """Draws one example of each procedural task, so that scene options under which a task
  has nothing to ask (relations with max_objects=1) fail here in one line, not in grain."""
  for name in task_names:
    try:
      module.build_example(name, None, None, options, np.random.default_rng(0))
    except ValueError as e:
      raise ValueError(f"task {name!r} cannot draw an example under config.data ({e}): "
                       f"set config.data.task_weights.{name} to 0") from None


def _check_lengths(data_config: Any, options: tasks.TaskOptions, task_names) -> None:
  """Refuses a seq_len that cannot hold one example of a task; warns when packing will
  drop examples."""
  if data_config.dataset in DIGIT_DATASETS:
    lengths = {name: tasks.max_example_length(name, options) for name in task_names}
    why = ""
  elif data_config.dataset in PROCEDURAL_DATASETS:
    module = PROCEDURAL[data_config.dataset]
    lengths = {name: module.max_example_length(name, options) for name in task_names}
    why = " (the grammar's longest texts)"
  else:  # Opens and checks every file once (cached): errors surface here, not in grain.
    data = open_user(data_config)
    module = user_video if data_config.dataset == user_video.DATASET else user_data
    lengths = {name: module.max_example_length(name, options, data.item_shape,
                                               data.longest_caption)
               for name in task_names}
    why = (f" (the longest caption has {len(data.longest_caption.encode('utf-8'))} bytes; "
           "shorten it or raise seq_len)")
  longest = max(lengths, key=lengths.get)
  seq_len = int(_f(data_config, "seq_len"))
  if seq_len < lengths[longest]:
    raise ValueError(f"config.data.seq_len={seq_len} cannot hold one {longest!r} example: "
                     f"the minimum needed is {lengths[longest]}{why}")
  per_row = int(_f(data_config, "examples_per_row"))
  group = max(lengths[n] * tasks.get_task(n).per_row for n in task_names)
  if per_row * group > seq_len:
    _warn_once(f"config.data.seq_len={seq_len} < examples_per_row={per_row} x {group} "
               "tokens (the longest task's example): a row whose drawn examples do not fit "
               "drops the last ones (rare when most examples are shorter); raise seq_len "
               "to drop none")


def open_user(data_config: Any) -> user_data.UserData:
  """The checked, split user dataset (images or clips) of config.data."""
  if data_config.dataset == user_video.DATASET:
    return user_video.open_user_video(data_config)
  return user_data.open_user_data(data_config)


def scan_user(data_config: Any) -> user_data.Scan:
  """The checked files of a user dataset (images or clips), nothing decoded."""
  if data_config.dataset == user_video.DATASET:
    return user_video.scan_user_video(data_config)
  return user_data.scan_user_data(data_config)


def _check_latent_cache(data_config: Any) -> None:
  """A latent cache holds images' latents, read as they are (no pixel augmentation)."""
  if not user_data.latent_dir(data_config):
    return
  if data_config.dataset == user_video.DATASET:
    raise ValueError("config.data.latent_cache holds images' latents; dataset "
                     "'video_folder' trains on pixels: set it to ''")
  if int(_f(data_config, "shift_pixels")):
    raise ValueError(f"config.data.shift_pixels={data_config.shift_pixels} moves pixels; a "
                     "latent run reads its cached latents as they are: set it to 0")


def _check_user_video(data_config: Any) -> dict[str, Any]:
  """The video fields of a video-folder config, checked, as TaskOptions keywords."""
  num_frames = _f(data_config, "num_frames")
  if not isinstance(num_frames, int) or num_frames < 1:
    raise ValueError(f"config.data.num_frames={num_frames!r} must be a positive integer "
                     "(frames of each clip the run trains on)")
  layout = str(_f(data_config, "video_layout"))
  if layout not in moving_digits.VIDEO_LAYOUTS:
    raise ValueError(f"config.data.video_layout={layout!r} must be one of "
                     f"{moving_digits.VIDEO_LAYOUTS}")
  first_weight = float(_f(data_config, "first_frame_weight"))
  if not 0 < first_weight <= 100 or (layout != "frames" and first_weight != 1):
    raise ValueError(f"config.data.first_frame_weight={first_weight} must be in (0, 100] "
                     "and weighs a frame only with video_layout='frames' (else use 1)")
  return dict(num_frames=num_frames, video_layout=layout, first_frame_weight=first_weight)


def _question(data_config: Any) -> str:
  """config.data.question (user data: the reading task's question), checked."""
  question = _f(data_config, "question")
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f"config.data.question={question!r} must be a non-empty string (the "
                     "question the reading task asks, e.g. 'Describe this image.')")
  return question


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  """logging.warning, once per process: validate() runs for every dataset built."""
  if message not in _WARNED:
    _WARNED.add(message)
    logging.warning(message)


class _MakeExample:
  """random_map transform: pair index -> one example of a task drawn from the mix."""

  def __init__(self, pairs, build, names, probs, options, shift_pixels):
    self.pairs, self.build = pairs, build
    self.names, self.cum_probs = names, np.cumsum(probs)
    self.options, self.shift_pixels = options, shift_pixels

  def __call__(self, index: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """The example(s) of one drawn task: one, or the task's `per_row`, the rest from
    pairs drawn by rng (all packed together, in order, by _PackRow)."""
    # Inverse-CDF draw: same law as rng.choice(p=...), several times cheaper.
    task = min(int(np.searchsorted(self.cum_probs, rng.random(), side="right")),
               len(self.names) - 1)
    name = self.names[task]
    indices, count = [index], tasks.get_task(name).per_row
    if count > 1:
      indices += rng.integers(len(self.pairs), size=count - 1).tolist()
    examples = []
    for i in indices:
      image, label = self.pairs[i]  # User data: the image is decoded here.
      examples.append(self.build(name, image, label, self.options, rng, self.shift_pixels))
    return examples


class _PackRow:
  """batch_fn: a group of examples -> one packed row (overflowing examples dropped)."""

  def __init__(self, seq_len: int):
    self.seq_len = int(seq_len)

  def __call__(self, groups) -> dict[str, np.ndarray]:
    return packing.pack_examples([e for group in groups for e in group], self.seq_len)[0]


def _task_mixture(data_config: Any) -> tuple[tuple[str, ...], np.ndarray]:
  """(task names, probabilities) of the tasks with positive weight."""
  weights = dict(data_config.task_weights)
  for name, w in weights.items():
    tasks.get_task(name)  # Unknown names raise, listing the known ones.
    if data_config.dataset == user_video.DATASET and w > 0:
      user_video.check_task(name)
    elif data_config.dataset in USER_DATASETS and w > 0:
      user_data.check_task(name)
    if w < 0:
      raise ValueError(f"config.data.task_weights[{name!r}]={w} is negative")
  names = tuple(sorted(n for n, w in weights.items() if w > 0))
  if not names:
    raise ValueError("config.data.task_weights has no positive weight")
  probs = np.array([weights[n] for n in names], np.float64)
  return names, probs / probs.sum()


class _ArrayPairs:
  """pairs[i] -> (image [H, W], label) of in-memory arrays (the digits)."""

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    self.images, self.labels = images, labels

  def __len__(self) -> int:
    return len(self.images)

  def __getitem__(self, i: int):
    return self.images[i], self.labels[i]


class _IndexPairs:
  """pairs[i] -> (None, i): a procedural dataset's examples are drawn, not read."""

  def __init__(self, n: int):
    self.n = n

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i: int):
    return None, int(i)


def _build_fn(data_config: Any):
  """(task name, image, label or caption, options, rng, shift) -> example."""
  return {"digits": tasks.build_example, "moving_digits": tasks.build_video_example,
          **{name: m.build_example for name, m in PROCEDURAL.items()},
          user_video.DATASET: user_video.build_example}.get(data_config.dataset,
                                                            user_data.build_example)


def _split_pairs(data_config: Any, heldout: bool):
  """pairs[i] -> (image [H, W], label or caption) of the train or held-out split."""
  if data_config.dataset in DIGIT_DATASETS:  # moving digits: clips of the same digits
    train_x, train_y, held_x, held_y = digits.load_digits_split(
        digits.validation_size(data_config))
    return _ArrayPairs(held_x, held_y) if heldout else _ArrayPairs(train_x, train_y)
  if data_config.dataset in PROCEDURAL_DATASETS:
    if heldout:  # evaluation reads the fixed sets of mot.data.shapes instead
      raise ValueError(f"config.data.dataset={data_config.dataset!r} has no held-out pairs: "
                       "its evaluation sets are fixed (mot.eval_shapes, mot.eval_shapes_video)")
    return _IndexPairs(PROCEDURAL[data_config.dataset].VIRTUAL_PAIRS)
  if data_config.dataset in DATASETS:
    split = open_user(data_config)
    return split.heldout if heldout else split.train
  raise ValueError(f"config.data.dataset={data_config.dataset!r} is unknown; "
                   f"known: {DATASETS}")


def train_pairs(data_config: Any):
  """The pairs the model trains on."""
  return _split_pairs(data_config, heldout=False)


def heldout_pairs(data_config: Any):
  """The pairs kept for evaluation only."""
  return _split_pairs(data_config, heldout=True)

