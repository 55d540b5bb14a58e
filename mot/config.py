"""ConfigDict -> one frozen model config, plus validation of the whole run config.

Modules receive a single `ModelConfig` (Flax examples: "to minimise obnoxious kwarg
plumbing"). `validate(config)` checks every field a user is likely to get wrong *before*
anything compiles, and raises `ConfigError` with one line naming the field and the fix.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from mot import latent, tokenizer
from mot.data import auto_config, input_pipeline
from mot.errors import ConfigError, field  # noqa: F401  (mot.config.ConfigError, too)

EXPERT_MODES = ("shared", "mode", "modality")
EXPERT_IMPLS = ("auto", "tiled", "ragged")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "blockwise", "splash")
MATMUL_DTYPES = ("float32", "bfloat16", "float16")   # besides "same"
DM_PREDICTIONS = ("velocity", "x")   # what the DM head's linear map outputs
MEDIA_POS_EMBEDS = ("none", "sincos")  # absolute positions of media tokens (mot.media_positions)
PATCH_MIXINGS = ("none", "neighbours")  # grid neighbours read and written (mot.patch_neighbours)
DM_LOSS_SPACES = ("velocity", "x0")  # what the DM loss's squared error measures (mot.step)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the backbone and both heads, from `config.model` (every field is
  declared and explained in configs/digits.py; there are no defaults here)."""
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  patch_dim: int                         # P: width of the `patches` field
  modality_patch_dims: tuple[int, ...]   # valid patch dims per modality id
  rope_sections: tuple[int, int, int]
  rope_theta: float
  rope_interleaved: bool                 # Qwen3-VL interleaved layout (False: Qwen2-VL sections)
  time_embed_dim: int                    # sinusoidal features of the diffusion timestep
  experts: str
  expert_impl: str                       # grouped matmul: "auto" | "tiled" | "ragged"
  expert_tile: int                       # rows per tile of the "tiled" grouped matmul
  init_generation_from_understanding: bool  # every expert starts as expert 0
  scan_layers: bool
  scan_unroll: int                       # blocks per nn.scan loop iteration; -1: all
  remat_policy: str                      # "none" or a jax.checkpoint_policies name
  dtype: str                             # compute dtype
  matmul_dtype: str                      # Linear matmul operands: "same" or a dtype
  param_dtype: str
  norm_eps: float
  qkv_bias: bool                         # biases on the q/k/v projections (Qwen2 / Qwen2.5)
  qk_norm: bool                          # RMSNorm of every query and key head (Qwen3; not Qwen2)
  tie_embeddings: bool                   # the AR head unembeds with the token embedding table
  dropout_rate: float                    # residual dropout in training
  attention_impl: str                    # "auto" | "xla" | "cudnn" | "blockwise" | "splash"
  attention_block_q: int                 # blockwise/splash: queries per tile
  attention_block_kv: int                # blockwise/splash: keys per tile
  attention_blockwise_min_length: int    # "auto" runs blockwise from this many keys
  dm_prediction: str                     # DM head output: "velocity" or "x" (the clean x0)
  dm_min_time: float                     # "x": the t below which v = (x_t - x0) / t is floored
  media_pos_embed: str                   # "none" | "sincos": absolute (frame, row, col) of a
                                         # media token in its block, added to its projection
  patch_mixing: str                      # "none" | "neighbours": image/video patches' input
                                         # projection and DM output also span their 3x3
                                         # grid neighbours (mot.patch_neighbours)

  @property
  def num_modalities(self) -> int:
    return len(self.modality_patch_dims)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def matmul_operand_dtype(self):
    return self.compute_dtype if self.matmul_dtype == "same" else jnp.dtype(self.matmul_dtype)

  @property
  def params_dtype(self):
    return jnp.dtype(self.param_dtype)

  @classmethod
  def from_config(cls, model_cfg: Any, **overrides) -> "ModelConfig":
    """From `config.model` (a ConfigDict or dict): every field required, none unknown."""
    values = dict(model_cfg)
    fields = [f.name for f in dataclasses.fields(cls)]
    missing = [f for f in fields if f not in values and f not in overrides]
    unknown = sorted(set(values) - set(fields))
    if missing:
      raise ConfigError(f"config.model lacks {', '.join(missing)}: declare every model field "
                        "in your config file (see configs/digits.py)")
    if unknown:
      raise ConfigError(f"config.model has unknown fields {', '.join(unknown)}: remove them "
                        "(the model fields are those of configs/digits.py)")
    for key in ("rope_sections", "modality_patch_dims"):
      values[key] = tuple(int(x) for x in values[key])
    values.update(overrides)
    return cls(**values)


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def validate_model(m: ModelConfig) -> None:
  """Checks that the model fields are consistent with each other."""
  for name in ("d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
               "mlp_dim", "patch_dim", "time_embed_dim"):
    _check(isinstance(value := getattr(m, name), int) and value > 0,
           f"config.model.{name}={value!r} must be a positive integer")
  _check(m.num_heads % m.num_kv_heads == 0,
         f"config.model.num_heads={m.num_heads} is not divisible by "
         f"config.model.num_kv_heads={m.num_kv_heads}: pick num_kv_heads that divides it")
  _check(m.head_dim % 2 == 0, f"config.model.head_dim={m.head_dim} must be even for RoPE")
  _check(len(m.rope_sections) == 3 and all(s >= 0 for s in m.rope_sections),
         f"config.model.rope_sections={m.rope_sections} must be three non-negative ints (t, h, w)")
  _check(sum(m.rope_sections) == m.head_dim // 2,
         f"config.model.rope_sections={tuple(m.rope_sections)} sums to {sum(m.rope_sections)} "
         f"but must sum to head_dim // 2 = {m.head_dim // 2}: e.g. (8, 12, 12) for head_dim 64")
  _check(m.experts in EXPERT_MODES,
         f"config.model.experts={m.experts!r} is unknown: use one of {EXPERT_MODES}")
  _check(m.expert_impl in EXPERT_IMPLS,
         f"config.model.expert_impl={m.expert_impl!r} is unknown: use one of {EXPERT_IMPLS}")
  _check(isinstance(m.expert_tile, int) and m.expert_tile > 0,
         f"config.model.expert_tile={m.expert_tile!r} must be a positive integer")
  _check(not m.init_generation_from_understanding or m.experts != "shared",
         "config.model.init_generation_from_understanding=True needs experts: set "
         "config.model.experts='mode'")
  _check(max(m.modality_patch_dims) <= m.patch_dim,
         f"config.model.patch_dim={m.patch_dim} is smaller than a modality's patch "
         f"({max(m.modality_patch_dims)}): raise patch_dim")
  _check(isinstance(m.dropout_rate, (int, float)) and 0.0 <= m.dropout_rate < 1.0,
         f"config.model.dropout_rate={m.dropout_rate!r} must be in [0, 1): e.g. 0.1")
  _check(m.rope_theta > 0, f"config.model.rope_theta={m.rope_theta} must be positive")
  validate_numerics(m)
  for name in ("dtype", "param_dtype"):
    try:
      jnp.dtype(getattr(m, name))
    except TypeError:
      raise ConfigError(f"config.model.{name}={getattr(m, name)!r} is not a dtype: "
                        "use float32 or bfloat16") from None
  _check(m.matmul_dtype == "same" or m.matmul_dtype in MATMUL_DTYPES,
         f"config.model.matmul_dtype={m.matmul_dtype!r} is unknown: use 'same' (the compute "
         f"dtype) or one of {MATMUL_DTYPES}")
  _check(m.attention_impl in ATTENTION_IMPLS,
         f"config.model.attention_impl={m.attention_impl!r} is unknown: use one of "
         f"{ATTENTION_IMPLS}")
  if m.attention_impl == "cudnn":
    _check(m.dtype in ("bfloat16", "float16"),
           f"config.model.attention_impl='cudnn' needs 16-bit compute, not "
           f"config.model.dtype={m.dtype!r}: set config.model.dtype=bfloat16 (or use 'auto')")
    _check(jax.default_backend() == "gpu",
           f"config.model.attention_impl='cudnn' needs a GPU, but JAX runs on "
           f"{jax.default_backend()!r}: use 'auto' or 'xla'")
  validate_tiled_attention(m)
  validate_dm_head(m)
  _check(isinstance(m.scan_unroll, int) and not isinstance(m.scan_unroll, bool)
         and (m.scan_unroll > 0 or m.scan_unroll == -1),
         f"config.model.scan_unroll={m.scan_unroll!r} must be a positive integer (blocks per "
         "loop iteration) or -1 (all blocks, no loop)")
  if m.remat_policy != "none":
    _check(hasattr(jax.checkpoint_policies, m.remat_policy),
           f"config.model.remat_policy={m.remat_policy!r} is not in jax.checkpoint_policies: "
           "use 'none', 'nothing_saveable' or 'dots_with_no_batch_dims_saveable'")


def validate_tiled_attention(m: ModelConfig) -> None:
  """The blockwise/splash fields: tile sizes, the "auto" length, splash's TPU."""
  if m.attention_impl == "splash":
    _check(jax.default_backend() == "tpu",
           f"config.model.attention_impl='splash' needs a TPU, but JAX runs on "
           f"{jax.default_backend()!r}: use 'blockwise' (or 'auto')")
  for name in ("attention_block_q", "attention_block_kv", "attention_blockwise_min_length"):
    value = getattr(m, name)
    _check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
           f"config.model.{name}={value!r} must be a positive integer (tokens)")


def validate_dm_head(m: ModelConfig) -> None:
  """What the DM head predicts, the floor on t that turns an x0 into a velocity, the
  absolute position embedding media tokens carry and whether patches read neighbours."""
  _check(m.patch_mixing in PATCH_MIXINGS,
         f"config.model.patch_mixing={m.patch_mixing!r} is unknown: use one of "
         f"{PATCH_MIXINGS}")
  _check(m.media_pos_embed in MEDIA_POS_EMBEDS,
         f"config.model.media_pos_embed={m.media_pos_embed!r} is unknown: use one of "
         f"{MEDIA_POS_EMBEDS}")
  _check(m.dm_prediction in DM_PREDICTIONS,
         f"config.model.dm_prediction={m.dm_prediction!r} is unknown: use one of "
         f"{DM_PREDICTIONS}")
  _check(isinstance(m.dm_min_time, (int, float)) and not isinstance(m.dm_min_time, bool)
         and 0 < m.dm_min_time < 1,
         f"config.model.dm_min_time={m.dm_min_time!r} must be in (0, 1): e.g. 0.05")


def validate_numerics(m: ModelConfig) -> None:
  """The fields that pretrained checkpoints (mot.convert) set from their config.json."""
  _check(_is_int(m.vocab_size) and m.vocab_size > 0,
         f"config.model.vocab_size={m.vocab_size!r} must be a positive integer")
  _check(isinstance(m.norm_eps, (int, float)) and m.norm_eps > 0,
         f"config.model.norm_eps={m.norm_eps!r} must be a positive number: e.g. 1e-6")
  for name in ("qkv_bias", "qk_norm", "tie_embeddings"):
    _check(isinstance(getattr(m, name), bool),
           f"config.model.{name}={getattr(m, name)!r} must be True or False")


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def validate_training(config: Any) -> None:
  """The optimisation, loss and logging fields."""
  for name in ("num_train_steps", "batch_size", "log_every_steps",
               "checkpoint_every_steps", "eval_every_steps", "max_nonfinite_steps"):
    value = field(config, name)
    _check(_is_int(value) and value > 0, f"config.{name}={value!r} must be a positive integer")
  lr = field(config, "learning_rate")
  _check(lr > 0 and lr == lr, f"config.learning_rate={lr} must be a positive number")
  _check(0 <= field(config, "warmup_steps"),
         f"config.warmup_steps={config.warmup_steps} must be >= 0")
  _check(0.0 <= field(config, "cond_drop_prob") < 1.0,
         f"config.cond_drop_prob={config.cond_drop_prob} must be in [0, 1)")
  _check(0.0 <= field(config, "ema_decay") < 1.0,
         f"config.ema_decay={config.ema_decay} must be in [0, 1)")
  smoothing = field(config, "ar_label_smoothing")
  _check(isinstance(smoothing, (int, float)) and 0.0 <= smoothing < 1.0,
         f"config.ar_label_smoothing={smoothing!r} must be in [0, 1): e.g. 0.1")
  _check(field(config, "dm_loss_weight") >= 0,
         f"config.dm_loss_weight={config.dm_loss_weight} must be >= 0")
  _check(field(config, "dm_loss_space") in DM_LOSS_SPACES,
         f"config.dm_loss_space={config.dm_loss_space!r} is unknown: use one of "
         f"{DM_LOSS_SPACES}")
  per_digit = field(config, "eval_samples_per_digit")
  _check(_is_int(per_digit) and per_digit >= 0,
         f"config.eval_samples_per_digit={per_digit!r} must be an integer >= 0 (0 turns the "
         "sampling evaluation off)")


def validate_sample(sample: Any) -> None:
  """config.sample: the sampling defaults of sample.py, the evaluation and `Pipeline`."""
  steps, sampler = field(sample, "steps", "config.sample"), field(sample, "sampler",
                                                                   "config.sample")
  _check(_is_int(steps) and steps > 0, f"config.sample.steps={steps!r} must be positive")
  _check(sampler in ("euler", "heun"),
         f"config.sample.sampler={sampler!r} is unknown: use 'euler' or 'heun'")
  cfg_scale = field(sample, "cfg_scale", "config.sample")
  _check(isinstance(cfg_scale, (int, float)) and cfg_scale == cfg_scale,
         f"config.sample.cfg_scale={cfg_scale!r} must be a number (1: no guidance)")
  shift = field(sample, "shift", "config.sample")
  _check(isinstance(shift, (int, float)) and shift > 0,
         f"config.sample.shift={shift!r} must be a positive number (1: the uniform time grid)")
  reason_shifts = field(sample, "reason_shifts", "config.sample")
  _check(_is_int(reason_shifts) and 0 <= reason_shifts <= 2,
         f"config.sample.reason_shifts={reason_shifts!r} must be 0 (off), 1 or 2 (pixels of "
         "test-time shift when reading an image)")
  tokens = field(sample, "max_new_tokens", "config.sample")
  _check(_is_int(tokens) and tokens > 0,
         f"config.sample.max_new_tokens={tokens!r} must be a positive integer (the most "
         "answer tokens sampling decodes)")
  context = field(sample, "context_length", "config.sample")
  _check(_is_int(context) and context >= 0,
         f"config.sample.context_length={context!r} must be an integer >= 0 (the longest "
         "prompt plus answer sampling accepts; at least config.data.seq_len either way)")


def run_tokenizer(config: Any, model: ModelConfig) -> tokenizer.Tokenizer:
  """The tokenizer `config.tokenizer` names, for a model of `config.model.vocab_size` ids;
  a missing or malformed file, or a vocabulary that does not fit, is a ConfigError."""
  try:
    return tokenizer.load(str(field(config, "tokenizer")), model.vocab_size)
  except ValueError as e:
    raise ConfigError(f"config.tokenizer: {e}") from None


def validate(config: Any) -> ModelConfig:
  """Validates a full run config; returns its frozen ModelConfig."""
  auto_config.check_filled(config)
  validate_training(config)
  validate_sample(field(config, "sample"))
  try:
    model = ModelConfig.from_config(field(config, "model"))
  except TypeError as e:
    raise ConfigError(f"config.model has a bad field: {e}") from None
  validate_model(model)
  tok = run_tokenizer(config, model)
  data = field(config, "data")
  latent.check(config)   # a VAE's latents: patches of its channels (one-line errors)
  patch = field(data, "patch_size", "config.data") ** 2 * field(data, "channels", "config.data")
  _check(bool(latent.vae_dir(config)) or patch == model.modality_patch_dims[1],
         f"config.model.modality_patch_dims[1]={model.modality_patch_dims[1]} must equal "
         f"config.data.patch_size**2 * config.data.channels = {patch} (an image patch's "
         "size)")
  _check(not field(config, "freeze_understanding") or model.experts == "mode",
         "config.freeze_understanding=True needs the understanding expert: set "
         "config.model.experts='mode'")
  try:
    input_pipeline.validate(data, tokenizer=tok)
  except (ValueError, TypeError, AttributeError) as e:
    raise ConfigError(str(e)) from None
  return model
