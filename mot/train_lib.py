"""Train state, the jitted train step, held-out losses, and the training loop.

`train_step(state, batch, rng) -> (state, metrics)` is a pure function: both losses, one
AdamW update (skipped when the loss or gradients are not finite), and an EMA of the
parameters for sampling. `train_and_evaluate(config, workdir)` wires it to the mesh, the
grain input pipeline, orbax checkpoints and the metrics log.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from mot import checkpoint as ckpt_lib
from mot import config as config_lib
from mot import diffusion, experts, plot, sharding, summary
from mot.data import packing, pipeline
from mot.model import MoT, inputs_from_batch

Array = jax.Array


class TrainingError(RuntimeError):
  """Training cannot continue; the message says why and what to do."""


@flax.struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any
  ema_params: Any
  nonfinite_run: Array   # consecutive steps whose update was skipped as non-finite


# ----------------------------------------------------------------------------------------
# Optimizer and state.
# ----------------------------------------------------------------------------------------
def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up to `learning_rate`, then cosine decay to `min_lr_ratio` of it."""
  steps = max(config.num_train_steps, config.warmup_steps + 1)
  return optax.warmup_cosine_decay_schedule(
      0.0, config.learning_rate, config.warmup_steps, steps,
      end_value=config.learning_rate * config.min_lr_ratio)


def make_optimizer(config) -> optax.GradientTransformation:
  """Clipped AdamW; weight decay on matrices only (kernels, embeddings), judged per layer
  and per expert so that the stacked layer and expert axes change nothing.

  With `config.freeze_understanding` the understanding expert (`experts.understanding_mask`)
  gets no update: its gradients are zeroed before clipping (they neither count in the norm
  nor enter Adam's moments) and its updates after AdamW (no weight decay either).
  """
  model_cfg = config_lib.ModelConfig.from_config(config.model)

  def decay_mask(params):
    def is_matrix(path, p):
      names = [getattr(k, "key", None) for k in path]
      stacked = 0
      if "backbone" in names:
        stacked = int(model_cfg.scan_layers) + int(model_cfg.experts != "shared")
      return p.ndim - stacked >= 2
    return jax.tree_util.tree_map_with_path(is_matrix, params)

  tx = optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                  weight_decay=config.weight_decay, mask=decay_mask))
  if not config.get("freeze_understanding", False):
    return tx
  freeze = experts.freeze_understanding(model_cfg)
  return optax.chain(freeze, tx, freeze)


def dummy_batch(model_cfg, seq_len: int, batch: int = 1) -> dict[str, np.ndarray]:
  """An all-text batch with the DESIGN §1 fields, for shapes and initialisation."""
  ints = lambda: np.zeros((batch, seq_len), np.int32)
  return {"tokens": ints(), "patches": np.zeros((batch, seq_len, model_cfg.patch_dim),
                                                 np.float32),
          "modality": ints(), "positions": np.zeros((batch, seq_len, 3), np.int32),
          "segment_ids": np.ones((batch, seq_len), np.int32), "block_ids": ints(),
          "ar_targets": ints(), "ar_weights": np.zeros((batch, seq_len), np.float32),
          "dm_mask": np.zeros((batch, seq_len), np.float32),
          "cond_mask": np.zeros((batch, seq_len), np.float32)}


def init_state_fn(model: MoT, tx, seq_len: int):
  """rng -> TrainState with logically boxed leaves (for eval_shape and shardings)."""
  def init(rng):
    variables = model.init(rng, inputs_from_batch(
        jax.tree.map(jnp.asarray, dummy_batch(model.cfg, seq_len))))
    params = variables["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), ema_params=params,
                      nonfinite_run=jnp.zeros((), jnp.int32))
  return init


def create_train_state(model: MoT, tx, mesh, rules, rng, seq_len: int):
  """Shapes first, then shardings, then a jitted init: parameters and optimizer state are
  born sharded and never materialised on one device. Returns (state, shardings)."""
  init = init_state_fn(model, tx, seq_len)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init, rng)
    shardings = sharding.logical_shardings(abstract, mesh, rules)
    state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)
  return state, shardings


# ----------------------------------------------------------------------------------------
# Losses and the train step.
# ----------------------------------------------------------------------------------------
def patch_dim_mask(modality: Array, modality_patch_dims: tuple[int, ...], patch_dim: int
                   ) -> Array:
  """float [B, L, P]: 1 on the patch dims that are real for each token's modality."""
  dims = jnp.asarray(modality_patch_dims, jnp.int32)[modality]
  return (jnp.arange(patch_dim)[None, None, :] < dims[..., None]).astype(jnp.float32)


def cfg_dropout(rng, batch, prob: float) -> Array:
  """bool [B, L]: conditioning tokens blanked for CFG, one coin per packed example."""
  b, l = batch["segment_ids"].shape
  coins = jax.random.uniform(rng, (b, l + 1)) < prob
  dropped = jnp.take_along_axis(coins, batch["segment_ids"], axis=1)
  return dropped & (batch["cond_mask"] > 0)


def compute_losses(params, batch, rng, model: MoT, config, train: bool = True):
  """Noises the DM targets, runs the model once, returns (total, metrics).

  `train` enables residual dropout (`model.dropout_rate`); evaluation passes False.
  """
  cfg = model.cfg
  rng_t, rng_noise, rng_drop = jax.random.split(rng, 3)
  noised = batch["dm_mask"] > 0
  x0 = batch["patches"]
  t = diffusion.block_timesteps(rng_t, batch["block_ids"], noised,
                                config.timestep_logit_mean, config.timestep_logit_std)
  dims = patch_dim_mask(batch["modality"], cfg.modality_patch_dims, cfg.patch_dim)
  noise = jax.random.normal(rng_noise, x0.shape, jnp.float32) * dims
  x_t = jnp.where(noised[..., None], diffusion.add_noise(x0, noise, t), x0)
  dropped = cfg_dropout(rng_drop, batch, config.cond_drop_prob)
  inputs = inputs_from_batch(batch, patches=x_t, timesteps=t, keep=~dropped)
  # fold_in, not a 4th split: runs without dropout keep their exact random stream.
  rngs = {"dropout": jax.random.fold_in(rng, 3)} if train else {}
  logits, velocity, _ = model.apply({"params": params}, inputs, rngs=rngs)

  # A dropped caption is not a target either: the model cannot see the tokens before it.
  ar_w = batch["ar_weights"] * ~jnp.roll(dropped, -1, axis=1)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["ar_targets"])
  ar_loss = jnp.sum(ce * ar_w) / jnp.maximum(jnp.sum(ar_w), 1.0)
  ar_objective = ar_loss
  smoothing = config.get("ar_label_smoothing", 0.0) if train else 0.0
  if smoothing:
    ar_objective = label_smoothed(ar_loss, logits, ar_w, smoothing)
  # dm_mask is each noised token's loss weight (1, or e.g. a clip's first frame's).
  dm_loss = diffusion.velocity_loss(velocity, diffusion.velocity_target(x0, noise),
                                    batch["dm_mask"], dims)
  total = config.ar_loss_weight * ar_objective + config.dm_loss_weight * dm_loss
  # ar_loss stays the plain cross-entropy, so runs with and without smoothing compare.
  return total, {"loss": total, "ar_loss": ar_loss, "dm_loss": dm_loss}


def label_smoothed(ar_loss: Array, logits: Array, ar_w: Array, smoothing: float) -> Array:
  """(1 - s) * cross-entropy + s * cross-entropy against the uniform distribution.

  The uniform term is logsumexp - mean(logits) per token, so no one-hot [B, L, V] is built.
  logits [B, L, V], ar_w [B, L]; ar_loss is the weighted mean plain cross-entropy.
  """
  logits = logits.astype(jnp.float32)
  uniform = jax.nn.logsumexp(logits, axis=-1) - jnp.mean(logits, axis=-1)
  uniform = jnp.sum(uniform * ar_w) / jnp.maximum(jnp.sum(ar_w), 1.0)
  return (1.0 - smoothing) * ar_loss + smoothing * uniform


def ema_decay(step: Array, decay: float) -> Array:
  """EMA decay warmed up as (1 + step) / (10 + step), capped at `decay`."""
  step = step.astype(jnp.float32)
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def train_step(state: TrainState, batch: dict, rng: Array, *, model: MoT, tx, config
               ) -> tuple[TrainState, dict]:
  """One update. rng is the run's base key; the step's key is fold_in(rng, step)."""
  step_rng = jax.random.fold_in(rng, state.step)
  grad_fn = jax.value_and_grad(compute_losses, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, batch, step_rng, model, config)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  decay = ema_decay(state.step, config.ema_decay)
  ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state.ema_params, params)
  new_state = state.replace(params=params, opt_state=opt_state, ema_params=ema)
  # A non-finite loss or gradient leaves the state as it was (but counts the step).
  new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
  nonfinite_run = jnp.where(finite, 0, state.nonfinite_run + 1)
  new_state = new_state.replace(step=state.step + 1, nonfinite_run=nonfinite_run)
  metrics = dict(metrics, grad_norm=grad_norm, nonfinite_run=nonfinite_run,
                 learning_rate=learning_rate_schedule(config)(state.step),
                 real_tokens=jnp.sum(batch["segment_ids"] > 0))  # global: every host's rows
  return new_state, metrics


def eval_step(params, batch, rng, *, model: MoT, config) -> dict:
  """Held-out losses with a fixed rng and no CFG dropout."""
  no_drop = config.copy_and_resolve_references()
  no_drop.cond_drop_prob = 0.0
  _, metrics = compute_losses(params, batch, rng, model, no_drop, train=False)
  # Weights, so that batches with few (or no) targets of one kind count for what they hold.
  dims = patch_dim_mask(batch["modality"], model.cfg.modality_patch_dims, model.cfg.patch_dim)
  metrics["ar_weight"] = jnp.sum(batch["ar_weights"])
  metrics["dm_weight"] = jnp.sum(batch["dm_mask"][..., None] * dims)  # dm_loss's denominator
  return metrics


def weighted_eval_means(results: list[dict]) -> dict[str, float]:
  """Held-out losses averaged over targets, not over batches."""
  results = jax.device_get(results)
  out = {}
  for loss, weight in (("ar_loss", "ar_weight"), ("dm_loss", "dm_weight")):
    w = np.asarray([r[weight] for r in results], np.float64)
    v = np.asarray([r[loss] for r in results], np.float64)
    out[loss] = float(np.sum(w * v) / max(np.sum(w), 1.0))
  return out


def _jit_under_rules(step, model, mesh, rules, first_shardings, out_shardings, **jit_kw):
  """jit of step(first, batch, rng) under the logical rules (so the activation constraints
  reach the program), with `first`'s shardings, the batch split over the data axes and a
  replicated rng."""
  def with_rules(first, batch, rng):
    with nn.logical_axis_rules(rules):
      return step(first, batch, rng)

  batch_shardings = {k: sharding.batch_sharding(mesh, v.ndim)
                     for k, v in dummy_batch(model.cfg, 1).items()}
  return jax.jit(with_rules, in_shardings=(first_shardings, batch_shardings,
                                           sharding.replicated(mesh)),
                 out_shardings=out_shardings, **jit_kw)


def jit_train_step(model, tx, config, mesh, rules, state_shardings):
  """train_step(state, batch, rng) -> (state, metrics), the state donated."""
  step = functools.partial(train_step, model=model, tx=tx, config=config)
  return _jit_under_rules(step, model, mesh, rules, state_shardings,
                          (state_shardings, sharding.replicated(mesh)), donate_argnums=0)


def jit_eval_step(model, config, mesh, rules, param_shardings):
  """eval_step(params, batch, rng) -> metrics, jitted like the train step: the parameters
  kept where they live, the metrics replicated."""
  step = functools.partial(eval_step, model=model, config=config)
  return _jit_under_rules(step, model, mesh, rules, param_shardings,
                          sharding.replicated(mesh))


class Training(NamedTuple):
  """What a training loop runs, built as train.py builds it (`build_training`)."""
  model: MoT
  tx: optax.GradientTransformation
  mesh: jax.sharding.Mesh
  rules: tuple                 # logical axis rules (config.logical_axis_rules)
  state: TrainState            # born sharded
  state_shardings: Any         # the TrainState tree of NamedShardings
  p_train_step: Any            # jitted train_step(state, batch, rng); donates state
  p_eval_step: Any             # jitted eval_step(params, batch, rng) -> metrics
  step_rng: Array              # replicated over the mesh
  eval_rng: Array              # replicated over the mesh


def build_training(config, devices=None) -> Training:
  """Mesh, rules, model, optimizer, sharded state and jitted steps from one config: the
  one place train_and_evaluate, the benchmarks and your own loops get them from, so what
  a benchmark times is what train.py runs. `devices` defaults to all of them."""
  model_cfg = config_lib.validate(config)
  mesh = sharding.make_mesh(config, devices)
  rules = sharding.logical_rules(config)
  if config.batch_size % sharding.batch_divisor(mesh):
    raise config_lib.ConfigError(
        f"config.batch_size={config.batch_size} is not divisible by the "
        f"{sharding.batch_divisor(mesh)} data-parallel devices of config.mesh_shape")
  model, tx = MoT(model_cfg), make_optimizer(config)
  init_rng, step_rng, eval_rng = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state, state_shardings = create_train_state(model, tx, mesh, rules, init_rng,
                                              config.data.seq_len)
  return Training(model=model, tx=tx, mesh=mesh, rules=rules, state=state,
                  state_shardings=state_shardings,
                  p_train_step=jit_train_step(model, tx, config, mesh, rules,
                                              state_shardings),
                  p_eval_step=jit_eval_step(model, config, mesh, rules,
                                            state_shardings.ema_params),
                  step_rng=sharding.replicate(mesh, step_rng),  # checkpointed by every host
                  eval_rng=sharding.replicate(mesh, eval_rng))


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
  examples = (pipeline.heldout_examples(config.data, "generation")
              + pipeline.heldout_examples(config.data, "reasoning"))
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
  return pipeline.make_train_dataset(config.data, config.seed, config.batch_size // count,
                                     index, count)


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


def check_resumable(workdir: str, step: int, config) -> None:
  """Refuses to resume a checkpoint whose model or data layout differs from `config`."""
  try:
    saved = ckpt_lib.saved_config(workdir, step)
  except (OSError, ValueError):
    return  # older checkpoints without a readable config: the restore itself will tell
  for section in ("model", "data"):
    ours = json.loads(json.dumps(config[section].to_dict()))
    theirs = saved.get(section, {})
    defaults = json.loads(json.dumps(dataclasses.asdict(config_lib.ModelConfig()))) \
        if section == "model" else {"validation_size": 0}
    # A field added to the code after the checkpoint was written matches when it keeps
    # its default (older checkpoints stay resumable).
    added_at_default = lambda k: k not in theirs and k in defaults and ours[k] == defaults[k]
    diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)
                  and not added_at_default(k)
                  and k not in ("task_weights", "shift_pixels", "rotate_degrees",
                                "scale_jitter", "cutout_size", "cutout_prob",
                                "elastic_alpha", "elastic_sigma", "elastic_prob",
                                "num_threads", "prefetch", "workers"))
    if diff:
      raise ckpt_lib.CheckpointError(
          f"the checkpoint in {workdir} was trained with different config.{section} fields "
          f"({', '.join(diff)}): use a new --workdir, or the config it was trained with")


def train_and_evaluate(config, workdir: str) -> TrainState:
  """Trains `config` in `workdir`, resuming from its newest checkpoint; returns the state."""
  run_start = time.perf_counter()
  config_lib.validate(config)   # bad values fail before anything is built or written
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise config_lib.ConfigError(f"--workdir {workdir} is a file: pass a directory")

  # ---- Mesh, rules, model, optimizer, state (born sharded), jitted step. ----
  training = build_training(config)
  mesh, p_train_step, p_eval_step = training.mesh, training.p_train_step, training.p_eval_step
  state, step_rng, eval_rng = training.state, training.step_rng, training.eval_rng
  del training   # a restored state replaces this one: hold no second copy
  os.makedirs(workdir, exist_ok=True)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info("Model: %.2fM parameters", num_params / 1e6)

  # ---- Input pipeline. ----
  dataset = process_train_dataset(config, mesh)
  data_iter = iter(dataset)

  # ---- Checkpoint: resume from the newest good one. ----
  manager = ckpt_lib.make_manager(workdir, keep=config.keep_checkpoints)
  history = []
  restored = ckpt_lib.restore_newest(
      manager, workdir, lambda step: check_resumable(workdir, step, config),
      ckpt_lib.abstract_like({"state": state, "rng": step_rng}), data_iter)
  if restored is not None:
    state, step_rng, history = restored["state"]["state"], restored["state"]["rng"], \
        restored["log"]["history"]
    logging.info("Resumed from step %d", int(state.step))

  start_step = int(state.step)
  log = MetricsLog(workdir, start_step)

  def save(step, force=False):
    pending = [{k: float(v) for k, v in h.items()} for h in jax.device_get(history)]
    ckpt_lib.save(manager, step, {"state": state, "rng": step_rng}, data_iter,
                  config.to_dict(), {"history": pending}, force=force)

  from tqdm import tqdm
  # Redirected to a file (no terminal), redraw every 30 s instead of every step.
  bar = tqdm(total=config.num_train_steps, initial=start_step, desc="train",
             disable=jax.process_index() != 0 or not config.progress_bar, dynamic_ncols=True,
             mininterval=0.1 if sys.stderr.isatty() else 30.0)
  # Steps timed since the last log (the compile step is not); their real tokens are
  # counted inside the step (`_interval_tokens`).
  interval_start, timed_steps = time.perf_counter(), 0
  log_start = interval_start    # the compile step's interval, timed whole if alone
  previous_metrics = None
  try:
    with jax.set_mesh(mesh), StopRequest() as stop:
      if start_step >= config.num_train_steps and final_evaluation_missing(config, workdir,
                                                                          start_step):
        logging.info("Step %d was saved but its evaluation did not finish: evaluating now",
                     start_step)
        evaluate_heldout(config, state, p_eval_step, eval_rng, mesh, log, start_step)
      for step in range(start_step + 1, config.num_train_steps + 1):
        local = next(data_iter)
        state, metrics = p_train_step(
            state, sharding.global_batch(mesh, local, config.batch_size), step_rng)
        history.append(metrics)
        timed_steps += 1
        if step == start_step + 1:
          jax.block_until_ready(state)
          logging.info("First step (compile + run): %.1fs", time.perf_counter() - interval_start)
          interval_start, timed_steps = time.perf_counter(), 0
        # Read the previous step's counter (already computed: no stall of the pipeline).
        if previous_metrics is not None:
          check_nonfinite(previous_metrics, config, step - 1)
        previous_metrics = metrics
        if step % config.log_every_steps == 0 or step == config.num_train_steps:
          history = jax.device_get(history)
          summary = _mean_metrics(history)
          elapsed = time.perf_counter() - interval_start
          record = {"step": step, **{k: summary[k] for k in LOGGED},
                    **_interval_tokens(history, timed_steps, elapsed,
                                       time.perf_counter() - log_start)}
          log.write(record)
          bar.set_postfix(loss=f"{record['loss']:.3f}", ar=f"{record['ar_loss']:.3f}",
                          dm=f"{record['dm_loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
          history, interval_start, timed_steps = [], time.perf_counter(), 0
          log_start = interval_start
        bar.update(1)
        # Save before evaluating: an evaluation that fails (or is killed) at the last step
        # must not cost the steps since the previous checkpoint.
        if (step % config.checkpoint_every_steps == 0 or step == config.num_train_steps
            or stop.signal_name):
          check_nonfinite(metrics, config, step)
          save(step, force=bool(stop.signal_name))
        if step % config.eval_every_steps == 0 or step == config.num_train_steps:
          evaluate_heldout(config, state, p_eval_step, eval_rng, mesh, log, step)
        if stop.signal_name:
          logging.warning("%s: saved a checkpoint at step %d in %s; run the same command to "
                          "resume", stop.signal_name, step, workdir)
          break
  finally:
    bar.close()
    manager.wait_until_finished()
    manager.close()
    log.close()
  finish(workdir, state, time.perf_counter() - run_start)
  return state


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
  from mot import evaluate  # pylint: disable=g-import-not-at-top
  return all(r.get("step") != step for r in evaluate.read_evaluations(workdir))


def protocol_enabled(config) -> bool:
  """Whether evaluations include the sampling protocol (mot.evaluate): on for the digit
  data sets when config.eval_samples_per_digit > 0."""
  return bool(config.eval_samples_per_digit) and config.data.dataset in pipeline.DIGIT_DATASETS


def evaluate_protocol(config, state, log, step) -> dict:
  """Reasoning / generation accuracy and Fréchet distance (mot.evaluate) of the EMA
  parameters; DIR/eval.json and a sample grid. Off when eval_samples_per_digit is 0."""
  if not protocol_enabled(config):
    return {}
  if jax.process_count() > 1:
    logging.warning("Skipping the sampling evaluation in a multi-process run: run "
                    "python -m mot.evaluate --workdir %s afterwards", os.path.dirname(log.path))
    return {}
  from mot import evaluate  # pylint: disable=g-import-not-at-top  (pulls in sampling)
  from mot.pipeline import Pipeline  # pylint: disable=g-import-not-at-top
  pipe = Pipeline(config, state.ema_params, step)
  result = evaluate.write_results(os.path.dirname(log.path),
                                  evaluate.evaluate_pipeline(pipe,
                                                             config.eval_samples_per_digit))
  log.image(step, "samples", result.pop("_grid_image"))
  logging.info("%s", evaluate.format_result(result))
  # Scalars only (the image and video protocols report different keys).
  return {k: v for k, v in result.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
