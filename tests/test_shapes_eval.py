"""Tests for the Shapes detector and scorers (GenEval-style, VQA, captioning)."""
import dataclasses

import numpy as np
import pytest

from bench import shapes_figures
from mot import shapes_detector
from mot import shapes_metrics
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject


def obj(top, left, size, color, shape):
  return SceneObject(top, left, size, size, color, shape)


def random_scenes(n, tag, options=shapes_scene.DEFAULT_OPTIONS):
  rng = shapes_scene.rng_for("test/detector", tag)
  return [shapes_scene.sample_scene(rng, shapes_scene.KINDS[i % 4], options,
                                    heldout=i % 2 == 1) for i in range(n)]


# ------------------------------------------------------------------------ detector


def test_detector_recovers_every_rendered_object_exactly():
  scenes = random_scenes(500, 0) + random_scenes(
      100, 1, shapes_scene.validate_options(min_size=5, max_size=13))
  for scene in scenes:
    assert shapes_detector.detect(shapes_scene.render(scene)) == scene, scene
  assert sum(len(s.objects) for s in scenes) > 1000
  assert {o.shape for s in scenes for o in s.objects} == set(shapes_scene.SHAPES)


def test_detector_tolerates_off_colours_holes_and_specks():
  rng = np.random.default_rng(0)
  for scene in random_scenes(150, 2):
    image = shapes_scene.render(scene).astype(int)
    image = np.clip(image + rng.integers(-40, 41, image.shape), 0, 255)
    for o in scene.objects:  # two wrong pixels inside each object
      rows = rng.integers(o.top + 1, o.top + o.height - 1, 2)
      cols = rng.integers(o.left + 1, o.left + o.width - 1, 2)
      image[rows, cols] = 0
    clear = np.ones((32, 32), bool)  # specks at >= 2 px from every box
    for o in scene.objects:
      clear[max(o.top - 3, 0):o.top + o.height + 2, max(o.left - 3, 0):o.left + o.width + 2] = 0
    spots = np.argwhere(clear[:31, :31])
    if len(spots):
      r, c = spots[rng.integers(len(spots))]
      image[r:r + 2, c:c + 2] = shapes_scene.PALETTE["green"]  # a 4-pixel speck
    assert shapes_detector.detect(image.astype(np.uint8)) == scene


def test_far_colours_are_ignored_and_blobs_are_unknown():
  image = np.zeros((32, 32, 3), np.uint8)
  image[0:8, 0:8] = (128, 128, 128)                 # far from every palette colour
  image[10:13, 0:12] = (255, 0, 0)                  # a bar: no shape of ours
  image[20:27, 20:27] = shapes_scene.render(Scene(
      (obj(0, 0, 7, "blue", "triangle"),), 7))[::-1]  # upside-down triangle
  classes = shapes_detector.classify_pixels(image)
  assert (classes[0:8, 0:8] == shapes_detector.IGNORED).all()
  assert classes[11, 5] == 1 + shapes_scene.COLORS.index("red")
  scene = shapes_detector.detect(image)
  assert [(o.color, o.shape) for o in scene.objects] == [("red", "unknown"),
                                                        ("blue", "unknown")]
  assert shapes_detector.shape_of(shapes_scene.shape_mask("circle", 9)) == "circle"
  with pytest.raises(ValueError, match=r"RGB image \[H, W, 3\]"):
    shapes_detector.detect(np.zeros((32, 32)))


def test_components_are_per_colour_and_8_connected():
  classes = np.zeros((6, 6), np.int32)
  classes[0, 0] = classes[1, 1] = 1      # diagonal neighbours: one component
  classes[0, 2] = 2                       # another colour touching: its own
  classes[4, 4] = classes[4, 5] = 1       # apart: another component
  labels = shapes_detector.components(classes)
  assert labels[0, 0] == labels[1, 1] != labels[0, 2]
  assert labels[4, 4] == labels[4, 5] not in (labels[0, 0], labels[0, 2])
  assert (labels[classes == 0] == 0).all()


# --------------------------------------------------------------------- generation


def _ground_truth(category, split, n=12, seed=0):
  prompts = shapes.prompt_set(category, split, n)
  rng = shapes_scene.rng_for("test/ground_truth", category, split, seed)
  images = [shapes_scene.render(shapes.scene_for(grammar.parse_caption(p), rng, split=split))
            for p in prompts]
  return list(prompts), images


def test_rendered_ground_truth_scores_one_everywhere():
  prompts, images = [], []
  for category in grammar.CATEGORIES:
    for split in shapes.SPLITS:
      p, i = _ground_truth(category, split)
      prompts += p
      images += i
  scores = shapes_metrics.geneval_scores(prompts + ["a purple star"],
                                         images + [images[0]])
  assert scores["unscorable"] == 1
  for split in shapes.SPLITS:
    assert scores[split]["overall"] == 1.0
    assert all(scores[split][c] == 1.0 for c in grammar.CATEGORIES)
    assert scores[split]["num_images"] == {c: 12 for c in grammar.CATEGORIES}


def _perturbed(scene, index, **changes):
  objects = list(scene.objects)
  objects[index] = dataclasses.replace(objects[index], **changes)
  return Scene(tuple(objects), scene.image_size)


def test_perturbed_scenes_score_zero_in_their_category():
  red_sq, blue_ci = obj(2, 2, 7, "red", "square"), obj(2, 20, 9, "blue", "circle")
  pair = Scene((red_sq, blue_ci))
  cases = [
      ("a red square", Scene((red_sq,)), True, "single_object"),
      ("a red square", _perturbed(Scene((red_sq,)), 0, color="green"), False,
       "single_object"),                                                 # wrong colour
      ("a red square", pair, False, "single_object"),                     # extra object
      ("a red square and a red circle",
       Scene((red_sq, obj(2, 20, 9, "red", "circle"))), True, "two_object"),
      ("a red square and a red circle", Scene((red_sq,)), False, "two_object"),  # missing
      ("two red squares", Scene((red_sq, obj(20, 20, 8, "red", "square"))), True,
       "counting"),
      ("three red squares", Scene((red_sq, obj(20, 20, 8, "red", "square"))), False,
       "counting"),                                                      # wrong count
      ("a red square and a blue circle", pair, True, "color_attr"),
      ("a blue square and a red circle", pair, False, "color_attr"),      # swapped binding
      ("a red square left of a blue circle", pair, True, "position"),
      ("a red square right of a blue circle", pair, False, "position"),   # wrong relation
      ("a red square above a blue circle", pair, False, "position"),      # 1 px: no relation
  ]
  for prompt, scene, correct, category in cases:
    assert grammar.parse_caption(prompt).category == category
    assert shapes_metrics.score_scene(prompt, scene) is correct, prompt
    assert shapes_metrics.score_image(prompt, shapes_scene.render(scene)) is correct, prompt
    scores = shapes_metrics.geneval_scores_from_scenes([prompt], [scene])
    assert scores["in_distribution"][category] == float(correct)
    assert scores["in_distribution"]["overall"] == float(correct)
  assert shapes_metrics.score_image("draw me a cat", shapes_scene.render(pair)) is None


def test_one_wrong_image_in_a_set_lowers_only_its_category():
  prompts, images = _ground_truth("position", "heldout", n=4)
  first = shapes_detector.detect(images[0])
  images[0] = shapes_scene.render(Scene(first.objects[:1]))   # drop one object
  more_prompts, more_images = _ground_truth("counting", "heldout", n=4)
  scores = shapes_metrics.geneval_scores(prompts + more_prompts, images + more_images)
  assert scores["heldout"]["position"] == 0.75 and scores["heldout"]["counting"] == 1.0
  assert scores["heldout"]["overall"] == pytest.approx(0.875)
  assert scores["in_distribution"]["overall"] is None


# ------------------------------------------------------------------- VQA, captions


def test_vqa_scores_per_question_type():
  items = []
  for qtype in grammar.QTYPES:
    for _, qa in shapes.vqa_set(qtype, "heldout", 8):
      items.append((qa.question, qa.answer, qa.accepted))
  scores = shapes_metrics.vqa_scores(items)
  assert scores["overall"] == 1.0 and scores["unscorable"] == 0
  assert scores["num_questions"] == {q: 8 for q in grammar.QTYPES}
  wrong = [(q, "yes" if a == "no" else "no", t) if grammar.question_type(q) == "relation"
           else (q, a, t) for q, a, t in items]
  scores = shapes_metrics.vqa_scores(wrong + [("What is it?", "a cat", "a dog")])
  assert scores["relation"] == 0.0 and scores["count"] == 1.0 and scores["unscorable"] == 1
  assert scores["overall"] == pytest.approx(5 / 6)
  pair = Scene((obj(2, 2, 7, "red", "square"), obj(2, 20, 9, "blue", "circle")))
  qa = grammar.answer_question("Describe this image.", pair)
  alt = shapes_metrics.vqa_scores([(qa.question, " a red square and a blue circle ",
                                    qa.accepted)])
  assert alt["describe"] == 1.0 and alt["count"] is None


def test_caption_scores_allow_every_grammar_caption():
  pair = Scene((obj(2, 2, 7, "red", "square"), obj(2, 20, 9, "blue", "circle")))
  scores = shapes_metrics.caption_scores([
      ("a red square left of a blue circle", pair),
      ("a blue circle and a red square", pair),
      ("a red square below a blue circle", pair),
      ("a red square", Scene((obj(2, 2, 7, "red", "square"),))),
  ])
  assert scores == {"match": 0.75, "canonical": 0.5, "num": 4}


def test_think_draw_scores_use_the_true_answer():
  td = shapes.think_draw_set("heldout", 2)
  images = [shapes_scene.render(t.scene) for t in td]
  scores = shapes_metrics.think_draw_scores([(td[0].answer, images[0], td[0].answer),
                                             ("a red square", images[1], td[1].answer)])
  assert scores == {"answer": 0.5, "image": 1.0, "both": 0.5, "num": 2}


# ----------------------------------------------------------------------- figures


def test_bench_figures_count_scenes_and_read_perturbed_images():
  assert shapes_figures.detector_figures(12, 0)["perturbed"] == 12
  options = shapes_scene.validate_options(image_size=16, min_size=5, max_size=6,
                                          colors=["red", "blue"], heldout_pairs=[])
  counts = shapes_figures.scene_counts(options, trials=1000)
  boxes = [(t, c, s) for s in (5, 6) for t in range(17 - s) for c in range(17 - s)]
  apart = sum(not (b[0] < a[0] + a[2] + 2 and a[0] < b[0] + b[2] + 2
                   and b[1] < a[1] + a[2] + 2 and a[1] < b[1] + b[2] + 2)
              for a in boxes for b in boxes)
  assert counts["1"] == 6 * len(boxes) and counts["2"] == 36 * apart // 2
