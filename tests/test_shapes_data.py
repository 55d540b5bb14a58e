"""Tests for the Shapes scene contract, grammar, training streams and evaluation sets."""
import collections
import itertools

import numpy as np
import pytest

from mot import tokenizer as tok
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_order
from mot.data import shapes_scene
from mot.data import shapes_tasks
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject

OPTIONS = shapes_scene.DEFAULT_OPTIONS
HELDOUT_WORDS = [f"{c} {s}" for c, s in shapes_scene.HELDOUT_PAIRS]


def obj(top, left, size, color, shape):
  return SceneObject(top, left, size, size, color, shape)


def separated(a, b):
  rows = b.top >= a.top + a.height + 2 or a.top >= b.top + b.height + 2
  cols = b.left >= a.left + a.width + 2 or a.left >= b.left + b.width + 2
  return rows or cols


# ------------------------------------------------------------------------ contract


def test_shape_masks_follow_the_written_rules():
  tri7 = ["...#...", "..###..", "..###..", ".#####.", ".#####.", "#######", "#######"]
  disc7 = ["..###..", ".#####.", "#######", "#######", "#######", ".#####.", "..###.."]
  for shape, rows in (("triangle", tri7), ("circle", disc7)):
    want = np.array([[ch == "#" for ch in r] for r in rows])
    np.testing.assert_array_equal(shapes_scene.shape_mask(shape, 7), want)
  np.testing.assert_array_equal(shapes_scene.shape_mask("triangle", 8).sum(1),
                                [2, 2, 4, 4, 6, 6, 8, 8])
  for s in range(5, 17):
    for shape in shapes_scene.SHAPES:
      m = shapes_scene.shape_mask(shape, s)
      assert m.any(0).all() and m.any(1).all(), (shape, s)  # touches all four sides
      np.testing.assert_array_equal(m, m[:, ::-1])         # left-right symmetric
    assert np.all(np.diff(shapes_scene.shape_mask("triangle", s).sum(1)) >= 0)
  with pytest.raises(ValueError, match="unknown shape"):
    shapes_scene.shape_mask("star", 7)


def test_render_draws_flat_palette_colours_on_black():
  scene = Scene((obj(2, 3, 7, "red", "triangle"), obj(20, 18, 10, "cyan", "circle")))
  image = shapes_scene.render(scene)
  assert image.shape == (32, 32, 3) and image.dtype == np.uint8
  colours = {tuple(p) for p in image.reshape(-1, 3)}
  assert colours == {(0, 0, 0), (255, 0, 0), (0, 255, 255)}
  red = (image == (255, 0, 0)).all(-1)
  np.testing.assert_array_equal(red[2:9, 3:10], shapes_scene.shape_mask("triangle", 7))
  assert red.sum() == shapes_scene.shape_mask("triangle", 7).sum()
  assert (image[20, 18] == 0).all() and (image[25, 18] == (0, 255, 255)).all()
  with pytest.raises(ValueError, match="inside the 32x32"):
    shapes_scene.render(Scene((obj(25, 0, 11, "red", "square"),)))


def test_layouts_keep_boxes_apart_and_inside():
  rng = shapes_scene.rng_for("test/layout", 0)
  for _ in range(200):
    scene = shapes_scene.place([("red", "square")] * 4, rng,
                               shapes_scene.ShapesOptions(min_size=11, max_size=11))
    assert len(scene.objects) == 4
    for o in scene.objects:
      assert 0 <= o.top <= 32 - o.height and 0 <= o.left <= 32 - o.width
    for a, b in itertools.combinations(scene.objects, 2):
      assert separated(a, b), (a, b)


def test_training_stream_is_a_pure_function_of_seed_and_index():
  a = [shapes.training_scene(3, i) for i in range(20)]
  assert a == list(itertools.islice(shapes.training_scenes(3), 20))
  assert a[5:] == list(itertools.islice(shapes.training_scenes(3, start=5), 15))
  assert a != [shapes.training_scene(4, i) for i in range(20)]
  assert len({s.key() for s in a}) == 20
  assert shapes.generation_example(1, 7) == shapes.generation_example(1, 7)
  assert shapes.vqa_example(1, 7) == shapes.vqa_example(1, 7)
  assert shapes.think_draw_example(1, 7) == shapes.think_draw_example(1, 7)
  kinds = {len(s.objects) for s in a}
  assert kinds >= {1, 2}


def _texts_and_scenes(index):
  caption, scene = shapes.generation_example(0, index)
  yield caption, scene
  scene, qa = shapes.vqa_example(0, index)
  yield qa.question + " " + qa.answer, scene
  scene, caption = shapes.caption_example(0, index)
  yield caption, scene
  td = shapes.think_draw_example(0, index)
  yield td.prompt + " " + td.answer, td.context
  yield td.answer, td.scene
  yield shapes.text_example(0, index), Scene(())


def test_no_heldout_pair_in_any_training_example():
  for i in range(300):
    for text, scene in _texts_and_scenes(i):
      assert not OPTIONS.scene_is_heldout(scene), (i, scene)
      assert not any(w in text for w in HELDOUT_WORDS), (i, text)
      assert not shapes.is_eval_scene(scene) or not scene.objects, (i, scene)
  assert shapes.training_scene(0, 0) != shapes.training_scene(0, 1)


def test_generation_examples_are_captioned_by_their_scene():
  categories = set()
  for i in range(200):
    caption, scene = shapes.generation_example(2, i)
    req = grammar.parse_caption(caption)
    assert caption in grammar.captions(scene), (caption, scene)
    categories.add(req.category)
    scene, canonical = shapes.caption_example(2, i)
    assert canonical == grammar.captions(scene)[0]
  assert categories == set(grammar.CATEGORIES)


def test_evaluation_sets_are_fixed_split_and_held_out():
  for qtype in grammar.QTYPES:
    small = shapes.vqa_set(qtype, "heldout", 8)
    assert small == shapes.vqa_set(qtype, "heldout", 16)[:8]  # a prefix, independent of n
    for split in shapes.SPLITS:
      for scene, qa in shapes.vqa_set(qtype, split, 16):
        assert qa.qtype == qtype and grammar.answer_question(qa.question, scene) == qa
        assert OPTIONS.scene_is_heldout(scene) == (split == "heldout")
        assert split == "heldout" or shapes.is_eval_scene(scene)
  about_heldout = [qa for scene, qa in shapes.vqa_set("color", "heldout", 16)
                   if OPTIONS.is_heldout(scene.objects[qa.objects[0]].kind)]
  assert len(about_heldout) == 16  # a held-out item asks about its held-out object
  for split in shapes.SPLITS:
    for td in shapes.think_draw_set(split, 16):
      req = grammar.parse_caption(td.answer)
      assert req.is_heldout() == (split == "heldout")
      assert grammar.answer_draw(td.prompt, td.context).answer == td.answer
      assert td.answer in grammar.captions(td.scene)
    assert all(grammar.captions(s) for s in shapes.caption_set(split, 16))


def test_vqa_answers_are_balanced():
  for qtype in ("count", "count_color", "color", "shape", "relation"):
    for split in shapes.SPLITS:
      space = shapes.answer_space(qtype, heldout=split == "heldout")
      answers = [qa.answer for _, qa in shapes.vqa_set(qtype, split, 2 * len(space))]
      assert sorted(answers) == sorted(space * 2), (qtype, split)
  assert shapes.answer_space("count_color", heldout=True) == ("1", "2", "3", "4")
  assert shapes.answer_space("color", heldout=True) == ("blue", "yellow", "magenta")
  assert shapes.answer_space("describe") is None
  counts = collections.Counter(shapes.vqa_example(0, i, qtype="count_color")[1].answer
                               for i in range(200))
  assert set(counts) == {"0", "1", "2", "3", "4"} and max(counts.values()) < 70
  qtypes = collections.Counter(shapes.vqa_example(1, i)[1].qtype for i in range(300))
  assert set(qtypes) == set(grammar.QTYPES) and min(qtypes.values()) > 25
  one = shapes_scene.validate_options(max_objects=1)
  assert "relation" not in shapes.available_qtypes(one)
  assert {shapes.vqa_example(0, i, one)[1].qtype for i in range(30)} <= set(
      shapes.available_qtypes(one))


def test_prompt_sets_cover_each_category_and_split():
  for category in grammar.CATEGORIES:
    for split in shapes.SPLITS:
      prompts = shapes.prompt_set(category, split, 40)
      assert len(prompts) == 40 and prompts == shapes.prompt_set(category, split, 40)
      reqs = [grammar.parse_caption(p) for p in prompts]
      assert all(r.category == category for r in reqs)
      assert all(r.is_heldout() == (split == "heldout") for r in reqs)
      distinct = len(shapes.category_requirements(category, split))
      assert len(set(prompts)) == min(40, distinct)
  assert len(shapes.category_requirements("single_object", "in_distribution")) == 15
  assert len(shapes.category_requirements("position", "heldout")) == 384
  with pytest.raises(ValueError, match="unknown split"):
    shapes.prompt_set("counting", "test")


def test_eval_shard_is_about_one_in_eight():
  rng = shapes_scene.rng_for("test/shard", 0)
  hits = [shapes.is_eval_scene(shapes_scene.sample_scene(rng, "mixed")) for _ in range(800)]
  assert 60 < sum(hits) < 140


# ------------------------------------------------------------------------- options


def test_default_options_validate():
  assert shapes_scene.validate_options() == OPTIONS
  small = shapes_scene.validate_options(image_size=16, min_size=5, max_size=7,
                                        colors=["red", "blue"], shapes=["square", "circle"],
                                        heldout_pairs=[("red", "circle")])
  assert small.training_types == (("red", "square"), ("blue", "square"), ("blue", "circle"))
  scene = shapes.training_scene(0, 0, small)
  assert scene.image_size == 16 and all(o.kind in small.training_types for o in scene.objects)


@pytest.mark.parametrize("fields, pattern", [
    (dict(colors=["red", "orange"]), r"config\.data\.shapes\.colors=.*unknown colour 'orange'"),
    (dict(shapes=["square", "star"]), r"config\.data\.shapes\.shapes=.*unknown shape 'star'"),
    (dict(max_size=16), r"config\.data\.shapes\.max_size=16 cannot fit 4 objects.*lower it "
                        r"to 15"),
    (dict(image_size=20), r"config\.data\.shapes\.max_size=11 cannot fit"),
    (dict(min_size=3), r"config\.data\.shapes\.min_size=3 must be an integer in \[5, 32\]"),
    (dict(max_objects=5), r"config\.data\.shapes\.max_objects=5 must be an integer in \[1, 4\]"),
    (dict(heldout_pairs=[("blue", "hexagon")]), r"heldout_pairs=.*not a \(colour, shape\)"),
    (dict(colors=["red"], heldout_pairs=[("red", "circle")]),
     r"heldout_pairs=.*no training object of colour 'red'"),
    (dict(colors=[]), r"colors=\[\] must be a non-empty list"),
    (dict(heldout_pairs=None), r"heldout_pairs=None must be a list of \(colour, shape\) pairs"),
    (dict(colors=["red", "red"]), r"repeats a colour"),
])
def test_bad_options_raise_one_line(fields, pattern):
  with pytest.raises(ValueError, match=pattern) as e:
    shapes_scene.validate_options(**fields)
  assert "\n" not in str(e.value)


def test_a_task_with_nothing_to_ask_is_refused_in_one_line():
  """One-object scenes have no relation: the tasks that need one are refused when the
  data is validated, naming the task and the fix, instead of failing inside grain."""
  from configs import shapes as shapes_config
  from mot.data import input_pipeline
  config = shapes_config.get_config("tiny")
  config.data.shapes.max_objects = 1
  with pytest.raises(ValueError, match=r"task 'shapes_text' cannot draw an example .*"
                     r"set config\.data\.task_weights\.shapes_text to 0") as e:
    input_pipeline.validate(config.data)
  assert "\n" not in str(e.value)
  config.data.task_weights.shapes_text = 0.0
  input_pipeline.validate(config.data)
  config.data.task_weights.shapes_order = 0.1
  with pytest.raises(ValueError, match="task 'shapes_order' cannot draw an example"):
    input_pipeline.validate(config.data)


def test_one_object_options_allow_large_sizes():
  options = shapes_scene.validate_options(max_size=20, max_objects=1)
  scene = shapes.training_scene(0, 3, options)
  assert len(scene.objects) == 1


# ------------------------------------------------------------------------- grammar


def test_captions_by_scene():
  red_sq, blue_ci = obj(2, 2, 7, "red", "square"), obj(2, 20, 9, "blue", "circle")
  assert grammar.captions(Scene((red_sq,))) == ("a red square",)
  twins = Scene((red_sq, obj(20, 20, 8, "red", "square")))
  assert grammar.captions(twins) == ("two red squares",)
  pair = Scene((red_sq, blue_ci))  # centres x 5 vs 24 (left of), y 5 vs 6 (no vertical)
  assert grammar.captions(pair) == (
      "a red square left of a blue circle", "a blue circle and a red square",
      "a blue circle right of a red square", "a red square and a blue circle")
  # Vertical only: x 5 vs 6 (< 3 apart), the circle is below.
  stacked = Scene((red_sq, obj(12, 2, 9, "blue", "circle")))
  assert grammar.caption(stacked) == "a red square above a blue circle"
  assert "a blue circle below a red square" in grammar.captions(stacked)
  assert not any("left" in c or "right" in c for c in grammar.captions(stacked))
  mixed = Scene((red_sq, blue_ci, obj(20, 2, 7, "red", "triangle")))
  assert grammar.captions(mixed) == () and grammar.caption(mixed) is None
  unknown = Scene((SceneObject(2, 2, 7, 7, "red", "unknown"),))
  assert grammar.captions(unknown) == ()


def test_relation_margin_is_three_pixels():
  a = obj(0, 0, 7, "red", "square")                 # centre x 3
  for left, width, holds in ((5, 1, False), (5, 2, False), (6, 1, True), (5, 3, True)):
    b = SceneObject(20, left, 7, width, "blue", "circle")  # centre x left + (width - 1) / 2
    assert grammar.relation_holds(a, b, "left of") == holds, left
    assert grammar.relation_holds(b, a, "right of") == holds


def test_parse_inverts_caption_text_and_rejects_the_rest():
  reqs = grammar.all_requirements(OPTIONS.all_types)
  assert len(reqs) == 18 + 54 + 18 * 17 * 5
  for req in reqs:
    assert grammar.parse_caption(grammar.caption_text(req)) == req
  for text in ("a red square and a red square", "one red square", "a purple square",
               "two red square", "a red squares", "a red square.", "five red squares",
               "a red square near a blue circle", "A red square", ""):
    assert grammar.parse_caption(text) is None, text
  assert grammar.parse_caption(" a red square\n") == grammar.Requirement((("red", "square", 1),))


def test_satisfies_agrees_with_captions():
  reqs = grammar.all_requirements(OPTIONS.all_types)
  rng = shapes_scene.rng_for("test/satisfies", 0)
  for i in range(40):
    scene = shapes_scene.sample_scene(rng, shapes_scene.KINDS[i % 3], heldout=i % 2 == 1)
    texts = {grammar.caption_text(r) for r in reqs if grammar.satisfies(scene, r)}
    assert texts == set(grammar.captions(scene)) and texts, scene


def test_answers_and_well_definedness():
  scene = Scene((obj(2, 2, 7, "red", "square"), obj(2, 20, 9, "blue", "circle"),
                 obj(20, 4, 8, "red", "circle")))
  def answer(q):
    qa = grammar.answer_question(q, scene)
    return None if qa is None else qa.answer
  assert answer("How many objects are there?") == "3"
  assert answer("How many red objects are there?") == "2"
  assert answer("How many green objects are there?") == "0"
  assert answer("What color is the square?") == "red"
  assert answer("What color is the circle?") is None        # two circles
  assert answer("What color is the triangle?") is None      # none
  assert answer("What shape is the blue object?") == "circle"
  assert answer("What shape is the red object?") is None    # two red objects
  assert answer("Is the red square left of the blue circle?") == "yes"
  assert answer("Is the blue circle left of the red square?") == "no"
  assert answer("Is the red square above the red circle?") == "yes"
  assert answer("Is the red square above the blue circle?") is None  # 1 px apart in y
  assert answer("Is the red square left of the red square?") is None
  assert answer("Describe this image.") is None             # no caption fits
  assert answer("What is this?") is None
  qas = grammar.questions(scene)
  assert {q.qtype for q in qas} == set(grammar.QTYPES) - {"describe"}
  assert all(grammar.question_type(q.question) == q.qtype for q in qas)
  single = Scene((obj(2, 2, 7, "red", "square"),))
  describe = grammar.answer_question("Describe this image.", single)
  assert describe.answer == "a red square" and describe.accepted == ("a red square",)


def test_think_then_draw():
  scene = Scene((obj(2, 2, 7, "red", "circle"), obj(2, 20, 9, "yellow", "square")))
  def answer(prompt):
    d = grammar.answer_draw(prompt, scene)
    return None if d is None else d.answer
  assert answer("draw three of the shape that is red:") == "three red circles"
  assert answer("draw the shape that is yellow:") == "a yellow square"
  assert answer("draw a circle in the color of the square:") == "a yellow circle"
  assert answer("draw a square in the color of the square:") is None
  assert answer("draw the shape that is blue:") is None
  assert answer("draw three blue circles") is None
  prompts = {d.prompt for d in grammar.draw_prompts(scene)}
  assert "draw four of the shape that is yellow:" in prompts and len(prompts) == 12


def test_texts_fit_the_byte_tokenizer():
  lengths = shapes.max_text_tokens()
  assert lengths == {"caption": 45, "question": 53, "answer": 45, "draw_prompt": 43,
                     "draw_answer": 23, "text": 96}
  t = tok.ByteTokenizer()
  for req in grammar.all_requirements(OPTIONS.all_types):
    text = grammar.caption_text(req)
    assert text.isascii() and t.decode(t.encode(text, eos=True)) == text


def test_more_questions_are_distinct_true_answers_about_the_same_scene():
  for index in range(40):
    scene, first = shapes.vqa_example(0, index)
    more = shapes.more_questions(0, index, scene, first, 3)
    assert more == shapes.more_questions(0, index, scene, first, 3)   # pure
    questions = [first.question] + [qa.question for qa in more]
    assert len(set(questions)) == len(questions) and len(more) <= 3
    for qa in more:
      assert qa.qtype != "describe"
      assert grammar.answer_question(qa.question, scene).answer == qa.answer
  one_object = Scene((SceneObject(4, 4, 9, 9, "red", "square"),))
  first = grammar.answer_question(grammar.COUNT_QUESTION, one_object)
  more = shapes.more_questions(0, 0, one_object, first, 16)
  expected = {q.question for q in grammar.questions(one_object, OPTIONS.colors)
              if q.qtype != "describe"} - {first.question}
  assert {qa.question for qa in more} == expected   # runs out without repeating


def test_a_vqa_example_asks_vqa_questions_of_one_image():
  from configs import shapes as shapes_config
  from mot.data import shapes_tasks
  config = shapes_config.get_config("tiny")
  one = shapes_tasks.validate(config.data)
  config.data.vqa_questions = 3
  three = shapes_tasks.validate(config.data)
  a, b = (shapes_tasks.TASKS["shapes_vqa"].build(None, 7, o, 0) for o in (one, three))
  n = len(a["tokens"])
  for name in ("tokens", "ar_weights", "patches", "modality"):   # the same first turn
    np.testing.assert_array_equal(a[name], b[name][:n])
  np.testing.assert_array_equal(a["ar_targets"][:n - 1], b["ar_targets"][:n - 1])
  eos = tok.BYTE_TOKENIZER.eos_id
  assert list(a["tokens"]).count(eos) == 1 and list(b["tokens"]).count(eos) == 3
  assert (b["modality"][n:] == 0).all()                             # text after the image
  assert len(b["tokens"]) <= shapes_tasks.max_example_length("shapes_vqa", three)
  config.data.vqa_questions = 0
  with pytest.raises(ValueError, match=r"vqa_questions=0 must be an integer in \[1, 16\]"):
    shapes_tasks.validate(config.data)


def test_word_list_covers_every_text_the_tasks_write():
  """Under the "bytes+shapes" tokenizer no letter of any task's text falls back to bytes:
  every word the grammar writes is on shapes_grammar.WORDS. The order curriculum's
  question (outside the grammar) spells "Which", "other" and "or" in bytes: adding them
  would renumber every word's id (the list is sorted) and so every checkpoint's."""
  words = tok.load("bytes+shapes", 358)
  options = shapes_tasks.ShapesTaskOptions(8, 192, shapes_scene.DEFAULT_OPTIONS, words, 3)
  letters = {tok.BYTE_OFFSET + b for b in range(256) if chr(b).isalpha()}
  rng = np.random.default_rng(0)
  for task in shapes_tasks.TASKS:
    for _ in range(100):
      ex = shapes_tasks.build_example(task, None, None, options, rng)
      ids = ex["ar_targets"][ex["ar_weights"] > 0] if task == "shapes_order" else ex["tokens"]
      assert not letters & set(ids.tolist()), task  # (the order task: its answers)
    # The longest-example bound holds with the shorter ids too.
    assert max(len(shapes_tasks.build_example(task, None, None, options, rng)["tokens"])
               for _ in range(50)) <= shapes_tasks.max_example_length(task, options)


# ------------------------------------------------------------------- order curriculum


def test_order_questions_name_the_object_the_relation_puts_first():
  red = obj(2, 2, 7, "red", "circle")          # centre (5, 5)
  blue = obj(20, 20, 7, "blue", "square")      # centre (23, 23)
  got = {qa.question: qa.answer for qa in shapes_order.order_questions(Scene((red, blue)))}
  want = {"left of": "red circle", "right of": "blue square", "above": "red circle",
          "below": "blue square"}
  assert got == {shapes_order.question_text(r, *names): want[r] for r in grammar.RELATIONS
                 for names in ((red.kind, blue.kind), (blue.kind, red.kind))}
  # Within the margin on an axis: no question on it; a repeated kind is never named.
  level = obj(3, 20, 7, "blue", "square")      # centre (23, 6): 1 px below the red one
  got = [qa.question for qa in shapes_order.order_questions(Scene((red, level)))]
  assert got and not any(" above " in q or " below " in q for q in got)
  twin = obj(20, 2, 7, "red", "circle")
  assert all("red circle" not in qa.question
             for qa in shapes_order.order_questions(Scene((red, blue, twin))))


def test_order_examples_are_training_scenes_with_distinct_true_answers():
  options = shapes_scene.DEFAULT_OPTIONS
  for index in range(40):
    scene, qas = shapes_order.order_example(0, index, 3, options)
    assert (scene, qas) == shapes_order.order_example(0, index, 3, options)
    assert 1 <= len(qas) <= 3 and len({qa.question for qa in qas}) == len(qas)
    assert not any(options.is_heldout(o.kind) for o in scene.objects)
    assert not shapes.is_eval_scene(scene)
    for qa in qas:
      i, j = qa.objects
      relation = next(r for r in grammar.RELATIONS if f" {r} " in qa.question)
      first = i if grammar.relation_holds(scene.objects[i], scene.objects[j], relation) else j
      assert qa.answer == " ".join(scene.objects[first].kind)
