"""`Pipeline`: one checkpoint, both heads. Reason about images, generate them, or both.

  pipe = mot.Pipeline.from_workdir("runs/digits")            # newest checkpoint, EMA weights
  pipe.reason("What digit is this?", images=heldout)          # -> ["7", "2", ...]
  pipe.generate("a handwritten digit 7", num_samples=4)       # -> float32 [4, 8, 8] in [0, 1]
  pipe.think_then_draw("draw the digit after 3:")            # -> ("4", [1, 8, 8] image)

On a mesh (as train.py shards, by the config's logical rules; the parameters are read
straight into their shards, never whole on one device, and the jitted decode and denoise
run there with each batch's rows split over the data axes):

  pipe = mot.Pipeline.from_workdir("runs/digits", mesh_shape="(2,2,2)")

A moving-digits checkpoint (config.data.dataset="moving_digits") works on clips:

  video = mot.Pipeline.from_workdir("runs/moving")
  video.generate("a handwritten digit 3 moving right", num_frames=8)  # -> [1, 8, 16, 16]
  video.predict(first_frame, "right,right,up")      # world model -> [1, 4, 16, 16]
  video.infer_actions(clip)                         # inverse dynamics -> [1, T - 1, 2]
  video.reason("Which digit moves, and where?", video=clip)   # -> "3, right"

A checkpoint trained on your own images or clips (configs/image_folder.py,
configs/video_folder.py) reads a file exactly as its training files were read
(`mot.data.preprocess`: size, channels, crop / pad / stretch, invert), asks the question it
trained on and answers up to its longest caption by default:

  mine = mot.Pipeline.from_workdir("runs/mine")
  mine.reason(images="photo.jpg")                   # "Describe this image." -> a caption
  mine.generate("a red bicycle", num_samples=4)     # -> float32 [4, H, W, 3] in [0, 1]

Prompts use the training layouts (`mot.prompts.PromptBuilder`, built by the same
`SequenceBuilder` as the data). Images come in as arrays (digits scale [0, 16] or [0, 1]),
paths or PIL images of any size and colour mode (`mot.media`), and go out in [0, 1]
(1 = most ink): [N, H, W] for a grayscale checkpoint, [N, H, W, 3] for an RGB one
(config.data.channels), at the trained (H, W). A latent run (config.latent.vae) encodes
images and decodes its samples with its VAE (`mot.latent`). All heavy work is batched and
jitted in `mot.sampling`.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from mot import checkpoint as ckpt_lib
from mot import config as config_lib
from mot import latent, media, patches, sampling, sharding
from mot import pipeline_setup as setup
from mot import sample_options as opts
from mot import tokenizer as tokenizer_lib
from mot.data import (clip_files, input_pipeline, moving_digits, preprocess, shapes_grammar,
                      shapes_tasks, shapes_think, tasks)
from mot.errors import InputError
from mot.model import MoT
from mot.prompts import PromptBuilder

DEFAULT_QUESTION = tasks.QUESTION
SHAPES_QUESTION = shapes_grammar.DESCRIBE_QUESTION
VIDEO_QUESTION = moving_digits.QUESTION
MAX_DECODE_BATCH = 256                    # rows per jitted decode call
MAX_SAMPLE_BATCH = 128                    # samples per jitted denoise call (x2 with CFG)
THINK_TOKENS = 8                          # think_then_draw's answers: a short plan


class Pipeline:
  """A model, its parameters and its config: reasoning and generation from one checkpoint.

  Build it with `Pipeline.from_workdir(workdir)` or, for parameters already in memory
  (e.g. during training), `Pipeline(config, params)`.
  """

  def __init__(self, config: Any, params: Any, step: int | None = None,
               mesh: jax.sharding.Mesh | None = None):
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
    self.mesh = mesh               # None: one device; else params are sharded over it
    self.rules = sharding.logical_rules(config) if mesh is not None else ()
    self.step = step
    self.tokenizer = tokenizer_lib.from_config(config)   # validate() has loaded it
    data, sample = config.data, config.sample
    self.dataset = str(data.dataset)
    self.is_video = self.dataset in input_pipeline.CLIP_DATASETS
    self.is_shapes = self.dataset == shapes_tasks.DATASET   # no reading window either
    self.patch_size = int(data.patch_size)
    self.channels = int(data.channels)
    self.image_shape = patches.image_shape(
        data.canvas_size if self.dataset == "moving_digits" else data.image_size)
    h, w = self.image_shape
    self.image_size = h if h == w else self.image_shape   # the side, for square images
    self.num_frames = int(data.num_frames) if self.is_video else None
    # User data: a file is read by the run's own preprocessing (size, channels, crop /
    # pad / stretch, invert), the function its training files went through.
    self.image_options = (preprocess.image_options(data)
                          if self.dataset in input_pipeline.USER_DATASETS else None)
    self.question = setup.run_question(config)
    self.default_max_new_tokens = int(sample.max_new_tokens)
    self.vae = setup.load_vae(config)     # latent runs: images <-> the VAE's scaled latents
    self.prompts = PromptBuilder(
        patch_dim=self.model_cfg.patch_dim, patch_size=self.patch_size,
        image_size=latent.image_grid(config), channels=latent.model_channels(config),
        read_window=0 if self.is_video or self.is_shapes else int(data.read_window),
        video_layout=str(data.video_layout) if self.is_video else "clip",
        action_dim=self.model_cfg.modality_patch_dims[3], tokenizer=self.tokenizer,
        encode=None if self.vae is None else self.encode_latents)
    # Positions restart at 0 in every packed example, so the training row's length does
    # not bound what the model reads: sample.context_length may allow more.
    self.context_length = max(int(data.seq_len), int(sample.context_length))
    self.default_steps = int(sample.steps)
    self.default_sampler = str(sample.sampler)
    self.default_cfg_scale = float(sample.cfg_scale)
    # config.sample.shift, composed with the resolution shift training used (if any).
    self.time_shift = float(sample.shift) * latent.timestep_shift(config)
    self.default_reason_shifts = int(sample.reason_shifts)
    # Answer budgets that hold the data's longest answer, and the answer a reply gives.
    self.default_max_new_tokens, self.default_draw_tokens = setup.answer_budgets(
        config, self.tokenizer, self.default_max_new_tokens, THINK_TOKENS)
    self.final_answer = setup.answer_reader(config)
    # Shapes runs that draw after a layout plan (data.layout_plan) write it first.
    self.plan_temperature = (float(sample.plan_temperature)
                             if self.is_shapes and data.layout_plan else None)

  @classmethod
  def from_workdir(cls, workdir: str, use_ema: bool = True, step: int | None = None,
                   mesh_shape: str | None = None) -> "Pipeline":
    """Loads the newest (or `step`'s) checkpoint of a training workdir once.

    The config comes from the JSON saved beside the checkpoint (brought up to date by
    `mot.config_upgrade.upgrade_config`) and is validated again; only the parameters (EMA
    when present and `use_ema`) are read. With `mesh_shape` (e.g. "(2,2,2)" over the
    config's mesh axes; one -1 takes the remaining devices) they are read sharded by the
    config's logical rules, as training shards them, and sampling runs on that mesh.
    Raises `CheckpointError` (one line) for a missing workdir, no checkpoint, or no
    readable checkpoint, and `ConfigError` for a mesh the devices cannot form.
    """
    meshes = []

    def sharded_params(saved: dict):
      config = setup.checked_config(saved, workdir)
      meshes.append(setup.mesh_of(config, mesh_shape))
      return setup.sharded_param_shapes(config, meshes[-1])

    params, saved, restored_step = ckpt_lib.restore_params(
        workdir, step, use_ema, shardings=None if mesh_shape is None else sharded_params)
    config = setup.checked_config(saved, workdir, restored_step)
    return cls(config, params, restored_step, meshes[-1] if meshes else None)

  # -------------------------------------------------------------------------- mesh ------
  def on_mesh(self):
    """Where the jitted sampling calls trace and run: the mesh and its logical rules (so
    the model's activation constraints apply), or nothing special on one device."""
    if self.mesh is None:
      return contextlib.nullcontext()
    return sharding.on_mesh(self.mesh, self.rules)

  def place(self, tree):
    """A host batch for a jitted call: on a mesh, its rows split over the data axes."""
    return tree if self.mesh is None else sharding.put_rows(self.mesh, tree)

  # -------------------------------------------------------------------------- checks ----
  def check_length(self, n: int, extra: int, what: str) -> None:
    """Refuses a prompt of n tokens that needs `extra` more beyond the model's context."""
    if n + extra > self.context_length:
      raise InputError(
          f"{what} needs {n + extra} tokens but the model's context is "
          f"{self.context_length} (the larger of config.data.seq_len and "
          "config.sample.context_length): shorten the prompt")

  def require_video(self, what: str, actions: bool = False) -> None:
    """Refuses `what` (an option or method that needs clips, or with `actions` clips
    with actions: the moving digits) on a checkpoint trained on other data."""
    if not self.is_video or (actions and self.dataset != "moving_digits"):
      if actions and self.is_video and self.dataset not in input_pipeline.VIDEO_DATASETS:
        # shapes_video: its world model names the agent
        raise InputError(f"{what} moves the moving digits; a shapes_video world model needs "
                         "its agent named: use mot.eval_shapes_video.predict_clips")
      need = ("'moving_digits' (clips with actions)" if actions
              else " or ".join(repr(d) for d in input_pipeline.CLIP_DATASETS))
      raise InputError(f"{what} needs a video checkpoint (config.data.dataset={need}); "
                       f"this one was trained on {self.dataset!r}")

  def sampling_settings(self, num_samples: int = 1, steps: int | None = None,
                        cfg_scale: float | None = None, sampler: str | None = None
                        ) -> tuple[int, float, str]:
    """(steps, cfg_scale, sampler) with config.sample's defaults for those left None."""
    return opts.check_sampling(num_samples,
                               self.default_steps if steps is None else steps,
                               self.default_cfg_scale if cfg_scale is None else cfg_scale,
                               self.default_sampler if sampler is None else sampler)

  # -------------------------------------------------------------------------- inputs ----
  def unit_images(self, images: Any) -> tuple[np.ndarray, bool]:
    """float32 [N, H, W(, C)] in [0, 1] at the model's image size and channels, and
    whether one image was given (user data: through the run's preprocessing)."""
    if self.image_options is not None:
      return media.to_run_images(images, self.image_options)
    return media.to_unit_images(images, self.image_shape, self.channels)

  def load_clip(self, path: Any) -> np.ndarray:
    """float32 [T, H, W(, C)] in [0, 1] of a clip file (GIF, folder of frames; user
    video: also MP4, its first config.data.num_frames frames through the run's
    preprocessing)."""
    if self.image_options is None:
      return media.load_clip(path, self.image_shape, self.channels)
    if not os.path.exists(path):
      raise InputError(f"clip {path} does not exist")
    try:
      return clip_files.load_clip(os.fspath(path), self.image_options, self.num_frames)
    except ValueError as e:
      raise InputError(str(e)) from None

  def clips(self, video: Any) -> np.ndarray:
    """float32 [N, T, H, W(, C)] in [0, 1] from frames [T, H, W(, C)] / clips [N, T, ...]
    (digits scale 0..16 or 0..1), or a clip path (GIF, folder of frames, user video: MP4)
    or a list of them."""
    if isinstance(video, (str, os.PathLike)):
      return self.load_clip(video)[None]
    if isinstance(video, (list, tuple)) and video and isinstance(video[0], (str, os.PathLike)):
      clips = [self.load_clip(v) for v in video]
      if len({len(c) for c in clips}) != 1:
        raise InputError(f"clips have different frame counts {[len(c) for c in clips]}: "
                         "give clips of one length per call")
      return np.stack(clips)
    arr = np.asarray(video, np.float32)
    rank = len(self.prompts.frame_shape)   # of one frame
    if arr.ndim == rank + 1:
      arr = arr[None]
    if arr.ndim != rank + 2 or arr.size == 0:
      raise InputError(f"video must be frames [T, H, W{'' if rank == 2 else ', C'}] or "
                       f"clips [N, T, ...], got shape {arr.shape}")
    n, t = arr.shape[:2]
    frames = self.unit_images(arr.reshape(n * t, *arr.shape[2:]))[0]
    return frames.reshape(n, t, *self.prompts.frame_shape)

  # -------------------------------------------------------------------------- reason ----
  def reason(self, prompt: str | Sequence[str] | None = None, images: Any = None,
             video: Any = None, max_new_tokens: int | None = None, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             shifts: int | None = None, raw: bool = False) -> str | list[str]:
    """Answers prompts with the AR head, in one batched jitted decode (chunked if large).

    Args:
      prompt: a string or a list of strings; None asks the question the run trained on
        (`self.question`: "What digit is this?", "Which digit moves, and where?" for
        moving digits, config.data.question for user data, e.g. "Describe this image.").
      images: None; an array [H, W] / [N, H, W] (digits scale 0..16, or 0..1); a path,
        PIL image, or a list of them. With N images and one prompt, one answer per image;
        with N prompts, image i goes with prompt i.
      video: None; frames [T, H, W] (same scales), one clip for every prompt; clips
        [N, T, H, W] (or GIF paths / frame folders), one answer per clip as for images.
      max_new_tokens: most tokens per answer; decoding stops at EOS. None takes
        config.sample.max_new_tokens (user data: the run's longest caption and its EOS;
        Shapes: at least the longest caption and its EOS, so that a "Describe this
        image." answer is complete).
      temperature: 0 is greedy; otherwise top_k (0 = off) and top_p (1 = off) filter.
      seed: sampling seed (row i always draws from the same stream).
      shifts: test-time augmentation for images: each image is read in the (2s+1)^2
        views moved by -s..s pixels per axis (background-filled, as the training shifts)
        and one answer is decoded from the views' mean log-probabilities
        (`sampling.decode(views=...)`). 0 reads the image as given; None takes
        config.sample.reason_shifts. Needs images.
      raw: the whole decoded reply, a Shapes relation trace included (data.relation_trace),
        instead of the answer after it.
    Returns:
      The answer (str) for one prompt and at most one image, else a list of answers.
    """
    if prompt is None:
      prompt = self.question
    prompts, single = opts.prompt_list(prompt)
    if max_new_tokens is None:
      max_new_tokens = self.default_max_new_tokens
    opts.check_decoding(max_new_tokens, temperature, top_k, top_p)
    seed = opts.check_seed(seed)
    rows, single_input = self._reading_rows(prompts, images, video)
    views = self._shift_views(shifts, any(image is not None for _, image, _ in rows))
    examples = []
    for text, image, clip in rows:
      for dy, dx in views:
        shifted = None if image is None else shift(image, dy, dx)
        ex = self.prompts.reasoning_prompt(text, shifted, clip)
        self.check_length(len(ex["tokens"]), max_new_tokens, "prompt plus answer")
        examples.append(ex)
    ids = self.decode_answers(examples, max_new_tokens, temperature, top_k, top_p, seed,
                              views=len(views))
    read = str.strip if raw else self.final_answer
    answers = [read(self.tokenizer.decode(row)) for row in ids]
    return answers[0] if single and single_input and len(rows) == 1 else answers

  def _reading_rows(self, prompts: list[str], images: Any, video: Any):
    """[(prompt, image [S, S] or None, clip [T, S, S] or None)] for `reason`: one row per
    image (or clip) when several are given, else one per prompt; and whether at most one
    image or clip was given."""
    unit, single_input = (None, True) if images is None else self.unit_images(images)
    clips = None if video is None else self.clips(video)
    if clips is not None and unit is not None:
      raise InputError("give images or a video, not both")
    many = unit if unit is not None else clips if clips is not None and len(clips) > 1 else None
    if many is None:
      clip = None if clips is None else clips[0]
      return [(p, None, clip) for p in prompts], single_input
    what = "images" if unit is not None else "clips"
    if len(prompts) not in (1, len(many)):
      raise InputError(f"{len(prompts)} prompts for {len(many)} {what}: give one prompt, "
                       f"or one per {what[:-1]}")
    rows = []
    for i, item in enumerate(many):
      text = prompts[i if len(prompts) > 1 else 0]
      rows.append((text, item, None) if unit is not None else (text, None, item))
    return rows, single_input and unit is not None

  def _shift_views(self, shifts: int | None, has_images: bool) -> list[tuple[int, int]]:
    """The (dy, dx) views `reason` reads each image in: [(0, 0)] without test-time shifts."""
    if shifts is None:
      shifts = self.default_reason_shifts if has_images else 0
    opts.check_shifts(shifts)
    if shifts and not has_images:
      raise InputError(f"shifts={shifts} moves images, but no image was given: use shifts=0")
    r = range(-int(shifts), int(shifts) + 1)
    return [(dy, dx) for dy in r for dx in r]

  def decode_answers(self, examples, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
                     seed=0, views=1) -> list[list[int]]:
    """Answer ids (up to, without, the stop token) of each example, or of each group of
    `views` consecutive examples decoded as one ensemble (`sampling.decode`)."""
    rng = jax.random.PRNGKey(seed)
    length = sampling.length_bucket(max(len(ex["tokens"]) for ex in examples))
    special = self.tokenizer.special_ids
    stop = sampling.stop_mask(special, self.model_cfg.vocab_size)
    out = []
    groups = len(examples) // views
    for start, stop_i, batch in sampling.chunks(groups, max(1, MAX_DECODE_BATCH // views)):
      rows = (stop_i - start) * views
      padded = sampling.pad_left(examples[start * views:stop_i * views], length,
                                 batch * views, row_ids=range(start * views, stop_i * views))
      with self.on_mesh():
        tokens, _ = sampling.decode(self.model, self.params, self.place(padded),
                                    max_new_tokens, rng, temperature, top_k, top_p,
                                    stop_tokens=special, views=views,
                                    pad_id=self.tokenizer.pad_id, with_logits=False)
      for row in tokens[:rows:views]:
        ends = np.flatnonzero(stop[row])
        out.append([int(t) for t in row[:ends[0] if ends.size else len(row)]])
    return out

  def text_logits(self, token_ids: Any) -> np.ndarray:
    """AR-head logits float32 [B, L, V] of int token ids [B, L] (or [L]: B = 1) of this
    checkpoint's tokenizer, nothing prepended: one causal example a row at positions
    0 .. L - 1. For a converted model (`mot.convert`) the first columns are the
    pretrained vocabulary, mot's appended special ids after them; such a workdir computes
    in float32 (its config's model.dtype), as the original does."""
    ids = np.asarray(token_ids)
    if ids.ndim == 1:
      ids = ids[None]
    if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
      raise InputError(f"token_ids must be a non-empty int array [B, L] (or [L]), got "
                       f"{ids.dtype} {list(ids.shape)}")
    vocab = self.model_cfg.vocab_size
    if ids.min() < 0 or ids.max() >= vocab:
      raise InputError(f"token ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
    return sampling.text_logits(self.model, self.params, ids)

  # -------------------------------------------------------------------------- generate --
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
    prompts, _ = opts.prompt_list(prompt)
    steps, cfg_scale, sampler = self.sampling_settings(num_samples, steps, cfg_scale, sampler)
    seed = opts.check_seed(seed)
    if not self.is_video:
      if num_frames is not None:
        self.require_video("num_frames")
      if self.plan_temperature is not None:
        return self.plan_then_draw(prompts, num_samples, steps, cfg_scale, sampler, seed)[1]
      examples = [self.prompts.generation_example(p) for p in prompts]
      return self.to_images(self.denoise(examples, num_samples, steps, cfg_scale, sampler,
                                         seed))
    t = opts.check_num_frames(self.num_frames if num_frames is None else num_frames)
    rows = [p for p in prompts for _ in range(num_samples)]
    return self.draw_clips(
        lambda r, drawn: self.prompts.video_generation_example(rows[r], t, drawn),
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
    self.require_video("predict", actions=True)
    steps, cfg_scale, sampler = self.sampling_settings(num_samples, steps, cfg_scale, sampler)
    seed = opts.check_seed(seed)
    frames, _ = self.unit_images(first_frames)
    actions = opts.action_chunks(actions, len(frames))
    rows = [(f, a) for f, a in zip(frames, actions) for _ in range(num_samples)]
    predicted = self.draw_clips(
        lambda r, drawn: self.prompts.world_model_example(*rows[r], drawn), len(rows),
        actions.shape[1], steps, cfg_scale, sampler, seed)
    first = np.repeat(frames, num_samples, axis=0)[:, None]
    return np.concatenate([first, predicted], axis=1)

  def infer_actions(self, video: Any, steps: int | None = None, sampler: str | None = None,
                    seed: int = 0) -> np.ndarray:
    """Inverse dynamics: clip(s) [T, H, W] / [N, T, H, W] (or GIF paths) -> float32
    [N, T - 1, 2] (dx, dy) actions drawn by the DM head (no guidance)."""
    self.require_video("infer_actions", actions=True)
    steps, _, sampler = self.sampling_settings(1, steps, 1.0, sampler)
    seed = opts.check_seed(seed)
    clips = self.clips(video)
    if clips.shape[1] < 2:
      raise InputError("a clip needs at least 2 frames to have actions")
    examples = [self.prompts.inverse_dynamics_example(c) for c in clips]
    x0 = self.denoise(examples, 1, steps, 1.0, sampler, seed)
    return x0[..., :self.model_cfg.modality_patch_dims[3]].astype(np.float32)

  def draw_clips(self, make_example, rows: int, num_frames: int, steps, cfg_scale, sampler,
                  seed) -> np.ndarray:
    """float32 [rows, num_frames, H, W] in [0, 1]; make_example(row, drawn) -> example.

    Layout "clip" denoises all frames in one block. Layout "frames" rolls out: frame k
    of every row is drawn from the row's frames 0..k-1 (as drawn, clipped to [0, 1]),
    with its own noise stream (seed, row, k + 1), so it is as reproducible as an image.
    """
    if self.prompts.video_layout == "clip":
      x0 = self.denoise([make_example(r, None) for r in range(rows)], 1, steps, cfg_scale,
                        sampler, seed)
      frames = self.to_images(x0.reshape(rows * num_frames, -1, x0.shape[-1]))
      return frames.reshape(rows, num_frames, *frames.shape[1:])
    clips = np.zeros((rows, 0, *self.prompts.frame_shape), np.float32)
    for k in range(num_frames):
      examples = [make_example(r, clips[r]) for r in range(rows)]
      x0 = self.denoise(examples, 1, steps, cfg_scale, sampler, seed, stream=k + 1)
      clips = np.concatenate([clips, self.to_images(x0)[:, None]], axis=1)
    return clips

  def denoise(self, examples, num_samples, steps, cfg_scale, sampler, seed,
              stream: int | None = None) -> np.ndarray:
    """float32 [len(examples) * num_samples, M, P]: each example's dm_mask block drawn.
    Row i starts from the noise of (seed, i) (or (seed, i, stream))."""
    prefixes, blocks = [], []
    for ex in examples:
      self.check_length(len(ex["tokens"]), 1, "prompt plus generated block")  # + EOS
      prefix, block = sampling.split_block(ex)
      prefixes += [prefix] * num_samples
      blocks += [block] * num_samples
    length = sampling.length_bucket(max(len(p["tokens"]) for p in prefixes))
    m, p = blocks[0]["tokens"].shape[0], self.model_cfg.patch_dim
    out = []
    for start, stop, batch in sampling.chunks(len(prefixes), MAX_SAMPLE_BATCH):
      prefix = sampling.pad_left(prefixes[start:stop], length, batch)
      block = sampling.block_arrays(blocks[start:stop], batch)
      ids = np.arange(start, start + batch)  # padding rows draw their own (unused) noise
      noise = sampling.initial_noise(seed, ids, (m, p), stream)
      with self.on_mesh():
        x0 = sampling.denoise(self.model, self.params, self.place(prefix), self.place(block),
                              self.place(noise), steps, cfg_scale, sampler, self.time_shift)
      out.append(x0[:stop - start])
    return np.concatenate(out)

  def to_images(self, tokens: np.ndarray) -> np.ndarray:
    """[N, M, P] model-scale patches -> float32 [N, H, W] (or [N, H, W, C]) in [0, 1]
    (latent runs: the latents decoded by the VAE)."""
    ps, c = self.patch_size, self.prompts.channels
    h, w = patches.image_shape(self.prompts.image_size)
    x = tokens[..., :ps * ps * c].reshape(-1, h // ps, w // ps, ps * ps * c)
    return self.to_unit(patches.from_patches(x, ps, c))

  def to_unit(self, arrays: np.ndarray) -> np.ndarray:
    """The model's arrays (images in [-1, 1], or a latent run's scaled latents
    [N, h, w, C]) -> float32 images in [0, 1]."""
    if self.vae is not None:
      decoded = [self.vae.decode(self.vae.unscale_latents(arrays[i:i + MAX_SAMPLE_BATCH]))
                 for i in range(0, len(arrays), MAX_SAMPLE_BATCH)]
      arrays = np.concatenate([np.asarray(d, np.float32) for d in decoded])
    return np.clip((arrays + 1.0) / 2.0, 0.0, 1.0).astype(np.float32)

  def encode_latents(self, unit: np.ndarray) -> np.ndarray:
    """Images [..., H, W, 3] in [0, 1] -> the VAE's scaled latents [..., h, w, C] (the
    posterior mean, as the latent cache holds)."""
    x = media.to_model_scale(unit)
    lead = x.shape[:-3]
    z = self.vae.scale_latents(self.vae.encode(x.reshape(-1, *x.shape[-3:])))
    z = np.asarray(z, np.float32)
    return z.reshape(*lead, *z.shape[1:])

  # -------------------------------------------------------------------------- both ------
  def think_then_draw(self, prompt: str | Sequence[str], num_samples: int = 1,
                      max_new_tokens: int | None = None, steps: int | None = None,
                      cfg_scale: float | None = None, sampler: str | None = None,
                      seed: int = 0, temperature: float = 0.0, top_k: int = 0,
                      top_p: float = 1.0, images: Any = None
                      ) -> tuple[str | list[str], np.ndarray]:
    """The AR head answers, then the DM head draws the answer in the same sequence.

    E.g. "draw the digit after 3:" (the training template of the interleaved task) ->
    "4" -> an image of a 4. The sequence is BOS, [context image], prompt, answer (all
    conditioning), image: a Shapes prompt ("draw three of the shape that is red:") is
    about a context image, one per prompt (or one for all), given as `reason`'s images.
    max_new_tokens None: THINK_TOKENS, or the longest Shapes draw answer plus its end
    token. Returns (answer or list of answers, float32 [len(prompts) * num_samples, H,
    W(, C)]).
    """
    prompts, single = opts.prompt_list(prompt)
    if self.is_video:
      raise InputError("think_then_draw draws images; this is a video checkpoint: use "
                       "generate, predict or reason")
    if max_new_tokens is None:
      max_new_tokens = self.default_draw_tokens
    opts.check_decoding(max_new_tokens, temperature, top_k, top_p)
    steps, cfg_scale, sampler = self.sampling_settings(num_samples, steps, cfg_scale, sampler)
    seed = opts.check_seed(seed)
    contexts = self._draw_contexts(prompts, images)
    m = latent.image_tokens(self.config)
    asks = []
    for p, context in zip(prompts, contexts):
      ex = self.prompts.reasoning_prompt(p, context)
      self.check_length(len(ex["tokens"]), max_new_tokens + m + 3, "prompt, answer and image")
      asks.append(ex)
    answer_ids = self.decode_answers(asks, max_new_tokens, temperature, top_k, top_p, seed)
    examples = [self.prompts.generation_example(p, ids, context)
                for p, ids, context in zip(prompts, answer_ids, contexts)]
    images = self.to_images(self.denoise(examples, num_samples, steps, cfg_scale, sampler,
                                         seed))
    answers = [self.tokenizer.decode(ids).strip() for ids in answer_ids]
    return (answers[0] if single else answers), images


  def plan_then_draw(self, prompts: list[str], num_samples: int, steps: int,
                     cfg_scale: float, sampler: str, seed: int
                     ) -> tuple[list[str], np.ndarray]:
    """`generate` of a Shapes run trained with data.layout_plan: the AR head writes each
    sample's plan after its caption ("a red circle: red circle 1 5"), drawn at
    config.sample.plan_temperature, then the DM head draws the image conditioned on both
    (and on the plan's canvas, `shapes_think.plan_canvas`, with data.layout_canvas).
    Returns (plans, images), both prompt-major, len(prompts) * num_samples long."""
    rows = [shapes_think.plan_prompt(p) for p in prompts for _ in range(num_samples)]
    asks = [self.prompts.reasoning_prompt(r) for r in rows]
    need = self.default_draw_tokens + (1 + self.config.data.layout_canvas) * (
        latent.image_tokens(self.config) + 2) + 1
    for ex in asks:
      self.check_length(len(ex["tokens"]), need, "caption, layout plan and image")
    ids = self.decode_answers(asks, self.default_draw_tokens, self.plan_temperature, seed=seed)
    plans = [self.tokenizer.decode(i).strip() for i in ids]
    canvases = [shapes_think.drawing_canvas(p, self.config.data) for p in plans]
    examples = [self.prompts.generation_example(r, i, canvas=c)
                for r, i, c in zip(rows, ids, canvases)]
    return plans, self.to_images(self.denoise(examples, 1, steps, cfg_scale, sampler, seed))

  def _draw_contexts(self, prompts: list[str], images: Any) -> list:
    """One context image [S, S(, C)] in [0, 1] (or None) per think-then-draw prompt."""
    if images is None:
      return [None] * len(prompts)
    unit, _ = self.unit_images(images)
    if len(unit) not in (1, len(prompts)):
      raise InputError(f"{len(prompts)} prompts for {len(unit)} images: give one image, or "
                       "one per prompt")
    return [unit[i if len(unit) > 1 else 0] for i in range(len(prompts))]


def shift(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
  """An image [H, W] or [H, W, C] in [0, 1] moved dy rows down and dx columns right, the
  uncovered pixels 0 (as the training shifts, `mot.data.tasks.shift_image`)."""
  if image.ndim == 2:
    return tasks.shift_image(image, dy, dx, background=0.0)
  return np.moveaxis(tasks.shift_image(np.moveaxis(image, -1, 0), dy, dx, background=0.0),
                     0, -1)
