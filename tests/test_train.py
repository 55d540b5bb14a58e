"""train_and_evaluate end to end on the bundled digits, with tiny configs."""
import json
import os
import subprocess
import sys

import numpy as np

from mot import train_lib
from mot import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_one_step(tiny_config, tmp_path):
  tiny_config.num_train_steps = 1
  state = train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  assert int(state.step) == 1
  records = read_metrics(tmp_path)
  train = [r for r in records if "loss" in r]
  assert train and set(train[0]) >= {"step", "loss", "ar_loss", "dm_loss", "learning_rate",
                                     "tokens_per_s", "real_tokens"}
  # The lone (compile) step is timed whole, and its real tokens are the batch's.
  from mot.data import input_pipeline
  first = next(iter(input_pipeline.make_train_dataset(tiny_config.data, tiny_config.seed,
                                                tiny_config.batch_size)))
  assert train[0]["real_tokens"] == int((first["segment_ids"] > 0).sum()) > 0
  assert train[0]["tokens_per_s"] > 0
  assert all(np.isfinite(train[0][k]) for k in ("loss", "ar_loss", "dm_loss"))
  assert any("eval_ar_loss" in r for r in records)
  assert os.path.isdir(os.path.join(tmp_path, "checkpoints", "1"))


def test_both_losses_fall_over_50_steps(tiny_config, tmp_path):
  tiny_config.num_train_steps = 50
  tiny_config.log_every_steps = 10
  tiny_config.eval_every_steps = 50
  tiny_config.checkpoint_every_steps = 50
  tiny_config.learning_rate = 3e-3
  tiny_config.warmup_steps = 5
  train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  train = [r for r in read_metrics(tmp_path) if "loss" in r]
  assert [r["step"] for r in train] == [10, 20, 30, 40, 50]
  first, last = train[0], train[-1]
  assert last["ar_loss"] < 0.8 * first["ar_loss"], (first, last)
  assert last["dm_loss"] < 0.9 * first["dm_loss"], (first, last)


def test_cli_trains_and_overrides_fields(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/digits.py:tiny", "--workdir",
       str(workdir), "--config.num_train_steps=2", "--config.log_every_steps=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  steps = [r["step"] for r in read_metrics(workdir) if "loss" in r]
  assert steps == [1, 2]


def test_heldout_losses_weigh_targets_not_batches():
  # The last held-out batches hold only reading examples (no DM target): they must not
  # drag the DM average toward zero.
  results = [{"ar_loss": 1.0, "dm_loss": 0.8, "ar_weight": 10.0, "dm_weight": 64.0},
             {"ar_loss": 3.0, "dm_loss": 0.0, "ar_weight": 30.0, "dm_weight": 0.0}]
  means = step_lib.weighted_eval_means(results)
  np.testing.assert_allclose(means["dm_loss"], 0.8)
  np.testing.assert_allclose(means["ar_loss"], 2.5)


def test_label_smoothing_matches_the_one_hot_soft_target_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, size=(2, 5))
  weights = (rng.random((2, 5)) > 0.3).astype(np.float32)
  s = 0.1
  logp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
  soft = np.full(logits.shape, s / 7) + (1 - s) * np.eye(7)[targets]
  want = np.sum(-np.sum(soft * logp, -1) * weights) / weights.sum()
  plain = np.sum(-np.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights)
  plain /= weights.sum()
  got = step_lib.label_smoothed(np.float32(plain), logits, weights, s)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert want > plain  # the uniform term costs something when the logits are peaked


def losses_of(config, field, values):
  """compute_losses' (total, metrics) for each value of config.FIELD: one tiny model,
  batch and random draw, so only the field differs."""
  import jax
  from mot import model as model_lib
  from mot.config import validate
  from mot.data import input_pipeline
  model = model_lib.MoT(validate(config))
  batch = next(iter(input_pipeline.make_train_dataset(config.data, 0, 4)))
  batch = jax.tree.map(np.asarray, batch)
  params = model.init(jax.random.PRNGKey(0), model_lib.inputs_from_batch(batch))["params"]
  out = {}
  for value in values:
    config[field] = value
    validate(config)
    out[value] = step_lib.compute_losses(params, batch, jax.random.PRNGKey(1), model, config)
  return out


def test_label_smoothing_changes_the_objective_not_the_logged_ar_loss(tiny_config):
  out = losses_of(tiny_config, "ar_label_smoothing", (0.0, 0.2))
  (total0, m0), (total2, m2) = out[0.0], out[0.2]
  np.testing.assert_allclose(m0["ar_loss"], m2["ar_loss"], rtol=1e-6)
  assert abs(float(total2) - float(total0)) > 1e-4


def test_the_x0_loss_is_the_squared_error_of_the_clean_estimate():
  """dm_loss_space="x0": x_t - t v_pred against x0, over the same tokens and dims."""
  from mot import diffusion
  rng = np.random.default_rng(0)
  x0, noise, pred = (rng.normal(size=(2, 5, 6)).astype(np.float32) for _ in range(3))
  t = rng.uniform(0.05, 1.0, size=(2, 5)).astype(np.float32)
  tokens = np.array([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]], np.float32)
  dims = np.array([1, 1, 1, 1, 0, 0], np.float32)
  x_t = diffusion.add_noise(x0, noise, t)
  x0_hat = x_t - t[..., None] * pred
  w = tokens[..., None] * dims
  want = np.sum(w * (x0_hat - x0) ** 2) / np.sum(w)
  target = diffusion.velocity_target(x0, noise)
  got = diffusion.velocity_loss(pred, target, tokens, dims, t)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  velocity = diffusion.velocity_loss(pred, target, tokens, dims)
  np.testing.assert_allclose(velocity, np.sum(w * (pred - target) ** 2) / np.sum(w), rtol=1e-5)


def test_dm_loss_space_x0_changes_only_the_dm_loss(tiny_config):
  import pytest
  from mot.config import ConfigError, validate
  out = {k: v[1] for k, v in losses_of(tiny_config, "dm_loss_space", ("velocity", "x0")).items()}
  np.testing.assert_allclose(out["x0"]["ar_loss"], out["velocity"]["ar_loss"], rtol=1e-6)
  # Each token's error is weighted by t^2 < 1: the same draws give a smaller loss.
  assert 0 < float(out["x0"]["dm_loss"]) < 0.9 * float(out["velocity"]["dm_loss"])
  tiny_config.dm_loss_space = "eps"
  with pytest.raises(ConfigError, match="dm_loss_space='eps' is unknown") as e:
    validate(tiny_config)
  assert "\n" not in str(e.value)


def test_resume_check_takes_a_missing_validation_size_as_0_and_refuses_another(tmp_path):
  # A checkpoint written before data.validation_size existed trained on all 1,500 digits,
  # i.e. validation_size 0: it resumes. One trained with another split is refused.
  import pytest
  from configs import digits
  from mot import checkpoint as ckpt_lib
  config = digits.get_config("tiny")
  meta = tmp_path / "checkpoints" / "5" / "config" / "metadata"
  meta.parent.mkdir(parents=True)
  saved = json.loads(json.dumps(config.to_dict()))
  del saved["data"]["validation_size"]
  meta.write_text(json.dumps(saved))
  train_lib.check_resumable(str(tmp_path), 5, config)
  config.data.validation_size = 100
  with pytest.raises(ckpt_lib.CheckpointError, match=r"config.data fields \(validation_size\)"):
    train_lib.check_resumable(str(tmp_path), 5, config)


def test_a_failed_last_evaluation_keeps_its_checkpoint_and_a_rerun_evaluates(
    tiny_config, tmp_path, monkeypatch):
  # The checkpoint is written before the evaluation at the same step: a crash in the
  # evaluation (here a stand-in error) must not cost the steps since the previous save.
  import pytest
  from mot import checkpoint as ckpt_lib, evaluate
  def broken(*args, **kwargs):
    raise RuntimeError("evaluation broke")
  monkeypatch.setattr(evaluate, "evaluate_pipeline", broken)
  tiny_config.num_train_steps = 3
  tiny_config.checkpoint_every_steps = 100
  tiny_config.eval_every_steps = 100
  tiny_config.eval_samples_per_digit = 1
  tiny_config.sample.reason_shifts = 0  # one view: this test is about the order, not reading
  with pytest.raises(RuntimeError, match="evaluation broke"):
    train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  assert ckpt_lib.available_steps(str(tmp_path)) == [3]
  assert train_lib.final_evaluation_missing(tiny_config, str(tmp_path), 3)
  # Rerunning the same command trains nothing and evaluates the saved last step.
  monkeypatch.undo()
  train_lib.train_and_evaluate(tiny_config, str(tmp_path))
  with open(tmp_path / "eval.json") as f:
    assert [r["step"] for r in json.load(f)["evaluations"]] == [3]
  assert not train_lib.final_evaluation_missing(tiny_config, str(tmp_path), 3)
  assert ckpt_lib.available_steps(str(tmp_path)) == [3]


def test_a_nonfinite_step_leaves_the_state_bitwise_unchanged(tiny_config):
  """The update is skipped (lax.cond in step.train_step): parameters, AdamW moments and
  EMA stay bit for bit, the step counts; the next finite batch updates as usual."""
  import jax
  from mot import sharding
  from mot.data import input_pipeline
  t = step_lib.build_training(tiny_config, jax.devices()[:1])
  batch = next(iter(input_pipeline.make_train_dataset(tiny_config.data, tiny_config.seed,
                                                      tiny_config.batch_size)))
  poisoned = dict(batch, patches=np.full_like(batch["patches"], np.nan))
  put = lambda b: sharding.global_batch(t.mesh, b, tiny_config.batch_size)
  with jax.set_mesh(t.mesh):
    state, _ = t.p_train_step(t.state, put(batch), t.step_rng)   # lr > 0 from step 1 on
    before = jax.device_get(state)
    state, metrics = t.p_train_step(state, put(poisoned), t.step_rng)
    after = jax.device_get(state)
    state, _ = t.p_train_step(state, put(batch), t.step_rng)
  assert not np.isfinite(float(metrics["loss"])) and int(metrics["nonfinite_run"]) == 1
  assert int(after.step) == int(before.step) + 1
  for old, new in zip(jax.tree.leaves((before.params, before.opt_state, before.ema_params)),
                      jax.tree.leaves((after.params, after.opt_state, after.ema_params))):
    np.testing.assert_array_equal(old, new)
  moved = jax.tree.leaves(jax.device_get(state.params))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after.params), moved))


def test_a_step_keeps_bf16_parameters_and_their_ema_in_bf16(tiny_config):
  """model.param_dtype=bfloat16: the EMA's float32 decay must not promote the state
  (the step's lax.cond needs the same dtypes either way, and a promoted state would
  recompile the next step)."""
  import jax
  from mot import sharding
  from mot.data import input_pipeline
  tiny_config.model.param_dtype = "bfloat16"
  t = step_lib.build_training(tiny_config, jax.devices()[:1])
  batch = next(iter(input_pipeline.make_train_dataset(tiny_config.data, tiny_config.seed,
                                                      tiny_config.batch_size)))
  dtypes = jax.tree.map(lambda x: x.dtype, t.state)
  with jax.set_mesh(t.mesh):
    state, metrics = t.p_train_step(
        t.state, sharding.global_batch(t.mesh, batch, tiny_config.batch_size), t.step_rng)
  assert np.isfinite(float(metrics["loss"]))
  assert jax.tree.map(lambda x: x.dtype, state) == dtypes
  assert {str(x.dtype) for x in jax.tree.leaves(state.ema_params)} == {"bfloat16"}
