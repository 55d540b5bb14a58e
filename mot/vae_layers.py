"""The KL autoencoder's network in Flax (linen), laid out as diffusers' `AutoencoderKL`.

NHWC throughout. Module and parameter names mirror diffusers' state-dict keys, so that
`encoder.down_blocks.0.resnets.1.conv1.weight` is the parameter
`encoder/down_blocks_0/resnets_1/conv1/kernel` here (mot.vae converts between the two):

  Encoder: conv_in (3x3) -> down_blocks_i (layers_per_block ResnetBlock2D, then a stride-2
    3x3 conv on the input padded by one row and column at the bottom and right, except in
    the last block) -> mid_block (resnet, single-head self-attention, resnet) ->
    conv_norm_out (GroupNorm) -> act -> conv_out (3x3, 2 * latent_channels: mean, logvar).
  Decoder: conv_in -> mid_block -> up_blocks_i (layers_per_block + 1 resnets over the
    reversed channel list, then nearest-neighbour 2x upsampling and a 3x3 conv, except in
    the last block) -> conv_norm_out -> act -> conv_out (3x3, out_channels).
  AutoencoderKL: optional 1x1 quant_conv after the encoder and post_quant_conv before the
    decoder (`use_quant_conv`, `use_post_quant_conv`); logvar clamped to [-30, 20].

Every GroupNorm has `norm_num_groups` groups and eps 1e-6; resnets are pre-norm
(norm -> act -> conv, twice) with a 1x1 conv_shortcut where the channels change. Logical
axis names on every parameter: conv kernels ("kernel_h", "kernel_w", "channels_in",
"channels"), attention projections ("channels_in", "channels"), biases ("channels",), norm
scales and biases ("norm",); rules that do not name them leave them replicated.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DOWN_BLOCK = "DownEncoderBlock2D"   # the only encoder block type of AutoencoderKL's layout
UP_BLOCK = "UpDecoderBlock2D"       # ... and decoder block type
NORM_EPS = 1e-6                     # every GroupNorm of AutoencoderKL
LOGVAR_RANGE = (-30.0, 20.0)        # diffusers' DiagonalGaussianDistribution clamp


def _mish(x: Array) -> Array:
  return x * jnp.tanh(jax.nn.softplus(x))


# diffusers.models.activations.get_activation: "swish" and "silu" are the same function;
# torch's GELU is the exact (erf) one.
ACTIVATIONS = {"silu": jax.nn.silu, "swish": jax.nn.silu, "relu": jax.nn.relu,
               "gelu": functools.partial(jax.nn.gelu, approximate=False), "mish": _mish}


@dataclasses.dataclass(frozen=True)
class VAEConfig:
  """The fields of diffusers' AutoencoderKL config.json, with diffusers' own defaults (the
  values diffusers uses for a field a config.json leaves out). Validated by mot.vae."""
  in_channels: int = 3                       # image channels
  out_channels: int = 3                      # decoded image channels
  block_out_channels: tuple[int, ...] = (64,)  # channels per resolution level (encoder order)
  layers_per_block: int = 1                  # resnets per encoder block (decoder: one more)
  act_fn: str = "silu"                       # a key of ACTIVATIONS
  latent_channels: int = 4                   # 4: SD-style, 16: FLUX-style
  norm_num_groups: int = 32                  # GroupNorm groups (divides every channel count)
  sample_size: int = 32                      # training image size (informational here)
  scaling_factor: float = 0.18215            # scaled latent = (z - shift) * scaling_factor
  shift_factor: float | None = None          # None: no shift (SD); FLUX sets one
  latents_mean: tuple[float, ...] | None = None  # per-channel statistics some pipelines use;
  latents_std: tuple[float, ...] | None = None   # carried, not applied (see mot.vae)
  force_upcast: bool = True                  # diffusers: run the VAE in float32
  use_quant_conv: bool = True                # 1x1 conv on the moments after the encoder
  use_post_quant_conv: bool = True           # 1x1 conv on the latent before the decoder
  mid_block_add_attention: bool = True       # self-attention in both mid-blocks

  @property
  def downsample_factor(self) -> int:
    """Image pixels per latent pixel along each axis: 2 ** (levels - 1)."""
    return 2 ** (len(self.block_out_channels) - 1)

  @property
  def network(self) -> "VAEConfig":
    """This config with the fields that do not change the network (the latent scaling,
    statistics and informational fields) at their defaults: a key for compiled code."""
    return dataclasses.replace(self, scaling_factor=VAEConfig.scaling_factor,
                               shift_factor=None, latents_mean=None, latents_std=None,
                               sample_size=VAEConfig.sample_size, force_upcast=True)


def _conv_init(names):
  # torch's default Conv2d / Linear init (kaiming uniform, a=sqrt(5)): U(+-1/sqrt(fan_in)).
  return nn.with_logical_partitioning(
      nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"), names)


def _bias_init(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)
  init = lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype,
                                                                  -bound, bound)
  return nn.with_logical_partitioning(init, ("channels",))


def conv(features: int, kernel: int, in_features: int, name: str | None = None,
         stride: int = 1, padding=None) -> nn.Conv:
  """A torch-like Conv2d: 'same' padding for odd kernels unless `padding` is given."""
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), strides=(stride, stride),
                 padding=padding if padding is not None else ((pad, pad), (pad, pad)),
                 kernel_init=_conv_init(("kernel_h", "kernel_w", "channels_in", "channels")),
                 bias_init=_bias_init(in_features * kernel * kernel), name=name)


def group_norm(cfg: VAEConfig, name: str) -> nn.GroupNorm:
  # use_fast_variance=False: E[(x - mean)^2], as torch computes it (closer in float32).
  return nn.GroupNorm(num_groups=cfg.norm_num_groups, epsilon=NORM_EPS,
                      use_fast_variance=False, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)))


class ResnetBlock(nn.Module):
  """diffusers' ResnetBlock2D without a time embedding: pre-norm, two 3x3 convs."""
  cfg: VAEConfig
  out_channels: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    act = ACTIVATIONS[self.cfg.act_fn]
    c_in, c_out = x.shape[-1], self.out_channels
    h = conv(c_out, 3, c_in, "conv1")(act(group_norm(self.cfg, "norm1")(x)))
    h = conv(c_out, 3, c_out, "conv2")(act(group_norm(self.cfg, "norm2")(h)))
    if c_in != c_out:
      x = conv(c_out, 1, c_in, "conv_shortcut")(x)
    return x + h


class Attention(nn.Module):
  """The mid-block's single-head self-attention over all H*W positions, with GroupNorm
  before it and the residual after it (diffusers' Attention, _from_deprecated_attn_block)."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    b, h, w, c = x.shape
    dense = lambda name: nn.Dense(
        c, name=name, kernel_init=_conv_init(("channels_in", "channels")),
        bias_init=_bias_init(c))
    t = group_norm(self.cfg, "group_norm")(x).reshape(b, h * w, c)
    q, k, v = dense("to_q")(t), dense("to_k")(t), dense("to_v")(t)
    scores = jnp.einsum("bqc,bkc->bqk", q, k) / math.sqrt(c)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
    out = dense("to_out_0")(jnp.einsum("bqk,bkc->bqc", probs, v))
    return x + out.reshape(b, h, w, c)


class MidBlock(nn.Module):
  """resnet -> attention (optional) -> resnet at the lowest resolution."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = x.shape[-1]
    x = ResnetBlock(self.cfg, c, name="resnets_0")(x)
    if self.cfg.mid_block_add_attention:
      x = Attention(self.cfg, name="attentions_0")(x)
    return ResnetBlock(self.cfg, c, name="resnets_1")(x)


class Downsample(nn.Module):
  """Stride-2 3x3 conv after padding one zero row/column at the bottom/right only."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = x.shape[-1]
    return conv(c, 3, c, "conv", stride=2, padding=((0, 1), (0, 1)))(x)


class Upsample(nn.Module):
  """Nearest-neighbour 2x upsampling, then a 3x3 conv."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    c = x.shape[-1]
    return conv(c, 3, c, "conv")(x)


class DownBlock(nn.Module):
  cfg: VAEConfig
  out_channels: int
  num_layers: int
  add_downsample: bool

  @nn.compact
  def __call__(self, x: Array) -> Array:
    for i in range(self.num_layers):
      x = ResnetBlock(self.cfg, self.out_channels, name=f"resnets_{i}")(x)
    if self.add_downsample:
      x = Downsample(self.cfg, name="downsamplers_0")(x)
    return x


class UpBlock(nn.Module):
  cfg: VAEConfig
  out_channels: int
  num_layers: int
  add_upsample: bool

  @nn.compact
  def __call__(self, x: Array) -> Array:
    for i in range(self.num_layers):
      x = ResnetBlock(self.cfg, self.out_channels, name=f"resnets_{i}")(x)
    if self.add_upsample:
      x = Upsample(self.cfg, name="upsamplers_0")(x)
    return x


class Encoder(nn.Module):
  """Images [B, H, W, in_channels] -> moments [B, H/f, W/f, 2 * latent_channels]."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg, chans = self.cfg, self.cfg.block_out_channels
    x = conv(chans[0], 3, x.shape[-1], "conv_in")(x)
    for i, c in enumerate(chans):
      x = DownBlock(cfg, c, cfg.layers_per_block, i < len(chans) - 1,
                    name=f"down_blocks_{i}")(x)
    x = MidBlock(cfg, name="mid_block")(x)
    x = ACTIVATIONS[cfg.act_fn](group_norm(cfg, "conv_norm_out")(x))
    return conv(2 * cfg.latent_channels, 3, chans[-1], "conv_out")(x)


class Decoder(nn.Module):
  """Latents [B, h, w, latent_channels] -> images [B, h*f, w*f, out_channels]."""
  cfg: VAEConfig

  @nn.compact
  def __call__(self, z: Array) -> Array:
    cfg, chans = self.cfg, tuple(reversed(self.cfg.block_out_channels))
    x = conv(chans[0], 3, z.shape[-1], "conv_in")(z)
    x = MidBlock(cfg, name="mid_block")(x)
    for i, c in enumerate(chans):
      x = UpBlock(cfg, c, cfg.layers_per_block + 1, i < len(chans) - 1,
                  name=f"up_blocks_{i}")(x)
    x = ACTIVATIONS[cfg.act_fn](group_norm(cfg, "conv_norm_out")(x))
    return conv(cfg.out_channels, 3, chans[-1], "conv_out")(x)


class AutoencoderKL(nn.Module):
  """The KL autoencoder. Methods (via `apply(..., method=...)`): `moments`, `encode`,
  `decode`; calling it samples a latent (rng "sample") and reconstructs."""
  cfg: VAEConfig

  def setup(self):
    lat = self.cfg.latent_channels
    self.encoder = Encoder(self.cfg)
    self.decoder = Decoder(self.cfg)
    if self.cfg.use_quant_conv:
      self.quant_conv = conv(2 * lat, 1, 2 * lat)
    if self.cfg.use_post_quant_conv:
      self.post_quant_conv = conv(lat, 1, lat)

  def moments(self, x: Array) -> tuple[Array, Array]:
    """Images in [-1, 1] -> (posterior mean, log-variance), each [B, H/f, W/f, latent]."""
    m = self.encoder(x)
    if self.cfg.use_quant_conv:
      m = self.quant_conv(m)
    mean, logvar = jnp.split(m, 2, axis=-1)
    return mean, jnp.clip(logvar, *LOGVAR_RANGE)

  def encode(self, x: Array) -> Array:
    """Images -> the posterior mean (unscaled latents)."""
    return self.moments(x)[0]

  def decode(self, z: Array) -> Array:
    """Unscaled latents -> images, nominally in [-1, 1] (not clipped)."""
    if self.cfg.use_post_quant_conv:
      z = self.post_quant_conv(z)
    return self.decoder(z)

  def __call__(self, x: Array) -> tuple[Array, Array, Array]:
    """(reconstruction of a posterior sample, mean, logvar); needs the "sample" rng."""
    mean, logvar = self.moments(x)
    eps = jax.random.normal(self.make_rng("sample"), mean.shape, mean.dtype)
    return self.decode(mean + jnp.exp(0.5 * logvar) * eps), mean, logvar


# ----------------------------------------------------------------------------------------
# Shapes and a fast initialisation.
# ----------------------------------------------------------------------------------------
def param_shapes(cfg: VAEConfig) -> dict:
  """The parameter tree of AutoencoderKL(cfg) as ShapeDtypeStructs (no compute)."""
  return _param_shapes(cfg.network)


@functools.lru_cache(maxsize=16)
def _param_shapes(cfg: VAEConfig) -> dict:
  model = AutoencoderKL(cfg)
  f = cfg.downsample_factor
  x = jax.ShapeDtypeStruct((1, 2 * f, 2 * f, cfg.in_channels), jnp.float32)
  init = lambda r, x: nn.meta.unbox(model.init({"params": r, "sample": r}, x)["params"])
  return jax.eval_shape(init, jax.random.PRNGKey(0), x)


def init_params(cfg: VAEConfig, rng: Array) -> dict:
  """Parameters drawn as `AutoencoderKL(cfg).init` draws them (torch's defaults: kernels
  and biases U(+-1 / sqrt(fan_in)), norm scales 1 and biases 0), from one random vector:
  jitting `init` compiles one random-number program per parameter, ~10 s on 2 cores."""
  flat = flax.traverse_util.flatten_dict(param_shapes(cfg))
  sizes = {k: math.prod(v.shape) for k, v in flat.items()
           if (*k[:-1], "scale") not in flat}
  noise = np.asarray(jax.random.uniform(rng, (sum(sizes.values()),), jnp.float32, -1.0, 1.0))
  out, offset = {}, 0
  for key, s in sorted(flat.items()):
    if key not in sizes:   # a GroupNorm's scale or bias
      out[key] = np.full(s.shape, 1.0 if key[-1] == "scale" else 0.0, np.float32)
      continue
    fan_in = math.prod(flat[(*key[:-1], "kernel")].shape[:-1])
    out[key] = noise[offset:offset + sizes[key]].reshape(s.shape) / np.float32(
        math.sqrt(fan_in))
    offset += sizes[key]
  return jax.tree.map(jnp.asarray, flax.traverse_util.unflatten_dict(out))
