"""sample.py and Pipeline.from_workdir on a tiny checkpoint: outputs and bad inputs.

The checkpoint is written once per module by `mot.checkpoint.save`, exactly as training
writes it (TrainState + config JSON), with random parameters of the tiny config: the
format is what matters here, and compiling init and a train step would cost more than
every other test in this file (sample quality is issue 4's evaluation).
"""
import io
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from mot import checkpoint as ckpt_lib
from mot import media, pipeline, sample_cli
from mot.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_sample(workdir, mode, stdout=None, **options):
  """sample.py's logic on a Request of these options (as its flags would give them)."""
  sample_cli.run_sample(sample_cli.Request(workdir, mode, **options), stdout=stdout)


def write_checkpoint(workdir, steps=(2,), config=None):
  """Checkpoints of the tiny config (or `config`; random parameters) in training's on-disk
  format: {"state": TrainState, "rng": key} + config JSON, through `mot.checkpoint.save`."""
  import flax.linen as nn
  from configs import digits as digits_config
  from mot import config as config_lib
  from mot import step as step_lib
  from mot.model import MoT
  config = digits_config.get_config("tiny") if config is None else config
  model = MoT(config_lib.validate(config))
  init = step_lib.init_state_fn(model, step_lib.make_optimizer(config), 8)
  shapes = nn.meta.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s.shape), s.dtype),
                        shapes.params)
  state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes).replace(
      params=params, ema_params=jax.tree.map(lambda p: 0.5 * p, params))
  manager = ckpt_lib.make_manager(str(workdir))
  for step in steps:
    ckpt_lib.save(manager, step, {"state": state.replace(step=jnp.int32(step)),
                                  "rng": jax.random.PRNGKey(0)}, config=config.to_dict())
  manager.wait_until_finished()
  manager.close()
  return config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("run")
  write_checkpoint(path)
  return str(path)


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
  """Two digits in a folder (plus a non-image there, ignored) and a large RGB file."""
  base = tmp_path_factory.mktemp("images")
  folder = base / "folder"
  folder.mkdir()
  rng = np.random.default_rng(0)
  for name in ("a.png", "b.jpg"):
    Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), "L").save(folder / name)
  (folder / "notes.txt").write_text("not an image")
  Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8), "RGB").save(
      base / "big.png")
  return str(base / "big.png"), str(folder)


def sample_cmd(*args):
  return [sys.executable, "sample.py", *args]


def popen(args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)


class Runs:
  """Processes started at once; `result(name)` waits for one: (stdout, stderr, rc)."""

  def __init__(self, commands, tmp):
    self.tmp = tmp
    self.procs = {name: popen(cmd) for name, cmd in commands.items()}
    self.results = {}

  def result(self, name):
    if name not in self.results:
      proc = self.procs[name]
      self.results[name] = proc.communicate(timeout=300) + (proc.returncode,)
    return self.results[name]


@pytest.fixture(scope="module", autouse=True)
def cli_runs(workdir, image_files, tmp_path_factory):
  """Real sample.py processes, started before this module's first test so that they run
  beside the in-process tests (each is mostly start-up): reading with --json, and bad
  inputs (a checkpoint error, an input error, a flag error)."""
  tmp = tmp_path_factory.mktemp("cli")
  big, folder = image_files
  gen = ["--workdir", workdir, "--mode", "generate", "--prompt", "a digit", "--out",
         str(tmp / "out")]
  commands = {
      "reason": sample_cmd("--workdir", workdir, "--mode", "reason", "--images", big, folder,
                           "--json"),
      "missing workdir": sample_cmd("--workdir", str(tmp / "nope"), "--mode", "reason"),
      "cfg nan": sample_cmd(*gen, "--cfg_scale", "nan"),
      "bad sampler": sample_cmd(*gen, "--sampler", "rk4"),
  }
  runs = Runs(commands, tmp)
  yield runs
  for proc in runs.procs.values():
    if proc.poll() is None:
      proc.kill()
      proc.communicate()


def test_generate_writes_pngs_grid_and_manifest(workdir, tmp_path):
  # sample.py's logic, in-process (absl only parses the flags); with test_sampling's
  # settings, so the compiled sampler is shared.
  out = str(tmp_path / "samples")
  stdout = io.StringIO()
  run_sample(workdir, "generate", prompts=["a handwritten digit 7",
                                                    "a handwritten digit 1"],
                      num_samples=2, out=out, steps=3, cfg_scale=2.0, sampler="heun", seed=1,
                      as_json=True, stdout=stdout)
  with open(os.path.join(out, "manifest.json")) as f:
    manifest = json.load(f)
  files = [s["file"] for s in manifest["samples"]]
  assert len(files) == 4 and len(set(files)) == 4
  assert [s["prompt"] for s in manifest["samples"]] == (["a handwritten digit 7"] * 2
                                                        + ["a handwritten digit 1"] * 2)
  assert (manifest["steps"], manifest["cfg_scale"], manifest["sampler"]) == (3, 2.0, "heun")
  for name in files:
    with Image.open(os.path.join(out, name)) as img:
      assert img.size == (8, 8) and img.mode == "L"
  with Image.open(os.path.join(out, "grid.png")) as img:
    assert img.size == (2 * 65 + 1, 2 * 65 + 1)   # 2 prompts x 2 samples, 64-px cells
  printed = [json.loads(line) for line in stdout.getvalue().splitlines()]
  assert [p["file"] for p in printed] == [os.path.join(out, f) for f in files]
  # Reading that folder back reads the samples, not the montage; named, the grid is read.
  assert media.image_paths([out]) == sorted(os.path.join(out, f) for f in files)
  grid_file = os.path.join(out, "grid.png")
  assert media.image_paths([grid_file]) == [grid_file]
  with open(os.path.join(out, "manifest.json"), "w") as f:
    f.write("{broken")
  assert grid_file in media.image_paths([out])   # no readable manifest: every image


def test_think_then_draw_and_generation_are_reproducible(workdir, tmp_path):
  # In-process, with test_sampling's settings: the compiled programs are shared.
  for out in ("a", "b"):
    with open(os.devnull, "w") as devnull:
      run_sample(workdir, "think_then_draw", prompts=["draw the digit after 3:"],
                          num_samples=2, out=str(tmp_path / out), steps=3, cfg_scale=2.0,
                          sampler="heun", stdout=devnull)
  with open(tmp_path / "a" / "manifest.json") as f:
    manifest = json.load(f)
  assert len(manifest["samples"]) == 2 and "answer" in manifest["samples"][0]
  for name in ("sample_0000.png", "sample_0001.png", "grid.png"):
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_from_workdir_loads_ema_and_skips_a_damaged_newest_checkpoint(tmp_path):
  write_checkpoint(tmp_path, steps=(1, 2))
  params, _, step = ckpt_lib.restore_params(str(tmp_path))
  raw, _, _ = ckpt_lib.restore_params(str(tmp_path), use_ema=False)
  assert step == 2
  leaf = lambda tree: np.asarray(jax.tree.leaves(tree)[0])
  np.testing.assert_allclose(leaf(params), 0.5 * leaf(raw))   # EMA chosen by default
  state_dir = tmp_path / "checkpoints" / "2" / "state"
  for f in state_dir.rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  assert ckpt_lib.restore_params(str(tmp_path))[2] == 1       # falls back, with a warning
  for f in (tmp_path / "checkpoints" / "1" / "state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  with pytest.raises(ckpt_lib.CheckpointError, match="no readable checkpoint"):
    pipeline.Pipeline.from_workdir(str(tmp_path))


# ----------------------------------------------------------------------------------------
# Bad input: one line naming the problem, nothing written.
# ----------------------------------------------------------------------------------------
def bad_cases(workdir, tmp):
  """(name, run_sample kwargs, expected error type, text the message must contain)."""
  (tmp / "not_image.png").write_text("hello")
  (tmp / "a_file").write_text("x")
  (tmp / "empty_dir").mkdir()
  (tmp / "no_ckpt").mkdir()
  gen = dict(workdir=workdir, mode="generate", prompts=["a handwritten digit 7"],
             out=str(tmp / "out"))
  input_error, ckpt_error = InputError, ckpt_lib.CheckpointError
  return [
      ("missing workdir", dict(gen, workdir=str(tmp / "nope")), ckpt_error, "does not exist"),
      ("no checkpoint", dict(gen, workdir=str(tmp / "no_ckpt")), ckpt_error, "no checkpoint"),
      ("not an image", dict(workdir=workdir, mode="reason",
                            images=[str(tmp / "not_image.png")]), input_error, "not an image"),
      ("missing image", dict(workdir=workdir, mode="reason", images=[str(tmp / "x.png")]),
       input_error, "does not exist"),
      ("folder without images", dict(workdir=workdir, mode="reason",
                                     images=[str(tmp / "empty_dir")]), input_error,
       "no image files"),
      ("empty prompt", dict(gen, prompts=["  "]), input_error, "empty prompt"),
      ("prompt too long", dict(gen, prompts=["x" * 500]), input_error, "context"),
      ("reason prompt too long", dict(workdir=workdir, mode="reason", prompts=["x" * 500]),
       input_error, "context"),
      ("num_samples 0", dict(gen, num_samples=0), input_error, "num_samples"),
      ("steps 0", dict(gen, steps=0), input_error, "steps"),
      ("cfg nan", dict(gen, cfg_scale=float("nan")), input_error, "cfg_scale"),
      ("cfg inf", dict(gen, cfg_scale=float("inf")), input_error, "cfg_scale"),
      ("out is a file", dict(gen, out=str(tmp / "a_file")), input_error, "is a file"),
      ("no out", dict(gen, out=None), input_error, "--out"),
      ("no prompt", dict(gen, prompts=[]), input_error, "--prompt"),
      ("negative seed", dict(gen, seed=-1), input_error, "seed"),
      ("shifts when generating", dict(gen, reason_shifts=1), input_error, "--reason_shifts"),
      ("shifts out of range", dict(workdir=workdir, mode="reason", reason_shifts=3,
                                   images=[str(tmp / "x.png")]), input_error, "shifts="),
      ("shifts without images", dict(workdir=workdir, mode="reason", prompts=["hi"],
                                     reason_shifts=1), input_error, "no image"),
  ]


def test_bad_inputs_raise_one_line_errors_and_write_nothing(workdir, tmp_path):
  cases = bad_cases(workdir, tmp_path)
  before = sorted(os.listdir(tmp_path))
  ckpt_before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  for name, kwargs, error, text in cases:
    with pytest.raises(error) as e:
      run_sample(**kwargs, stdout=sys.stderr)
    assert text in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    assert sorted(os.listdir(tmp_path)) == before, name           # nothing written
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ckpt_before


# ----------------------------------------------------------------------------------------
# The real processes (started by the autouse fixture above).
# ----------------------------------------------------------------------------------------
def test_reason_json(cli_runs, image_files):
  stdout, stderr, rc = cli_runs.result("reason")
  assert rc == 0, stderr[-2000:]
  records = [json.loads(line) for line in stdout.splitlines()]
  big, folder = image_files
  assert [r["image"] for r in records] == [big, os.path.join(folder, "a.png"),
                                           os.path.join(folder, "b.jpg")]
  for r in records:
    assert r["prompt"] == "What digit is this?" and isinstance(r["answer"], str)


def test_cli_bad_inputs_exit_with_one_error_line(cli_runs):
  """test_bad_inputs_raise_one_line_errors... covers every case; these check the process
  boundary: exit status, one `error:` line on stderr, no traceback."""
  for name in ("missing workdir", "cfg nan", "bad sampler"):
    _, stderr, rc = cli_runs.result(name)
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert rc != 0, name
    assert "Traceback" not in stderr, (name, stderr)
    assert lines[-1].startswith("error: ") and sum(l.startswith("error") for l in lines) == 1, (
        name, stderr)
  assert os.listdir(cli_runs.tmp) == []                      # nothing written
