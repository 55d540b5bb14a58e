"""The prompts sampling builds: the training layouts of `mot.data.tasks` and
`mot.data.moving_digits` up to the part the model answers or draws.

`PromptBuilder` holds what a layout depends on (patch size and width, image side, the
reading window, the video layout) and builds every example with the `SequenceBuilder` the
data pipeline uses, so positions, block ids and conditioning marks match training exactly.
Images come in as float [H, W] (grayscale) or [H, W, C] in [0, 1] (`mot.media`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mot import media, patches
from mot import tokenizer as tokenizer_lib
from mot.data import digits
from mot.data.builder import SequenceBuilder

ACTIONS_PROMPT = "actions:"   # = mot.data.moving_digits.ACTIONS_PROMPT


@dataclasses.dataclass(frozen=True)
class PromptBuilder:
  """Builds sampling prompts in one checkpoint's training layouts."""
  patch_dim: int             # P: width of the `patches` field (model.patch_dim)
  patch_size: int            # pixels per patch side (data.patch_size)
  image_size: Any           # image (or video frame) size: (H, W), or an int S for S x S
  channels: int              # 1: grayscale images [H, W]; C: images [H, W, C]
  read_window: int           # reading images: the window each patch token carries (0: off)
  video_layout: str          # "clip" (one block) or "frames" (one block a frame)
  action_dim: int            # real dims of an action patch (model.modality_patch_dims[3])
  tokenizer: tokenizer_lib.Tokenizer = tokenizer_lib.BYTE_TOKENIZER   # the run's
  # Latent runs: images [..., H, W, 3] in [0, 1] -> the VAE's scaled latents [..., h, w, C]
  # (then image_size is (h, w) and channels C); None: pixels in [-1, 1].
  encode: Callable[[np.ndarray], np.ndarray] | None = None

  def _start(self) -> SequenceBuilder:
    b = SequenceBuilder(self.patch_dim, self.tokenizer)
    b.add_text([self.tokenizer.bos_id])
    return b

  def _patches(self, unit: np.ndarray) -> np.ndarray:
    """Patches [..., H/p, W/p, P'] of images [..., H, W(, C)] in [0, 1] (latent runs:
    of their latents)."""
    x = media.to_model_scale(unit) if self.encode is None else self.encode(unit)
    return patches.to_patches(x, self.patch_size, self.channels)

  def reasoning_prompt(self, text: str, image: np.ndarray | None = None,
                       video: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BOS, [clean image], [clean video], text: the reading layout up to its answer."""
    b = self._start()
    if image is not None and self.read_window:  # grayscale only (checked by the config)
      b.add_image(digits.patchify_window(media.to_model_scale(image), self.patch_size,
                                         self.read_window), noised=False)
    elif image is not None:
      b.add_image(self._patches(image), noised=False)
    if video is not None:
      b.add_video(self._patches(video), noised=False)
    b.add_text(self.tokenizer.encode(text))
    return b.build()

  def generation_example(self, text: str, answer_ids: Sequence[int] = (),
                         context: np.ndarray | None = None,
                         canvas: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BOS, [a clean context image,] text (+ answer ids), [a clean canvas image,] all
    conditioning, then a noised image block: the drawing layout (with a context: Shapes'
    think-then-draw; with a canvas: a Shapes layout plan's, data.layout_canvas)."""
    b = self._start()
    if context is not None:
      b.add_image(self._patches(context), noised=False, cond=True)
    b.add_text(self.tokenizer.encode(text), cond=True)
    if answer_ids:
      b.add_text(list(answer_ids), cond=True)
    if canvas is not None:
      b.add_image(self._patches(canvas), noised=False, cond=True)
    b.add_image(self.blank_frames(1)[0], noised=True)
    return b.build()

  def blank_frames(self, n: int) -> np.ndarray:
    """Patches [n, H/p, W/p, P'] of n empty frames (the shape of the blocks to draw)."""
    if self.encode is not None:  # the noised block's values are never read: its shape
      h, w = patches.image_shape(self.image_size)
      p = self.patch_size
      return np.zeros((n, h // p, w // p, p * p * self.channels), np.float32)
    return self._patches(np.zeros((n, *self.frame_shape), np.float32))

  @property
  def frame_shape(self) -> tuple[int, ...]:
    """Shape of one image or frame in [0, 1]: (H, W) grayscale, (H, W, C) otherwise."""
    h, w = patches.image_shape(self.image_size)
    return (h, w) if self.channels == 1 else (h, w, self.channels)

  def add_frames_to_draw(self, b: SequenceBuilder, num_frames: int,
                         drawn: np.ndarray | None, given: np.ndarray | None = None) -> None:
    """Appends the frames to generate. Layout "clip": num_frames noised frames, one
    block. Layout "frames": the `given` first frame [1, H, W] (if any, as conditioning)
    and the frames drawn so far (float [k, H, W] in [0, 1]) clean, then the next frame
    noised: the example that draws frame k (`Pipeline` rolls these out)."""
    if self.video_layout == "clip":
      b.add_video(self.blank_frames(num_frames), noised=True)
      return
    empty = np.zeros((0, *self.frame_shape), np.float32)
    given = empty if given is None else np.asarray(given, np.float32)
    drawn = empty if drawn is None else np.asarray(drawn, np.float32)
    known = np.concatenate([given, drawn])
    patches = np.concatenate([self._patches(known), self.blank_frames(1)])
    b.add_video_frames(patches, ["given"] * len(given) + ["clean"] * len(drawn) + ["noised"])

  def video_generation_example(self, text: str, num_frames: int,
                               drawn: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BOS, text as conditioning, the clip to draw (caption -> clip; see
    `add_frames_to_draw` for `drawn`)."""
    b = self._start()
    b.add_text(self.tokenizer.encode(text), cond=True)
    self.add_frames_to_draw(b, num_frames, drawn)
    return b.build()

  def world_model_example(self, first_frame: np.ndarray, actions: np.ndarray,
                          drawn: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The world-model layout (mot.data.moving_digits): first frame [H, W] in [0, 1],
    actions [K, 2], the K frames to draw (`add_frames_to_draw` for `drawn`)."""
    b = self._start()
    actions = np.asarray(actions, np.float32)
    if self.video_layout == "clip":
      b.add_video(self._patches(first_frame[None]), noised=False, cond=True)
      b.add_action(actions, noised=False, cond=True)
      self.add_frames_to_draw(b, len(actions), None)
    else:  # as mot.data.moving_digits.world_model_example: the first frame opens the clip
      b.add_action(actions, noised=False, cond=True)
      self.add_frames_to_draw(b, len(actions), drawn, given=first_frame[None])
    return b.build()

  def inverse_dynamics_example(self, clip: np.ndarray) -> dict[str, np.ndarray]:
    """BOS, [clip [T, H, W] in [0, 1]], "actions:", T - 1 noised actions."""
    b = self._start()
    b.add_video(self._patches(clip), noised=False, cond=True)
    b.add_text(self.tokenizer.encode(ACTIONS_PROMPT))
    b.add_action(np.zeros((len(clip) - 1, self.action_dim), np.float32), noised=True)
    return b.build()
