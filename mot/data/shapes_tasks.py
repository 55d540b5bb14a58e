"""Shapes tasks (issue #39): the training examples of `config.data.dataset="shapes"`.

Each task turns one key (an integer the input pipeline draws from the element's rng, so
an example is a pure function of (seed, element index) and resuming is exact) into one
example, through the deterministic streams of `mot.data.shapes`:

  shapes_generation   BOS  a red square left of a blue circle  [img> noised <img]  EOS
                           (with data.layout_plan the caption ends in ":" and its plan,
                           " red square 1 5, blue circle 7 6", follows: shapes_think)
  shapes_vqa          BOS  [img> clean <img]  How many red objects are there?  2  EOS
                           (then vqa_questions - 1 more questions about it, each
                           question  answer  EOS)
  shapes_caption      BOS  [img> clean <img]  Describe this image.  a red square ...  EOS
  shapes_text         BOS  a red square left of a blue circle means a blue ...  EOS
  shapes_think_draw   BOS  [img> context <img]  draw three of the shape that is red:
                           three red circles  [img> noised <img]  EOS
                           (with data.relation_trace a relation question is answered
                           "red circle 2, blue square 7: yes": mot.data.shapes_think)
  shapes_order        BOS  [img> clean <img]  Which is left of the other, the red
                           circle or the blue square?  red circle  EOS  (up to
                           vqa_questions such turns; a curriculum outside the
                           evaluated grammar: mot.data.shapes_order)

Loss tokens are the caption (generation, as the digits task), the answer, the caption of
"Describe this image.", the text and the think-then-draw answer, each with EOS. The
generation caption, and the context image, prompt and answer of think-then-draw, are the
conditioning that classifier-free guidance drops. `shapes_vqa` draws its question type
uniformly among the types the options can ask, "describe" excepted (that is
`shapes_caption`), and its answer uniformly from the type's answers
(`shapes.vqa_example`); `data.vqa_questions` > 1 asks further questions of the same
image after it (`shapes.more_questions`), so one image's tokens carry several answers.
Training draws training (colour, shape) types only.

The tasks register themselves in `mot.data.tasks.TASKS` (media "shapes"), so
`config.data.task_weights` names them like any task.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mot import patches
from mot import tokenizer as tokenizer_lib
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_order
from mot.data import shapes_scene
from mot.data import shapes_think
from mot.data import tasks
from mot.data.builder import SequenceBuilder
from mot.errors import field

DATASET = "shapes"
MEDIA = "shapes"            # Task.media of these tasks: only dataset "shapes" makes them
CHANNELS = 3                # RGB
KEY_RANGE = 2**62           # keys drawn per example (index into the endless streams)
VIRTUAL_PAIRS = 2**16       # length of the index range the input pipeline shuffles
# train_lib's held-out losses ask for the digits' task names.
HELDOUT_ALIASES = {"generation": "shapes_generation", "reasoning": "shapes_vqa"}
HELDOUT_LOSS_ITEMS = 64     # held-out examples per task for the eval losses
# Answers that are not a caption: a colour, a shape, yes / no or a count (one digit).
_SHORT_ANSWERS = (*shapes_scene.COLORS, *shapes_scene.SHAPES, "yes", "no")


@dataclasses.dataclass(frozen=True)
class ShapesTaskOptions:
  """What the shapes tasks need: how to cut images, and what scenes may hold."""
  patch_size: int
  patch_dim: int
  scene: shapes_scene.ShapesOptions
  tokenizer: tokenizer_lib.Tokenizer = tokenizer_lib.BYTE_TOKENIZER   # the run's
  vqa_questions: int = 1    # questions (with answers) a shapes_vqa example asks of its image
  relation_trace: bool = False  # relation answers write both places first (shapes_think)
  layout_plan: bool = False     # captions to draw are followed by a layout plan (same)
  layout_canvas: bool = False   # ... and by the plan's canvas, a clean image (same)


def image_patches(image: np.ndarray, patch_size: int) -> np.ndarray:
  """uint8 [S, S, 3] -> float32 [S/p, S/p, p*p*3] patches in the model's [-1, 1]."""
  return patches.patchify(shapes_scene.to_model(image), patch_size)


def _start(options: ShapesTaskOptions) -> SequenceBuilder:
  b = SequenceBuilder(options.patch_dim, options.tokenizer)
  b.add_text([options.tokenizer.bos_id])
  return b


def _ids(b: SequenceBuilder, text: str) -> list[int]:
  return b.tokenizer.encode(text)


def _answer(b: SequenceBuilder, text: str, cond: bool = False) -> None:
  b.add_text(_ids(b, text) + [b.tokenizer.eos_id], loss=True, cond=cond)


def generation_example(caption: str, image: np.ndarray, options: ShapesTaskOptions,
                       plan: str | None = None) -> dict[str, np.ndarray]:
  """Caption -> image: BOS, caption (target, conditioning), noised image, EOS (target);
  with a layout plan (`shapes_think.plan_text`) the caption ends in ":" and the plan
  follows it, both targets and conditioning, and the image's begin marker is a target
  too: it is where a sampled plan stops. With data.layout_canvas the plan's canvas
  (`shapes_think.plan_canvas`) comes between plan and image, clean conditioning, and its
  begin marker is the target."""
  b = _start(options)
  if plan is None:
    b.add_text(_ids(b, caption), loss=True, cond=True)
  else:
    b.add_text(_ids(b, shapes_think.plan_prompt(caption)), loss=True, cond=True)
    b.add_text(_ids(b, plan), loss=True, cond=True)
  if plan is not None and options.layout_canvas:
    canvas = shapes_think.plan_canvas(plan, options.scene.image_size)
    b.add_image(image_patches(canvas, options.patch_size), noised=False, cond=True,
                begin_loss=True)
  b.add_image(image_patches(image, options.patch_size), noised=True,
              begin_loss=plan is not None and not options.layout_canvas)
  b.add_text([b.tokenizer.eos_id], loss=True)
  return b.build()


def reading_example(image: np.ndarray, question: str, answer: str,
                    options: ShapesTaskOptions, more=()) -> dict[str, np.ndarray]:
  """Image -> answer: BOS, clean image, question, answer + EOS (targets); the layout
  `mot.prompts.PromptBuilder.reasoning_prompt` builds for sampling. `more` (QAs) follow
  as further question, answer + EOS turns about the same image."""
  b = _start(options)
  b.add_image(image_patches(image, options.patch_size), noised=False)
  for q, a in [(question, answer)] + [(qa.question, qa.answer) for qa in more]:
    b.add_text(_ids(b, q))
    _answer(b, a)
  return b.build()


def text_example(text: str, options: ShapesTaskOptions) -> dict[str, np.ndarray]:
  """Text only: BOS, text + EOS (targets)."""
  b = _start(options)
  _answer(b, text)
  return b.build()


def think_draw_example(context: np.ndarray, prompt: str, answer: str, image: np.ndarray,
                       options: ShapesTaskOptions) -> dict[str, np.ndarray]:
  """Think, then draw: BOS, context image, prompt, answer (target), noised image, EOS
  (target); context, prompt and answer condition the drawn image."""
  b = _start(options)
  b.add_image(image_patches(context, options.patch_size), noised=False, cond=True)
  b.add_text(_ids(b, prompt), cond=True)
  b.add_text(_ids(b, answer), loss=True, cond=True)
  b.add_image(image_patches(image, options.patch_size), noised=True)
  b.add_text([b.tokenizer.eos_id], loss=True)
  return b.build()


# ------------------------------------------------------------------------ the tasks


def _generation(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant  # Everything comes from the key.
  caption, scene = shapes.generation_example(0, key, options.scene)
  return generation_example(caption, shapes_scene.render(scene), options, _plan(scene, options))


def _plan(scene, options: ShapesTaskOptions) -> str | None:
  """The scene's layout plan when the run trains with one (data.layout_plan), else None."""
  return shapes_think.plan_text(scene.objects) if options.layout_plan else None


def _vqa(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant
  qtypes = shapes.vqa_types(options.scene)
  qtype = qtypes[key % len(qtypes)]
  scene, qa = shapes.vqa_example(0, key // len(qtypes), options.scene, qtype)
  more = shapes.more_questions(0, key, scene, qa, options.vqa_questions - 1, options.scene)
  if options.relation_trace:
    qa, *more = (shapes_think.with_trace(q, scene) for q in (qa, *more))
  return reading_example(shapes_scene.render(scene), qa.question, qa.answer, options, more)


def _caption(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant
  scene, caption = shapes.caption_example(0, key, options.scene)
  return reading_example(shapes_scene.render(scene), grammar.DESCRIBE_QUESTION, caption,
                         options)


def _text(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant
  return text_example(shapes.text_example(0, key, options.scene), options)


def _think_draw(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant
  item = shapes.think_draw_example(0, key, options.scene)
  return think_draw_example(shapes_scene.render(item.context), item.prompt, item.answer,
                            shapes_scene.render(item.scene), options)


def _order(image, key, options: ShapesTaskOptions, variant: int):
  del image, variant
  scene, qas = shapes_order.order_example(0, key, options.vqa_questions, options.scene)
  return reading_example(shapes_scene.render(scene), qas[0].question, qas[0].answer,
                         options, qas[1:])


TASKS: dict[str, tasks.Task] = {
    "shapes_generation": tasks.Task(_generation, media=MEDIA),
    "shapes_vqa": tasks.Task(_vqa, media=MEDIA),
    "shapes_caption": tasks.Task(_caption, media=MEDIA),
    "shapes_text": tasks.Task(_text, media=MEDIA),
    "shapes_think_draw": tasks.Task(_think_draw, media=MEDIA),
    "shapes_order": tasks.Task(_order, media=MEDIA),
}
tasks.TASKS.update(TASKS)  # registered: config.data.task_weights names them


def build_example(name: str, image: Any, label: Any, options: ShapesTaskOptions,
                  rng: np.random.Generator, shift_pixels: int = 0) -> dict[str, np.ndarray]:
  """One training example of shapes task `name`, keyed by a draw from `rng` (the
  signature of `tasks.build_example`, so the input pipeline uses either; the pair the
  pipeline passes is an index, unused: scenes are drawn, not read)."""
  del image, label, shift_pixels  # Scenes vary by construction: no augmentation.
  task = tasks.get_task(name)
  if task.media != MEDIA:
    raise ValueError(f"task {name!r} is not a shapes task; config.data.dataset='shapes' "
                     f"trains {sorted(TASKS)}")
  return task.build(None, int(rng.integers(KEY_RANGE)), options, 0)


# ---------------------------------------------------------------- lengths and sets


def image_tokens(options: ShapesTaskOptions) -> int:
  """Tokens of one image block: its patches and the two markers."""
  return (options.scene.image_size // options.patch_size) ** 2 + 2


def max_example_length(name: str, options: ShapesTaskOptions) -> int:
  """Longest example task `name` can produce under `options` (from the grammar's
  longest texts, `shapes.max_text_tokens`)."""
  n = shapes.max_text_tokens(options.scene, options.tokenizer)
  img = image_tokens(options)
  short = max(len(options.tokenizer.encode(w)) for w in _SHORT_ANSWERS)
  if options.relation_trace:
    short = max(short, shapes_think.longest_trace(options.scene, options.tokenizer))
  describe = len(options.tokenizer.encode(grammar.DESCRIBE_QUESTION))
  lengths = {
      "shapes_generation": 1 + n["caption"] + img + 1 + (1 + shapes_think.longest_plan(
          options.scene, options.tokenizer) if options.layout_plan else 0)
          + (img if options.layout_plan and options.layout_canvas else 0),
      "shapes_vqa": 1 + img + options.vqa_questions * (n["question"] + short + 1),
      "shapes_caption": 1 + img + describe + n["caption"] + 1,
      "shapes_text": 1 + n["text"] + 1,
      "shapes_think_draw": 1 + img + n["draw_prompt"] + n["draw_answer"] + img + 1,
      "shapes_order": 1 + img + options.vqa_questions * (
          shapes_order.longest_question(options.scene, options.tokenizer)
          + shapes_order.longest_answer(options.scene, options.tokenizer) + 1),
  }
  if name not in lengths:
    raise ValueError(f"task {name!r} is not a shapes task: use one of {sorted(lengths)}")
  return lengths[name]


def heldout_examples(task: str, options: ShapesTaskOptions,
                     n: int = HELDOUT_LOSS_ITEMS) -> list[dict[str, np.ndarray]]:
  """Fixed in-distribution evaluation examples of `task` (digits names alias to
  shapes_generation / shapes_vqa) for the held-out losses: never trained on."""
  task = HELDOUT_ALIASES.get(task, task)
  split = "in_distribution"
  if task == "shapes_generation":
    out = []
    categories = [c for c in grammar.CATEGORIES
                  if shapes.category_requirements(c, split, options.scene)]
    for i in range(n):
      category = categories[i % len(categories)]
      prompt = shapes.prompt_set(category, split, n // len(categories) + 1,
                                 options.scene)[i // len(categories)]
      scene = shapes.scene_for(grammar.parse_caption(prompt),
                               shapes_scene.rng_for("eval/loss", i), options.scene, split)
      out.append(generation_example(prompt, shapes_scene.render(scene), options,
                                    _plan(scene, options)))
    return out
  if task == "shapes_vqa":
    qtypes = shapes.vqa_types(options.scene)
    items = [shapes.vqa_set(q, split, n // len(qtypes) + 1, options.scene)[i // len(qtypes)]
             for i, q in zip(range(n), (qtypes * n)[:n])]
    if options.relation_trace:   # the held-out loss scores what training teaches
      items = [(s, shapes_think.with_trace(qa, s)) for s, qa in items]
    return [reading_example(shapes_scene.render(s), qa.question, qa.answer, options)
            for s, qa in items]
  raise ValueError(f"no held-out examples for task {task!r}: use {sorted(HELDOUT_ALIASES)}")


# ------------------------------------------------------------------------- config


def scene_options(data_config: Any) -> shapes_scene.ShapesOptions:
  """The ShapesOptions of `config.data` (image_size and the `shapes` section), checked;
  a one-line ValueError naming the field otherwise."""
  size = field(data_config, "image_size", "config.data")
  if isinstance(size, bool) or not isinstance(size, int) or not (
      shapes_scene.MIN_SIDE <= size <= 1024):
    raise ValueError(f"config.data.image_size={size!r} must be an integer in "
                     f"[{shapes_scene.MIN_SIDE}, 1024] (pixels a side; the benchmark's 32)")
  s = field(data_config, "shapes", "config.data")
  names = ("min_size", "max_size", "max_objects", "colors", "shapes", "heldout_pairs")
  values = {k: field(s, k, "config.data.shapes") for k in names}
  for k in ("colors", "shapes", "heldout_pairs"):  # ConfigDict tuples may come as lists
    if isinstance(values[k], list):
      values[k] = tuple(tuple(v) if isinstance(v, list) else v for v in values[k])
  return shapes_scene.validate_options(image_size=size, **values)


def validate(data_config: Any,
             tokenizer: tokenizer_lib.Tokenizer = tokenizer_lib.BYTE_TOKENIZER
             ) -> ShapesTaskOptions:
  """ShapesTaskOptions of a shapes `config.data` (scenes, channels, patches), checked;
  the examples are written with `tokenizer` (the run's)."""
  scene = scene_options(data_config)
  channels = field(data_config, "channels", "config.data")
  if channels != CHANNELS:
    raise ValueError(f"config.data.channels={channels!r}: shapes images are RGB, set it "
                     f"to {CHANNELS}")
  p = field(data_config, "patch_size", "config.data")
  patch_dim = field(data_config, "patch_dim", "config.data")
  if not isinstance(p, int) or p < 1 or scene.image_size % p:
    raise ValueError(f"config.data.patch_size={p!r} must divide the {scene.image_size}x"
                     f"{scene.image_size} images (config.data.image_size)")
  if not isinstance(patch_dim, int) or patch_dim < p * p * CHANNELS:
    raise ValueError(f"config.data.patch_dim={patch_dim!r} is smaller than patch_size**2 "
                     f"* channels = {p * p * CHANNELS}")
  k = field(data_config, "vqa_questions", "config.data")
  if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16:
    raise ValueError(f"config.data.vqa_questions={k!r} must be an integer in [1, 16] "
                     "(questions a shapes_vqa example asks of its image)")
  trace = field(data_config, "relation_trace", "config.data")
  if not isinstance(trace, bool):
    raise ValueError(f"config.data.relation_trace={trace!r} must be True or False (relation "
                     "answers written after both objects' places: mot.data.shapes_think)")
  plan = field(data_config, "layout_plan", "config.data")
  if not isinstance(plan, bool):
    raise ValueError(f"config.data.layout_plan={plan!r} must be True or False (captions to "
                     "draw followed by the objects' places: mot.data.shapes_think)")
  canvas = field(data_config, "layout_canvas", "config.data")
  if not isinstance(canvas, bool) or (canvas and not plan):
    raise ValueError(f"config.data.layout_canvas={canvas!r} must be True or False, and True "
                     "only with config.data.layout_plan=True (the canvas draws the plan)")
  return ShapesTaskOptions(p, patch_dim, scene, tokenizer, k, trace, plan, canvas)
