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

from mot import tokenizer

EXPERT_MODES = ("shared", "mode", "modality")
EXPERT_IMPLS = ("auto", "tiled", "ragged")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")
MATMUL_DTYPES = ("float32", "bfloat16", "float16")   # besides "same"


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the backbone and both heads (see configs/*.py for meanings)."""
  vocab_size: int = tokenizer.VOCAB_SIZE
  d_model: int = 256
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 64
  mlp_dim: int = 1024
  patch_dim: int = 4                     # P: width of the `patches` field
  modality_patch_dims: tuple[int, ...] = (0, 4, 4, 2)  # valid patch dims per modality id
  rope_sections: tuple[int, int, int] = (8, 12, 12)
  rope_theta: float = 10000.0
  rope_interleaved: bool = True          # Qwen3-VL interleaved layout (False: Qwen2-VL sections)
  time_embed_dim: int = 256              # sinusoidal features of the diffusion timestep
  experts: str = "shared"
  expert_impl: str = "auto"              # grouped matmul: "auto" | "tiled" | "ragged"
  expert_tile: int = 256                 # rows per tile of the "tiled" grouped matmul
  init_generation_from_understanding: bool = False  # every expert starts as expert 0
  scan_layers: bool = True
  scan_unroll: int = 1                   # blocks per nn.scan loop iteration; -1: all (no loop);
                                         # passes with a KV cache keep the loop
  remat_policy: str = "none"             # "none" or a jax.checkpoint_policies name
  dtype: str = "float32"                 # compute dtype
  matmul_dtype: str = "same"             # Linear matmul operands: "same" (the compute dtype)
                                         # or a dtype, e.g. "bfloat16" (f32 accumulation)
  param_dtype: str = "float32"
  norm_eps: float = 1e-6
  dropout_rate: float = 0.0              # residual dropout in training (only with a "dropout" rng)
  attention_impl: str = "auto"           # "auto" (cuDNN where it applies, else XLA) | "xla" | "cudnn"

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
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in dict(model_cfg).items() if k in fields}
    for key in ("rope_sections", "modality_patch_dims"):
      if key in values:
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
    value = getattr(m, name)
    _check(isinstance(value, int) and value > 0,
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
  _check(isinstance(m.scan_unroll, int) and not isinstance(m.scan_unroll, bool)
         and (m.scan_unroll > 0 or m.scan_unroll == -1),
         f"config.model.scan_unroll={m.scan_unroll!r} must be a positive integer (blocks per "
         "loop iteration) or -1 (all blocks, no loop)")
  if m.remat_policy != "none":
    _check(hasattr(jax.checkpoint_policies, m.remat_policy),
           f"config.model.remat_policy={m.remat_policy!r} is not in jax.checkpoint_policies: "
           "use 'none', 'nothing_saveable' or 'dots_with_no_batch_dims_saveable'")


def validate(config: Any) -> ModelConfig:
  """Validates a full run config; returns its frozen ModelConfig."""
  for name in ("num_train_steps", "batch_size", "log_every_steps",
               "checkpoint_every_steps", "eval_every_steps"):
    value = config.get(name)
    _check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
           f"config.{name}={value!r} must be a positive integer")
  _check(config.learning_rate > 0 and config.learning_rate == config.learning_rate,
         f"config.learning_rate={config.learning_rate} must be a positive number")
  _check(0 <= config.warmup_steps, f"config.warmup_steps={config.warmup_steps} must be >= 0")
  _check(0.0 <= config.cond_drop_prob < 1.0,
         f"config.cond_drop_prob={config.cond_drop_prob} must be in [0, 1)")
  _check(0.0 <= config.ema_decay < 1.0,
         f"config.ema_decay={config.ema_decay} must be in [0, 1)")
  smoothing = config.get("ar_label_smoothing", 0.0)
  _check(isinstance(smoothing, (int, float)) and 0.0 <= smoothing < 1.0,
         f"config.ar_label_smoothing={smoothing!r} must be in [0, 1): e.g. 0.1")
  _check(config.dm_loss_weight >= 0,
         f"config.dm_loss_weight={config.dm_loss_weight} must be >= 0")
  try:
    model = ModelConfig.from_config(config.model)
  except TypeError as e:
    raise ConfigError(f"config.model has a bad field: {e}") from None
  validate_model(model)
  _check(config.data.patch_size ** 2 == model.modality_patch_dims[1],
         f"config.model.modality_patch_dims[1]={model.modality_patch_dims[1]} must equal "
         f"config.data.patch_size**2 = {config.data.patch_size ** 2} (an image patch's size)")
  _check(isinstance(config.get("eval_samples_per_digit", 0), int)
         and config.get("eval_samples_per_digit", 0) >= 0,
         f"config.eval_samples_per_digit={config.get('eval_samples_per_digit')!r} must be an "
         "integer >= 0 (0 turns the sampling evaluation off)")
  shift = (config.get("sample") or {}).get("shift", 1.0)
  _check(isinstance(shift, (int, float)) and shift > 0,
         f"config.sample.shift={shift!r} must be a positive number (1: the uniform time grid)")
  reason_shifts = (config.get("sample") or {}).get("reason_shifts", 0)
  _check(isinstance(reason_shifts, int) and not isinstance(reason_shifts, bool)
         and 0 <= reason_shifts <= 2,
         f"config.sample.reason_shifts={reason_shifts!r} must be 0 (off), 1 or 2 (pixels of "
         "test-time shift when reading an image)")
  context = (config.get("sample") or {}).get("context_length", 0)
  _check(isinstance(context, int) and not isinstance(context, bool) and context >= 0,
         f"config.sample.context_length={context!r} must be an integer >= 0 (the longest "
         "prompt plus answer sampling accepts; at least config.data.seq_len either way)")
  _check(not config.get("freeze_understanding", False) or model.experts == "mode",
         "config.freeze_understanding=True needs the understanding expert: set "
         "config.model.experts='mode'")
  _check(config.max_nonfinite_steps > 0,
         f"config.max_nonfinite_steps={config.max_nonfinite_steps} must be positive")
  from mot.data import pipeline  # local: keeps `import mot.config` light
  try:
    pipeline.validate(config.data)
  except (ValueError, TypeError, AttributeError) as e:
    raise ConfigError(str(e)) from None
  return model
