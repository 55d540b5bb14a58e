"""Training a KL autoencoder (mot.vae_layers) on bundled images, exported for diffusers.

`train_and_evaluate(config, workdir)` (configs/vae_shapes.py; entry point mot.vae_train):
- data: `images(split, n, seed) -> uint8 [n, H, W, 3]` of config.data.source; a pool of
  config.data.num_train images is drawn once and batch j is a pure function of (seed, j)
  (one permutation of the pool per epoch), so a resumed run sees exactly the batches an
  uninterrupted one would;
- loss: reconstruction of a posterior sample (mean |x - x̂| or mean (x - x̂)^2 over pixels
  and channels, images in [-1, 1]) + config.kl_weight * the KL to N(0, I) per latent
  element, 0.5 * mean(mu^2 + sigma^2 - 1 - log sigma^2);
- one jitted AdamW step; orbax checkpoints (mot.checkpoint) every checkpoint_every_steps
  and at the end, resumed exactly from the newest;
- evaluation on config.data.num_heldout held-out images, from the posterior mean:
  PSNR = 10 log10(2^2 / MSE) in dB, the MSE over all held-out pixels and channels of the
  decoded images clipped to [-1, 1] (so 2 is the peak-to-peak range; the same as
  10 log10(255^2 / MSE) on 0..255 pixels), and the mean KL per latent element;
- export: WORKDIR/vae/ (config.json + diffusion_pytorch_model.safetensors) that
  mot.vae.load_diffusers and diffusers read, with scaling_factor (and shift_factor) set
  from the held-out latents' statistics as config.latent_stats says; WORKDIR/eval.json
  and WORKDIR/reconstructions.png (held-out images over their reconstructions).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from PIL import Image

from mot import checkpoint as ckpt_lib
from mot import vae as vae_lib
from mot.errors import ConfigError
from mot.data import shapes, shapes_scene
from mot.step import learning_rate_schedule
from mot.train_lib import MetricsLog
from mot.vae_layers import AutoencoderKL, VAEConfig, init_params

RECON_LOSSES = ("l1", "l2")
LATENT_STATS = ("none", "scale", "shift_and_scale")
VAE_DIR = "vae"
EVAL_FILE = "eval.json"


def shapes_images(split: str, n: int, seed: int) -> np.ndarray:
  """uint8 [n, 32, 32, 3] shapes scenes (mot.data.shapes). "train": scenes 0..n-1 of the
  training stream of `seed` (no held-out pair, no evaluation scene); "heldout": the fixed
  caption scenes of both evaluation splits (independent of `seed`), the first n // 2
  in-distribution, the rest each with a held-out pair (e.g. a blue triangle), which the
  VAE never saw."""
  if split == "train":
    scenes = [shapes.training_scene(seed, i) for i in range(n)]
  elif split == "heldout":
    scenes = (list(shapes.caption_set("in_distribution", n // 2))
              + list(shapes.caption_set("heldout", n - n // 2)))
  else:
    raise ValueError(f"unknown split {split!r}: use 'train' or 'heldout'")
  return np.stack([shapes_scene.render(s) for s in scenes])


# config.data.source -> images(split, n, seed) -> uint8 [n, H, W, 3].
SOURCES: dict[str, Callable[..., np.ndarray]] = {"shapes": shapes_images}


@flax.struct.dataclass
class VAETrainState:
  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------------------
def vae_config(config) -> VAEConfig:
  """config.vae (+ the image channels) -> the frozen VAEConfig; ConfigError if bad."""
  v = config.vae
  try:
    cfg = VAEConfig(in_channels=3, out_channels=3,
                    block_out_channels=tuple(int(c) for c in v.block_out_channels),
                    layers_per_block=v.layers_per_block, act_fn=v.act_fn,
                    latent_channels=v.latent_channels, norm_num_groups=v.norm_num_groups,
                    sample_size=config.data.image_size, scaling_factor=v.scaling_factor,
                    shift_factor=v.shift_factor, use_quant_conv=v.use_quant_conv,
                    use_post_quant_conv=v.use_post_quant_conv,
                    mid_block_add_attention=v.mid_block_add_attention)
    vae_lib.validate_config(cfg, "config.vae")
  except (TypeError, ValueError) as e:
    raise ConfigError(str(e)) from None
  return cfg


def validate(config) -> VAEConfig:
  """Checks the run config before anything is built or written; returns the VAEConfig."""
  def check(ok: bool, message: str):
    if not ok:
      raise ConfigError(message)
  for name in ("num_train_steps", "batch_size", "log_every_steps", "eval_every_steps",
               "checkpoint_every_steps", "keep_checkpoints"):
    value = config[name]
    check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
          f"config.{name}={value!r} must be a positive integer")
  check(config.learning_rate > 0, f"config.learning_rate={config.learning_rate} must be > 0")
  check(config.kl_weight >= 0, f"config.kl_weight={config.kl_weight} must be >= 0")
  check(config.recon_loss in RECON_LOSSES,
        f"config.recon_loss={config.recon_loss!r} is unknown: use one of {RECON_LOSSES}")
  check(config.latent_stats in LATENT_STATS,
        f"config.latent_stats={config.latent_stats!r} is unknown: use one of {LATENT_STATS}")
  check(config.data.source in SOURCES,
        f"config.data.source={config.data.source!r} is unknown: use one of {sorted(SOURCES)}")
  check(config.data.num_train >= config.batch_size,
        f"config.data.num_train={config.data.num_train} must be at least config.batch_size="
        f"{config.batch_size}")
  check(config.data.num_heldout > 0,
        f"config.data.num_heldout={config.data.num_heldout} must be positive")
  cfg = vae_config(config)
  f = cfg.downsample_factor
  check(config.data.image_size % f == 0,
        f"config.data.image_size={config.data.image_size} is not divisible by the VAE's "
        f"downsampling factor {f} (2 ** (len(config.vae.block_out_channels) - 1)): change "
        "either")
  return cfg


# ----------------------------------------------------------------------------------------
# Data.
# ----------------------------------------------------------------------------------------
def load_images(config, split: str, n: int) -> np.ndarray:
  """uint8 [n, S, S, 3] of config.data.source, checked against config.data.image_size."""
  images = np.asarray(SOURCES[config.data.source](split, n, config.seed))
  s = config.data.image_size
  if images.shape != (n, s, s, 3) or images.dtype != np.uint8:
    raise ConfigError(f"config.data.source={config.data.source!r} gives {images.dtype} "
                      f"{images.shape} images, not uint8 [{n}, {s}, {s}, 3]: set "
                      "config.data.image_size to its size")
  return images


def batch_indices(seed: int, step: int, batch_size: int, pool: int) -> np.ndarray:
  """Pool indices of the batch that trains step `step` (1-based): positions
  [(step - 1) * B, step * B) of a sequence of per-epoch permutations of the pool."""
  start = (step - 1) * batch_size
  positions = np.arange(start, start + batch_size)
  epochs, offsets = np.divmod(positions, pool)
  out = np.empty(batch_size, np.int64)
  for epoch in np.unique(epochs):
    perm = np.random.default_rng([seed, int(epoch)]).permutation(pool)
    out[epochs == epoch] = perm[offsets[epochs == epoch]]
  return out


# ----------------------------------------------------------------------------------------
# Loss and steps.
# ----------------------------------------------------------------------------------------
def kl_per_element(mean: jax.Array, logvar: jax.Array) -> jax.Array:
  """Mean KL(N(mean, exp(logvar)) || N(0, 1)) per latent element (nats)."""
  return 0.5 * jnp.mean(mean ** 2 + jnp.exp(logvar) - 1.0 - logvar)


def compute_loss(params, images: jax.Array, rng: jax.Array, model: AutoencoderKL, config
                 ) -> tuple[jax.Array, dict]:
  """uint8 images -> (loss, metrics) for one batch (see the module docstring)."""
  x = images.astype(jnp.float32) / 127.5 - 1.0
  recon, mean, logvar = model.apply({"params": params}, x, rngs={"sample": rng})
  err = recon - x
  rec = jnp.mean(jnp.abs(err)) if config.recon_loss == "l1" else jnp.mean(err ** 2)
  kl = kl_per_element(mean, logvar)
  loss = rec + config.kl_weight * kl
  return loss, {"loss": loss, "recon_loss": rec, "kl": kl}


def make_optimizer(config) -> optax.GradientTransformation:
  """Clipped AdamW (weight decay on every parameter) with the main trainer's warm-up +
  cosine schedule."""
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                  weight_decay=config.weight_decay))


def train_step(state: VAETrainState, images, rng, *, model, tx, config):
  """One AdamW update; the step's sampling key is fold_in(rng, step)."""
  step_rng = jax.random.fold_in(rng, state.step)
  grad_fn = jax.value_and_grad(compute_loss, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, images, step_rng, model, config)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics["grad_norm"] = optax.tree.norm(grads)
  return VAETrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def init_state(cfg: VAEConfig, tx, rng) -> VAETrainState:
  # Committed to the device, as a restored state is: both then hit the same compiled code.
  params = jax.device_put(init_params(cfg, rng), jax.devices()[0])
  return VAETrainState(step=jnp.zeros((), jnp.int32), params=params,
                       opt_state=jax.jit(tx.init)(params))


# ----------------------------------------------------------------------------------------
# Evaluation and export.
# ----------------------------------------------------------------------------------------
def evaluate(vae: vae_lib.VAE, images: np.ndarray, batch_size: int) -> dict[str, Any]:
  """Held-out PSNR (dB, from the posterior mean; see the module docstring), the mean KL
  per latent element, and the latents' mean and std (for the scaled latent)."""
  sq_err, kl, latents = 0.0, 0.0, []
  for i in range(0, len(images), batch_size):
    x = vae_lib.images_to_input(images[i:i + batch_size])
    mean, logvar = vae.moments(x)
    recon = jnp.clip(vae.decode(mean), -1.0, 1.0)
    sq_err += float(jnp.sum((recon - x) ** 2))
    kl += float(kl_per_element(mean, logvar)) * mean.size
    latents.append(np.asarray(mean))
  latents = np.concatenate(latents)
  mse = sq_err / images.size
  return {"psnr": float(10.0 * np.log10(4.0 / max(mse, 1e-20))),
          "kl": kl / latents.size, "latent_mean": float(latents.mean()),
          "latent_std": float(latents.std())}


def exported_config(cfg: VAEConfig, result: dict, latent_stats: str) -> VAEConfig:
  """cfg with the held-out latents' statistics, as `latent_stats` says: "shift_and_scale"
  (FLUX-style): shift_factor = their mean, scaling_factor = 1 / their std;
  "scale" (SD-style, no shift): scaling_factor = 1 / their root mean square; so that the
  scaled latents have about unit second moment either way. "none" keeps config.vae's."""
  if latent_stats == "none":
    return cfg
  shift = result["latent_mean"] if latent_stats == "shift_and_scale" else None
  spread = result["latent_std"] if shift is not None else float(
      np.sqrt(result["latent_std"] ** 2 + result["latent_mean"] ** 2))
  return dataclasses.replace(cfg, scaling_factor=1.0 / max(spread, 1e-6), shift_factor=shift)


def write_grid(path: str, images: np.ndarray, recon: np.ndarray, scale: int = 4) -> None:
  """A PNG of `images` (top row) over `recon` (bottom row), uint8 [n, H, W, 3] each."""
  rows = [np.concatenate(list(a), axis=1) for a in (images, recon)]
  grid = np.concatenate(rows, axis=0)
  Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale),
                               Image.NEAREST).save(path)


def export(vae: vae_lib.VAE, config, workdir: str, heldout: np.ndarray) -> dict[str, Any]:
  """Evaluates `vae` on the held-out images, writes WORKDIR/vae/ with the latent
  statistics applied, eval.json and reconstructions.png; returns the evaluation."""
  result = evaluate(vae, heldout, config.batch_size)
  cfg = exported_config(vae.config, result, config.latent_stats)
  result.update(scaling_factor=cfg.scaling_factor, shift_factor=cfg.shift_factor)
  path = vae_lib.save_diffusers(vae_lib.VAE(cfg, vae.params), os.path.join(workdir, VAE_DIR))
  shown = heldout[:config.batch_size]   # the evaluation's batch shape: compiled already
  recon = vae.decode(vae.moments(vae_lib.images_to_input(shown))[0])
  write_grid(os.path.join(workdir, "reconstructions.png"), shown[:8],
             vae_lib.output_to_images(recon)[:8])
  logging.info("held-out PSNR %.2f dB, KL %.4f per latent element (%d images); latents "
               "mean %.3f std %.3f; wrote %s", result["psnr"], result["kl"], len(heldout),
               result["latent_mean"], result["latent_std"], path)
  return result


# ----------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------
def check_resumable(workdir: str, step: int, config) -> None:
  """Refuses a checkpoint trained with other config.vae or config.data fields."""
  saved = ckpt_lib.saved_config(workdir, step)
  for section in ("vae", "data"):
    ours = json.loads(json.dumps(config[section].to_dict()))
    theirs = saved.get(section, {})
    diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    if diff:
      raise ckpt_lib.CheckpointError(
          f"the checkpoint in {workdir} was trained with different config.{section} fields "
          f"({', '.join(diff)}): use a new --workdir, or the config it was trained with")


def _log_record(step: int, history: list[dict], timed_steps: int, elapsed: float) -> dict:
  """Means of the metrics since the last record (restored ones included) and the speed
  of the `timed_steps` this process ran in `elapsed` seconds (not the compile step)."""
  record = {"step": step}
  for key in history[0]:
    record[key] = float(np.mean([h[key] for h in history], dtype=np.float64))
  if timed_steps:   # none when the interval held only the compile step
    record["steps_per_s"] = timed_steps / max(elapsed, 1e-9)
  return record


def finished_result(config, workdir: str) -> dict[str, Any] | None:
  """WORKDIR/eval.json when the run of `config` finished there (eval.json records its
  last step, whose checkpoint and WORKDIR/vae/ exist), else None."""
  try:
    with open(os.path.join(workdir, EVAL_FILE)) as f:
      result = json.load(f)
    ckpt_lib.saved_config(workdir, config.num_train_steps)
  except (OSError, ValueError):
    return None
  if (not isinstance(result, dict) or result.get("step") != config.num_train_steps
      or not os.path.isfile(os.path.join(workdir, VAE_DIR, vae_lib.WEIGHTS_FILE))):
    return None
  check_resumable(workdir, config.num_train_steps, config)
  return result


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Trains the VAE of `config` in `workdir` (resuming its newest checkpoint), evaluates
  it and exports WORKDIR/vae/; returns the final evaluation record."""
  cfg = validate(config)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir} is a file: pass a directory")
  done = finished_result(config, workdir)
  if done is not None:
    logging.info("%s already holds the finished run (step %d): nothing to do", workdir,
                 done["step"])
    return done
  model, tx = AutoencoderKL(cfg), make_optimizer(config)
  init_rng, step_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  state = init_state(cfg, tx, init_rng)
  train_images = load_images(config, "train", config.data.num_train)
  heldout = load_images(config, "heldout", config.data.num_heldout)
  os.makedirs(workdir, exist_ok=True)

  manager = ckpt_lib.make_manager(workdir, keep=config.keep_checkpoints)
  log = None
  try:
    restored = ckpt_lib.restore_newest(
        manager, workdir, lambda step: check_resumable(workdir, step, config),
        ckpt_lib.abstract_like(state), with_log=True)
    history = []   # metrics since the last metrics.jsonl record, kept across a resume
    if restored is not None:
      state, history = restored["state"], restored["log"]["history"]
      logging.info("Resumed from step %d", int(state.step))
    log = MetricsLog(workdir, int(state.step))
    vae = vae_lib.VAE(cfg, state.params)
    logging.info("VAE: %.2fM parameters; %dx%d images -> latents %s",
                 sum(x.size for x in jax.tree.leaves(state.params)) / 1e6,
                 config.data.image_size, config.data.image_size,
                 vae.latent_shape(config.data.image_size, config.data.image_size))
    state = _train_loop(config, state, history, step_rng, model, tx, train_images, heldout,
                        manager, log, vae)
    vae.params = state.params
    result = export(vae, config, workdir, heldout)
    result["step"] = int(state.step)
    log.write({"step": result["step"], "eval_psnr": result["psnr"], "eval_kl": result["kl"]})
  finally:
    manager.wait_until_finished()
    manager.close()
    if log is not None:
      log.close()
  with open(os.path.join(workdir, EVAL_FILE), "w") as f:
    json.dump(result, f, indent=1)
  return result


def _train_loop(config, state, history, step_rng, model, tx, train_images, heldout,
                manager, log, vae) -> VAETrainState:
  """Steps from state.step to num_train_steps: metrics.jsonl records, checkpoints, and
  held-out evaluations before the last step (the export evaluates the last)."""
  p_step = jax.jit(functools.partial(train_step, model=model, tx=tx, config=config),
                   donate_argnums=0)
  t0, timed, start = time.perf_counter(), 0, int(state.step)
  for step in range(start + 1, config.num_train_steps + 1):
    idx = batch_indices(config.seed, step, config.batch_size, len(train_images))
    state, metrics = p_step(state, train_images[idx], step_rng)
    history.append(metrics)
    timed += 1
    if step == start + 1:
      jax.block_until_ready(state)
      logging.info("First step (compile + run): %.1fs", time.perf_counter() - t0)
      t0, timed = time.perf_counter(), 0
    if step % config.log_every_steps == 0 or step == config.num_train_steps:
      history = [{k: float(v) for k, v in h.items()} for h in jax.device_get(history)]
      log.write(_log_record(step, history, timed, time.perf_counter() - t0))
      history, t0, timed = [], time.perf_counter(), 0
    if step % config.checkpoint_every_steps == 0 or step == config.num_train_steps:
      pending = [{k: float(v) for k, v in h.items()} for h in jax.device_get(history)]
      ckpt_lib.save(manager, step, state, config=config.to_dict(),
                    log={"history": pending})
    if step % config.eval_every_steps == 0 and step < config.num_train_steps:
      vae.params = state.params
      result = evaluate(vae, heldout, config.batch_size)
      log.write({"step": step, "eval_psnr": result["psnr"], "eval_kl": result["kl"]})
      logging.info("step %d: held-out PSNR %.2f dB, KL %.4f", step, result["psnr"],
                   result["kl"])
  return state
