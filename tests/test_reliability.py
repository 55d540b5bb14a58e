"""Exact resume after SIGKILL (also mid-save), SIGTERM, damaged checkpoints, NaN guard.

Training runs in subprocesses so that they can be killed for real. Every resumed run is
compared with an uninterrupted run from another process, bitwise: that also proves
determinism (same config and seed, same metrics.jsonl apart from tokens/s timing)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12
BASE = ["--config", "configs/digits.py:tiny", f"--config.num_train_steps={STEPS}",
        "--config.log_every_steps=2", "--config.checkpoint_every_steps=3",
        "--config.eval_every_steps=6", "--config.keep_checkpoints=10"]
TIMING = ("tokens_per_s",)


def train_cmd(workdir, *extra):
  return [sys.executable, "train.py", *BASE, "--workdir", str(workdir), *extra]


def run_train(workdir, *extra, check=True):
  proc = subprocess.run(train_cmd(workdir, *extra), cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def final_state(workdir, step=STEPS):
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(path)


def assert_bitwise_equal(a, b):
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def wait_for(predicate, proc, timeout=240):
  start = time.time()
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f"training ended before the kill: {proc.stderr.read()[-2000:]}")
    if time.time() - start > timeout:
      proc.kill()
      raise AssertionError("timed out waiting for the training subprocess")
    time.sleep(0.005)


def steps_on_disk(workdir):
  d = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def saving_now(workdir):
  d = os.path.join(workdir, "checkpoints")
  return os.path.isdir(d) and any("tmp" in n for n in os.listdir(d))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("reference")
  run_train(workdir)
  return workdir


@pytest.mark.parametrize("when", ["after_a_checkpoint", "during_a_save"])
def test_sigkill_then_resume_is_exact(reference, tmp_path, when):
  proc = subprocess.Popen(train_cmd(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  if when == "during_a_save":
    wait_for(lambda: steps_on_disk(tmp_path) and saving_now(tmp_path), proc)
  else:
    wait_for(lambda: any(s >= 3 for s in steps_on_disk(tmp_path)), proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert max(steps_on_disk(tmp_path), default=0) < STEPS, "killed too late to test"
  run_train(tmp_path)                 # resumes by itself
  assert metrics(tmp_path) == metrics(reference)
  assert_bitwise_equal(final_state(tmp_path), final_state(reference))


def test_sigterm_saves_then_exits_cleanly(reference, tmp_path):
  proc = subprocess.Popen(train_cmd(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  wait_for(lambda: any(s >= 3 for s in steps_on_disk(tmp_path)), proc)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-2000:]
  assert "SIGTERM" in err and "resume" in err
  saved = steps_on_disk(tmp_path)
  run_train(tmp_path)
  assert metrics(tmp_path) == metrics(reference)
  assert_bitwise_equal(final_state(tmp_path), final_state(reference))
  assert saved  # the stop left a checkpoint behind


def _damage(workdir, step):
  """Overwrites every data file of a checkpoint's state with garbage."""
  state_dir = os.path.join(workdir, "checkpoints", str(step), "state")
  for dirpath, _, files in os.walk(state_dir):
    for name in files:
      with open(os.path.join(dirpath, name), "wb") as f:
        f.write(b"\x00garbage")


def test_damaged_and_incompatible_checkpoints(tmp_path):
  run_train(tmp_path, "--config.num_train_steps=6")
  # A damaged newest checkpoint is skipped with a warning naming it; the older one is used.
  _damage(tmp_path, 6)
  proc = run_train(tmp_path, "--config.num_train_steps=9")
  assert "Skipping damaged checkpoint" in proc.stderr and "checkpoints/6" in proc.stderr
  assert 9 in steps_on_disk(tmp_path)
  # A checkpoint from another model config is refused before anything is restored.
  proc = run_train(tmp_path, "--config.model.d_model=32", check=False)
  assert proc.returncode == 1
  assert "different config.model fields (d_model)" in proc.stderr.strip().splitlines()[-1]
  # When no checkpoint reads back: one clear line, and the workdir is left as it was.
  for step in steps_on_disk(tmp_path):
    _damage(tmp_path, step)
  before = snapshot(tmp_path)
  proc = run_train(tmp_path, check=False)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: no checkpoint in")
  assert snapshot(tmp_path) == before


def test_nonfinite_updates_are_skipped_then_training_stops(tiny_config, tmp_path, monkeypatch):
  from mot import train_lib
  from mot.data import input_pipeline
  tiny_config.num_train_steps = 2
  train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  good = final_state(tmp_path, 2)

  real = input_pipeline.make_train_dataset

  def poisoned(*args, **kwargs):
    def add_nan(batch):
      batch = dict(batch)
      batch["patches"] = np.full_like(batch["patches"], np.nan)
      return batch
    return real(*args, **kwargs).map(add_nan)

  monkeypatch.setattr(input_pipeline, "make_train_dataset", poisoned)
  tiny_config.num_train_steps = 40
  tiny_config.max_nonfinite_steps = 3
  tiny_config.checkpoint_every_steps = 100
  with pytest.raises(train_lib.TrainingError, match="not finite for 3 steps in a row"):
    train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  assert steps_on_disk(tmp_path) == [2]
  assert_bitwise_equal(final_state(tmp_path, 2), good)
