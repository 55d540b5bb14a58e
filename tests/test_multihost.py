"""Multi-host training on one machine: 2 processes x 4 CPU devices (jax.distributed over
127.0.0.1, gloo collectives) give the losses of 1 process x 8 devices, save and restore
orbax checkpoints together, and only process 0 writes metrics and the progress bar.
"""
import json
import os
import shutil

import numpy as np

from tests import _procs

STEPS = 4
TRAIN_ARGS = ["train.py", "--config", "configs/digits.py:tiny",
              f"--config.num_train_steps={STEPS}", "--config.log_every_steps=1",
              "--config.checkpoint_every_steps=2", f"--config.eval_every_steps={STEPS}",
              # data spans the two processes; fsdp and tensor stay inside each. With the
              # tiny model's single KV head, tensor=2 also covers the replicated fallback.
              "--config.mesh_shape=(2,2,2)",
              # float32 matmul operands: the two layouts' collectives sum in different
              # orders, and bf16 operands would turn those last bits into rounding flips
              # (tests/_sharding_worker.py checks the bf16 default on a mesh apart)
              "--config.model.matmul_dtype=same"]
TIMEOUT = 240


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def launch_two(workdir, tmp_path, tag, extra=()):
  port = _procs.free_port()
  commands = []
  for pid in range(2):
    argv = [_procs.python(), *TRAIN_ARGS, *extra, "--workdir", str(workdir),
            "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
            "--process_id", str(pid)]
    commands.append((argv, _procs.cpu_env(4), str(tmp_path / f"{tag}_p{pid}.log")))
  return commands


def assert_same_metrics(got, want, what):
  assert [r["step"] for r in got] == [r["step"] for r in want], (what, got, want)
  for g, w in zip(got, want):
    for key in ("loss", "ar_loss", "dm_loss", "grad_norm", "eval_ar_loss", "eval_dm_loss",
                "real_tokens"):  # every host's rows, counted in the step (not estimated)
      if key in w:
        np.testing.assert_allclose(g[key], w[key], rtol=1e-5,
                                   err_msg=f"{what}: step {w['step']} {key}")


def test_two_processes_match_one_and_resume_together(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  # The 1 x 8 reference runs beside the first 2 x 4 run (3 processes on the cores).
  _procs.run_all(
      [([_procs.python(), *TRAIN_ARGS, "--workdir", str(one)], _procs.cpu_env(8),
        str(tmp_path / "one.log"))]
      + launch_two(two, tmp_path, "first", ["--config.progress_bar=True"]),
      timeout=TIMEOUT, what="1x8 reference and 2x4 run")
  want = read_metrics(one)
  assert [r["step"] for r in want if "loss" in r] == list(range(1, STEPS + 1)), want

  # Only process 0 writes: one record per step, and the bar only on process 0.
  assert_same_metrics(read_metrics(two), want, "2 processes x 4 devices vs 1 x 8")
  bar = f"{STEPS}/{STEPS}"
  assert bar in _procs.tail(str(tmp_path / "first_p0.log"), 10**6), "no bar on process 0"
  assert bar not in _procs.tail(str(tmp_path / "first_p1.log"), 10**6), "bar on process 1"

  # Orbax saved from both processes, the data iterator once per process.
  ckpt = two / "checkpoints"
  assert sorted(os.listdir(ckpt)) == ["2", str(STEPS)], os.listdir(ckpt)
  data_files = sorted(f for f in os.listdir(ckpt / "2" / "data") if f.endswith(".json"))
  assert data_files == ["process_0-of-2.json", "process_1-of-2.json"], data_files

  # Both processes restore step 2 (state, rng, each its own data position) and redo
  # steps 3..4 exactly: metrics.jsonl is cut back to step 2 and written again.
  shutil.rmtree(ckpt / str(STEPS))
  _procs.run_all(launch_two(two, tmp_path, "resume"), timeout=TIMEOUT,
                 what="2x4 resume from step 2")
  assert "Resumed from step 2" in _procs.tail(str(tmp_path / "resume_p0.log"), 10**6)
  assert_same_metrics(read_metrics(two), want, "2x4 resumed from step 2 vs 1x8")
