"""The training loop: `train_and_evaluate(config, workdir)` runs the jitted step of
`mot.step` on the grain input pipeline, with orbax checkpoints (exact resume), the metrics
log and held-out evaluation."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import tqdm
from absl import logging

from mot import checkpoint as ckpt_lib
from mot import config as config_lib
from mot import config_upgrade
from mot import evaluate, plot, sharding, summary, tokenizer, warm_start
from mot.data import auto_config, input_pipeline, packing
from mot.errors import TrainingError  # noqa: F401  (raised here; also mot.train_lib's name)
from mot.pipeline import Pipeline
from mot.step import TrainState, build_training, weighted_eval_means

Array = jax.Array


# ----------------------------------------------------------------------------------------
# Held-out data.
# ----------------------------------------------------------------------------------------
def pack_rows(examples: list[dict], seq_len: int, per_row: int) -> list[dict]:
  """Greedy rows of at most `per_row` examples: a new row starts when the next example
  does not fit, so no held-out example is ever dropped (each one fits alone: validated)."""
  rows, current, used = [], [], 0
  for ex in examples:
    n = len(ex["tokens"])
    if current and (used + n > seq_len or len(current) == per_row):
      rows.append(packing.pack_examples(current, seq_len)[0])
      current, used = [], 0
    current.append(ex)
    used += n
  if current:
    rows.append(packing.pack_examples(current, seq_len)[0])
  return rows


def heldout_batches(config, batch_size: int) -> list[dict[str, np.ndarray]]:
  """The held-out examples (generation and reasoning tasks), packed into full batches."""
  tok = tokenizer.from_config(config)
  examples = (input_pipeline.heldout_examples(config.data, "generation", tok)
              + input_pipeline.heldout_examples(config.data, "reasoning", tok))
  rows = pack_rows(examples, config.data.seq_len, config.data.examples_per_row)
  empty = {k: np.zeros_like(v) for k, v in rows[0].items()}
  while len(rows) % batch_size:
    rows.append(empty)
  return [{k: np.stack([r[k] for r in rows[i:i + batch_size]]) for k in rows[0]}
          for i in range(0, len(rows), batch_size)]


# ----------------------------------------------------------------------------------------
# Training input (multi-host: each process loads only its rows).
# ----------------------------------------------------------------------------------------
def process_train_dataset(config, mesh):
  """This process's rows of every global training batch (all of them on one process).

  Global batch j is the same for any number of processes, so losses match a
  single-process run; process p loads its block, rows [p*B/P, (p+1)*B/P) on CPU/GPU.
  """
  index, count = sharding.data_shard(mesh, config.batch_size)
  return input_pipeline.make_train_dataset(config.data, config.seed, config.batch_size // count,
                                           index, count, tokenizer.from_config(config))


def global_tokens(local: dict[str, np.ndarray], batch_size: int) -> int:
  """Real tokens in the global batch, estimated from this process's rows (exact with one
  process, as in the benchmarks; the training loop counts them inside the step instead)."""
  rows = local["segment_ids"].shape[0]
  return int(np.sum(local["segment_ids"] > 0)) * batch_size // rows


# ----------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------
class MetricsLog:
  """Appends one JSON object per logged step to DIR/metrics.jsonl (process 0 only).

  On resume, records past the restored step are dropped first: they were written by the
  interrupted run after its last checkpoint and will be written again, identically.
  """

  def __init__(self, workdir: str, resume_step: int = 0):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.enabled = jax.process_index() == 0
    if self.enabled and os.path.exists(self.path):
      self._truncate_after(resume_step)
    self.tensorboard = summary.SummaryWriter(workdir, enabled=self.enabled)

  def _truncate_after(self, step: int) -> None:
    with open(self.path) as f:
      lines = f.readlines()
    kept = []
    for line in lines:
      try:
        if json.loads(line)["step"] <= step:
          kept.append(line)
      except (ValueError, KeyError, TypeError):
        break  # a line cut by a crash: nothing after it is trustworthy
    if kept != lines:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(kept)
      os.replace(tmp, self.path)

  def write(self, record: dict) -> None:
    """Appends the record to metrics.jsonl and mirrors its scalars to TensorBoard."""
    if self.enabled:
      with open(self.path, "a") as f:
        f.write(json.dumps(record) + "\n")
      self.tensorboard.scalars(record["step"], record)

  def image(self, step: int, name: str, image) -> None:
    self.tensorboard.image(step, name, image)

  def close(self) -> None:
    self.tensorboard.close()


def _mean_metrics(history: list[dict]) -> dict[str, float]:
  history = jax.device_get(history)
  # float64 on purpose: restored (JSON) and fresh (float32) entries then average alike.
  return {k: float(np.mean(np.asarray([h[k] for h in history], np.float64)))
          for k in history[0]}


LOGGED = ("loss", "ar_loss", "dm_loss", "learning_rate", "grad_norm")


def _interval_tokens(history: list[dict], timed_steps: int, timed_s: float, whole_s: float
                     ) -> dict[str, float]:
  """real_tokens: the global batch's real tokens over the steps since the last log (all
  hosts, counted in the step); tokens_per_s: over the last `timed_steps`, which leave out
  the compile step unless it is the interval's only step (then it is timed, compile and
  all). A history restored from a checkpoint older than the count gives tokens_per_s only.
  `history`: fetched (host) metrics."""
  counts = [h.get("real_tokens") for h in history]
  timed = counts[-timed_steps:] if timed_steps else counts[-1:]   # else: the compile step
  out = {"tokens_per_s": float(sum(timed)) / max(timed_s if timed_steps else whole_s, 1e-9)}
  if None not in counts:
    out["real_tokens"] = int(sum(counts))
  return out


class StopRequest:
  """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and returns at the next step."""

  def __init__(self):
    self.signal_name = None
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    self.signal_name = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


# Data fields that change what a run draws next, not what it has learned: a run resumes
# with new values of these (e.g. a changed task mix or augmentation, more reading threads).
RESUMABLE_DATA_FIELDS = ("task_weights", "shift_pixels", "rotate_degrees", "scale_jitter",
                         "cutout_size", "cutout_prob", "elastic_alpha", "elastic_sigma",
                         "elastic_prob", "num_threads", "prefetch", "workers")


def check_resumable(workdir: str, step: int, config) -> None:
  """Refuses to resume a checkpoint whose model, data layout or latent space (the VAE)
  differs from `config`."""
  try:
    saved = config_upgrade.upgrade_config(ckpt_lib.saved_config(workdir, step))
  except (OSError, ValueError):
    return  # a checkpoint without a readable config: the restore itself will tell
  for section in ("model", "data", "latent"):
    ours = json.loads(json.dumps(config[section].to_dict()))
    theirs = json.loads(json.dumps(saved[section].to_dict()))
    ignored = RESUMABLE_DATA_FIELDS if section == "data" else ()
    diff = sorted(k for k in set(ours) | set(theirs)
                  if ours.get(k) != theirs.get(k) and k not in ignored)
    if diff:
      raise ckpt_lib.CheckpointError(
          f"the checkpoint in {workdir} was trained with different config.{section} fields "
          f"({', '.join(diff)}): use a new --workdir, or the config it was trained with")


class Run(NamedTuple):
  """What the training loop holds besides the state (built by `start_run`)."""
  mesh: Any
  p_train_step: Any
  p_eval_step: Any
  eval_rng: Array
  data_iter: Any
  manager: Any
  log: MetricsLog


def start_run(config, workdir: str) -> tuple[Run, TrainState, Array, list]:
  """Mesh, sharded state and jitted steps, the input pipeline, and the newest good
  checkpoint restored: (run, state, step rng, metrics history since the last log)."""
  training = build_training(config)
  os.makedirs(workdir, exist_ok=True)
  state, step_rng = training.state, training.step_rng
  logging.info("Model: %.2fM parameters",
               sum(x.size for x in jax.tree.leaves(state.params)) / 1e6)
  data_iter = iter(process_train_dataset(config, training.mesh))
  manager = ckpt_lib.make_manager(workdir, keep=config.keep_checkpoints)
  history = []
  restored = ckpt_lib.restore_newest(
      manager, workdir, lambda step: check_resumable(workdir, step, config),
      ckpt_lib.abstract_like({"state": state, "rng": step_rng}), data_iter)
  if restored is not None:
    state, step_rng = restored["state"]["state"], restored["state"]["rng"]
    history = restored["log"]["history"]
    logging.info("Resumed from step %d", int(state.step))
  elif config.init_from:
    params = warm_start.initial_params(config, training.state_shardings.params)
    # The EMA its own copy: the step donates both, and one buffer cannot be donated twice.
    state = state.replace(params=params, ema_params=jax.tree.map(lambda x: x.copy(), params))
    logging.info("Starting from the weights of %s", config.init_from)
  run = Run(mesh=training.mesh, p_train_step=training.p_train_step,
            p_eval_step=training.p_eval_step, eval_rng=training.eval_rng,
            data_iter=data_iter, manager=manager, log=MetricsLog(workdir, int(state.step)))
  return run, state, step_rng, history


def train_and_evaluate(config, workdir: str) -> TrainState:
  """Trains `config` in `workdir`, resuming from its newest checkpoint; returns the state."""
  run_start = time.perf_counter()
  config = warm_start.resolve(config)   # the model fields of config.init_from, if any
  auto_config.fill_from_data(config)  # image size, channels, ... left to the data
  config_lib.validate(config)   # bad values fail before anything is built or written
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise config_lib.ConfigError(f"--workdir {workdir} is a file: pass a directory")
  run, state, step_rng, history = start_run(config, workdir)
  start_step = int(state.step)
  bar = progress_bar(config, start_step)
  try:
    with jax.set_mesh(run.mesh), StopRequest() as stop:
      if start_step >= config.num_train_steps and final_evaluation_missing(config, workdir,
                                                                          start_step):
        logging.info("Step %d was saved but its evaluation did not finish: evaluating now",
                     start_step)
        evaluate_heldout(config, state, run.p_eval_step, run.eval_rng, run.mesh, run.log,
                         start_step)
      state = train_loop(config, workdir, run, state, step_rng, history, bar, stop)
  finally:
    bar.close()
    run.manager.wait_until_finished()
    run.manager.close()
    run.log.close()
  finish(workdir, state, time.perf_counter() - run_start)
  return state


def progress_bar(config, start_step: int):
  """tqdm bar on process 0; redirected to a file (no terminal), redrawn every 30 s."""
  return tqdm.tqdm(total=config.num_train_steps, initial=start_step, desc="train",
                   disable=jax.process_index() != 0 or not config.progress_bar,
                   dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 30.0)


class _Interval:
  """Steps timed since the last log line; the compile step is timed apart."""

  def __init__(self):
    self.start = self.log_start = time.perf_counter()
    self.timed_steps = 0

  def restart(self):
    self.start = self.log_start = time.perf_counter()
    self.timed_steps = 0


def train_loop(config, workdir, run: Run, state, step_rng, history, bar, stop) -> TrainState:
  """Steps from the state's step to config.num_train_steps: log, save, evaluate."""
  start_step = int(state.step)
  interval, previous_metrics = _Interval(), None

  def save(step, force=False):
    pending = [{k: float(v) for k, v in h.items()} for h in jax.device_get(history)]
    ckpt_lib.save(run.manager, step, {"state": state, "rng": step_rng}, run.data_iter,
                  config_upgrade.saved_form(config), {"history": pending}, force=force)

  for step in range(start_step + 1, config.num_train_steps + 1):
    state, metrics = run.p_train_step(
        state, sharding.global_batch(run.mesh, next(run.data_iter), config.batch_size),
        step_rng)
    history.append(metrics)
    interval.timed_steps += 1
    if step == start_step + 1:
      jax.block_until_ready(state)
      logging.info("First step (compile + run): %.1fs", time.perf_counter() - interval.start)
      interval.restart()
    # Read the previous step's counter (already computed: no stall of the pipeline).
    if previous_metrics is not None:
      check_nonfinite(previous_metrics, config, step - 1)
    previous_metrics = metrics
    if step % config.log_every_steps == 0 or step == config.num_train_steps:
      log_interval(run.log, bar, history, interval, step)
      history.clear()
      interval.restart()
    bar.update(1)
    # Save before evaluating: an evaluation that fails (or is killed) at the last step
    # must not cost the steps since the previous checkpoint.
    last = step == config.num_train_steps
    if step % config.checkpoint_every_steps == 0 or last or stop.signal_name:
      check_nonfinite(metrics, config, step)
      save(step, force=bool(stop.signal_name))
    if step % config.eval_every_steps == 0 or last:
      evaluate_heldout(config, state, run.p_eval_step, run.eval_rng, run.mesh, run.log, step)
    if stop.signal_name:
      logging.warning("%s: saved a checkpoint at step %d in %s; run the same command to "
                      "resume", stop.signal_name, step, workdir)
      break
  return state


def log_interval(log: MetricsLog, bar, history: list, interval: _Interval, step: int) -> None:
  """One metrics.jsonl record (and progress-bar postfix) for the steps since the last."""
  fetched = jax.device_get(history)
  means = _mean_metrics(fetched)
  elapsed = time.perf_counter() - interval.start
  record = {"step": step, **{k: means[k] for k in LOGGED},
            **_interval_tokens(fetched, interval.timed_steps, elapsed,
                               time.perf_counter() - interval.log_start)}
  log.write(record)
  bar.set_postfix(loss=f"{record['loss']:.3f}", ar=f"{record['ar_loss']:.3f}",
                  dm=f"{record['dm_loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")


def finish(workdir: str, state: TrainState, wall_s: float) -> None:
  """End-of-run summary: curves PNG and where everything is (process 0)."""
  if jax.process_index() != 0:
    return
  try:
    curves = plot.plot_metrics(workdir)
  except (OSError, ValueError) as e:
    curves = f"(no curves: {e})"
  logging.info("Finished at step %d in %.0fs. Checkpoints: %s; metrics: %s; curves: %s; "
               "TensorBoard: tensorboard --logdir %s", int(state.step), wall_s,
               ckpt_lib.checkpoint_dir(workdir), os.path.join(workdir, "metrics.jsonl"),
               curves, workdir)


def check_nonfinite(metrics, config, step) -> None:
  """Stops training after `max_nonfinite_steps` non-finite updates in a row."""
  run = int(jax.device_get(metrics["nonfinite_run"]))
  if run >= config.max_nonfinite_steps:
    raise TrainingError(
        f"the loss or gradients were not finite for {run} steps in a row (up to step "
        f"{step}); the updates were skipped and the last checkpoint is intact: lower "
        "config.learning_rate or check the data for NaNs")


def evaluate_heldout(config, state, p_eval_step, rng, mesh, log, step) -> dict:
  """Held-out AR and DM losses of the EMA parameters, logged as eval_* records."""
  batches = heldout_batches(config, config.batch_size)
  # Every process holds the whole held-out batch; each device takes its own rows of it.
  results = [p_eval_step(state.ema_params, sharding.global_batch(mesh, b, config.batch_size),
                         rng) for b in batches]
  summary = weighted_eval_means(results)
  record = {"step": step, "eval_ar_loss": summary["ar_loss"], "eval_dm_loss": summary["dm_loss"]}
  logging.info("step %d held-out: ar_loss %.4f dm_loss %.4f", step, summary["ar_loss"],
               summary["dm_loss"])
  record.update(evaluate_protocol(config, state, log, step))
  log.write(record)
  return record


def final_evaluation_missing(config, workdir: str, step: int) -> bool:
  """Whether a run that has nothing left to train still owes its last evaluation: on, and
  DIR/eval.json holds no record of `step` (the evaluation failed or was killed after the
  checkpoint was saved)."""
  if not protocol_enabled(config) or jax.process_count() > 1:
    return False
  return all(r.get("step") != step for r in evaluate.read_evaluations(workdir))


def protocol_enabled(config) -> bool:
  """Whether evaluations include the sampling protocol (mot.evaluate): on for the data
  sets that have one when config.eval_samples_per_digit > 0."""
  return bool(config.eval_samples_per_digit) and config.data.dataset in evaluate.PROTOCOLS


def evaluate_protocol(config, state, log, step) -> dict:
  """Reasoning / generation accuracy and Fréchet distance (mot.evaluate) of the EMA
  parameters; DIR/eval.json and a sample grid. Off when eval_samples_per_digit is 0."""
  if not protocol_enabled(config):
    return {}
  if jax.process_count() > 1:
    logging.warning("Skipping the sampling evaluation in a multi-process run: run "
                    "python -m mot.evaluate --workdir %s afterwards", os.path.dirname(log.path))
    return {}
  pipe = Pipeline(config, state.ema_params, step)
  result = evaluate.write_results(os.path.dirname(log.path),
                                  evaluate.evaluate_pipeline(pipe,
                                                             config.eval_samples_per_digit))
  log.image(step, "samples", result.pop("_grid_image"))
  logging.info("%s", evaluate.format_result(result))
  # Scalars only (the image and video protocols report different keys).
  return {k: v for k, v in result.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
