"""The train state, both losses, and the jitted, sharded train and eval steps.

`train_step(state, batch, rng) -> (state, metrics)` is a pure function: both losses, one
AdamW update (skipped when the loss or gradients are not finite), and an EMA of the
parameters for sampling. `build_training(config)` builds the mesh, the state (born
sharded) and the jitted steps exactly as train.py runs them; `mot.train_lib` wires them
to the input pipeline, checkpoints and the metrics log.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mot import config as config_lib
from mot import diffusion, experts, latent, sharding
from mot.model import MoT, inputs_from_batch

Array = jax.Array


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
  if not config.freeze_understanding:
    return tx
  freeze = experts.freeze_understanding(model_cfg)
  return optax.chain(freeze, tx, freeze)


def dummy_batch(model_cfg, seq_len: int, batch: int = 1) -> dict[str, np.ndarray]:
  """An all-text batch with the docs/design.md §1 fields, for shapes and initialisation."""
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
                                config.timestep_logit_mean, config.timestep_logit_std,
                                latent.timestep_shift(config))
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
  smoothing = config.ar_label_smoothing if train else 0.0
  if smoothing:
    ar_objective = label_smoothed(ar_loss, logits, ar_w, smoothing)
  # dm_mask is each noised token's loss weight (1, or e.g. a clip's first frame's).
  dm_loss = diffusion.velocity_loss(velocity, diffusion.velocity_target(x0, noise),
                                    batch["dm_mask"], dims,
                                    t if config.dm_loss_space == "x0" else None)
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


def apply_update(state: TrainState, grads, tx, config) -> TrainState:
  """AdamW and the EMA: the state after one update from `grads` (step not advanced)."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  decay = ema_decay(state.step, config.ema_decay)
  # e + (1 - decay) (p - e): the same average, and exactly e where p == e, so frozen
  # weights (config.freeze_understanding) stay bit-identical in the EMA too. Kept in the
  # parameters' dtype (the float32 decay would promote bf16 parameters).
  ema = jax.tree.map(lambda e, p: (e + (1.0 - decay) * (p - e)).astype(e.dtype),
                     state.ema_params, params)
  return state.replace(params=params, opt_state=opt_state, ema_params=ema)


def train_step(state: TrainState, batch: dict, rng: Array, *, model: MoT, tx, config
               ) -> tuple[TrainState, dict]:
  """One update. rng is the run's base key; the step's key is fold_in(rng, step)."""
  step_rng = jax.random.fold_in(rng, state.step)
  grad_fn = jax.value_and_grad(compute_losses, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, batch, step_rng, model, config)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
  # A non-finite loss or gradient leaves the state as it was (but counts the step). A
  # cond, not a select of every leaf between the new and the old state: the select keeps
  # both alive, 1.3x the parameters' bytes more of XLA's temporaries (bench.memory_plan).
  new_state = jax.lax.cond(finite, lambda s, g: apply_update(s, g, tx, config),
                           lambda s, g: s, state, grads)
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
