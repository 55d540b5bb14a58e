"""Shapes through the public interfaces (issue #39 deliverables 6 and 7) on configs/shapes.py:tiny.

A checkpoint of the tiny config with random parameters, written in training's format: the
tests check shapes, files and forms (not accuracy): sample.py --mode generate with several
--prompt, Pipeline.reason over uint8 RGB arrays, think-then-draw over a context image, the
Shapes protocol's record, the input pipeline's examples, and the one-line errors.
"""
import json
import os

import numpy as np
import pytest
from PIL import Image

from configs import shapes as shapes_config
from mot import config as config_lib
from mot import eval_shapes, evaluate, pipeline_setup, shapes_features
from mot.data import input_pipeline, shapes, shapes_grammar, shapes_scene, shapes_tasks
from mot.data import shapes_think
from mot.errors import ConfigError, InputError
from mot.pipeline import Pipeline
from tests.test_sample_cli import run_sample, write_checkpoint

PROMPTS = ["a red square", "two green circles left of", "a blue triangle above a red circle"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("shapes_run")
  write_checkpoint(path, config=shapes_config.get_config("tiny"))
  return str(path)


@pytest.fixture(scope="module")
def pipe(workdir):
  return Pipeline.from_workdir(workdir)


def test_sample_py_generate_writes_rgb_pngs_and_a_manifest(workdir, tmp_path):
  out = tmp_path / "samples"
  run_sample(workdir, "generate", prompts=PROMPTS, num_samples=2, seed=3, out=str(out),
             steps=2)
  manifest = json.loads((out / "manifest.json").read_text())
  assert [(s["prompt"], s["sample_index"]) for s in manifest["samples"]] == [
      (p, k) for p in PROMPTS for k in range(2)]
  for record in manifest["samples"]:
    with Image.open(out / record["file"]) as png:
      assert png.mode == "RGB" and png.size == (32, 32)


def test_sample_py_think_then_draw_reads_context_images(workdir, tmp_path):
  context = tmp_path / "context.png"
  Image.fromarray(shapes_scene.render(shapes.training_scene(0, 5)), "RGB").save(context)
  out = tmp_path / "drawn"
  run_sample(workdir, "think_then_draw", prompts=["draw the shape that is red:"],
             images=[str(context)], out=str(out), steps=2)
  record = json.loads((out / "manifest.json").read_text())["samples"][0]
  assert isinstance(record["answer"], str) and (out / record["file"]).exists()
  with pytest.raises(InputError, match="--images is for --mode reason, think_then_draw"):
    run_sample(workdir, "generate", prompts=["a red square"], images=[str(context)],
               out=str(tmp_path / "x"))


def test_reason_takes_uint8_rgb_arrays_and_answers_in_strings(pipe):
  scenes = [shapes.training_scene(0, i) for i in range(3)]
  images = [shapes_scene.render(s) for s in scenes]
  questions = [shapes_grammar.COUNT_QUESTION, "What color is the square?",
               shapes_grammar.DESCRIBE_QUESTION]
  answers = pipe.reason(questions, images=images)
  assert isinstance(answers, list) and len(answers) == 3
  assert all(isinstance(a, str) for a in answers)
  # The default budget holds the longest caption, in the run's tokens, and its end token.
  longest = max(len(pipe.tokenizer.encode(shapes_grammar.caption_text(r))) for r in
                shapes_grammar.all_requirements(shapes_scene.DEFAULT_OPTIONS.all_types))
  assert pipe.default_max_new_tokens >= longest + 1
  assert pipe.reason(images=images[0]) == pipe.reason(shapes_grammar.DESCRIBE_QUESTION,
                                                      images=images[0])


def test_generate_and_think_then_draw_return_rgb_images(pipe):
  images = pipe.generate(PROMPTS[:2], num_samples=2, steps=2, seed=1)
  assert images.shape == (4, 32, 32, 3) and images.dtype == np.float32
  assert 0.0 <= images.min() and images.max() <= 1.0
  np.testing.assert_array_equal(images, pipe.generate(PROMPTS[:2], num_samples=2, steps=2,
                                                      seed=1))
  context = shapes_scene.render(shapes.training_scene(0, 5))
  answers, drawn = pipe.think_then_draw(["draw the shape that is red:"] * 2, steps=2,
                                        images=[context, context])
  assert len(answers) == 2 and drawn.shape == (2, 32, 32, 3)


def test_protocol_record_and_files(pipe, workdir, monkeypatch):
  monkeypatch.setattr(shapes_features, "TRAIN_SCENES", 60)   # the judge's fit, shrunk
  monkeypatch.setattr(shapes_features, "EPOCHS", 2)
  shapes_features._fit.cache_clear()
  try:
    result = evaluate.evaluate_pipeline(pipe, 1, steps=2, set_size=1)
  finally:
    shapes_features._fit.cache_clear()
  assert set(result["geneval"]) == {"in_distribution", "heldout", "unscorable"}
  for split in ("in_distribution", "heldout"):
    assert set(shapes_grammar.CATEGORIES) <= set(result["geneval"][split])
    assert set(shapes_grammar.QTYPES) <= set(result["vqa"][split])
    assert result["vqa"][split]["num_questions"]["describe"] == 1
  for key in ("geneval_overall", "vqa_overall", "frechet", "frechet_floor"):
    assert isinstance(result[key], float)
  written = evaluate.write_results(workdir, result)
  assert os.path.exists(written["grid"])
  assert evaluate.format_result(written).startswith(f"step {pipe.step}: GenEval overall")
  record = evaluate.read_evaluations(workdir)[-1]
  assert record["grid_rows"][0]["split"] == "in_distribution"


def test_a_prompt_outside_the_grammar_generates_and_scores_nothing(pipe):
  prompts = ["a purple dog", "a red square"]
  images = eval_shapes.to_uint8(pipe.generate(prompts, steps=2))
  assert images.shape == (2, 32, 32, 3)
  scores = eval_shapes.shapes_metrics.geneval_scores(prompts, images)
  assert scores["unscorable"] == 1
  assert scores["in_distribution"]["num_images"]["single_object"] == 1


def test_training_batches_are_shapes_examples_and_resume_exactly():
  config = shapes_config.get_config("tiny")
  config.data.task_weights = {name: 1.0 for name in shapes_tasks.TASKS}
  it = iter(input_pipeline.make_train_dataset(config.data, 0, 4))
  first = [next(it) for _ in range(2)]
  state = it.get_state()
  third = next(it)
  again = iter(input_pipeline.make_train_dataset(config.data, 0, 4))
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["patches"], third["patches"])
  assert first[0]["patches"].shape == (4, 128, 192)
  assert np.abs(first[0]["patches"]).max() == 1.0   # flat palette colours at +-1
  lengths = {n: shapes_tasks.max_example_length(n, input_pipeline.validate(config.data))
             for n in shapes_tasks.TASKS}
  assert max(lengths.values()) <= config.data.seq_len


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.data.shapes, "colors", ("red", "purple")), "unknown colour 'purple'"),
    (lambda c: setattr(c.data.shapes, "shapes", ("square", "star")), "unknown shape 'star'"),
    (lambda c: setattr(c.data.shapes, "max_size", 16), "cannot fit 4 objects"),
    (lambda c: setattr(c.data, "channels", 1), "channels"),
    (lambda c: setattr(c.data.task_weights, "generation", 1.0), "makes image examples"),
])
def test_bad_config_fields_are_one_line_errors(change, message):
  config = shapes_config.get_config("tiny")
  change(config)
  with pytest.raises(ConfigError, match=message) as e:
    config_lib.validate(config)
  assert "\n" not in str(e.value)


def test_shapes_tasks_are_refused_on_other_datasets():
  from configs import digits as digits_config
  config = digits_config.get_config("tiny")
  config.data.task_weights.shapes_vqa = 1.0
  with pytest.raises(ConfigError, match="dataset='shapes'"):
    config_lib.validate(config)


def test_reason_returns_the_answer_after_a_relation_trace(pipe, monkeypatch):
  """A run trained with data.relation_trace replies "red circle 1, blue square 7: yes";
  Pipeline.reason returns the grammar's answer, "yes"."""
  traced = shapes_config.get_config("tiny")
  traced.data.relation_trace = True
  reply = pipe.tokenizer.encode(" red circle 1, blue square 7: yes")
  monkeypatch.setattr(pipe, "final_answer", pipeline_setup.answer_reader(traced))
  monkeypatch.setattr(pipe, "decode_answers", lambda examples, *a, **k: [reply] * len(examples))
  image = shapes_scene.render(shapes.training_scene(0, 3))
  question = "Is the red circle above the blue square?"
  assert pipe.reason([question, question], images=[image, image]) == ["yes", "yes"]
  assert pipe.reason(question, images=image, raw=True) == "red circle 1, blue square 7: yes"


def test_generate_writes_a_layout_plan_first_when_the_run_trained_with_one(pipe, monkeypatch):
  """data.layout_plan: generate decodes one plan per sample after "caption:", at
  sample.plan_temperature, then draws each image conditioned on caption and plan."""
  asked = []
  decode = pipe.decode_answers

  def spy(examples, max_new_tokens, temperature=0.0, *a, **k):
    asked.append((len(examples), max_new_tokens, temperature))
    return decode(examples, max_new_tokens, temperature, *a, **k)

  monkeypatch.setattr(pipe, "plan_temperature", 1.0)
  monkeypatch.setattr(pipe, "decode_answers", spy)
  images = pipe.generate(["a red square", "two green circles"], num_samples=2, steps=2)
  assert images.shape == (4, 32, 32, 3) and np.isfinite(images).all()
  assert asked == [(4, pipe.default_draw_tokens, 1.0)]
  plans, again = pipe.plan_then_draw(["a red square"], 2, 2, 1.0, "euler", 0)
  assert len(plans) == 2 and all(isinstance(p, str) for p in plans)
  np.testing.assert_array_equal(again, images[:2])   # (seed, row) fix plans and noise


def test_a_canvas_run_draws_on_its_plans_canvas(pipe, monkeypatch):
  """data.layout_canvas: each image is drawn after its plan's canvas, the same patches
  training put there (shapes_tasks.generation_example)."""
  plan = " red square 1 2"
  built = []
  denoise = pipe.denoise

  def spy(examples, *a, **k):
    built.extend(examples)
    return denoise(examples, *a, **k)

  monkeypatch.setattr(pipe, "plan_temperature", 1.0)
  monkeypatch.setattr(pipe.config.data, "layout_canvas", True)
  monkeypatch.setattr(pipe, "decode_answers",
                      lambda asks, *a, **k: [pipe.tokenizer.encode(plan)] * len(asks))
  monkeypatch.setattr(pipe, "denoise", spy)
  plans, images = pipe.plan_then_draw(["a red square"], 1, 2, 1.0, "euler", 0)
  assert plans == [plan.strip()] and images.shape == (1, 32, 32, 3)
  ex = built[0]
  clean = (ex["modality"] == 1) & (ex["dm_mask"] == 0)
  want = shapes_tasks.image_patches(shapes_think.plan_canvas(plan, 32), 8).reshape(16, -1)
  np.testing.assert_allclose(ex["patches"][clean][:, :want.shape[1]], want, atol=1e-6)
