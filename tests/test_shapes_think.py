"""Think-then-answer for relation questions (mot.data.shapes_think): the traces, the
training examples that carry them, and the pipeline reading the answer after them."""
import dataclasses

import numpy as np
import pytest

from configs import shapes as shapes_config
from mot import pipeline_setup
from mot import tokenizer as tok
from mot.data import shapes, shapes_tasks, shapes_think
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject

OPTIONS = shapes_scene.DEFAULT_OPTIONS
WORDS = tok.load("bytes+shapes", 358)


def traced_options(questions=3):
  return shapes_tasks.ShapesTaskOptions(8, 192, OPTIONS, WORDS, questions, True)


def test_a_trace_names_both_places_and_its_comparison_is_the_answer():
  red = SceneObject(2, 2, 7, 7, "red", "circle")        # centre (5, 5): places 1, 1
  blue = SceneObject(20, 21, 7, 7, "blue", "square")    # centre (24, 23): places 8, 7
  scene = Scene((red, blue))
  qa = grammar.answer_question("Is the blue square left of the red circle?", scene)
  traced = shapes_think.with_trace(qa, scene)
  assert traced.answer == "blue square 8, red circle 1: no"
  assert traced.accepted == ("no",) and shapes_think.final_answer(traced.answer) == "no"
  qa = grammar.answer_question("Is the red circle above the blue square?", scene)
  assert shapes_think.with_trace(qa, scene).answer == "red circle 1, blue square 7: yes"
  count = grammar.answer_question(grammar.COUNT_QUESTION, scene)
  assert shapes_think.with_trace(count, scene) == count          # only relations are traced
  assert shapes_think.final_answer(" a red circle above a blue square") == (
      "a red circle above a blue square")                          # untraced: unchanged
  with pytest.raises(ValueError, match="not a relation question"):
    shapes_think.relation_of(grammar.COUNT_QUESTION)


def test_every_trace_decides_its_answer():
  """Relations need MARGIN px and a place is MARGIN px: over many training questions the
  two places differ, and comparing them (smaller = left / up) gives the answer."""
  before = {"left of": True, "above": True, "right of": False, "below": False}
  seen = 0
  for index in range(300):
    scene, qa = shapes.vqa_example(0, index, OPTIONS, "relation")
    i, j = qa.objects
    relation = shapes_think.relation_of(qa.question)
    pa, pb = (shapes_think.place(scene.objects[k], relation) for k in (i, j))
    assert pa != pb
    assert (pa < pb) == before[relation] if qa.answer == "yes" else (pa > pb) == before[
        relation]
    assert shapes_think.final_answer(shapes_think.with_trace(qa, scene).answer) == qa.answer
    seen += 1
  assert seen == 300


def test_traced_vqa_examples_teach_the_trace_within_the_length_bound():
  options = traced_options()
  rng = np.random.default_rng(0)
  lengths, traced = [], 0
  for _ in range(200):
    ex = shapes_tasks.build_example("shapes_vqa", None, None, options, rng)
    lengths.append(len(ex["tokens"]))
    targets = WORDS.decode(ex["ar_targets"][ex["ar_weights"] > 0])
    traced += shapes_think.SEPARATOR.strip() in targets
  assert traced > 20                                   # relation questions carry traces
  assert max(lengths) <= shapes_tasks.max_example_length("shapes_vqa", options)
  plain = shapes_tasks.ShapesTaskOptions(8, 192, OPTIONS, WORDS, 3)
  assert shapes_tasks.max_example_length("shapes_vqa", plain) < max(lengths)
  held = shapes_tasks.heldout_examples("shapes_vqa", options, n=12)
  assert any(shapes_think.SEPARATOR.strip() in WORDS.decode(ex["tokens"]) for ex in held)


def test_the_longest_trace_bounds_every_trace():
  longest = shapes_think.longest_trace(OPTIONS, WORDS)
  for index in range(200):
    scene, qa = shapes.vqa_example(1, index, OPTIONS, "relation")
    assert len(WORDS.encode(shapes_think.with_trace(qa, scene).answer)) <= longest


def test_the_config_field_is_checked_and_read_by_the_pipeline():
  config = shapes_config.get_config("tiny")
  assert shapes_tasks.validate(config.data).relation_trace is False
  assert pipeline_setup.answer_reader(config)(" red circle 1, blue square 7: yes") == (
      "red circle 1, blue square 7: yes")              # an untraced run returns the reply
  plain, _ = pipeline_setup.answer_budgets(config, WORDS, 1, 1)
  config.data.relation_trace = True
  assert shapes_tasks.validate(config.data, WORDS).relation_trace is True
  assert pipeline_setup.answer_reader(config)(" red circle 1, blue square 7: yes") == "yes"
  traced, _ = pipeline_setup.answer_budgets(config, WORDS, 1, 1)
  assert traced == max(plain, shapes_think.longest_trace(OPTIONS, WORDS) + 1) > plain
  with pytest.raises(ValueError, match="relation_trace='yes' must be True or False"):
    shapes_tasks.validate(dict(config.data.to_dict(), relation_trace="yes"))


# ------------------------------------------------------------------ layout plans


def test_a_plan_lists_every_object_with_its_column_and_row_place():
  red = SceneObject(2, 2, 7, 7, "red", "circle")        # centre (5, 5): places 1, 1
  blue = SceneObject(20, 21, 7, 7, "blue", "square")    # centre (24, 23): places 8, 7
  assert shapes_think.plan_text(Scene((red, blue)).objects) == (
      " red circle 1 1, blue square 8 7")
  assert shapes_think.plan_prompt("a red circle above a blue square ") == (
      "a red circle above a blue square:")
  longest = shapes_think.longest_plan(OPTIONS, WORDS)
  for index in range(100):
    _, scene = shapes.generation_example(0, index, OPTIONS)
    assert len(WORDS.encode(shapes_think.plan_text(scene.objects))) <= longest


def test_planned_generation_examples_teach_caption_then_plan_as_conditioning():
  plain = shapes_tasks.ShapesTaskOptions(8, 192, OPTIONS, WORDS, 3)
  planned = dataclasses.replace(plain, layout_plan=True)
  rng = np.random.default_rng(0)
  for _ in range(30):
    ex = shapes_tasks.build_example("shapes_generation", None, None, planned, rng)
    text = ex["modality"] == 0
    cond = WORDS.decode(ex["tokens"][text & (ex["cond_mask"] > 0)])
    caption, plan = cond.split(shapes_think.PLAN_SEPARATOR)
    assert grammar.parse_caption(caption) is not None
    objects = plan.split(", ")
    assert len(objects) == len(grammar.parse_caption(caption).kinds)
    assert len(ex["tokens"]) <= shapes_tasks.max_example_length("shapes_generation", planned)
    targets = WORDS.decode(ex["ar_targets"][ex["ar_weights"] > 0])
    assert plan.strip() in targets                       # the AR head learns to write it
    image_begins = ex["ar_targets"] == WORDS.begin("image")
    assert (ex["ar_weights"][image_begins] > 0).sum() == 1  # ... and where it stops
    ex = shapes_tasks.build_example("shapes_generation", None, None, plain, rng)
    assert not (ex["ar_weights"][ex["ar_targets"] == WORDS.begin("image")] > 0).any()
  assert (shapes_tasks.max_example_length("shapes_generation", plain)
          < shapes_tasks.max_example_length("shapes_generation", planned))
  held = shapes_tasks.heldout_examples("shapes_generation", planned, n=8)
  assert all(shapes_think.PLAN_SEPARATOR in WORDS.decode(ex["tokens"]) for ex in held)


# ------------------------------------------------------------------ layout canvases


def test_a_canvas_marks_each_planned_object_in_its_colour_at_its_places():
  canvas = shapes_think.plan_canvas(" red circle 1 1, blue square 8 7", 32)
  assert canvas.shape == (32, 32, 3) and canvas.dtype == np.uint8
  assert (canvas[3:6, 3:6] == (255, 0, 0)).all()       # place 1 -> pixels 3..5, mark at 4
  assert (canvas[21:24, 24:27] == (0, 0, 255)).all()   # column 8, row 7
  assert (canvas.any(-1)).sum() == 2 * shapes_think.CANVAS_DOT ** 2
  for unreadable in ("red circle", " pink circle 1 1", ""):
    assert not shapes_think.plan_canvas(unreadable, 32).any(), unreadable
  far = shapes_think.plan_canvas(" red circle 10 10", 32)   # clipped at the border
  assert far[31, 31].tolist() == [255, 0, 0]


def test_canvas_examples_put_the_plans_canvas_between_plan_and_image():
  planned = shapes_tasks.ShapesTaskOptions(8, 192, OPTIONS, WORDS, 3, layout_plan=True,
                                           layout_canvas=True)
  rng = np.random.default_rng(1)
  for _ in range(10):
    ex = shapes_tasks.build_example("shapes_generation", None, None, planned, rng)
    text = ex["modality"] == 0
    plan = WORDS.decode(ex["tokens"][text & (ex["cond_mask"] > 0)]).split(
        shapes_think.PLAN_SEPARATOR)[1]
    clean = (ex["modality"] == 1) & (ex["dm_mask"] == 0)
    noised = (ex["modality"] == 1) & (ex["dm_mask"] > 0)
    assert clean.sum() == noised.sum() == 16
    assert (ex["cond_mask"][clean] > 0).all()
    assert np.flatnonzero(clean).max() < np.flatnonzero(noised).min()
    want = shapes_tasks.image_patches(shapes_think.plan_canvas(plan, 32), 8).reshape(16, -1)
    np.testing.assert_allclose(ex["patches"][clean][:, :want.shape[1]], want)
    begins = ex["ar_targets"] == WORDS.begin("image")
    assert (ex["ar_weights"][begins] > 0).sum() == 1     # the canvas's: where a plan ends
    assert len(ex["tokens"]) <= shapes_tasks.max_example_length("shapes_generation", planned)
  config = shapes_config.get_config("tiny")
  assert shapes_tasks.validate(config.data).layout_canvas is False
  with pytest.raises(ValueError, match="only with config.data.layout_plan=True"):
    shapes_tasks.validate(dict(config.data.to_dict(), layout_canvas=True))
  assert shapes_tasks.validate(dict(config.data.to_dict(), layout_canvas=True,
                                    layout_plan=True), WORDS).layout_canvas is True
