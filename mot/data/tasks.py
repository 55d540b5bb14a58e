"""Text templates and the tasks that turn one (image, label) pair into one example.

Each task is an entry of `TASKS`, so a new task is one function and one line. Task
builders return the unpadded arrays of `SequenceBuilder.build()`. Loss tokens are the
text the model must produce; the begin/end markers framing media are never targets
(the sampler inserts them itself).
"""
from __future__ import annotations

from collections.abc import Callable
import dataclasses

import numpy as np

from mot import tokenizer as tokenizer_lib
from mot.data import digits
from mot.data import moving_digits
from mot.data.builder import SequenceBuilder

QUESTION = "What digit is this?"
TEXT_RELATIONS = ("after", "before")  # Variants of the text-only task.
Tokenizer = tokenizer_lib.Tokenizer
BYTES = tokenizer_lib.BYTE_TOKENIZER


def caption(label: int) -> str:
  """Caption that conditions generation, e.g. "a handwritten digit 7"."""
  return f"a handwritten digit {int(label)}"


def answer(label: int) -> str:
  """Answer to QUESTION, e.g. "7"."""
  return str(int(label))


def relation_text(label: int, relation: str) -> str:
  """E.g. "the digit after 3 is 4" / "the digit before 3 is 2" (wrapping modulo 10)."""
  step = {"after": 1, "before": -1}[relation]
  return f"the digit {relation} {int(label)} is {(int(label) + step) % 10}"


def draw_prompt(label: int) -> str:
  """Interleaved prompt whose answer is `label`: "draw the digit after 6:" for 7."""
  return f"draw the digit after {(int(label) - 1) % 10}:"


def generation_example(image: np.ndarray, label: int, patch_size: int, patch_dim: int,
                       tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Caption -> image: BOS, caption (target, CFG conditioning), noised image, EOS.

  The caption is also an AR target, so the same example teaches captioning-style LM.
  Sampling uses this layout with any image (e.g. zeros): only dm_mask patches change.
  """
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_text(tokenizer.encode(caption(label)), loss=True, cond=True)
  b.add_image(digits.patchify(image, patch_size), noised=True)
  b.add_text([tokenizer.eos_id], loss=True)
  return b.build()


def reasoning_example(image: np.ndarray, label: int, patch_size: int, patch_dim: int,
                      read_window: int = 0, tokenizer: Tokenizer = BYTES
                      ) -> dict[str, np.ndarray]:
  """Image -> answer: BOS, clean image, QUESTION, answer (target), EOS (target); with
  read_window, each patch carries its neighbourhood (`digits.patchify_window`)."""
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_image(digits.patchify_window(image, patch_size, read_window), noised=False)
  b.add_text(tokenizer.encode(QUESTION))
  b.add_text(tokenizer.encode(answer(label)) + [tokenizer.eos_id], loss=True)
  return b.build()


def text_example(label: int, patch_dim: int, variant: int = 0,
                 tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Text only: BOS, relation_text (target), EOS (target); variant picks the relation."""
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_text(tokenizer.encode(relation_text(label, TEXT_RELATIONS[variant]))
             + [tokenizer.eos_id], loss=True)
  return b.build()


def interleaved_example(image: np.ndarray, label: int, patch_size: int, patch_dim: int,
                        tokenizer: Tokenizer = BYTES) -> dict[str, np.ndarray]:
  """Reason, then generate: BOS, draw_prompt, answer (target), noised image, EOS (target).

  Prompt and answer condition the image, so both are in cond_mask.
  """
  b = SequenceBuilder(patch_dim, tokenizer)
  b.add_text([tokenizer.bos_id])
  b.add_text(tokenizer.encode(draw_prompt(label)), cond=True)
  b.add_text(tokenizer.encode(answer(label)), loss=True, cond=True)
  b.add_image(digits.patchify(image, patch_size), noised=True)
  b.add_text([tokenizer.eos_id], loss=True)
  return b.build()


@dataclasses.dataclass(frozen=True)
class TaskOptions:
  """What every task needs besides the pair: how to cut images, how wide patches are
  (and, for the video tasks, how many frames a clip has on how large a canvas)."""
  patch_size: int
  patch_dim: int
  num_frames: int = moving_digits.NUM_FRAMES
  canvas: int = moving_digits.CANVAS
  rotate_degrees: float = 0.0   # reading augmentation: random rotation up to ± this
  scale_jitter: float = 0.0     # ... and random zoom by a factor in 1 ± this
  cutout_size: int = 0          # ... and a random square of this side erased (0: off)
  cutout_prob: float = 0.5      # ... in this fraction of the reading images
  elastic_alpha: float = 0.0    # ... and an elastic distortion of this RMS pixel shift (0: off)
  elastic_sigma: float = 1.5    # ... smooth over this many pixels
  elastic_prob: float = 0.5     # ... in this fraction of the reading images
  read_window: int = 0          # reading: patches carry this square neighbourhood (0: off)
  video_layout: str = "frames"  # generated frames: "frames" (one block a frame) | "clip"
  generation_start: str = "any"  # caption -> clip starts: "any" | "grid" (patch grid)
  first_frame_weight: float = 1.0  # caption -> clip, frame by frame: frame 0's loss weight
  channels: int = 1             # images [H, W] (1) or [H, W, C] (user data, latents)
  question: str = QUESTION      # user data: the reading task's question (data.question)
  tokenizer: Tokenizer = BYTES  # the run's (`mot.tokenizer.from_config`)


@dataclasses.dataclass(frozen=True)
class Task:
  """A registered task.

  Attributes:
    build: (image [H, W], label, options, variant) -> example dict.
    num_variants: text variants, drawn uniformly in training and enumerated for
      length bounds, so `max_example_length` is exact.
    augment: training may shift the image first (`random_shift`); generation targets
      are never augmented, so samples stay centred like the data.
    media: "image" (build takes an image [H, W]) or "video" (build takes a
      `moving_digits.Clip`; only config.data.dataset="moving_digits" makes those).
    per_row: examples of this task drawn together (from other random training pairs)
      and packed as one group: a short task fills a row that one long example would.
  """
  build: Callable[[np.ndarray, int, TaskOptions, int], dict[str, np.ndarray]]
  num_variants: int = 1
  augment: bool = False
  media: str = "image"
  per_row: int = 1


def _generation(image, label, options: TaskOptions, variant: int):
  del variant  # One variant.
  return generation_example(image, label, options.patch_size, options.patch_dim,
                            options.tokenizer)


def _reasoning(image, label, options: TaskOptions, variant: int):
  del variant
  return reasoning_example(image, label, options.patch_size, options.patch_dim,
                           options.read_window, options.tokenizer)


def _text(image, label, options: TaskOptions, variant: int):
  del image  # Text only: the pair contributes its label.
  return text_example(label, options.patch_dim, variant, options.tokenizer)


def _interleaved(image, label, options: TaskOptions, variant: int):
  del variant
  return interleaved_example(image, label, options.patch_size, options.patch_dim,
                             options.tokenizer)


def _video_generation(clip, label, options: TaskOptions, variant: int):
  del variant
  return moving_digits.video_generation_example(clip, label, options.patch_size,
                                                options.patch_dim, options.video_layout,
                                                options.first_frame_weight, options.tokenizer)


def _video_first_frame(clip, label, options: TaskOptions, variant: int):
  del variant
  return moving_digits.first_frame_example(clip, label, options.patch_size,
                                           options.patch_dim, options.video_layout,
                                           options.tokenizer)


def _video_qa(clip, label, options: TaskOptions, variant: int):
  del variant
  return moving_digits.video_qa_example(clip, label, options.patch_size, options.patch_dim,
                                        options.tokenizer)


def _video_frame_qa(clip, label, options: TaskOptions, variant: int):
  del variant
  return moving_digits.frame_qa_example(clip, label, options.patch_size, options.patch_dim,
                                        options.tokenizer)


def _world_model(clip, label, options: TaskOptions, variant: int):
  del label, variant  # The digit's identity is in the first frame, not in any text.
  return moving_digits.world_model_example(clip, options.patch_size, options.patch_dim,
                                           options.video_layout, options.tokenizer)


def _inverse_dynamics(clip, label, options: TaskOptions, variant: int):
  del label, variant
  return moving_digits.inverse_dynamics_example(clip, options.patch_size,
                                                options.patch_dim, options.tokenizer)


TASKS: dict[str, Task] = {
    "generation": Task(_generation),
    "reasoning": Task(_reasoning, augment=True),
    "text": Task(_text, num_variants=len(TEXT_RELATIONS)),
    "interleaved": Task(_interleaved),
    # Moving digits (config.data.dataset="moving_digits"; see mot.data.moving_digits).
    "video_generation": Task(_video_generation, media="video"),
    "video_first_frame": Task(_video_first_frame, media="video", per_row=5),
    "video_qa": Task(_video_qa, media="video"),
    "video_frame_qa": Task(_video_frame_qa, media="video", per_row=6),
    "world_model": Task(_world_model, media="video"),
    "inverse_dynamics": Task(_inverse_dynamics, media="video"),
}


def get_task(name: str) -> Task:
  """The registered task `name`; a ValueError naming the known tasks otherwise."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
  return TASKS[name]


def build_example(name: str, image: np.ndarray, label: int, options: TaskOptions,
                  rng: np.random.Generator, shift_pixels: int = 0) -> dict[str, np.ndarray]:
  """One training example of task `name`: draws its variant and augmentation from rng."""
  task = get_task(name)
  if task.media != "image":
    raise ValueError(f"task {name!r} makes {task.media} examples: train it with "
                     "config.data.dataset='moving_digits'")
  variant = int(rng.integers(task.num_variants))
  if task.augment and (options.rotate_degrees > 0 or options.scale_jitter > 0):
    image = random_rotate_scale(image, options.rotate_degrees, options.scale_jitter, rng)
  if task.augment and options.elastic_alpha > 0 and rng.random() < options.elastic_prob:
    image = random_elastic(image, options.elastic_alpha, options.elastic_sigma, rng)
  if task.augment and shift_pixels > 0:
    image = random_shift(image, shift_pixels, rng)
  if task.augment and options.cutout_size > 0 and rng.random() < options.cutout_prob:
    image = random_cutout(image, options.cutout_size, rng)
  return task.build(image, int(label), options, variant)



# Caption -> first frame starts where caption -> clip does (GENERATION_STARTS).
_VIDEO_GENERATION_TASKS = ("video_generation", "video_first_frame")


def build_video_example(name: str, image: np.ndarray, label, options: TaskOptions,
                        rng: np.random.Generator, shift_pixels: int = 0
                        ) -> dict[str, np.ndarray]:
  """One example of video task `name` from one digit: the clip is drawn from rng.

  The signature is `build_example`'s, so `mot.data.input_pipeline` uses either; the
  digit's motion is its augmentation (shift_pixels is unused).
  """
  del shift_pixels
  name = moving_digits.HELDOUT_ALIASES.get(name, name)
  task = get_task(name)
  if task.media != "video":
    raise ValueError(f"task {name!r} is an image task; config.data.dataset="
                     f"'moving_digits' trains the video tasks "
                     f"{sorted(n for n, t in TASKS.items() if t.media == 'video')}")
  variant = int(rng.integers(task.num_variants))
  grid = (options.patch_size if name in _VIDEO_GENERATION_TASKS
          and options.generation_start == "grid" else 1)
  clip = moving_digits.random_clip(image, rng, options.num_frames, options.canvas,
                                   moving_digits.WALK_PROB.get(name, 0.0), grid)
  return task.build(clip, int(label), options, variant)

def max_example_length(name: str, options: TaskOptions,
                       image_shape: tuple[int, int] = (8, 8)) -> int:
  """Longest example task `name` can produce for images of image_shape (all labels);
  a video task's clips have options.num_frames frames on options.canvas."""
  task = get_task(name)
  if task.media == "video":  # Longest caption/answer: the longest direction name.
    blank = moving_digits.blank_clip(options.num_frames, options.canvas)
    blank = moving_digits.Clip(blank.frames, blank.actions, blank.offsets,
                               max(moving_digits.DIRECTION_NAMES, key=len))
  else:
    blank = np.full(image_shape, digits.BACKGROUND, np.float32)
  return max(len(task.build(blank, label, options, v)["tokens"])
             for label in range(10) for v in range(task.num_variants))


def random_rotate_scale(image: np.ndarray, max_degrees: float, scale_jitter: float,
                        rng: np.random.Generator) -> np.ndarray:
  """float [H, W] image rotated by U(±max_degrees) and zoomed by U(1 ± scale_jitter)
  about its centre, bilinearly resampled; pixels from outside are BACKGROUND.

  Meant for the reading task's gap to unseen writers (slant, size); off in
  configs/digits.py, where it did not raise held-out reading (docs/results.md).
  """
  h, w = image.shape
  angle = np.deg2rad(rng.uniform(-max_degrees, max_degrees))
  scale = rng.uniform(1 - scale_jitter, 1 + scale_jitter)
  cy, cx = (h - 1) / 2, (w - 1) / 2
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
  # Inverse map: output pixel -> source coordinates.
  cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
  sy = cy + cos * (yy - cy) - sin * (xx - cx)
  sx = cx + sin * (yy - cy) + cos * (xx - cx)
  return _bilinear(image, sy, sx)


def random_elastic(image: np.ndarray, alpha: float, sigma: float,
                   rng: np.random.Generator) -> np.ndarray:
  """float [H, W] image elastically distorted (Simard et al. 2003), bilinearly resampled.

  Each pixel samples from itself moved by a smooth random field: uniform noise per pixel
  and axis, smoothed by a Gaussian of `sigma` pixels, scaled so the displacement's root
  mean square is `alpha` pixels. Unlike a rotation or zoom it bends strokes locally —
  the way one writer's 8 differs from another's — while small `alpha` keeps the digit.
  """
  h, w = image.shape
  dy, dx = elastic_field(h, w, alpha, sigma, rng)
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
  return _bilinear(image, yy + dy, xx + dx)


def elastic_field(h: int, w: int, alpha: float, sigma: float,
                  rng: np.random.Generator) -> np.ndarray:
  """float64 [2, H, W] displacement (rows, columns) of `random_elastic`: RMS `alpha`."""
  field = rng.uniform(-1, 1, size=(2, h, w))
  smooth = lambda n: np.exp(-0.5 * ((np.arange(n)[:, None] - np.arange(n)) / sigma) ** 2)
  field = smooth(h) @ field @ smooth(w).T          # separable Gaussian blur of both axes
  return field * (alpha / max(float(np.sqrt(np.mean(field ** 2))), 1e-12))


def _bilinear(image: np.ndarray, sy: np.ndarray, sx: np.ndarray) -> np.ndarray:
  """float32 [H, W]: `image` read at source coordinates (sy, sx) [H, W], bilinearly;
  coordinates beyond the border read BACKGROUND."""
  h, w = image.shape
  padded = np.pad(np.asarray(image, np.float64), 1, constant_values=digits.BACKGROUND)
  sy, sx = np.clip(sy + 1, 0, h + 1), np.clip(sx + 1, 0, w + 1)
  y0, x0 = np.minimum(np.floor(sy).astype(int), h), np.minimum(np.floor(sx).astype(int), w)
  fy, fx = sy - y0, sx - x0
  out = ((1 - fy) * (1 - fx) * padded[y0, x0] + (1 - fy) * fx * padded[y0, x0 + 1]
         + fy * (1 - fx) * padded[y0 + 1, x0] + fy * fx * padded[y0 + 1, x0 + 1])
  return out.astype(np.float32)


def random_cutout(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """float [H, W] image with a size x size square set to BACKGROUND (cutout, DeVries &
  Taylor 2017): its centre is uniform over the image, so near a border less is erased.

  For the reading task's gap to unseen writers: an answer that survives a missing
  stroke cannot rest on one pixel pattern of the training writers.
  """
  h, w = image.shape
  cy, cx = int(rng.integers(h)), int(rng.integers(w))
  top, left = cy - size // 2, cx - size // 2
  out = np.array(image, np.float32, copy=True)
  out[max(top, 0):max(top + size, 0), max(left, 0):max(left + size, 0)] = digits.BACKGROUND
  return out


def random_shift(image: np.ndarray, max_shift: int, rng: np.random.Generator) -> np.ndarray:
  """float [H, W] image translated by up to ±max_shift pixels per axis (`shift_image`)."""
  dy, dx = rng.integers(-max_shift, max_shift + 1, size=2)
  return shift_image(image, int(dy), int(dx))


def shift_image(image: np.ndarray, dy: int, dx: int,
                background: float = digits.BACKGROUND) -> np.ndarray:
  """float [..., H, W] images moved dy rows down and dx columns right.

  Pixels shifted out are lost; uncovered pixels become `background` (BACKGROUND, -1, in
  the model's scale; 0 for images in [0, 1]).
  """
  h, w = image.shape[-2:]
  out = np.full_like(image, background)
  out[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = (
      image[..., max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)])
  return out


def split_prompt(example: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[int]]:
  """(prompt, target ids): the example up to the first AR target, and its targets.

  For evaluation: feed the prompt (all fields, unpadded [n]), decode greedily, compare
  with the target ids (e.g. the answer and EOS of a reasoning example).
  """
  weights = example["ar_weights"]
  first = np.flatnonzero(weights > 0)
  if first.size == 0:
    raise ValueError("example has no AR targets to split at")
  prompt = {k: v[:first[0] + 1] for k, v in example.items()}
  return prompt, [int(t) for t in example["ar_targets"][weights > 0]]
