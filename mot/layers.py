"""Building blocks: RMSNorm, grouped-query attention with M-RoPE and optional QK-norm and
q/k/v biases (Qwen3 has the norm, Qwen2 the biases), SwiGLU MLP, timestep embedding.
Parameters carry logical axis names; no mesh axis appears here.

Linear, RMSNorm, Attention and SwiGLU take an optional `groups` (`mot.experts.Groups`):
with it their weights gain a leading "expert" axis, inputs and outputs are in the grouped
buffer layout [R, ...] and every row uses its own expert's weights; without it they are
the plain dense layers on [B, L, ...] (same parameter names and shapes as always).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from mot import attention, experts, matmul, rope
from mot.config import ModelConfig

Array = jax.Array


def dense_init(fan_in: int, names: tuple[str, ...], scale: float = 1.0):
  """Truncated-normal init with std scale/sqrt(fan_in), boxed with logical axis names."""
  std = scale / math.sqrt(fan_in)
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(std), names)


def constrain(x: Array, names: tuple[str, ...]) -> Array:
  """Logical constraint for [B, L, ...] names; on the grouped buffer [R, ...] the row axis
  takes the batch axis's name (its rows are the batch's tokens)."""
  if x.ndim == len(names) - 1:
    names = (names[0],) + tuple(names[2:])
  return nn.with_logical_constraint(x, names)


class Linear(nn.Module):
  """x [..., *in_shape] -> [..., *out_shape] with one kernel [*in_shape, *out_shape].

  Unlike nn.DenseGeneral, the kernel is created in its final shape, so its logical axis
  names (one per kernel dim) hold at init time under a mesh. The product's operands are
  rounded to `cfg.matmul_dtype` where it differs from the compute dtype (`mot.matmul`).
  With `use_bias`, a bias [*out_shape] (zero-initialised) is added in the compute dtype.
  """
  cfg: ModelConfig
  out_shape: tuple[int, ...]
  names: tuple[str, ...]
  in_dims: int = 1            # trailing input dims contracted
  scale: float = 1.0          # init std multiplier
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: Array, groups: experts.Groups | None = None) -> Array:
    in_shape = x.shape[x.ndim - self.in_dims:]
    dt = self.cfg.compute_dtype
    if groups is not None:
      std = self.scale / math.sqrt(math.prod(in_shape))
      init = experts.expert_init(nn.initializers.truncated_normal(std), self.cfg)
      kernel = self.param("kernel", nn.with_logical_partitioning(init, ("expert", *self.names)),
                          (groups.num_experts, *in_shape, *self.out_shape),
                          self.cfg.params_dtype)
      operand = self.cfg.matmul_operand_dtype
      y = experts.grouped_matmul(x.astype(dt), kernel.astype(dt), groups, self.in_dims,
                                 None if operand == dt else operand)
      if self.use_bias:
        y = experts.expert_bias(y, self._bias(groups.num_experts).astype(dt), groups)
      return y
    kernel = self.param("kernel", dense_init(math.prod(in_shape), self.names, self.scale),
                        (*in_shape, *self.out_shape), self.cfg.params_dtype)
    y = matmul.linear_matmul(x.astype(dt), kernel.astype(dt), self.in_dims,
                             self.cfg.matmul_operand_dtype, dt)
    return y + self._bias().astype(dt) if self.use_bias else y

  def _bias(self, num_experts: int | None = None) -> Array:
    """The bias [*out_shape] ([E, *out_shape] with experts), named like the kernel's
    output dims."""
    names = self.names[len(self.names) - len(self.out_shape):]
    shape = tuple(self.out_shape)
    if num_experts is not None:
      names, shape = ("expert", *names), (num_experts, *shape)
    return self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, names),
                      shape, self.cfg.params_dtype)


class RMSNorm(nn.Module):
  """Root-mean-square norm over the last axis with a learned scale (init 1)."""
  cfg: ModelConfig
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x: Array, groups: experts.Groups | None = None) -> Array:
    names = (self.axis_name,) if groups is None else ("expert", self.axis_name)
    shape = (x.shape[-1],) if groups is None else (groups.num_experts, x.shape[-1])
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, names),
                       shape, self.cfg.params_dtype).astype(jnp.float32)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.cfg.norm_eps)
    x32 = x32 * scale if groups is None else experts.expert_scale(x32, scale, groups)
    return x32.astype(self.cfg.compute_dtype)


class Attention(nn.Module):
  """Grouped-query attention over the whole (packed) sequence.

  q: [B, Lq, H, D]; k, v: [B, Lk, K, D] with H % K == 0; `rotary` is the (cos, sin) pair
  of `rope.rotary_tables` for the new tokens' positions, made once for all layers. With
  `cache` (dict of k, v [B, Lmax, K, D]) the queries attend over the cache as if the new
  keys/values were written at `cache_index` (the mask then has Lk = Lmax), and the layer
  returns only the new keys/values; `Backbone` writes them into the cache. With `groups`,
  x and the output are grouped buffers [R, d]: projections and QK-norms run per expert,
  then q, k, v return to [B, L, ...] for RoPE, the cache and the (global) attention.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array, rotary: tuple[Array, Array],
               mask: attention.AttentionMask, cache=None,
               cache_index=None, groups: experts.Groups | None = None):
    cfg = self.cfg
    d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dt = cfg.compute_dtype
    q = Linear(cfg, (h, hd), ("embed", "heads", "kv"), use_bias=cfg.qkv_bias,
               name="query")(x, groups)
    kv_pair = Linear(cfg, (2, kv, hd), ("embed", "kv_pair", "kv_heads", "kv"),
                     use_bias=cfg.qkv_bias, name="key_value")(x, groups)
    k, v = kv_pair[..., 0, :, :], kv_pair[..., 1, :, :]
    if cfg.qk_norm:
      q = RMSNorm(cfg, axis_name="kv", name="query_norm")(q, groups)
      k = RMSNorm(cfg, axis_name="kv", name="key_norm")(k, groups)
    if groups is not None:
      q, k, v = groups.combine(q), groups.combine(k), groups.combine(v)
    q, k = rope.rotate(q, *rotary), rope.rotate(k, *rotary)
    if cache is None:
      new_kv = None
      out = attention.attend(q, k.astype(dt), v.astype(dt), mask)
    else:
      new_kv = {"k": k.astype(cache["k"].dtype), "v": v.astype(cache["v"].dtype)}
      out = attention.attend_cached(q, new_kv, cache, cache_index, mask).astype(dt)
    out = nn.with_logical_constraint(out, ("activation_batch", "activation_length",
                                           "activation_heads", "activation_kv"))
    if groups is not None:
      out = groups.dispatch(out)
    out = Linear(cfg, (d,), ("heads", "kv", "embed"), in_dims=2, name="out")(out, groups)
    return out, new_kv


def swiglu_autodiff(gate_up: Array) -> Array:
  """silu(gate) * up of gate_up [..., 2, F] -> [..., F], left to JAX's autodiff (the
  reference `swiglu`'s gradient is tested and benchmarked against)."""
  return nn.silu(gate_up[..., 0, :]) * gate_up[..., 1, :]


@jax.custom_vjp
def swiglu(gate_up: Array) -> Array:
  """`swiglu_autodiff` with a custom gradient that writes d(gate_up) as one stacked array;
  autodiff of the two slices builds it from two zero-padded halves and their sum (two
  extra passes over a [tokens, 2F] buffer in every layer's backward).
  """
  return swiglu_autodiff(gate_up)


def _swiglu_fwd(gate_up):
  return swiglu(gate_up), gate_up


def _swiglu_bwd(gate_up, d_hidden):
  gate, up = gate_up[..., 0, :], gate_up[..., 1, :]
  sig = jax.nn.sigmoid(gate)
  d_gate = d_hidden * up * sig * (1 + gate * (1 - sig))
  d_up = d_hidden * gate * sig
  return (jnp.stack([d_gate, d_up], axis=-2).astype(gate_up.dtype),)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class SwiGLU(nn.Module):
  """Gated MLP: down(silu(gate(x)) * up(x)), gate and up fused in one matmul.

  (One matmul of twice the width keeps the CPU's matmul kernels busier than two.)
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array, groups: experts.Groups | None = None) -> Array:
    cfg = self.cfg
    gate_up = Linear(cfg, (2, cfg.mlp_dim), ("embed", "mlp_pair", "mlp"), name="wi")(x, groups)
    hidden = swiglu(gate_up)
    hidden = constrain(hidden, ("activation_batch", "activation_length", "activation_mlp"))
    return Linear(cfg, (cfg.d_model,), ("mlp", "embed"), name="wo")(hidden, groups)


def timestep_features(t: Array, dim: int, max_period: float = 10000.0) -> Array:
  """Sinusoidal features float32 [..., dim] of t in [0, 1] (scaled by 1000 as in DiT)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = (t.astype(jnp.float32) * 1000.0)[..., None] * freqs
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class TimestepEmbedding(nn.Module):
  """t [B, L] -> [B, L, d_model]: sinusoidal features then a SiLU MLP."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, t: Array) -> Array:
    cfg = self.cfg
    feats = timestep_features(t, cfg.time_embed_dim).astype(cfg.compute_dtype)
    x = nn.Dense(cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                 kernel_init=dense_init(cfg.time_embed_dim, ("time", "embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                 dot_general=matmul.dense_dot_general(cfg), name="fc1")(feats)
    x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))
    return nn.Dense(cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                    kernel_init=dense_init(cfg.d_model, ("embed_in", "embed")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                    dot_general=matmul.dense_dot_general(cfg), name="fc2")(nn.silu(x))
