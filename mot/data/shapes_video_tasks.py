"""Shapes video tasks (issue #39, deliverable 5): the examples of dataset "shapes_video".

Each task turns one key (drawn by the input pipeline from the element's rng, so an
example is a pure function of (seed, element index) and resuming is exact) into one
example of a clip from `mot.data.shapes_video` (T frames, each a 4x4 grid of RGB patches
at patch 8; generated frames one block each, teacher forced, as the moving digits'
"frames" layout):

  shapes_video_generation  BOS  a red circle moving left and ...  [f0~][f0]...[fT-1~]  EOS
  shapes_video_qa          BOS  [clip]  Which way is the red circle moving?  left  EOS
                                (or How many objects are there? / How many red ...?)
  shapes_video_world_model BOS  the agent is the red circle  [actions]
                                [f0][f1] (given)  [f2~][f2] ... [fT-1~]  EOS
  shapes_video_inverse_dynamics
                           BOS  [clip]  actions of the red circle:  [actions~]  EOS

The generation caption is an AR target and the conditioning CFG drops; so are the world
model's agent text, actions and `context_frames` given frames (two by default: one frame
cannot show the other objects' velocities). The QA answer (and EOS) is the AR target.
Generation and QA use the layouts `mot.prompts.PromptBuilder` samples (`Pipeline.generate`
draws clips, `Pipeline.reason(video=...)` reads them); world model and inverse dynamics
name the agent, so their sampling prompts are built here (`world_model_prompt`,
`inverse_dynamics_prompt`) and drawn by `mot.eval_shapes_video`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mot import patches
from mot import tokenizer as tokenizer_lib
from mot.data import moving_digits
from mot.data import shapes_scene
from mot.data import shapes_tasks
from mot.data import shapes_video as sv
from mot.data import tasks
from mot.data.builder import SequenceBuilder
from mot.errors import field

DATASET = "shapes_video"
MEDIA = "shapes_video"      # Task.media of these tasks: only dataset "shapes_video" makes them
KEY_RANGE = shapes_tasks.KEY_RANGE
VIRTUAL_PAIRS = shapes_tasks.VIRTUAL_PAIRS
HELDOUT_ALIASES = {"generation": "shapes_video_generation", "reasoning": "shapes_video_qa"}
HELDOUT_LOSS_ITEMS = 32     # held-out examples per task for the eval losses
LAYOUT = "frames"           # the only video layout (one block a frame)
Tokenizer = tokenizer_lib.Tokenizer


@dataclasses.dataclass(frozen=True)
class VideoTaskOptions:
  """What the tasks need: patches, what scenes hold, clip length, given frames."""
  patch_size: int
  patch_dim: int
  scene: shapes_scene.ShapesOptions
  num_frames: int
  context_frames: int
  tokenizer: Tokenizer = tokenizer_lib.BYTE_TOKENIZER


def clip_patches(frames: np.ndarray, patch_size: int) -> np.ndarray:
  """uint8 [T, S, S, 3] (or float in [0, 1]) -> float32 [T, S/p, S/p, p*p*3] in [-1, 1]."""
  frames = np.asarray(frames)
  model = (shapes_scene.to_model(frames) if frames.dtype == np.uint8
           else frames.astype(np.float32) * 2.0 - 1.0)
  return patches.patchify(model, patch_size)


def _start(options: VideoTaskOptions) -> SequenceBuilder:
  b = SequenceBuilder(options.patch_dim, options.tokenizer)
  b.add_text([options.tokenizer.bos_id])
  return b


def generation_example(caption: str, frames: np.ndarray, options: VideoTaskOptions
                       ) -> dict[str, np.ndarray]:
  """Caption -> clip: BOS, caption (target, conditioning), the clip frame by frame, EOS."""
  b = _start(options)
  b.add_text(b.tokenizer.encode(caption), loss=True, cond=True)
  moving_digits.add_frames(b, clip_patches(frames, options.patch_size), LAYOUT)
  b.add_text([b.tokenizer.eos_id], loss=True)
  return b.build()


def qa_example(frames: np.ndarray, question: str, answer: str, options: VideoTaskOptions
               ) -> dict[str, np.ndarray]:
  """Clip -> answer: BOS, clean clip, question, answer + EOS (targets)."""
  b = _start(options)
  b.add_video(clip_patches(frames, options.patch_size), noised=False)
  b.add_text(b.tokenizer.encode(question))
  b.add_text(b.tokenizer.encode(answer) + [b.tokenizer.eos_id], loss=True)
  return b.build()


def _world_model(agent: str, actions: np.ndarray, clip: np.ndarray, roles: list[str],
                 options: VideoTaskOptions, eos: bool) -> dict[str, np.ndarray]:
  b = _start(options)
  b.add_text(b.tokenizer.encode(agent), cond=True)
  b.add_action(np.asarray(actions, np.float32), noised=False, cond=True)
  b.add_video_frames(clip, roles)
  if eos:   # training: EOS closes the example (sampling stops at the noised frame)
    b.add_text([b.tokenizer.eos_id], loss=True)
  return b.build()


def world_model_example(agent: str, actions: np.ndarray, frames: np.ndarray,
                        options: VideoTaskOptions) -> dict[str, np.ndarray]:
  """Agent text + actions + the first `context_frames` frames -> the rest (teacher
  forced; the last frame only noised)."""
  k, t = options.context_frames, len(frames)
  roles = ["given"] * k + moving_digits.forced_roles(t - k)
  return _world_model(agent, actions, clip_patches(frames, options.patch_size), roles,
                      options, eos=True)


def world_model_prompt(agent: str, actions: np.ndarray, given: np.ndarray,
                       drawn: np.ndarray | None, options: VideoTaskOptions
                       ) -> dict[str, np.ndarray]:
  """The sampling form: given frames and the frames drawn so far (float [k, S, S, 3] in
  [0, 1]) clean, then the next frame noised (`Pipeline.draw_clips` rolls these out)."""
  drawn = np.zeros((0, *given.shape[1:]), np.float32) if drawn is None else drawn
  known = np.concatenate([np.asarray(given, np.float32), np.asarray(drawn, np.float32)])
  clip = np.concatenate([clip_patches(known, options.patch_size),
                         clip_patches(np.zeros_like(known[:1]), options.patch_size)])
  roles = ["given"] * len(given) + ["clean"] * len(drawn) + ["noised"]
  return _world_model(agent, actions, clip, roles, options, eos=False)


def inverse_dynamics_example(frames: np.ndarray, prompt: str, actions: np.ndarray,
                             options: VideoTaskOptions) -> dict[str, np.ndarray]:
  """Clip -> the agent's actions: BOS, clip (cond), "actions of the red circle:",
  noised actions, EOS (the sampling form is the same, actions zero, EOS ignored)."""
  b = _start(options)
  b.add_video(clip_patches(frames, options.patch_size), noised=False, cond=True)
  b.add_text(b.tokenizer.encode(prompt))
  b.add_action(np.asarray(actions, np.float32), noised=True)
  b.add_text([b.tokenizer.eos_id], loss=True)
  return b.build()


# ------------------------------------------------------------------------ the tasks


def pick_question(clip: sv.VideoClip, key: int, options: VideoTaskOptions
                  ) -> tuple[str, str]:
  """(question, answer) of a clip: a question type by key, then a question of it; colour
  counts ask about a present colour three times in four (else every answer is near 0)."""
  rng = shapes_scene.rng_for("video/question", key)
  asked = sv.clip_questions(clip, options.scene.colors)
  qtypes = [q for q in sv.QTYPES if asked[q]]
  qtype = qtypes[int(rng.integers(len(qtypes)))]
  pairs = asked[qtype]
  present = [p for p in pairs if p[1] != "0"]
  if qtype == "count_color" and present and rng.random() < 0.75:
    pairs = present
  return pairs[int(rng.integers(len(pairs)))]


def _generation(image, key, options: VideoTaskOptions, variant: int):
  del image, variant  # Everything comes from the key.
  clip = sv.training_clip("caption", key, options.scene, options.num_frames)
  return generation_example(sv.caption(clip), clip.frames(), options)


def _qa(image, key, options: VideoTaskOptions, variant: int):
  del image, variant
  clip = sv.training_clip("mixed", key, options.scene, options.num_frames)
  return qa_example(clip.frames(), *pick_question(clip, key, options), options)


def _world(image, key, options: VideoTaskOptions, variant: int):
  del image, variant
  clip = sv.training_clip("action", key, options.scene, options.num_frames)
  return world_model_example(sv.agent_text(clip), clip.actions, clip.frames(), options)


def _inverse(image, key, options: VideoTaskOptions, variant: int):
  del image, variant
  clip = sv.training_clip("action", key, options.scene, options.num_frames)
  return inverse_dynamics_example(clip.frames(), sv.actions_prompt(clip), clip.actions,
                                  options)


TASKS: dict[str, tasks.Task] = {
    "shapes_video_generation": tasks.Task(_generation, media=MEDIA),
    "shapes_video_qa": tasks.Task(_qa, media=MEDIA),
    "shapes_video_world_model": tasks.Task(_world, media=MEDIA),
    "shapes_video_inverse_dynamics": tasks.Task(_inverse, media=MEDIA),
}
tasks.TASKS.update(TASKS)  # registered: config.data.task_weights names them


def build_example(name: str, image: Any, label: Any, options: VideoTaskOptions,
                  rng: np.random.Generator, shift_pixels: int = 0) -> dict[str, np.ndarray]:
  """One training example of task `name`, keyed by a draw from `rng` (the signature of
  `tasks.build_example`; the pipeline's pair is an index, unused)."""
  del image, label, shift_pixels
  task = tasks.get_task(name)
  if task.media != MEDIA:
    raise ValueError(f"task {name!r} is not a shapes video task; config.data.dataset="
                     f"'shapes_video' trains {sorted(TASKS)}")
  return task.build(None, int(rng.integers(KEY_RANGE)), options, 0)


# ---------------------------------------------------------------- lengths and sets


def _longest_texts(options: VideoTaskOptions) -> dict[str, str]:
  """The longest text of each kind the options can produce (bytes)."""
  color = max(options.scene.colors, key=len)
  shape = max(options.scene.shapes, key=len)
  moving = f"a {color} {shape} moving {max(sv.DIRECTION_NAMES, key=len)}"
  pair = moving if options.scene.max_objects < 2 else f"{moving} and {moving}"
  questions = [sv.direction_question(color, shape), f"How many {color} objects are there?"]
  return {"caption": pair, "question": max(questions, key=len),
          "answer": max([*sv.DIRECTION_NAMES, "4"], key=len),
          "agent": f"the agent is the {color} {shape}",
          "actions": f"actions of the {color} {shape}:"}


def max_example_length(name: str, options: VideoTaskOptions) -> int:
  """Tokens of the longest example task `name` can produce (built from blank frames and
  the longest texts, so it is exact for the byte tokenizer)."""
  text = _longest_texts(options)
  s, t = options.scene.image_size, options.num_frames
  frames = np.zeros((t, s, s, 3), np.uint8)
  actions = np.zeros((t - 1, sv.ACTION_DIM), np.float32)
  build = {
      "shapes_video_generation": lambda: generation_example(text["caption"], frames, options),
      "shapes_video_qa": lambda: qa_example(frames, text["question"], text["answer"], options),
      "shapes_video_world_model": lambda: world_model_example(text["agent"], actions, frames,
                                                              options),
      "shapes_video_inverse_dynamics": lambda: inverse_dynamics_example(
          frames, text["actions"], actions, options),
  }
  if name not in build:
    raise ValueError(f"task {name!r} is not a shapes video task: use one of {sorted(build)}")
  return len(build[name]()["tokens"])


def heldout_examples(task: str, options: VideoTaskOptions,
                     n: int = HELDOUT_LOSS_ITEMS) -> list[dict[str, np.ndarray]]:
  """Fixed in-distribution evaluation examples of `task` (digits names alias) for the
  held-out losses: never trained on (their first frames are evaluation scenes)."""
  task = HELDOUT_ALIASES.get(task, task)
  split, scene, t = "in_distribution", options.scene, options.num_frames
  if task == "shapes_video_generation":
    clips = [sv.eval_clip("caption", split, i, scene, t) for i in range(n)]
    return [generation_example(sv.caption(c), c.frames(), options) for c in clips]
  if task == "shapes_video_qa":
    clips = [sv.eval_clip("mixed", split, i, scene, t) for i in range(n)]
    return [qa_example(c.frames(), *pick_question(c, i, options), options)
            for i, c in enumerate(clips)]
  raise ValueError(f"no held-out examples for task {task!r}: use {sorted(HELDOUT_ALIASES)}")


# ------------------------------------------------------------------------- config


def _int_field(data_config: Any, name: str, lo: int, hi: int, why: str) -> int:
  value = field(data_config, name, "config.data")
  if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
    raise ValueError(f"config.data.{name}={value!r} must be an integer in [{lo}, {hi}] "
                     f"({why})")
  return value


def validate(data_config: Any, tokenizer: Tokenizer = tokenizer_lib.BYTE_TOKENIZER
             ) -> VideoTaskOptions:
  """VideoTaskOptions of a shapes_video `config.data` (the Shapes scene, channel and
  patch fields as `shapes_tasks.validate`, plus num_frames, context_frames and
  video_layout), checked; one-line ValueErrors naming the field."""
  base = shapes_tasks.validate(data_config, tokenizer)
  t = _int_field(data_config, "num_frames", 2, 64, "frames a clip")
  k = _int_field(data_config, "context_frames", 1, t - 1,
                 "frames the world model is given: at least 1, fewer than num_frames")
  layout = field(data_config, "video_layout", "config.data")
  if layout != LAYOUT:
    raise ValueError(f"config.data.video_layout={layout!r}: shapes_video clips are drawn "
                     f"frame by frame, set it to {LAYOUT!r}")
  return VideoTaskOptions(base.patch_size, base.patch_dim, base.scene, t, k, tokenizer)
