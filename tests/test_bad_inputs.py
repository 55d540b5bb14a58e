"""The bad-input catalogue of train.py and mot.evaluate: each case exits non-zero with one
`error:` line, no traceback, and leaves an existing workdir exactly as it was.
(sample.py's catalogue is in tests/test_sample_cli.py.)"""
import importlib
import os
import subprocess
import sys

import pytest

from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config", "configs/digits.py:tiny"]


@pytest.fixture(scope="module")
def existing(tmp_path_factory):
  """A workdir with some files in it (no checkpoint), and a plain file."""
  d = tmp_path_factory.mktemp("existing")
  (d / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
  (d / "notes.txt").write_text("keep me\n")
  f = tmp_path_factory.mktemp("f") / "a_file"
  f.write_text("not a directory\n")
  return d, f


def train_cases(workdir, a_file):
  """Cases train.py's command line itself must refuse, run as a user runs them."""
  w = ["--workdir", str(workdir)]
  return {
      "unknown config file": ["--config", "configs/nope.py", *w],
      "unknown variant": ["--config", "configs/digits.py:huge", *w],
      "unknown field": [*TINY, *w, "--config.nope=3"],
      "bad value type": [*TINY, *w, "--config.batch_size=abc"],
      "missing workdir flag": [*TINY],
      "workdir is a file": [*TINY, "--workdir", str(a_file)],
      "heads vs kv heads": [*TINY, *w, "--config.model.num_kv_heads=3"],
      "mesh vs devices": [*TINY, *w, "--config.mesh_shape=(2,1,1)"],
      "stray argument": [*TINY, *w, "extra"],
  }


# Config values train_and_evaluate refuses before it builds or writes anything: checked
# in-process (train.py turns the same ConfigError into its one `error:` line, above).
VALUE_CASES = {
    "rope sections": ("digits:tiny", "model.rope_sections", (8, 12, 12)),
    "unknown experts": ("digits:tiny", "model.experts", "dense"),
    "seq_len too short": ("digits:tiny", "data.seq_len", 20),
    "zero steps": ("digits:tiny", "num_train_steps", 0),
    "negative batch": ("digits:tiny", "batch_size", -4),
    "bad learning rate": ("digits:tiny", "learning_rate", -1.0),
    "scan unroll zero": ("digits:tiny", "model.scan_unroll", 0),
    "unknown matmul dtype": ("digits:tiny", "model.matmul_dtype", "int8"),
    "negative sampling context": ("digits:tiny", "sample.context_length", -1),
    "dropout out of range": ("digits:tiny", "model.dropout_rate", 1.5),
    "label smoothing out of range": ("digits:tiny", "ar_label_smoothing", 1.0),
    "zero time shift": ("digits:tiny", "sample.shift", 0.0),
    "reading shifts out of range": ("digits:tiny", "sample.reason_shifts", 3),
    "cutout as large as the image": ("digits:tiny", "data.cutout_size", 8),
    "elastic distortion too strong": ("digits:tiny", "data.elastic_alpha", 3.0),
    "reading window wider than the patch field": ("digits:tiny", "data.read_window", 4),
    "validation split larger than allowed": ("digits:tiny", "data.validation_size", 1500),
    "unknown video layout": ("moving_digits:tiny", "data.video_layout", "joint"),
    "unknown generation start": ("moving_digits:tiny", "data.generation_start", "centre"),
}


def check_clean_failure(proc):
  assert proc.returncode != 0, proc.stdout[-500:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.strip().splitlines() if l.startswith("error:")]
  assert len(errors) == 1, proc.stderr[-2000:]


@pytest.mark.parametrize("case", sorted(train_cases("W", "F")))
def test_train_bad_input(existing, case):
  workdir, a_file = existing
  before = snapshot(workdir)
  args = train_cases(workdir, a_file)[case]
  proc = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  check_clean_failure(proc)
  assert snapshot(workdir) == before


@pytest.mark.parametrize("case", sorted(VALUE_CASES))
def test_train_refuses_bad_config_values_before_writing(existing, case):
  from mot import train_lib
  from mot.errors import ConfigError
  workdir, _ = existing
  before = snapshot(workdir)
  name, field, value = VALUE_CASES[case]
  module, arg = name.split(":")
  config = importlib.import_module(f"configs.{module}").get_config(arg)
  *path, leaf = field.split(".")
  section = config
  for part in path:
    section = section[part]
  section[leaf] = value
  with pytest.raises(ConfigError) as e:
    train_lib.train_and_evaluate(config, str(workdir))
  assert "\n" not in str(e.value) and field.split(".")[-1] in str(e.value), str(e.value)
  assert snapshot(workdir) == before


@pytest.mark.parametrize("case", ["missing workdir", "workdir is a file", "no checkpoint",
                                  "zero samples"])
def test_evaluate_bad_input(existing, tmp_path, case):
  workdir, a_file = existing
  before = snapshot(workdir)
  target = {"missing workdir": str(tmp_path / "nope"), "workdir is a file": str(a_file),
            "no checkpoint": str(workdir), "zero samples": str(workdir)}[case]
  extra = ["--samples_per_digit", "0"] if case == "zero samples" else []
  proc = subprocess.run([sys.executable, "-m", "mot.evaluate", "--workdir", target, *extra],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  check_clean_failure(proc)
  assert snapshot(workdir) == before
  assert not os.path.exists(tmp_path / "nope")
