"""bench/train_throughput.py on the tiny config: it runs and reports every figure.

No timing is asserted: the figures depend on the machine and its load.
"""
import json
import os
import signal
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import train_throughput
from configs import bench as bench_configs
from mot import config as config_lib
from mot.data import input_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = {"tokens_per_s", "step_ms", "input_wait_ms", "flops_per_token", "flops_per_s",
        "peak_flops_per_s", "peak_dtype", "mfu", "compile_s", "recompiles", "peak_rss_mb",
        "xla_memory_mb", "attended_context", "params_per_token", "cpu_user_ms_per_step",
        "cpu_sys_ms_per_step", "minor_faults_per_step", "loadavg_start", "loadavg_end"}


def test_cli_prints_a_json_line_with_every_figure():
  proc = subprocess.run(
      [sys.executable, "-m", "bench.train_throughput", "--config", "configs/digits.py:tiny",
       "--steps", "2", "--warmup", "1", "--peak_size", "256", "--peak_reps", "2"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert KEYS <= set(result), KEYS - set(result)
  assert result["recompiles"] == 0, result["recompiled"]
  assert result["steps"] == 2 and np.isfinite(result["loss"])
  for key in ("tokens_per_s", "step_ms", "flops_per_token", "peak_flops_per_s", "mfu"):
    assert result[key] > 0, key
  assert result["peak_dtype"] == "bfloat16"   # the config's model.matmul_dtype

@pytest.mark.parametrize("variant", bench_configs.VARIANTS)
def test_bench_config_rows_hold_their_examples_whole(variant):
  """The benchmark variants validate, and their packed rows drop no example: the peer
  variant's rows are exactly as long as its longest example (one per row, as the peer),
  so a longer caption would otherwise vanish from the figures unnoticed."""
  config = bench_configs.get_config(variant)
  config_lib.validate(config)
  data = input_pipeline.make_train_dataset(config.data, seed=0, batch_size=config.batch_size)
  batch = next(iter(data))
  chex.assert_shape(batch["tokens"], (config.batch_size, config.data.seq_len))
  counts = input_pipeline.describe_batch(batch)
  assert counts["examples"] == config.batch_size * config.data.examples_per_row
  if variant == "peer":  # 16 examples of 40-41 tokens: the peer's batch, little padding
    assert counts["examples"] == 16 and counts["padding_fraction"] < 0.03


def test_attended_context_counts_allowed_keys_per_real_query():
  # One row: a causal text example of 3 tokens, then a 2-token bidirectional block in a
  # second example, then one padding token.
  batch = {"segment_ids": np.array([[1, 1, 1, 2, 2, 0]]),
           "block_ids": np.array([[0, 0, 0, 1, 1, 0]]),
           "dm_mask": np.zeros((1, 6), np.float32)}
  # Text queries see 1, 2, 3 keys; each block token sees both block tokens.
  assert train_throughput.attended_context(batch) == (1 + 2 + 3 + 2 + 2) / 5
  # Queries a chunk at a time (long rows): the same count.
  assert train_throughput.attended_context(batch, chunk=4) == (1 + 2 + 3 + 2 + 2) / 5


def test_active_params_skips_the_token_table_and_selects_one_modality():
  import flax.linen as nn
  import jax.numpy as jnp
  boxed = {"embed": {"token_embedding": nn.LogicallyPartitioned(jnp.zeros((10, 4)),
                                                                ("vocab", "embed"))},
           "patch_projection": nn.LogicallyPartitioned(jnp.zeros((4, 3, 4)),
                                                       ("modality", "patch", "embed")),
           "kernel": nn.LogicallyPartitioned(jnp.zeros((4, 5)), ("embed", "mlp")),
           "plain": jnp.zeros((2,))}
  passed, embedding = train_throughput.active_params(boxed)
  assert embedding == 40 and passed == 3 * 4 + 20 + 2


def test_shifted_frame_correlation_separates_real_motion_from_per_phase_drawings():
  from bench.video_consistency import shifted_frame_correlation
  from mot.data import digits, moving_digits
  held_x = digits.load_digits_split()[2]
  rng = np.random.default_rng(0)
  real = np.stack([moving_digits.constant_clip(x, "right", rng).frames for x in held_x[:4]])
  chex.assert_trees_all_close(shifted_frame_correlation(real), {k: 1.0 for k in range(1, 8)},
                              atol=1e-9)
  # Four different digits, one per sub-patch phase, each repeated 4 frames later one patch
  # (4 px) to the right: what docs/results.md §4 measured on generated clips.
  phases = [moving_digits.constant_clip(held_x[i], "right", np.random.default_rng(1)).frames
            for i in range(4)]
  mixed = np.stack([np.stack([phases[f % 4][f] for f in range(8)])])
  corr = shifted_frame_correlation(mixed)
  assert corr[4] > 0.999 and max(corr[1], corr[2], corr[3]) < 0.9


def test_swiglu_gradient_bench_times_both_versions_with_equal_gradients():
  proc = subprocess.run(
      [sys.executable, "-m", "bench.swiglu_gradient", "--config", "configs/digits.py:tiny",
       "--steps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["custom_ms"] > 0 and result["autodiff_ms"] > 0 and result["steps_each"] == 2
  assert result["distinct_programs"] is True   # the autodiff version really was traced
  assert result["max_grad_difference"] < 1e-4


def test_profile_step_bench_groups_the_traced_step_by_op_kind(tmp_path):
  from bench import profile_step
  assert profile_step.op_kind("ynn_fusion.14") == "ynn_fusion"
  assert profile_step.op_kind("copy_bitcast_fusion") == "copy_bitcast_fusion"
  assert profile_step.is_xla_worker("tf_XLAEigen/123") and not profile_step.is_xla_worker(
      "tf_XLAPjRtCpuClient/1")
  proc = subprocess.run(
      [sys.executable, "-m", "bench.profile_step", "--config", "configs/digits.py:tiny",
       "--warmup", "1", "--steps", "1", "--top", "4", "--trace_dir", str(tmp_path)],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["xla_threads"] >= 1 and result["wall_ms_per_step"] > 0
  assert 1 <= len(result["top_ops"]) <= 4
  shares = [op["share"] for op in result["top_ops"]]
  assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0 + 1e-6
  assert 0 < result["busy_fraction"]
  assert all(0 <= op["alone_ms_per_step"] <= op["ms_per_step"] + 1e-6 for op in result["top_ops"])
  assert 0 <= result["alone_ms_per_step"] <= result["xla_thread_ms_per_step"] + 1e-6
  assert not any(op["op"] in ("while", "ThunkExecutor::Execute") for op in result["top_ops"])
  assert any(name.endswith(".xplane.pb") for _, _, files in os.walk(tmp_path) for name in files)


def test_profile_step_alone_time_is_what_no_other_thread_overlaps():
  """Two threads: a runs a matmul 0-10 and a copy 20-30; b runs an add 5-8 and a reduce
  8-25, so b is busy 5-25 without a gap. The matmul is alone 0-5, the copy 25-30; the add
  lies inside the matmul (alone 0), the reduce is alone 10-20. One thread: always alone."""
  from bench import profile_step
  ops = {"a": [(0, 10, "matmul"), (20, 30, "copy")],
         "b": [(5, 8, "add"), (8, 25, "reduce")]}
  assert profile_step.op_times(ops) == {"matmul": 10, "copy": 10, "add": 3, "reduce": 17}
  assert profile_step.alone_times(ops) == {"matmul": 5, "copy": 5, "add": 0, "reduce": 10}
  assert profile_step.alone_times({"only": [(0, 4, "x"), (6, 7, "x")]}) == {"x": 5}


FAKE_PEER = """import json, os, sys
steps = sys.argv[sys.argv.index("--steps") + 1]
print("a line the ratio bench must skip")
print(json.dumps({"tokens_per_s": 100.0, "step_ms": 480.0, "step_ms_p10": 400.0,
                  "steps": int(steps), "threads": len(os.sched_getaffinity(0))}))
"""


def test_peer_ratio_alternates_the_two_runs_and_divides_their_figures(tmp_path):
  """The peer is a stand-in script here (the real one needs torch): the bench's own work is
  the alternation, the parsing, the arithmetic, and pinning both sides to --cpus."""
  fake = tmp_path / "fake_peer.py"
  fake.write_text(FAKE_PEER)
  proc = subprocess.run(
      [sys.executable, "-m", "bench.peer_ratio", "--mot_config", "configs/digits.py:tiny",
       "--pairs", "2", "--steps", "2", "--mot_args=--warmup 1 --peak_size 256 --peak_reps 2",
       "--peer_python", sys.executable, "--peer_script", str(fake), "--cpus", "0"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["order"] == ["mot-peer", "peer-mot"]
  assert result["cpus"] == [0]
  assert [r["cpus"] for r in result["mot"]] == [1, 1]
  assert [r["threads"] for r in result["peer"]] == [1, 1]
  mot = [r["tokens_per_s"] for r in result["mot"]]
  np.testing.assert_allclose(result["tokens_per_s_ratios"], [m / 100.0 for m in mot],
                             rtol=1e-3)
  np.testing.assert_allclose(result["tokens_per_s_ratio"], np.median(mot) / 100.0, rtol=1e-3)
  np.testing.assert_allclose(result["step_ratios"],
                             [480.0 / r["step_ms"] for r in result["mot"]], rtol=1e-3)
  fast = [r["tokens_per_s"] * r["step_ms"] / r["step_ms_p10"] / 120.0 for r in result["mot"]]
  np.testing.assert_allclose(result["tokens_per_s_ratio_p10"], np.median(fast), rtol=1e-3)
  assert result["tokens_per_s_ratio_min"] <= result["tokens_per_s_ratio"] <= result[
      "tokens_per_s_ratio_max"]


def test_peer_ratio_fails_in_one_line_without_the_peer(tmp_path):
  from bench import peer_ratio
  proc = subprocess.run(
      [sys.executable, "-m", "bench.peer_ratio", "--peer_python", str(tmp_path / "nope")],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().count("\n") == 0 and "peer_setup.sh" in proc.stderr
  proc = subprocess.run(
      [sys.executable, "-m", "bench.peer_ratio", "--peer_python", sys.executable,
       "--mot_args=--config.seed='1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert "--mot_args" in proc.stderr and "quotes" in proc.stderr, proc.stderr
  broken = tmp_path / "no_torch.py"
  broken.write_text("import sys; sys.exit(\"ModuleNotFoundError: No module named 'torch'\")")
  try:
    peer_ratio.run_one("peer", [sys.executable, str(broken)], timeout=60)
  except peer_ratio.BenchError as e:
    assert "peer failed (exit 1)" in str(e) and "peer_setup.sh" in str(e), e
  else:
    raise AssertionError("a peer that exits 1 must raise BenchError")
  assert peer_ratio.parse_cpus("0-2,5") == {0, 1, 2, 5}
  for bad in ("x", "1-a", ","):
    try:
      peer_ratio.parse_cpus(bad)
    except peer_ratio.BenchError as e:
      assert "--cpus" in str(e), e
    else:
      raise AssertionError(f"--cpus={bad!r} must raise BenchError")
  before = os.sched_getaffinity(0)
  try:
    peer_ratio.pin_to_cpus("100000")
  except peer_ratio.BenchError as e:
    assert "cannot run on CPUs [100000]" in str(e), e
  else:
    raise AssertionError("a CPU the machine lacks must raise BenchError")
  assert os.sched_getaffinity(0) == before
  assert peer_ratio.last_json_line('x\n{"a": 1}\nnot json\n') == {"a": 1}
  assert peer_ratio.last_json_line("[1, 2]\n") is None


FAKE_TRAIN = r'''
import json, os, sys, time
args = sys.argv[1:]
workdir = args[args.index("--workdir") + 1]
seed = int(next(a for a in args if a.startswith("--config.seed=")).split("=")[1])
if "--fail" in args:
  sys.exit("ValueError: config.bad=1 is not a field")
if "--slow" in args:  # as train.py: SIGTERM -> save a checkpoint, stop, exit 0
  import signal
  def stop(*_):
    open(os.path.join(workdir, "stopped.txt"), "w").write("SIGTERM")
    sys.exit(0)
  signal.signal(signal.SIGTERM, stop)
  open(os.path.join(workdir, "started.txt"), "w").write("started")
  time.sleep(120)
with open(os.path.join(workdir, "runs.txt"), "a") as f:
  f.write("ran\n")
reading = 0.97 + 0.01 * seed + (0.005 if "--better" in args else 0)
misread = [{"index": i, "label": 3, "answer": "5"} for i in ([5, 7] if seed else [5])]
record = {"step": 4, "split": "held-out", "reasoning_accuracy": reading,
          "reasoning_accuracy_single_view": reading - 0.03, "generation_accuracy": 0.99,
          "frechet_ratio": 0.9, "frechet": 120.0, "frechet_floor": 133.3,
          "reasoning_misread": misread}
with open(os.path.join(workdir, "eval.json"), "w") as f:
  json.dump({"latest": record, "evaluations": [record]}, f)
'''


def _sweep(tmp_path, *args):
  return subprocess.run(
      [sys.executable, "-m", "bench.seed_sweep", "--workdir", str(tmp_path / "sweep"),
       "--train_script", str(tmp_path / "fake_train.py"), *args],
      cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_seed_sweep_runs_every_setting_and_seed_and_summarises_across_seeds(tmp_path):
  """The trainer is a stand-in (real runs take minutes): the bench's own work is running
  each (setting, seed) once with the right flags, the arithmetic, and resuming."""
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  settings = ["--setting", "default=", "--setting", "better=--better", "--seeds", "0,1,2",
              "--parallel", "2"]
  proc = _sweep(tmp_path, *settings)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert [(r["setting"], r["seed"]) for r in result["runs"]] == [
      (n, s) for n in ("default", "better") for s in (0, 1, 2)]
  default, better = result["summary"]["default"], result["summary"]["better"]
  np.testing.assert_allclose(default["reasoning_accuracy"]["per_seed"], [0.97, 0.98, 0.99])
  np.testing.assert_allclose(default["reasoning_accuracy"]["mean"], 0.98)
  np.testing.assert_allclose(better["reasoning_accuracy"]["mean"], 0.985)
  assert default["meets_targets"] == 2 and better["meets_targets"] == 2
  assert default["misread_by_every_seed"] == [5]
  assert "all three targets met by 2 of 3" in proc.stdout
  proc = _sweep(tmp_path, *settings, "--seeds", "0,1,2,3")  # resumes: only seed 3 runs
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count("(finished earlier)") == 6
  for name in ("default", "better"):
    for seed in range(4):
      runs = (tmp_path / "sweep" / name / f"seed_{seed}" / "runs.txt").read_text()
      assert runs == "ran\n", (name, seed)


def test_seed_sweep_reports_a_failing_run_and_bad_flags_in_one_line(tmp_path):
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  proc = _sweep(tmp_path, "--setting", "default=", "--setting", "broken=--fail",
                "--seeds", "0")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert "1 of 2 runs failed" in proc.stderr and "config.bad=1" in proc.stderr, proc.stderr
  assert proc.stderr.strip().count("\n") == 0
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["summary"]["default"]["meets_targets"] == 0  # 97 % at seed 0
  assert result["summary"]["broken"]["failed"] == 1
  for bad, words in ((["--seeds", "0,0"], "--seeds"), (["--setting", "a b="], "NAME=ARGS"),
                     (["--setting", "x=--config.seed='1"], "quotes")):
    proc = _sweep(tmp_path, *bad)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr


def test_seed_sweep_passes_sigterm_to_its_runs_and_says_how_to_resume(tmp_path):
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  proc = subprocess.Popen(
      [sys.executable, "-m", "bench.seed_sweep", "--workdir", str(tmp_path / "sweep"),
       "--train_script", str(tmp_path / "fake_train.py"), "--setting", "slow=--slow",
       "--seeds", "0,1,2", "--parallel", "2"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  started = [tmp_path / "sweep" / "slow" / f"seed_{s}" / "started.txt" for s in (0, 1)]
  deadline = time.time() + 120
  while not all(p.exists() for p in started) and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1 and "Traceback" not in stderr, stderr
  assert "stopped by SIGTERM: 0 of 3 runs finished" in stderr and "resume" in stderr, stderr
  for seed in (0, 1):  # both running trainers were told to stop (and save)
    assert (tmp_path / "sweep" / "slow" / f"seed_{seed}" / "stopped.txt").exists()
  assert not (tmp_path / "sweep" / "slow" / "seed_2" / "started.txt").exists()
  assert json.loads(stdout.strip().splitlines()[-1])["summary"]["slow"]["failed"] == 3


def test_cnn_reader_views_are_the_reading_shifts():
  from bench import cnn_reader
  from mot.data import digits, tasks
  images = digits.load_digits_split()[2][:5]
  views = cnn_reader.shifted_views(images, 1)
  chex.assert_shape(views, (9, 5, 8, 8))
  np.testing.assert_array_equal(views[4], images)             # (0, 0) in the middle
  np.testing.assert_array_equal(views[0], tasks.shift_image(images, -1, -1))
  np.testing.assert_array_equal(views[5], tasks.shift_image(images, 0, 1))
  assert cnn_reader.shifted_views(images, 0).shape == (1, 5, 8, 8)


def test_cnn_reader_learns_to_read_and_reports_every_seed():
  """A few hundred steps already read most held-out digits (chance is 10 %), so a broken
  augmentation, read-out or label pairing fails here."""
  proc = subprocess.run(
      [sys.executable, "-m", "bench.cnn_reader", "--seeds", "0,1", "--steps", "200",
       "--width", "8"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert [r["seed"] for r in result["seeds"]] == [0, 1] and result["views"] == 9
  for r in result["seeds"]:
    assert r["accuracy"] > 0.8 and r["accuracy_single_view"] > 0.7, r
    assert r["accuracy"] == pytest.approx(1 - len(r["misread"]) / 297)
  assert result["always_misread"] == sorted(
      set(result["seeds"][0]["misread"]) & set(result["seeds"][1]["misread"]))
  assert result["ensemble_accuracy"] == pytest.approx(1 - len(result["ensemble_misread"]) / 297)
  for seeds in ("a", "1,1"):  # a duplicate seed would count twice in the ensemble
    bad = subprocess.run([sys.executable, "-m", "bench.cnn_reader", "--seeds", seeds],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "--seeds" in bad.stderr, bad.stderr


def test_hlo_dots_reads_operand_dtypes_flops_and_layouts():
  from bench import hlo_dots
  meta = ', metadata={op_name="jit(f)/%s/dot_general"}'
  hlo = "\n".join([
      "%fused_computation.1 (param_0.2: bf16[512,2048], param_1.2: bf16[2048,256]) {",
      "  %param_0.2 = bf16[512,2048]{1,0} parameter(0)",
      "  %param_1.2 = bf16[2048,256]{1,0} parameter(1)",
      "  ROOT %dot.98 = f32[512,256]{1,0} dot(%param_0.2, %param_1.2), "
      "lhs_contracting_dims={1}, rhs_contracting_dims={0}" + meta % "mlp/wi",
      "}",
      "%fused_computation.2 (param_0.3: f32[2048,512], param_1.3: f32[2048,32]) {",
      "  %param_0.3 = f32[2048,512]{1,0} parameter(0)",
      "  %param_1.3 = f32[2048,32]{1,0} parameter(1)",
      "  ROOT %dot.99 = f32[512,32]{1,0} dot(%param_0.3, %param_1.3), "
      "lhs_contracting_dims={0}, rhs_contracting_dims={0}" + meta % "wgrad/x",
      "}"])
  dots = hlo_dots.parse_dots(hlo)
  assert [d["operands"] for d in dots] == ["bf16 x bf16", "f32 x f32"]
  assert dots[0]["flops"] == 2 * 512 * 256 * 2048 and not dots[0]["transposed"]
  assert dots[1]["flops"] == 2 * 512 * 32 * 2048 and dots[1]["transposed"] and dots[1]["small"]
  assert dots[0]["op"] == "wi" and not dots[0]["small"]
  summary = hlo_dots.summarize(dots)
  assert summary["flops_by_operands"]["bf16 x bf16"] == dots[0]["flops"]
  assert summary["transposed_flops"] == summary["small_flops"] == dots[1]["flops"]


def test_long_rows_runs_each_case_in_a_subprocess_and_tables_them():
  """bench.long_rows on 128-token rows: one case run (memory, time, loss), one refused
  by a memory bar it cannot meet (reported with XLA's bytes, not run)."""
  proc = subprocess.run(
      [sys.executable, "-m", "bench.long_rows", "--lengths", "128", "--impls", "blockwise",
       "--steps", "1", "--warmup", "1"], cwd=ROOT, capture_output=True, text=True,
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (case,) = json.loads(proc.stdout.strip().splitlines()[-1])["cases"]
  assert case["impl"] == "blockwise" and case["seq_len"] == 128 and case["fits"]
  for key in ("step_s", "tokens_per_s", "peak_rss_gb", "xla_gb", "real_tokens"):
    assert case[key] > 0, key
  assert np.isfinite(case["loss"]) and "| blockwise | 128 (" in proc.stdout
  from bench import long_rows
  refused = dict(case, impl="xla", fits=False, xla_gb=14.1)
  assert "14.10 GB | does not fit" in long_rows.table([refused], max_gb=6.0)


def test_patch_coupling_summarises_self_neighbour_and_far_blocks():
  from bench import patch_coupling
  blocks = np.arange(16, dtype=np.float64).reshape(4, 4)   # a 2 x 2 patch grid
  # self: the diagonal; neighbour: patches sharing an edge; far: the diagonal pairs.
  assert patch_coupling.summarise(blocks, 2) == {
      "self": np.mean([0, 5, 10, 15]), "neighbour": np.mean([1, 2, 4, 7, 8, 11, 13, 14]),
      "far": np.mean([3, 6, 9, 12])}


def _tiny_shapes_model_and_example():
  """A one-layer x0 model and an 8x8 "a red square" caption -> image example (2 x 2
  patches of 4 x 4): (model, params, example, batch, image)."""
  from mot import tokenizer
  from mot.data import shapes_scene
  from mot.data import shapes_tasks
  from mot.model import MoT
  from mot.model import inputs_from_batch
  from tests._models import model_config
  cfg = model_config(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                     mlp_dim=64, patch_dim=48, modality_patch_dims=(0, 48, 48, 2),
                     rope_sections=(2, 3, 3), time_embed_dim=32, dm_prediction="x")
  options = shapes_tasks.ShapesTaskOptions(patch_size=4, patch_dim=48,
                                           scene=shapes_scene.DEFAULT_OPTIONS,
                                           tokenizer=tokenizer.BYTE_TOKENIZER)
  image = np.zeros((8, 8, 3), np.uint8)
  image[2:6, 1:5] = (255, 0, 0)
  example = shapes_tasks.generation_example("a red square", image, options)  # 2 x 2 patches
  model = MoT(cfg)
  batch = {k: jnp.asarray(v)[None] for k, v in example.items()}
  batch["segment_ids"] = jnp.ones_like(batch["tokens"])
  params = model.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  return model, params, example, batch, image


def test_patch_coupling_blocks_are_the_full_jacobian_cut_per_patch():
  from bench import patch_coupling
  from mot.model import inputs_from_batch
  model, params, example, batch, _ = _tiny_shapes_model_and_example()
  t = 0.7
  noise = np.random.default_rng(0).standard_normal((4, 48)).astype(np.float32)
  blocks = patch_coupling.coupling_blocks(model, params, example, t, noise)

  noised = np.flatnonzero(example["dm_mask"] > 0)
  x_t = (1 - t) * batch["patches"][0, noised] + t * noise
  def flat_estimate(x):                 # the same estimate, flattened, reverse mode
    patches = batch["patches"].at[0, noised].set(x.reshape(4, 48))
    times = jnp.where(batch["dm_mask"] > 0, t, 0.0)
    _, v, _ = model.apply({"params": params}, inputs_from_batch(batch, patches, times))
    return (x.reshape(4, 48) - t * v[0, noised]).reshape(-1)
  full = np.asarray(jax.jacrev(flat_estimate)(x_t.reshape(-1))).reshape(4, 48, 4, 48)
  np.testing.assert_allclose(blocks, np.sqrt((full ** 2).sum((1, 3))), rtol=1e-4)
  step = np.zeros((4, 48), np.float32)
  step[1, 5] = 1e-2                     # one input of patch 1, by central differences
  column = (flat_estimate((x_t + step).reshape(-1)) - flat_estimate((x_t - step).reshape(-1)))
  np.testing.assert_allclose(np.asarray(column).reshape(4, 48) / 2e-2, full[:, :, 1, 5],
                             atol=2e-3)
  assert blocks.shape == (4, 4) and (blocks[~np.eye(4, dtype=bool)] > 0).all()


def test_relation_flip_premise_a_mirrored_scene_has_the_opposite_answer():
  """Its premise: every left / right relation item, mirrored and read back by the exact
  detector, answers the other way; and the figures count as the docstring says."""
  from bench import relation_flip
  from mot import shapes_detector
  from mot.data import shapes_grammar as grammar
  from mot.data import shapes_order
  from mot.data import shapes_scene
  items = relation_flip.relation_items(12)
  assert len(items) == 12
  for scene, qa in items:
    assert " left of " in qa.question or " right of " in qa.question
    seen = shapes_detector.detect(relation_flip.mirrored(shapes_scene.render(scene)))
    assert grammar.answer_question(qa.question, seen).answer == {"yes": "no",
                                                                 "no": "yes"}[qa.answer]
    question, answer, mirror_answer = relation_flip.order_item(scene, qa)
    kinds = [scene.objects[i].kind for i in qa.objects]
    assert question in {shapes_order.question_text(r, *kinds) for r in relation_flip.HORIZONTAL}
    names = {" ".join(scene.objects[i].kind) for i in qa.objects}
    assert {answer, mirror_answer} == names and answer != mirror_answer
    truth = next(o for o in shapes_order.order_questions(scene) if o.question == question)
    assert truth.answer == answer
    assert next(o for o in shapes_order.order_questions(seen)
                if o.question == question).answer == mirror_answer
  figures = relation_flip.question_figures(["yes", "no", "yes", "no"],
                                           ["yes", "yes", "no", "no"],
                                           ["no", "yes", "no", "yes"])
  assert figures == {"items": 4, "accuracy": 0.5, "mirror_accuracy": 1.0, "changed": 0.5}
  figures = relation_flip.question_figures(["red square", "blue circle"],
                                           ["red square", "red square"], ["red square"] * 2,
                                           ["blue circle", "red square"])
  assert figures == {"items": 2, "accuracy": 0.5, "mirror_accuracy": 0.5, "changed": 0.0}
  scenes = relation_flip.pair_scenes(2)
  truth = [grammar.caption(s) for s in scenes]
  figures = relation_flip.caption_figures(scenes, [truth[0], "a red square"], truth)
  assert figures == {"items": 2, "true": 0.5,
                     "with_relation": np.mean([" and " not in truth[0], False]),
                     "changed": 0.5}


def test_relation_flip_reads_a_trace_by_its_places_and_their_comparison():
  from bench import relation_flip
  from mot.data import shapes_think
  items = relation_flip.relation_items(3)
  replies = []
  for scene, qa in items:
    relation = shapes_think.relation_of(qa.question)
    a, b = (shapes_think.place(scene.objects[i], relation) for i in qa.objects)
    replies.append(f"red circle {a + 1}, blue square {b}: "
                   + shapes_think.implied_answer(a + 1, b, relation))
  replies[1] = replies[1].replace("red circle", "red")                  # not a trace
  replies[2] = f"{replies[2].rsplit(':', 1)[0]}: " + {"yes": "no", "no": "yes"}[
      replies[2].rsplit(": ", 1)[1]]                                   # contradicts itself
  figures = relation_flip.trace_figures(items, replies)
  assert figures == pytest.approx({"items": 3, "form": 2 / 3, "places_within_one_step": 2 / 3,
                                   "answer_follows_places": 1 / 3})
  assert shapes_think.implied_answer(2, 7, "left of") == "yes"
  assert shapes_think.implied_answer(2, 7, "below") == "no"
  assert shapes_think.parse_trace(" cyan square 8, cyan circle 3: no") == (8, 3, "no")


def test_plan_follow_place_response_is_one_when_drawn_as_planned_and_zero_when_not():
  import types
  from bench import plan_follow
  from mot.data import shapes_think

  def fake_pipe(follows: bool, canvas: bool):
    seen = []

    def example(text, plan, canvas=None):
      seen.append(canvas)
      return plan if follows else " red circle 5 5"

    def denoise(examples, *a):
      return np.stack([shapes_think.plan_canvas(p, 32) / 255.0 for p in examples])

    return seen, types.SimpleNamespace(
        config=types.SimpleNamespace(data=types.SimpleNamespace(layout_canvas=canvas,
                                                                image_size=32)),
        prompts=types.SimpleNamespace(generation_example=example),
        tokenizer=types.SimpleNamespace(encode=lambda text: text),
        sampling_settings=lambda n: (2, 1.0, "euler"), denoise=denoise,
        to_images=lambda x: x)

  seen, pipe = fake_pipe(True, canvas=True)
  assert plan_follow.place_response(pipe, 2) == {"column": 1.0, "row": 1.0, "no_ink": 0.0}
  assert len(seen) == 8 and all(c.shape == (32, 32, 3) for c in seen)
  seen, pipe = fake_pipe(False, canvas=False)
  assert plan_follow.place_response(pipe, 2) == {"column": 0.0, "row": 0.0, "no_ink": 0.0}
  assert seen == [None] * 8


def test_plan_follow_judges_plans_and_drawings_by_the_places():
  from bench import plan_follow
  from mot import shapes_detector
  from mot.data import shapes_scene, shapes_think
  from mot.data.shapes_scene import Scene, SceneObject
  red = SceneObject(2, 2, 7, 7, "red", "circle")        # places (1, 1)
  blue = SceneObject(20, 21, 7, 7, "blue", "square")    # places (8, 7)
  plan = shapes_think.plan_text([red, blue])
  assert shapes_think.parse_plan(plan) == [("red", "circle", 1, 1), ("blue", "square", 8, 7)]
  assert shapes_think.parse_plan("red circle 1") is None
  assert plan_follow.plan_valid("a red circle left of a blue square", plan)
  assert not plan_follow.plan_valid("a blue square left of a red circle", plan)
  assert plan_follow.plan_valid("a blue square below a red circle", plan)
  assert not plan_follow.plan_valid("a red circle", plan)            # an extra object
  assert not plan_follow.plan_valid("a red circle and a blue square", "red circle 1")
  seen = shapes_detector.detect(shapes_scene.render(Scene((red, blue))))
  assert plan_follow.drawn_as_planned(plan, seen)
  assert plan_follow.drawn_as_planned(" red circle 2 2, blue square 8 7", seen)  # one step off
  assert not plan_follow.drawn_as_planned(" red circle 3 1, blue square 8 7", seen)
  assert not plan_follow.drawn_as_planned(" red circle 1 1", seen)


def test_denoise_probe_scores_a_perfect_and_a_broken_estimate():
  from bench import denoise_probe
  scene = np.zeros((32, 32, 3), np.uint8)
  scene[4:13, 4:13] = (255, 0, 0)                  # a red square, 9 px
  assert denoise_probe.score(scene, scene) == {"exact": 1.0, "unknown": 0.0, "error": 0.0}
  broken = scene.copy()
  broken[4:8, 4:13] = 0                            # its top rows gone: a 5 x 9 bar
  got = denoise_probe.score(broken, scene)
  assert got["exact"] == 0.0 and got["unknown"] == 1.0
  assert got["error"] == pytest.approx(4 * 9 * 255 / (32 * 32 * 3))   # red: one channel of 3


def test_denoise_probe_estimate_is_x_t_minus_t_v_and_images_round_trip():
  from bench import denoise_probe
  from mot.model import inputs_from_batch
  model, params, example, batch, image = _tiny_shapes_model_and_example()
  noised = np.flatnonzero(example["dm_mask"] > 0)
  assert (denoise_probe.to_image(example["patches"][noised], 4) == image).all()
  t = 0.3
  x_t = (1 - t) * example["patches"][noised] + t * np.ones((4, 48), np.float32)
  got = denoise_probe.estimate_fn(model)(params, batch, jnp.asarray(noised), jnp.asarray(x_t),
                                         jnp.float32(t))
  patches = batch["patches"].at[0, noised].set(x_t)
  _, v, _ = model.apply({"params": params}, inputs_from_batch(
      batch, patches, jnp.where(batch["dm_mask"] > 0, t, 0.0)))
  np.testing.assert_allclose(np.asarray(got), x_t - t * np.asarray(v[0, noised]), rtol=1e-5,
                             atol=1e-6)


def test_generation_failures_sorts_each_scene_by_its_first_fault():
  from bench import generation_failures as gf
  from mot.data.shapes_scene import Scene
  from mot.data.shapes_scene import SceneObject
  red_square = SceneObject(2, 2, 9, 9, "red", "square")
  blue_circle = SceneObject(2, 20, 9, 9, "blue", "circle")
  blob = SceneObject(20, 2, 9, 9, "red", "unknown")
  assert gf.fault("a red square", Scene((red_square,))) == "correct"
  assert gf.fault("a red square", Scene((red_square, blob))) == "more objects"
  assert gf.fault("two red squares", Scene((red_square,))) == "fewer objects"
  assert gf.fault("a red square", Scene((blob,))) == "no shape"
  assert gf.fault("a blue circle", Scene((red_square,))) == "wrong attribute"
  assert gf.fault("a red square left of a blue circle",
                  Scene((red_square, blue_circle))) == "correct"
  assert gf.fault("a blue circle left of a red square",
                  Scene((red_square, blue_circle))) == "wrong attribute"


def test_noise_times_reads_the_flag_and_refuses_bad_values_in_one_line():
  import bench
  assert bench.noise_times("0.9,0.05", 8, "probe") == [0.9, 0.05]
  for times, examples in (("0.5,1.5", 8), ("0,0.5", 8), ("half", 8), ("0.5", 0)):
    with pytest.raises(SystemExit) as e:
      bench.noise_times(times, examples, "probe")
    assert str(e.value).startswith("probe: --examples must be >= 1") and "\n" not in str(e.value)
