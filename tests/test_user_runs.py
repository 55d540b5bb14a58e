"""User data end to end: a tiny RGB image folder and a tiny video folder trained a step,
then sampled through sample.py's logic exactly as they trained (size, mode, question,
answer length, preprocessing); and the one-line errors of bad user data."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from configs import image_folder, video_folder
from mot import checkpoint as ckpt_lib
from mot import config_upgrade, evaluate, media, sample_cli, summary, train_lib
from mot.data import input_pipeline, preprocess
from mot.errors import ConfigError, InputError
from mot.pipeline import Pipeline
from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# JAX warns on any fork; these forks exec ffmpeg or train.py at once (subprocess).
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
COLORS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}


def _square_image(h, w, color, rng):
  """uint8 [h, w, 3]: a coloured 4x4 square on a light ground."""
  im = np.full((h, w, 3), 245, np.uint8)
  r, c = rng.integers(0, h - 3), rng.integers(0, w - 3)
  im[r:r + 4, c:c + 4] = COLORS[color]
  return im


def _write_jsonl(folder, key, pairs):
  with open(folder / "captions.jsonl", "w") as f:
    f.writelines(json.dumps({key: k, "caption": c}) + "\n" for k, c in pairs)


def _tiny(config, path, steps=2):
  config.data.path = str(path)
  config.data.num_heldout = 1
  config.num_train_steps = steps
  config.eval_every_steps = config.checkpoint_every_steps = config.log_every_steps = 1
  return config


def _sample(workdir, mode, **options):
  """sample.py's logic; returns its stdout lines."""
  lines = []

  class Out:
    def write(self, s):
      lines.append(s)

  sample_cli.run_sample(sample_cli.Request(workdir, mode, **options), stdout=Out())
  return "".join(lines).splitlines()


@pytest.fixture(scope="module")
def rgb_run(tmp_path_factory):
  """A trained (two steps) RGB run on 8x12 images, inverted and padded, with one larger
  image held out: its checkpoint and data folder."""
  data = tmp_path_factory.mktemp("rgb_data")
  rng = np.random.default_rng(0)
  pairs = []
  for i in range(10):
    color = list(COLORS)[i % 3]
    shape = (16, 16) if i == 9 else (8, 12)   # the held-out one is resized at 16x16
    Image.fromarray(_square_image(*shape, color, rng)).save(data / f"{i}.png")
    pairs.append((f"{i}.png", f"a {color} square" + (" on the left" if i == 4 else "")))
  _write_jsonl(data, "image", pairs)
  config = _tiny(image_folder.get_config("tiny"), data)
  config.data.invert, config.data.resize, config.data.seq_len = True, "pad", 96
  workdir = str(tmp_path_factory.mktemp("rgb_run"))
  train_lib.train_and_evaluate(config, workdir)
  return workdir, data


def test_rgb_folder_records_what_it_chose_from_the_data(rgb_run):
  workdir, _ = rgb_run
  saved = config_upgrade.upgrade_config(ckpt_lib.saved_config(workdir, 2))
  assert tuple(saved.data.image_size) == (8, 12) and saved.data.channels == 3
  assert saved.data.patch_dim == 12 and tuple(saved.model.modality_patch_dims) == (0, 12, 12, 2)
  assert saved.sample.max_new_tokens == len("a green square on the left") + 1  # + EOS
  assert saved.data.question == "Describe this image."


def test_rgb_folder_samples_as_it_trained(rgb_run, tmp_path):
  workdir, data = rgb_run
  answers = [json.loads(line) for line in _sample(workdir, "reason", as_json=True,
                                                 images=[str(data / "9.png")])]
  assert [a["prompt"] for a in answers] == ["Describe this image."]  # no --prompt given
  pipe = Pipeline.from_workdir(workdir)
  assert pipe.question == "Describe this image." and pipe.default_max_new_tokens == 27
  # The held-out 16x16 file reads exactly as the data pipeline read it (pad, invert).
  unit, single = pipe.unit_images(str(data / "9.png"))
  held = input_pipeline.heldout_images(pipe.config.data)
  assert single and unit.shape == (1, 8, 12, 3)
  np.testing.assert_array_equal(media.to_model_scale(unit[0]), held[0])
  assert np.all(held[0][:, :2] == -1.0) and np.all(held[0][:, -2:] == -1.0)  # padded: black
  assert held[0][0, 2, 0] > -1.0                   # inverted light ground: a little ink
  out = tmp_path / "out"
  _sample(workdir, "generate", prompts=["a red square"], num_samples=2, out=str(out), steps=2)
  for name in ("sample_0000.png", "sample_0001.png"):
    with Image.open(out / name) as png:
      assert png.size == (12, 8) and png.mode == "RGB"
  lines = _sample(workdir, "reason", prompts=["Describe this image."], max_new_tokens=3,
                  images=[str(data / "0.png")])
  assert len(lines) == 1 and len(lines[0].split("\t", 1)[1].encode("utf-8")) <= 3 * 4


def test_rgb_folder_evaluation_writes_colour_samples(rgb_run, tmp_path):
  workdir, _ = rgb_run
  result = evaluate.evaluate_pipeline(Pipeline.from_workdir(workdir), samples_per_digit=2,
                                      steps=1)
  assert result["heldout_pairs"] == 1 and 0.0 <= result["caption_similarity"] <= 1.0
  assert result["_images"].shape == (1 * 2, 8, 12, 3)
  written = evaluate.write_results(str(tmp_path), result)
  with Image.open(written["grid"]) as png:   # one row: the real image, then two drawn
    assert png.mode == "RGB" and png.size == (3 * (12 * 8 + 1) + 1, 8 * 8 + 2)
  assert "caption exact match" in evaluate.format_result(written)
  with summary.SummaryWriter(str(tmp_path)) as writer:
    writer.image(1, "samples", written["_grid_image"])
  (image,) = [v.image for e in summary.read_events(writer.logdir) for v in e.summary.value]
  assert image.colorspace == 3 and (image.width, image.height) == (3 * 97 + 1, 66)


def _write_clip(folder, name, frames, kind):
  """One clip [T, H, W, 3] uint8 as a GIF, an MP4 or a folder of PNG frames."""
  path = folder / name
  if kind == "gif":
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=100, loop=0)
  elif kind == "mp4":
    import imageio.v3 as iio
    iio.imwrite(path, frames, plugin="FFMPEG", fps=8, macro_block_size=1)
  else:
    path.mkdir()
    for t, frame in enumerate(frames):
      Image.fromarray(frame).save(path / f"{t:03d}.png")
  return name


def _moving_square(color, step, num_frames=4, side=16):
  frames = np.full((num_frames, side, side, 3), 240, np.uint8)
  for t in range(num_frames):
    c = 6 + step * 2 * t
    frames[t, 6:10, c:c + 4] = COLORS[color]
  return frames


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
  data = tmp_path_factory.mktemp("video_data")
  pairs = []
  for i in range(6):
    color, step = ("red", "blue")[i % 2], (1, -1)[i // 3]
    kind = ("gif", "mp4", "frames")[i % 3]
    name = _write_clip(data, f"c{i}" + ("" if kind == "frames" else f".{kind}"),
                       _moving_square(color, step), kind)
    pairs.append((name, f"{color} moves {'right' if step > 0 else 'left'}"))
  _write_jsonl(data, "video", pairs)
  config = _tiny(video_folder.get_config("tiny"), data)
  config.data.seq_len = 160
  workdir = str(tmp_path_factory.mktemp("video_run"))
  train_lib.train_and_evaluate(config, workdir)
  return workdir, data


def test_video_folder_trains_and_samples_like_the_moving_digits(video_run, tmp_path):
  workdir, data = video_run
  saved = config_upgrade.upgrade_config(ckpt_lib.saved_config(workdir, 2))
  assert tuple(saved.data.image_size) == (16, 16) and saved.data.channels == 3
  answers = [json.loads(line) for line in _sample(
      workdir, "reason", as_json=True, images=[str(data / "c1.mp4"), str(data / "c2")])]
  assert [a["prompt"] for a in answers] == ["Describe this clip."] * 2
  out = tmp_path / "clips"
  _sample(workdir, "generate", prompts=["red moves left"], out=str(out), steps=1)
  with Image.open(out / "clip_0000.gif") as gif:
    assert gif.n_frames == 3 and gif.size == (16 * media.GIF_SCALE,) * 2
  pipe = Pipeline.from_workdir(workdir)
  clip = pipe.load_clip(str(data / "c0.gif"))
  options = preprocess.image_options(pipe.config.data)
  assert clip.shape == (3, 16, 16, 3) and options.shape == (16, 16, 3)
  with pytest.raises(Exception, match="predict needs a video checkpoint.*moving_digits"):
    pipe.predict(clip[0], "right")
  result = evaluate.evaluate_pipeline(pipe, samples_per_digit=1, steps=1)
  assert result["video"] and result["heldout_pairs"] == 1
  assert result["_grid"].shape == (16 * 8 + 2, 6 * (16 * 8 + 1) + 1, 3)  # real, then drawn


# ----------------------------------------------------------------------------------------
# Bad user data: one line each, nothing written.
# ----------------------------------------------------------------------------------------
def _bad_data(tmp):
  """case -> (config, {field: value}), each a folder whose data cannot train."""
  rng = np.random.default_rng(1)
  cases = {}
  mixed = tmp / "mixed"
  mixed.mkdir()
  for i, shape in enumerate([(8, 8), (8, 8), (8, 12), (8, 12), (16, 16)]):
    Image.fromarray(_square_image(*shape, "red", rng)).save(mixed / f"{i}.png")
  _write_jsonl(mixed, "image", [(f"{i}.png", "a red square") for i in range(5)])
  cases["mixed sizes"] = (image_folder, {"data.path": mixed})
  # Patches of 2x2 RGB pixels (12 values) for a VAE whose latents have 4 channels.
  cases["latent channels"] = (image_folder, {
      "data.path": mixed, "data.image_size": (8, 8), "data.patch_dim": 12,
      "model.modality_patch_dims": (0, 12, 12, 2),
      "latent.vae": os.path.join(ROOT, "tests", "golden", "vae_sd")})
  for kind, payload in (("gif", b"GIF89a\x10\x00\x10\x00\x80\x00\x00" + b"\x00" * 5),
                        ("mp4", b"\x00\x00\x00\x18ftypisom" + b"garbage" * 40)):
    folder = tmp / f"corrupt_{kind}"
    folder.mkdir()
    _write_clip(folder, f"good.{kind}", _moving_square("red", 1), kind)
    (folder / f"bad.{kind}").write_bytes(payload)
    _write_jsonl(folder, "video", [(f"good.{kind}", "red moves right"),
                                   (f"bad.{kind}", "red moves right")])
    cases[f"corrupt {kind}"] = (video_folder, {"data.path": folder})
  short = tmp / "short"
  short.mkdir()
  _write_clip(short, "long.gif", _moving_square("red", 1), "gif")
  _write_clip(short, "short.gif", _moving_square("red", 1, num_frames=2), "gif")
  _write_jsonl(short, "video", [("long.gif", "a"), ("short.gif", "b")])
  cases["too few frames"] = (video_folder, {"data.path": short})
  return cases


ERRORS = {"mixed sizes": r"no image size is the most common \(2 of 8x8, 2 of 8x12, 1 of "
                         r"16x16\): set --config.data.image_size",
          "corrupt gif": r"bad.gif \(from .*captions.jsonl:2\): cannot decode the clip",
          "corrupt mp4": r"bad.mp4 \(from .*captions.jsonl:2\): cannot decode the video",
          "too few frames": r"short.gif has 2 frame\(s\) but config.data.num_frames=3",
          "latent channels": r"modality_patch_dims\[1\]=12 disagrees with the latent: "
                             r"patch_size\*\*2 \* the VAE's 4 latent channels = 16"}


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
  return _bad_data(tmp_path_factory.mktemp("bad_data"))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_bad_user_data_is_one_line_and_writes_nothing(bad_data, tmp_path, name):
  module, fields = bad_data[name]
  config = module.get_config("tiny")
  for key, value in fields.items():
    section, field_name = key.split(".")
    config[section][field_name] = str(value) if isinstance(value, os.PathLike) else value
  before = snapshot(tmp_path)
  with pytest.raises(ConfigError) as e:
    train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  assert "\n" not in str(e.value) and re.search(ERRORS[name], str(e.value)), str(e.value)
  assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()


def test_train_py_prints_bad_user_data_as_one_error_line(bad_data, tmp_path):
  _, fields = bad_data["corrupt mp4"]
  proc = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/video_folder.py:tiny", "--workdir",
       str(tmp_path / "run"), f"--config.data.path={fields['data.path']}"], cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and re.search(ERRORS["corrupt mp4"], errors[0]), proc.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def test_max_new_tokens_flag_is_checked_before_the_checkpoint(tmp_path):
  request = dict(workdir=str(tmp_path / "nope"), prompts=["a"], out=str(tmp_path / "o"))
  with pytest.raises(InputError, match="--max_new_tokens bounds answers"):
    sample_cli.check_request(sample_cli.Request(mode="generate", max_new_tokens=4, **request))
  with pytest.raises(InputError, match="max_new_tokens=0 must be a positive integer"):
    sample_cli.check_request(sample_cli.Request(mode="reason", max_new_tokens=0, **request))
  sample_cli.check_request(sample_cli.Request(mode="think_then_draw", max_new_tokens=4,
                                              **request))
