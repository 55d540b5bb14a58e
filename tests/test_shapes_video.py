"""Shapes video (issue #39 deliverable 5): the simulator, its tasks, the detector-based
protocol and configs/shapes_video.py:tiny end to end (train.py's loop, evaluation,
sample.py)."""
import json
import os

import numpy as np
import pytest

from configs import shapes as shapes_config
from configs import shapes_video as video_config
from mot import config as config_lib
from mot import evaluate, eval_shapes_video, shapes_video_metrics, train_lib
from mot.data import input_pipeline, shapes, shapes_scene
from mot.data import shapes_video as sv
from mot.data import shapes_video_tasks as vt
from mot.errors import ConfigError, InputError
from tests.test_sample_cli import run_sample

OPTIONS = shapes_scene.DEFAULT_OPTIONS
FAMILIES = ("caption", "mixed", "action")


def clips(family, n, start=0):
  return [sv.training_clip(family, k, OPTIONS) for k in range(start, start + n)]


# ----------------------------------------------------------------------- simulator


def test_clips_are_pure_functions_of_their_key():
  for family in FAMILIES:
    a, b = sv.training_clip(family, 7, OPTIONS), sv.training_clip(family, 7, OPTIONS)
    assert a.objects == b.objects and np.array_equal(a.positions, b.positions)
    assert np.array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.frames(), b.frames())
  c, d = sv.eval_clip("action", "heldout", 3, OPTIONS), sv.eval_clip("action", "heldout", 3,
                                                                       OPTIONS)
  assert c.objects == d.objects and np.array_equal(c.positions, d.positions)
  assert len({sv.training_clip("mixed", k, OPTIONS).scene(0) for k in range(20)}) > 15


def test_objects_bounce_off_the_walls():
  # One 10-px box on a 32-px image (largest corner 22): at the left wall moving left 2 px
  # a frame it is reflected (1 -> -1 -> 1) and comes back; at the right wall likewise.
  pos, bounced = sv.simulate([[5, 1]], [[-2, 0]], [10], 32, 5)
  assert pos[0, :, 1].tolist() == [1, 1, 3, 5, 7] and pos[0, :, 0].tolist() == [5] * 5
  assert bounced[0].tolist() == [True, False, False, False]
  pos, _ = sv.simulate([[21, 0]], [[0, 2]], [10], 32, 4)
  assert pos[0, :, 0].tolist() == [21, 21, 19, 17]
  pos, _ = sv.simulate([[0, 20]], [[1, 0]], [10], 32, 5)
  assert pos[0, :, 1].tolist() == [20, 21, 22, 21, 20]


def test_other_objects_keep_their_speed_and_stay_inside():
  for clip in clips("mixed", 40):
    sizes = np.array([o.height for o in clip.objects])
    assert clip.positions.min() >= 0
    assert np.all(clip.positions.max(axis=1) <= 32 - sizes[:, None])
    steps = np.abs(np.diff(clip.positions, axis=1)).sum(-1)     # [N, T-1]
    speed = np.abs(clip.velocities).sum(-1)
    assert np.all(steps[:, 0] == speed)                           # no bounce on step 0
    assert np.all(steps <= speed[:, None])                        # a bounce only shortens
    for i, (vx, vy) in enumerate(clip.velocities):
      assert clip.direction(i) == sv.direction_word((vy, vx))


def test_the_agent_follows_its_actions():
  for clip in clips("action", 30):
    assert clip.agent >= 0 and clip.scene(0).count(*clip.objects[clip.agent].kind) == 1
    moved = np.diff(clip.positions[clip.agent], axis=0)[:, ::-1]   # (dleft, dtop)
    np.testing.assert_array_equal(moved, clip.actions)
    assert {tuple(a) for a in clip.actions.astype(int)} <= set(sv.AGENT_MOVES)
  with pytest.raises(ValueError, match="off the image"):
    sv.simulate([[0, 0]], [[0, 0]], [8], 32, 3, agent=0, actions=[[0, -1], [0, 0]])


def test_every_frame_keeps_the_boxes_apart_and_obeys_the_contract():
  for clip in clips("mixed", 30) + clips("action", 30):
    assert sv.apart(clip.positions, [o.height for o in clip.objects])
    for t in range(clip.num_frames):
      frame = clip.frames()[t]
      assert frame.dtype == np.uint8 and frame.shape == (32, 32, 3)
      colours = {tuple(c) for c in frame.reshape(-1, 3)}
      assert colours <= {(0, 0, 0), *shapes_scene.PALETTE.values()}


def test_heldout_pairs_never_appear_in_training_clips():
  for family in FAMILIES:
    for clip in clips(family, 150):
      assert not OPTIONS.scene_is_heldout(clip.scene(0))
      assert not shapes.is_eval_scene(clip.scene(0))
    for i in range(10):
      assert OPTIONS.scene_is_heldout(sv.eval_clip(family, "heldout", i, OPTIONS).scene(0))
      first = sv.eval_clip(family, "in_distribution", i, OPTIONS).scene(0)
      assert shapes.is_eval_scene(first) and not OPTIONS.scene_is_heldout(first)


# -------------------------------------------------------------------------- tasks


def task_options():
  return input_pipeline.validate(video_config.get_config("tiny").data)


def test_task_layouts():
  options = task_options()
  rng = np.random.default_rng(0)
  tok = options.tokenizer
  gen = vt.build_example("shapes_video_generation", None, 0, options, rng)
  cond_text = tok.decode(gen["tokens"][(gen["cond_mask"] > 0) & (gen["modality"] == 0)])
  assert shapes_video_metrics.parse_caption(cond_text) is not None
  frames = options.num_frames
  assert (gen["dm_mask"] > 0).sum() == 16 * frames            # every frame a target
  qa = vt.build_example("shapes_video_qa", None, 0, options, rng)
  answer = tok.decode(qa["ar_targets"][qa["ar_weights"] > 0][:-1])
  assert answer in (*sv.DIRECTION_NAMES, "0", "1", "2", "3", "4")
  assert (qa["dm_mask"] > 0).sum() == 0
  wm = vt.build_example("shapes_video_world_model", None, 0, options, rng)
  assert (wm["dm_mask"] > 0).sum() == 16 * (frames - options.context_frames)
  assert tok.decode(wm["tokens"][(wm["cond_mask"] > 0) & (wm["modality"] == 0)]).startswith(
      "the agent is the ")
  inv = vt.build_example("shapes_video_inverse_dynamics", None, 0, options, rng)
  assert (inv["dm_mask"] > 0).sum() == frames - 1                # the actions, noised
  assert (inv["modality"][inv["dm_mask"] > 0] == 3).all()
  for name in vt.TASKS:
    assert vt.max_example_length(name, options) <= video_config.get_config("tiny").data.seq_len


def test_training_batches_resume_exactly():
  data = video_config.get_config("tiny").data
  it = iter(input_pipeline.make_train_dataset(data, 0, 2))
  next(it)
  state = it.get_state()
  second = next(it)
  again = iter(input_pipeline.make_train_dataset(data, 0, 2))
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["patches"], second["patches"])
  assert second["patches"].shape == (2, 192, 192)


# ------------------------------------------------------------------------- judges


def test_the_detector_reads_simulated_clips_perfectly():
  options = task_options()
  sets = [eval_shapes_video.clips_for(f, s, 8, options) for f in ("caption", "action")
          for s in shapes.SPLITS]
  real = eval_shapes_video.real_scores([sets[0] + sets[1], sets[2] + sets[3]])
  assert real == {"objects_found": 1.0, "objects_within_1px": 1.0, "frames_exact": 1.0,
                  "agent_found": 1.0, "agent_error_px": 0.0, "agent_within_1px": 1.0,
                  "caption_correct": 1.0}


def test_the_judges_catch_wrong_clips():
  clip = next(c for c in clips("action", 50) if any(np.any(np.abs(a) > 0) for a in c.actions))
  frames = clip.frames()
  shifted = frames.copy()
  shifted[2:] = np.roll(frames[2:], 3, axis=2)           # everything 3 px to the right
  counts = shapes_video_metrics.track_scores(clip, shifted)
  assert counts["frames"] == clip.num_frames and counts["exact"] <= 2
  assert counts["within"] < counts["objects"]
  caption_clip = clips("caption", 1)[0]
  caption = sv.caption(caption_clip)
  backwards = caption_clip.frames()[::-1]
  assert not shapes_video_metrics.caption_scores(caption, backwards)["correct"]
  black = np.zeros_like(backwards)
  assert shapes_video_metrics.caption_scores(caption, black)["types_frames"] == 0.0


# --------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """configs/shapes_video.py:tiny (two-frame clips: fewer programs to compile) trained 2
  steps by train.py's loop, with its end-of-training evaluation on (one item a set)."""
  config = video_config.get_config("tiny")
  config.data.num_frames = 2
  config.data.context_frames = 1
  config.eval_samples_per_digit = 1
  config.eval_set_size = 1
  config.sample.steps = 1
  path = str(tmp_path_factory.mktemp("shapes_video_run"))
  train_lib.train_and_evaluate(config, path)
  return path


def test_training_ends_with_the_protocol_record(trained):
  record = evaluate.read_evaluations(trained)[-1]
  assert record["step"] == 2 and record["shapes_video"]
  for split in shapes.SPLITS:
    assert set(record[split]) == {"generation", "qa", "world_model", "inverse_dynamics",
                                  "real"}
    assert set(record[split]["qa"]) == {*sv.QTYPES, "overall"}
    assert record[split]["real"]["frames_exact"] == 1.0
  for key in ("caption_clip_accuracy", "qa_accuracy", "inverse_dynamics_step_accuracy"):
    assert 0.0 <= record[key] <= 1.0
  for key in ("grid", "gif", "world_model_gif"):
    assert os.path.exists(record[key])
  assert evaluate.format_result(record).startswith("step 2: caption->clip")


def test_sample_py_generates_clips_and_refuses_actions(trained, tmp_path):
  out = tmp_path / "clips"
  run_sample(trained, "generate", prompts=["a red circle moving left"], num_samples=1,
             out=str(out), steps=1)
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["samples"][0]["file"].endswith(".gif")
  gif = str(out / manifest["samples"][0]["file"])
  with pytest.raises(InputError, match="eval_shapes_video.predict_clips") as e:
    run_sample(trained, "generate", images=[gif], actions="right,up", out=str(tmp_path / "a"))
  assert "\n" not in str(e.value)


# ----------------------------------------------------------------------- bad input


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.data.shapes, "colors", ("red", "purple")), "unknown colour 'purple'"),
    (lambda c: setattr(c.data, "context_frames", 3), "context_frames=3"),
    (lambda c: setattr(c.data, "num_frames", 1), "num_frames=1"),
    (lambda c: setattr(c.data, "video_layout", "clip"), "frame by frame"),
    (lambda c: setattr(c.data.task_weights, "shapes_vqa", 1.0), "makes shapes examples"),
])
def test_bad_config_fields_are_one_line_errors(change, message):
  config = video_config.get_config("tiny")
  change(config)
  with pytest.raises(ConfigError, match=message) as e:
    config_lib.validate(config)
  assert "\n" not in str(e.value)


def test_video_tasks_are_refused_on_the_image_scenes():
  config = shapes_config.get_config("tiny")
  config.data.task_weights.shapes_video_qa = 1.0
  with pytest.raises(ConfigError, match="dataset='shapes_video'"):
    config_lib.validate(config)
