"""Rectified flow: timesteps, noising, the velocity loss and the ODE samplers.

x_t = (1 - t) x0 + t noise, t in [0, 1]; the model predicts v = noise - x0, so
dx/dt = v and sampling integrates from t = 1 (pure noise) down to t = 0 (data).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def block_timesteps(rng, block_ids: Array, noised: Array, mean: float = 0.0,
                    std: float = 1.0, shift: float = 1.0) -> Array:
  """One logit-normal t per (row, block) (SD3), broadcast to its tokens; 0 elsewhere.

  block_ids int [B, L] are unique within a row (the packer renumbers them), so one normal
  draw per (row, block id) gives every block its own t. `shift` > 1 moves every t toward
  noise (`shift_time`; the resolution-dependent shift, `mot.latent.timestep_shift`).
  Returns float32 [B, L].
  """
  b, l = block_ids.shape
  z = mean + std * jax.random.normal(rng, (b, l + 1), jnp.float32)
  t = jax.nn.sigmoid(jnp.take_along_axis(z, jnp.clip(block_ids, 0, l), axis=1))
  if shift != 1.0:  # static: unshifted runs keep their exact program
    t = shift_time(t, shift)
  return jnp.where(noised, t, 0.0)


def shift_time(t, shift: float):
  """SD3's time shift t -> shift t / (1 + (shift - 1) t): 1 and 0 stay, the rest moves
  toward 1 (noise) for shift > 1. Shifts compose by multiplying."""
  return shift * t / (1.0 + (shift - 1.0) * t)


def add_noise(x0: Array, noise: Array, t: Array) -> Array:
  """x_t = (1 - t) x0 + t noise, t broadcast over the patch axis."""
  t = t[..., None]
  return (1.0 - t) * x0 + t * noise


def velocity_target(x0: Array, noise: Array) -> Array:
  return noise - x0


def velocity_loss(pred: Array, target: Array, token_mask: Array, dim_mask: Array,
                  t: Array | None = None) -> Array:
  """Mean squared error over noised tokens and each token's valid patch dims.

  With `t` (float [B, L]) the error is of the clean estimate x0 = x_t - t v instead: its
  error is t times the velocity's, so each token's squared error is weighted by t^2. The
  mean stays over the same tokens and dims, so a loss of 0 means the same in both spaces.
  """
  w = token_mask[..., None] * dim_mask
  error = jnp.square(pred - target)
  if t is not None:
    error = error * jnp.square(t)[..., None]
  return jnp.sum(w * error) / jnp.maximum(jnp.sum(w), 1.0)


def time_grid(steps: int, shift: float = 1.0) -> Array:
  """Decreasing times t_0 = 1 > ... > t_steps = 0; `shift` > 1 spends more steps near 1."""
  return shift_time(jnp.linspace(1.0, 0.0, steps + 1), shift)


VelocityFn = Callable[[Array, Array], Array]   # (x_t [..], t scalar) -> v [..]


def euler_sample(velocity_fn: VelocityFn, x1: Array, steps: int, shift: float = 1.0) -> Array:
  """First-order ODE integration from noise x1 at t = 1 to t = 0."""
  ts = time_grid(steps, shift)

  def step(x, i):
    t, t_next = ts[i], ts[i + 1]
    return x + (t_next - t) * velocity_fn(x, t), None

  x, _ = jax.lax.scan(step, x1, jnp.arange(steps))
  return x


def heun_sample(velocity_fn: VelocityFn, x1: Array, steps: int, shift: float = 1.0) -> Array:
  """Second-order (Heun) integration; the last step is Euler as t_next = 0 (EDM)."""
  ts = time_grid(steps, shift)

  def step(x, i):
    t, t_next = ts[i], ts[i + 1]
    v = velocity_fn(x, t)
    x_euler = x + (t_next - t) * v
    v_next = velocity_fn(x_euler, t_next)
    x_heun = x + (t_next - t) * 0.5 * (v + v_next)
    return jnp.where(t_next > 0, x_heun, x_euler), None

  x, _ = jax.lax.scan(step, x1, jnp.arange(steps))
  return x


SAMPLERS = {"euler": euler_sample, "heun": heun_sample}
