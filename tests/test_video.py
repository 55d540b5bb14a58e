"""Moving digits: clips, video/action layouts and M-RoPE positions, the world model's
cached sampling, Pipeline/sample.py on clips, the video evaluation and a tiny training run.

Model tests use random parameters of configs/moving_digits.py:tiny (3-frame clips), as
tests/test_sampling.py does for images: layouts and numerics, not sample quality.
"""
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from mot import (config_upgrade, eval_video, evaluate, media, modalities, pipeline, sampling,
                 tokenizer)
from mot.errors import InputError
from mot.data import digits, moving_digits, tasks
from mot.data import input_pipeline
from mot.model import inputs_from_batch
from tests.test_sampling import _as_batch, random_params
from tests.test_sample_cli import run_sample, write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P = 4          # patch size of configs/moving_digits.py
G = 16 // P    # patches per frame side


def _digit(i=0):
  return digits.load_digits_split()[0][i]


# ----------------------------------------------------------------------------------------
# Clips.
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", moving_digits.DIRECTION_NAMES)
def test_constant_clip_moves_one_pixel_a_frame_on_the_canvas(direction):
  image = _digit(3)
  clip = moving_digits.constant_clip(image, direction, np.random.default_rng(0))
  assert clip.frames.shape == (8, 16, 16) and clip.actions.shape == (7, 2)
  dx, dy = moving_digits.DIRECTIONS[direction]
  np.testing.assert_array_equal(clip.actions, np.tile([dx, dy], (7, 1)))
  for f, (r, c) in enumerate(clip.offsets):
    assert 0 <= r <= 8 and 0 <= c <= 8
    np.testing.assert_array_equal(clip.frames[f, r:r + 8, c:c + 8], image)
    assert np.sum(clip.frames[f] > -1) == np.sum(image > -1)  # nothing else drawn
  np.testing.assert_array_equal(np.diff(clip.offsets, axis=0), np.tile([dy, dx], (7, 1)))
  # The judge measures the commanded motion exactly on real clips.
  px = digits.to_pixels(clip.frames)[None]
  assert eval_video.motion_error(px, clip.actions[None]) < 1e-9
  assert eval_video.motion_error(px, -clip.actions[None]) > 1.0


def test_clips_are_deterministic_and_random_walks_stay_on_the_canvas():
  image = _digit(5)
  a = moving_digits.random_walk_clip(image, np.random.default_rng(7))
  b = moving_digits.random_walk_clip(image, np.random.default_rng(7))
  np.testing.assert_array_equal(a.frames, b.frames)
  for seed in range(30):
    clip = moving_digits.random_walk_clip(image, np.random.default_rng(seed))
    assert clip.offsets.min() >= 0 and clip.offsets.max() <= 8
    np.testing.assert_array_equal(np.diff(clip.offsets, axis=0), clip.actions[:, ::-1])
    assert np.all(np.abs(clip.actions).sum(axis=1) == 1)


def _first_frame_offset(example, image):
  """(row, col) of `image` in the first frame of a video example."""
  video = example["patches"][example["modality"] == modalities.VIDEO]
  frame = digits.unpatchify(video[:G * G].reshape(G, G, -1), P)
  hits = [(r, c) for r in range(9) for c in range(9)
          if np.array_equal(frame, moving_digits.render(image, [(r, c)])[0])]
  assert len(hits) == 1, hits
  return hits[0]


def test_generation_clips_start_on_the_patch_grid_only_when_asked():
  image = _digit(2)

  def starts(task, start):
    options = tasks.TaskOptions(patch_size=P, patch_dim=16, generation_start=start)
    return {_first_frame_offset(tasks.build_video_example(
        task, image, 2, options, np.random.default_rng(seed)), image) for seed in range(60)}

  on_grid = starts("video_generation", "grid")
  assert all(r % P == 0 and c % P == 0 for r, c in on_grid)
  assert len(on_grid) > 3                      # several grid starts (all four directions)
  for task, start in (("video_generation", "any"), ("world_model", "grid")):
    assert any(r % P or c % P for r, c in starts(task, start)), (task, start)
  data = _tiny_config().data
  data.generation_start = "centre"
  with pytest.raises(ValueError, match="generation_start"):
    input_pipeline.validate(data)


def test_moving_digits_train_only_on_the_training_digits():
  from configs import moving_digits as config_file
  data = config_file.get_config("").data
  train = input_pipeline.train_pairs(data)
  held = input_pipeline.heldout_pairs(data)
  assert len(train) == 1500 and len(held) == 297
  np.testing.assert_array_equal(train.images, digits.load_digits_split()[0])


def test_parse_actions(tmp_path):
  np.testing.assert_array_equal(moving_digits.parse_actions("right, up,stay,LEFT"),
                                [[1, 0], [0, -1], [0, 0], [-1, 0]])
  path = tmp_path / "a.json"
  path.write_text("[[1, 0], [0, 1]]")
  np.testing.assert_array_equal(moving_digits.parse_actions(str(path)), [[1, 0], [0, 1]])
  np.save(tmp_path / "a.npy", np.ones((3, 2)))
  assert moving_digits.parse_actions(str(tmp_path / "a.npy")).shape == (3, 2)
  for bad in ("right,sideways", "", str(tmp_path / "missing.json")):
    with pytest.raises(ValueError):
      moving_digits.parse_actions(bad)
  np.save(tmp_path / "b.npy", np.ones((3, 3)))
  with pytest.raises(ValueError, match=r"\[K, 2\]"):
    moving_digits.parse_actions(str(tmp_path / "b.npy"))


# ----------------------------------------------------------------------------------------
# Layouts and positions (docs/design.md §2).
# ----------------------------------------------------------------------------------------
OPTIONS = tasks.TaskOptions(patch_size=P, patch_dim=16, num_frames=8, canvas=16,
                            video_layout="clip")
FRAME_OPTIONS = tasks.TaskOptions(patch_size=P, patch_dim=16, num_frames=8, canvas=16)
VIDEO_TASKS = ("video_generation", "video_qa", "world_model", "inverse_dynamics")


def _block(example, block_id):
  return np.flatnonzero(example["block_ids"] == block_id)


def test_video_positions_follow_design():
  clip = moving_digits.constant_clip(_digit(0), "right", np.random.default_rng(0))
  ex = tasks.TASKS["video_qa"].build(clip, 0, OPTIONS, 0)
  idx = _block(ex, 1)
  assert len(idx) == 8 * G * G
  assert np.all(ex["modality"][idx] == modalities.VIDEO)
  begin = idx[0] - 1
  assert ex["tokens"][begin] == modalities.get("video").begin_token
  s = ex["positions"][begin, 0] + 1     # the block starts after its begin marker
  pos = ex["positions"][idx].reshape(8, G, G, 3)
  f, r, c = np.meshgrid(np.arange(8), np.arange(G), np.arange(G), indexing="ij")
  np.testing.assert_array_equal(pos[..., 0], s + f)   # t advances one per frame
  np.testing.assert_array_equal(pos[..., 1], s + r)   # h per patch row
  np.testing.assert_array_equal(pos[..., 2], s + c)   # w per patch column
  end = idx[-1] + 1
  assert ex["tokens"][end] == modalities.get("video").end_token
  np.testing.assert_array_equal(ex["positions"][end], [pos.max() + 1] * 3)  # max + 1
  # The frames' patches are the clip's, frame by frame.
  np.testing.assert_array_equal(ex["patches"][idx].reshape(8, G, G, 16),
                                digits.patchify(clip.frames, P))


def test_world_model_layout_positions_and_one_generated_block():
  clip = moving_digits.random_walk_clip(_digit(1), np.random.default_rng(3))
  ex = tasks.TASKS["world_model"].build(clip, 1, OPTIONS, 0)
  first, act, rest = _block(ex, 1), _block(ex, 2), _block(ex, 3)
  assert len(first) == G * G and len(act) == 7 and len(rest) == 7 * G * G
  assert np.all(ex["modality"][act] == modalities.ACTION)
  np.testing.assert_array_equal(ex["patches"][act, :2], clip.actions)
  assert np.all(ex["patches"][act, 2:] == 0)
  s = ex["positions"][act[0] - 1, 0] + 1
  np.testing.assert_array_equal(ex["positions"][act], np.stack(
      [s + np.arange(7), np.full(7, s), np.full(7, s)], -1))   # t per step, h = w = s
  np.testing.assert_array_equal(ex["positions"][first[-1] + 1],        # end marker: max + 1
                                [ex["positions"][first].max() + 1] * 3)
  np.testing.assert_array_equal(ex["positions"][act[-1] + 1], [s + 7] * 3)  # chunk max + 1
  np.testing.assert_array_equal(np.flatnonzero(ex["dm_mask"]), rest)  # only the rest noised
  assert ex["cond_mask"][first].all() and ex["cond_mask"][act].all()


def test_frame_layout_is_teacher_forced_frame_by_frame():
  """Layout "frames": frame k noised, then frame k clean at the same positions; a noised
  frame reads the clean frames before it and no noised frame; positions are one clip's
  (docs/design.md §2), the world model's first frame opening it."""
  clip = moving_digits.random_walk_clip(_digit(1), np.random.default_rng(3))
  assert tasks.TaskOptions(patch_size=P, patch_dim=16).video_layout == "frames"  # default
  ex = tasks.TASKS["world_model"].build(clip, 1, FRAME_OPTIONS, 0)
  act, first = _block(ex, 1), _block(ex, 2)
  frames = [_block(ex, k) for k in range(3, 3 + 13)]   # 6 forced pairs + the last frame
  assert _block(ex, 16).size == 0 and all(len(f) == G * G for f in frames)
  assert len(act) == 7 and np.all(ex["modality"][act] == modalities.ACTION)
  noised, clean = frames[0::2], frames[1::2]
  assert len(noised) == 7 and len(clean) == 6
  truth = digits.patchify(clip.frames, P).reshape(8, G * G, 16)
  s = ex["positions"][first[0], 0]
  grid = np.stack(np.meshgrid(np.arange(G), np.arange(G), indexing="ij"), -1).reshape(-1, 2)
  at = lambda k: np.concatenate([np.full((G * G, 1), s + k), s + grid], -1)
  np.testing.assert_array_equal(ex["positions"][first], at(0))
  np.testing.assert_array_equal(ex["patches"][first], truth[0])
  assert ex["cond_mask"][first].all() and ex["cond_mask"][act].all()
  for k, idx in enumerate(noised):
    assert np.all(ex["dm_mask"][idx] == 1) and not ex["cond_mask"][idx].any()
    np.testing.assert_array_equal(ex["positions"][idx], at(k + 1))  # t advances per frame
    np.testing.assert_array_equal(ex["patches"][idx], truth[k + 1])
  for k, idx in enumerate(clean):
    assert not ex["dm_mask"][idx].any() and not ex["cond_mask"][idx].any()
    np.testing.assert_array_equal(ex["positions"][idx], at(k + 1))
    np.testing.assert_array_equal(ex["patches"][idx], truth[k + 1])
  assert ex["dm_mask"].sum() == 7 * G * G
  end = frames[-1][-1] + 1                               # one end marker: max + 1
  assert ex["tokens"][end] == modalities.get("video").end_token
  np.testing.assert_array_equal(ex["positions"][end], [s + 8] * 3)
  # Who reads whom (the model's own mask rule).
  from mot import masks
  n = len(ex["tokens"])
  ids = masks.MaskIds.from_fields(jnp.ones((1, n), jnp.int32), jnp.asarray(ex["block_ids"])[None],
                                  jnp.asarray(ex["dm_mask"] > 0)[None])
  allowed = np.asarray(masks.attention_mask(ids, ids))[0, 0]
  for k, q in enumerate(noised):
    sees = lambda idx: allowed[np.ix_(q, idx)]
    assert sees(first).all() and sees(act).all()
    assert all(sees(c).all() for c in clean[:k])          # the true earlier frames
    assert not any(sees(c).any() for c in clean[k:])      # not itself clean, nor later
    assert not any(sees(o).any() for j, o in enumerate(noised) if j != k)
    assert sees(q).all()                                  # bidirectional inside the frame
  from mot.data.builder import SequenceBuilder
  for roles in (["clean"], ["clean", "drawn"]):
    with pytest.raises(ValueError, match="roles"):
      SequenceBuilder(16).add_video_frames(np.zeros((2, G, G, 16)), roles)
  with pytest.raises(ValueError, match="empty video block"):
    SequenceBuilder(16).add_video_frames(np.zeros((0, G, G, 16)), [])
  with pytest.raises(ValueError, match="positive weight"):
    SequenceBuilder(16).add_video_frames(np.zeros((2, G, G, 16)), ["clean"] * 2, [1.0, 0.0])


@pytest.mark.parametrize("layout", moving_digits.VIDEO_LAYOUTS)
@pytest.mark.parametrize("name", VIDEO_TASKS)
@pytest.mark.parametrize("frames", [3, 8])
def test_every_video_task_has_its_generated_frames_or_an_answer(name, frames, layout):
  options = tasks.TaskOptions(patch_size=P, patch_dim=16, num_frames=frames, canvas=16,
                              video_layout=layout)
  rng = np.random.default_rng(0)
  ex = tasks.build_video_example(name, _digit(2), 2, options, rng)
  noised = np.flatnonzero(ex["dm_mask"])
  video = np.flatnonzero(ex["modality"] == modalities.VIDEO)
  generated = {"video_generation": frames, "world_model": frames - 1}.get(name, 0)
  copies = generated - 1 if layout == "frames" and generated else 0  # teacher-forced
  assert len(video) == (frames + copies) * G * G            # shapes for T frames
  if name == "video_qa":
    assert noised.size == 0
    answer = tokenizer.ByteTokenizer().decode(ex["ar_targets"][ex["ar_weights"] > 0])
    assert answer.startswith("2, ")
  elif layout == "clip" or name == "inverse_dynamics":
    assert noised.size and np.all(np.diff(noised) == 1)   # one block, as denoise needs
    sampling.split_block(ex)
  else:
    assert noised.size == generated * G * G
    assert len(np.unique(ex["block_ids"][noised])) == generated   # one block a frame
  assert len(ex["tokens"]) <= tasks.max_example_length(name, options)


def test_image_and_video_tasks_do_not_mix():
  from configs import moving_digits as config_file
  config = config_file.get_config("")
  config.data.task_weights = {"generation": 1.0}
  with pytest.raises(ValueError, match="image"):
    input_pipeline.validate(config.data)
  from configs import digits as digits_config
  config = digits_config.get_config("")
  config.data.task_weights = {"world_model": 1.0}
  with pytest.raises(ValueError, match="moving_digits"):
    input_pipeline.validate(config.data)


def test_train_batches_and_heldout_examples():
  from configs import moving_digits as config_file
  data = config_file.get_config("").data
  batch = next(iter(input_pipeline.make_train_dataset(data, 0, 4)))
  assert batch["patches"].shape == (4, data.seq_len, 16)
  assert set(np.unique(batch["modality"])) <= {0, 2, 3}
  again = next(iter(input_pipeline.make_train_dataset(data, 0, 4)))
  np.testing.assert_array_equal(batch["patches"], again["patches"])
  gen = input_pipeline.heldout_examples(data, "generation")   # train_lib's names
  assert len(gen) == 297 and gen[0]["dm_mask"].sum() == 8 * G * G


# ----------------------------------------------------------------------------------------
# Model: the world model reads its cached prefix; generated shapes.
# ----------------------------------------------------------------------------------------
def _tiny_config():
  from configs import moving_digits as config_file
  return config_file.get_config("tiny")


@pytest.fixture(scope="module")
def pipe():
  config = _tiny_config()
  # float32 matmul operands: the cached-vs-full tests below hold two programs equal to
  # float32 rounding, which bf16 operands would turn into rounding flips of 2^-8
  config.model.matmul_dtype = "same"
  shell = pipeline.Pipeline(config, None)
  ex = shell.prompts.world_model_example(np.zeros((16, 16), np.float32), np.zeros((2, 2)))
  return pipeline.Pipeline(config, random_params(shell.model, inputs_from_batch(
      _as_batch(ex))))


@pytest.fixture(scope="module")
def clip_pipe(pipe):
  """The same parameters read with the one-block clip layout (older checkpoints)."""
  config = _tiny_config()
  config.model.matmul_dtype = "same"
  config.data.video_layout = "clip"
  return pipeline.Pipeline(config, pipe.params)


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, inputs):
  return model.apply({"params": params}, inputs)


@functools.partial(jax.jit, static_argnums=0)
def _cached_velocity(model, params, prefix, block, keep, x, t):
  return sampling.cached_block_velocity(model, params, prefix, block, keep)(x, t)


@pytest.mark.parametrize("layout", moving_digits.VIDEO_LAYOUTS)
def test_world_model_cached_denoise_matches_full_forward(pipe, clip_pipe, layout):
  """The drawn block reads its cached prefix: first frame, actions and (layout "frames",
  here drawing the second of two frames) the frame drawn before it."""
  pipe = {"frames": pipe, "clip": clip_pipe}[layout]
  rng = np.random.default_rng(0)
  first = [rng.uniform(0, 1, (16, 16)).astype(np.float32) for _ in range(2)]
  drawn = [rng.uniform(0, 1, (1, 16, 16)).astype(np.float32) for _ in range(2)]
  if layout == "clip":
    drawn = [None, None]
  actions = [np.array([[1, 0], [0, 1]], np.float32), np.array([[-1, 0], [0, -1]], np.float32)]
  examples = [pipe.prompts.world_model_example(f, a, d) for f, a, d in zip(first, actions, drawn)]
  split = [sampling.split_block(ex) for ex in examples]
  prefix = sampling.pad_left([p for p, _ in split], length=96)
  block = sampling.block_arrays([b for _, b in split])
  m, p = block["modality"].shape[1], pipe.model_cfg.patch_dim
  assert m == {"clip": 2, "frames": 1}[layout] * G * G
  x = rng.normal(size=(2, m, p)).astype(np.float32)
  t = 0.6
  v = np.asarray(_cached_velocity(pipe.model, pipe.params, prefix, block,
                                  np.ones(prefix["tokens"].shape, bool), x, t))
  start = int(np.flatnonzero(examples[0]["dm_mask"])[0])
  full = [dict(ex, patches=ex["patches"].copy()) for ex in examples]
  for row, ex in enumerate(full):
    ex["patches"][start:start + m] = x[row]
  batch = _as_batch(*full)
  timesteps = jnp.where(batch["dm_mask"] > 0, t, 0.0)
  _, ref, _ = _apply(pipe.model, pipe.params, inputs_from_batch(batch, timesteps=timesteps))
  ref = np.asarray(ref)
  for row in range(2):
    np.testing.assert_allclose(v[row], ref[row, start:start + m], rtol=1e-4, atol=1e-4)
  # The prefix matters: other actions (same first frames) give another velocity.
  other = [pipe.prompts.world_model_example(f, -a, d) for f, a, d in zip(first, actions, drawn)]
  prefix2 = sampling.pad_left([sampling.split_block(ex)[0] for ex in other], length=96)
  v2 = np.asarray(_cached_velocity(pipe.model, pipe.params, prefix2, block,
                                   np.ones(prefix2["tokens"].shape, bool), x, t))
  assert not np.allclose(v, v2, atol=1e-4)
  if layout == "frames":  # ... and so does the frame drawn before
    other = [pipe.prompts.world_model_example(f, a, 1 - d)
             for f, a, d in zip(first, actions, drawn)]
    prefix3 = sampling.pad_left([sampling.split_block(ex)[0] for ex in other], length=96)
    v3 = np.asarray(_cached_velocity(pipe.model, pipe.params, prefix3, block,
                                     np.ones(prefix3["tokens"].shape, bool), x, t))
    assert not np.allclose(v, v3, atol=1e-4)


def test_generate_predict_and_infer_shapes(pipe):
  clips = pipe.generate(["a handwritten digit 3 moving right", "a 1"], num_samples=2,
                        steps=2, seed=1)
  assert clips.shape == (4, 3, 16, 16)                 # config's num_frames
  assert clips.min() >= 0 and clips.max() <= 1
  assert pipe.generate("a 2", steps=2, num_frames=5).shape == (1, 5, 16, 16)
  again = pipe.generate(["a handwritten digit 3 moving right", "a 1"], num_samples=2,
                        steps=2, seed=1)
  np.testing.assert_array_equal(clips, again)
  # Frame by frame: a shorter roll-out is the start of the longer one (frame k is drawn
  # from the frames before it only), and samples of one prompt differ.
  short = pipe.generate(["a handwritten digit 3 moving right", "a 1"], num_samples=2,
                        steps=2, seed=1, num_frames=2)
  np.testing.assert_allclose(short, clips[:, :2], atol=1e-6)
  assert not np.allclose(clips[0], clips[1])
  first = np.random.default_rng(0).uniform(0, 1, (2, 16, 16)).astype(np.float32)
  pred = pipe.predict(first, "right,down,down", steps=2)
  assert pred.shape == (2, 4, 16, 16)
  np.testing.assert_allclose(pred[:, 0], first, atol=1e-6)   # the given frame leads
  actions = pipe.infer_actions(pred, steps=2)
  assert actions.shape == (2, 3, 2) and np.all(np.isfinite(actions))
  clip = pred[:, :3]  # the tiny config's clip length (its context holds no more)
  answer = pipe.reason("Which digit moves, and where?", video=clip[0], max_new_tokens=4)
  assert isinstance(answer, str)
  answers = pipe.reason("Which digit moves, and where?", video=clip, max_new_tokens=4)
  assert isinstance(answers, list) and len(answers) == 2
  # Without a prompt a video checkpoint asks its own question, not the image one.
  assert pipe.reason(video=clip, max_new_tokens=4) == answers
  with pytest.raises(InputError, match="sideways"):
    pipe.predict(first, "right,sideways")
  with pytest.raises(InputError, match="num_frames"):
    pipe.generate("a 2", num_frames=0)


def test_clip_layout_draws_all_frames_at_once_and_old_checkpoints_keep_it(clip_pipe):
  clips = clip_pipe.generate(["a 2", "a 3"], steps=2, seed=4)
  assert clips.shape == (2, 3, 16, 16)
  np.testing.assert_array_equal(clips, clip_pipe.generate(["a 2", "a 3"], steps=2, seed=4))
  first = np.zeros((2, 16, 16), np.float32)
  assert clip_pipe.predict(first, "right,down", steps=2).shape == (2, 3, 16, 16)
  # A checkpoint saved before config.data.video_layout existed trained one clip block.
  saved = _tiny_config().to_dict()
  del saved["data"]["video_layout"]
  assert config_upgrade.upgrade_config(saved).data.video_layout == "clip"
  current = config_upgrade.saved_form(_tiny_config())
  assert config_upgrade.upgrade_config(current).data.video_layout == "frames"


def test_video_evaluation_runs_and_its_judges_see_real_clips(pipe, tmp_path):
  result = eval_video.evaluate_video(pipe, samples_per_digit=1, steps=1)
  for key in ("qa_accuracy", "identity_accuracy", "motion_error_px",
              "world_model_com_error_px", "inverse_dynamics_mae_px"):
    assert np.isfinite(result[key]), key
  assert result["_images"].shape == (10, 3, 16, 16)
  real, predicted = result["_world_model_clips"]
  assert real.shape == predicted.shape == (10, 3, 16, 16)
  np.testing.assert_allclose(predicted[:, 0], real[:, 0], atol=1e-6)  # the given frame
  written = evaluate.write_results(str(tmp_path), result)
  with Image.open(written["world_model_gif"]) as gif:
    assert gif.n_frames >= 2
  assert json.loads((tmp_path / evaluate.EVAL_FILE).read_text())["latest"]["step"] == pipe.step
  # The crop judge on real held-out clips is about as good as the SVC on the digits.
  assert result["real_clip_identity_accuracy"] > 0.85
  assert result["real_clip_identity_accuracy"] > result["identity_accuracy"]


# ----------------------------------------------------------------------------------------
# Entry points.
# ----------------------------------------------------------------------------------------
def _run(args, timeout=300):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=env)


def test_tiny_moving_digits_config_trains(tmp_path):
  proc = _run(["train.py", "--config", "configs/moving_digits.py:tiny", "--workdir",
               str(tmp_path / "run")])
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if "loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  assert all(np.isfinite(r["dm_loss"]) and np.isfinite(r["ar_loss"]) for r in train)
  assert any("eval_dm_loss" in r for r in records)


@pytest.fixture(scope="module")
def video_workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("video_run")
  write_checkpoint(path, config=_tiny_config())
  return str(path)


def test_sample_generate_writes_gifs_and_reason_reads_them(video_workdir, tmp_path):
  out = tmp_path / "clips"
  import io
  stdout = io.StringIO()
  run_sample(video_workdir, "generate", prompts=["a handwritten digit 3 moving up"],
                      num_samples=2, out=str(out), steps=2, seed=0, stdout=stdout)
  manifest = json.loads((out / "manifest.json").read_text())
  assert [s["file"] for s in manifest["samples"]] == ["clip_0000.gif", "clip_0001.gif"]
  assert manifest["num_frames"] == 3
  with Image.open(out / "clip_0000.gif") as gif:
    assert gif.n_frames == 3 and gif.size == (16 * media.GIF_SCALE,) * 2
  assert (out / "grid.png").exists()
  # A GIF and a folder of frames read back as clips of 3 frames.
  clip = media.load_clip(str(out / "clip_0000.gif"), 16)
  assert clip.shape == (3, 16, 16)
  frames = tmp_path / "frames"
  frames.mkdir()
  for i, f in enumerate(clip):
    Image.fromarray(np.uint8(f * 255), "L").save(frames / f"{i:02d}.png")
  np.testing.assert_allclose(media.load_clip(str(frames), 16), clip, atol=1 / 255)
  # A digit that stays still: Pillow stores frames 1-3 as one frame shown 3x as long,
  # and the clip still reads back with its 5 frames.
  still = np.concatenate([clip[:1], clip[1:2], clip[1:2], clip[1:2], clip[2:3]])
  media.save_gif(str(tmp_path / "still.gif"), still)
  with Image.open(tmp_path / "still.gif") as gif:
    assert gif.n_frames == 3
  np.testing.assert_allclose(media.load_clip(str(tmp_path / "still.gif"), 16), still,
                             atol=1 / 255)
  assert media.frame_repeats([100, 200, 100]) == [1, 2, 1]
  assert media.frame_repeats([100, 150]) == [1, 1]      # hand-timed: each frame once
  assert media.frame_repeats([None, 100]) == [1, 1]     # no durations: each once
  stdout = io.StringIO()
  run_sample(video_workdir, "reason", images=[str(out / "clip_0000.gif"),
                                                       str(frames)], stdout=stdout)
  lines = stdout.getvalue().splitlines()
  assert len(lines) == 2 and lines[0].startswith(str(out / "clip_0000.gif"))
  # World model from a first frame and --actions.
  first = tmp_path / "first.png"
  Image.fromarray(np.uint8(clip[0] * 255), "L").save(first)
  pred_out = tmp_path / "pred"
  run_sample(video_workdir, "generate", images=[str(first)],
                      actions="right,right,down,up", out=str(pred_out), steps=2,
                      stdout=io.StringIO())
  manifest = json.loads((pred_out / "manifest.json").read_text())
  assert manifest["num_frames"] == 5 and manifest["actions"][0] == [1, 0]
  with Image.open(pred_out / "clip_0000.gif") as gif:
    assert gif.n_frames == 5


@pytest.mark.parametrize("extra,message", [
    (["--actions", "right,sideways"], "sideways"),
    (["--actions", "right"], "--images"),
])
def test_bad_actions_give_one_error_line(video_workdir, tmp_path, extra, message):
  proc = _run(["sample.py", "--workdir", video_workdir, "--mode", "generate", "--out",
               str(tmp_path / "o"), *extra], timeout=120)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
      proc.stderr)
  assert not (tmp_path / "o").exists()


def test_first_frame_weight_weighs_frame_zero_in_the_diffusion_loss(pipe):
  from mot import step as step_lib
  config = _tiny_config()
  clip = moving_digits.constant_clip(_digit(4), "down", np.random.default_rng(0), 3)
  options = tasks.TaskOptions(patch_size=P, patch_dim=16, num_frames=3,
                              first_frame_weight=8.0)
  ex = tasks.get_task("video_generation").build(clip, 4, options, 0)
  noised = ex["dm_mask"] > 0
  first = np.flatnonzero(noised)[:G * G]          # frame 0's noised copy comes first
  np.testing.assert_array_equal(ex["dm_mask"][first], 8.0)
  assert np.all(ex["dm_mask"][noised] > 0) and np.sum(ex["dm_mask"] == 1.0) == 2 * G * G
  batch = {k: jnp.asarray(v) for k, v in _as_batch(ex).items()}

  def dm_loss(weights):  # same rng: same timesteps and noise, only the weights differ
    b = dict(batch, dm_mask=jnp.asarray(weights[None]))
    return float(step_lib.compute_losses(pipe.params, b, jax.random.PRNGKey(1), pipe.model,
                                          config, train=False)[1]["dm_loss"])

  tiny = 1e-9
  only_first = np.where(noised, tiny, 0).astype(np.float32)
  only_first[first] = 1
  rest = np.where(noised, 1, 0).astype(np.float32)
  rest[first] = tiny
  e0, e1, n0, n1 = dm_loss(only_first), dm_loss(rest), len(first), noised.sum() - len(first)
  expected = (8 * n0 * e0 + n1 * e1) / (8 * n0 + n1)
  np.testing.assert_allclose(dm_loss(ex["dm_mask"]), expected, rtol=1e-4)
  np.testing.assert_allclose(dm_loss(3 * ex["dm_mask"]), expected, rtol=1e-4)  # normalised
  assert abs(e0 - e1) > 1e-3 * max(e0, e1)  # the two parts differ: the weighting shows
  data = _tiny_config().data
  data.first_frame_weight = 0.0
  with pytest.raises(ValueError, match="first_frame_weight"):
    input_pipeline.validate(data)


def test_caption_probe_reads_the_caption_of_the_first_frame(pipe):
  from bench import caption_probe
  clip = moving_digits.constant_clip(_digit(1), "left", np.random.default_rng(0), 3)
  noise = np.random.default_rng(1).standard_normal((G * G, 16)).astype(np.float32)
  captions = [moving_digits.caption(k, "left") for k in (1, 1, 7)]
  errors = caption_probe.first_frame_errors(pipe, clip.frames[0], captions, noise)
  assert errors.shape == (len(caption_probe.TIMES), 3) and np.all(errors > 0)
  np.testing.assert_allclose(errors[:, 0], errors[:, 1], rtol=1e-5)  # same caption
  assert np.all(np.abs(errors[:, 2] - errors[:, 0]) > 1e-7)          # the digit is read
  result = caption_probe.probe(pipe, num_clips=2)
  assert result["clips"] == 2
  for name in ("digit_top1", "direction_top1"):
    assert set(result[name]) == {"0.3", "0.6", "0.9"}
    assert all(v in (0.0, 0.5, 1.0) for v in result[name].values())


def test_first_frame_task_is_caption_to_clip_cut_after_frame_zero_five_to_a_row():
  clip = moving_digits.constant_clip(_digit(6), "up", np.random.default_rng(3))
  full = moving_digits.video_generation_example(clip, 6, P, 16)
  first = moving_digits.first_frame_example(clip, 6, P, 16)
  noised = lambda ex: np.flatnonzero(ex["dm_mask"] > 0)[:G * G]
  assert np.sum(first["dm_mask"] > 0) == G * G
  for field in ("patches", "positions", "modality"):
    np.testing.assert_array_equal(first[field][noised(first)], full[field][noised(full)])
  n = noised(first)[0]  # everything before frame 0 (BOS, caption, marker) is the same
  for field in ("tokens", "positions", "cond_mask", "ar_weights"):
    np.testing.assert_array_equal(first[field][:n], full[field][:n])
  data = _tiny_config().data
  data.seq_len = 288
  data.task_weights = {"video_first_frame": 1.0}
  batch = next(iter(input_pipeline.make_train_dataset(data, 0, 2)))
  np.testing.assert_array_equal(batch["segment_ids"].max(axis=1), [5, 5])
  np.testing.assert_array_equal((batch["dm_mask"] > 0).sum(axis=1), [5 * G * G] * 2)


def test_frame_qa_reads_frame_zero_as_the_clip_has_it_six_to_a_row():
  clip = moving_digits.constant_clip(_digit(4), "down", np.random.default_rng(5))
  qa = moving_digits.video_qa_example(clip, 4, P, 16)
  one = moving_digits.frame_qa_example(clip, 4, P, 16)
  video = lambda ex: np.flatnonzero(ex["modality"] == modalities.VIDEO)
  assert len(video(one)) == G * G and np.sum(one["dm_mask"]) == 0  # clean, not generated
  for field in ("patches", "positions"):  # frame 0 with the clip's own patches and places
    np.testing.assert_array_equal(one[field][video(one)], qa[field][video(qa)[:G * G]])
  targets = tokenizer.ByteTokenizer().decode(
      [int(t) for t, w in zip(one["tokens"][1:], one["ar_weights"][:-1]) if w > 0])
  assert targets == "4" and np.sum(one["ar_weights"]) == 2  # the digit, then EOS
  data = _tiny_config().data
  data.seq_len = 288
  data.task_weights = {"video_frame_qa": 1.0}
  batch = next(iter(input_pipeline.make_train_dataset(data, 0, 2)))
  np.testing.assert_array_equal(batch["segment_ids"].max(axis=1), [6, 6])
  assert np.sum(batch["dm_mask"]) == 0
  np.testing.assert_array_equal((batch["ar_weights"] > 0).sum(axis=1), [12, 12])
