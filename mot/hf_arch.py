"""Qwen3 / Qwen2 / Qwen3-VL checkpoints in mot's terms.

Two tables: config.json's fields that fix the numerics <-> `mot.config.ModelConfig`
fields (`model_fields`, `hf_config`), and every Hugging Face tensor <-> the mot parameter
that holds it (`tensor_table`), with `hf_view`, the numpy view of a mot array in the
Hugging Face layout, so that import writes into it and export reads from it.

mot's block is Qwen3's: pre-norm RMSNorm, GQA with per-head QK-norm (Qwen3) or q/k/v
biases (Qwen2), rotate-half RoPE, SwiGLU. Text positions are M-RoPE's t = h = w = index,
so any `rope_sections` split computes plain RoPE on text; Qwen3-VL's language model keeps
its own interleaved `mrope_section`. mot fuses k/v ([d, 2, K, D]) and gate/up ([d, 2, F])
and keeps heads as their own axis; Hugging Face stores [out, in] matrices.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mot.config import ConfigError, ModelConfig

QWEN3, QWEN2, QWEN3_VL = "Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen3VLForConditionalGeneration"
ARCHITECTURES = (QWEN3, QWEN2, QWEN3_VL)
MODEL_TYPES = {QWEN3: "qwen3", QWEN2: "qwen2"}

# Tensors of layer i, after "<prefix>layers.<i>.": (path inside mot's block, kind of view).
LAYER_TENSORS = {
    "self_attn.q_proj.weight": (("attention", "query", "kernel"), "query"),
    "self_attn.k_proj.weight": (("attention", "key_value", "kernel"), "key"),
    "self_attn.v_proj.weight": (("attention", "key_value", "kernel"), "value"),
    "self_attn.o_proj.weight": (("attention", "out", "kernel"), "out"),
    "mlp.gate_proj.weight": (("mlp", "wi", "kernel"), "gate"),
    "mlp.up_proj.weight": (("mlp", "wi", "kernel"), "up"),
    "mlp.down_proj.weight": (("mlp", "wo", "kernel"), "down"),
    "input_layernorm.weight": (("attention_norm", "scale"), "vector"),
    "post_attention_layernorm.weight": (("mlp_norm", "scale"), "vector"),
}
QK_NORM_TENSORS = {
    "self_attn.q_norm.weight": (("attention", "query_norm", "scale"), "vector"),
    "self_attn.k_norm.weight": (("attention", "key_norm", "scale"), "vector"),
}
QKV_BIAS_TENSORS = {
    "self_attn.q_proj.bias": (("attention", "query", "bias"), "query_bias"),
    "self_attn.k_proj.bias": (("attention", "key_value", "bias"), "key_bias"),
    "self_attn.v_proj.bias": (("attention", "key_value", "bias"), "value_bias"),
}
EMBEDDING = ("embed", "token_embedding")
FINAL_NORM = ("ar_head", "norm", "scale")
UNEMBED = ("ar_head", "unembed", "kernel")
# Buffers some exporters save beside the weights; recomputed, never read.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class Arch:
  """A checkpoint's architecture: its name, its language model's config, where its
  language model's tensors live and which tensors are left out."""
  name: str
  text: dict              # the language model's config: config.json or its text_config
  prefix: str             # "model." or "model.language_model."
  skipped_prefix: str     # tensors not converted (the vision tower); "" for none
  tie: bool               # tie_word_embeddings


@dataclasses.dataclass(frozen=True)
class Entry:
  """One Hugging Face tensor and the mot parameter holding it."""
  name: str               # Hugging Face tensor name
  path: tuple[str, ...]   # mot parameter path (under "params"; inside the block for layers)
  layer: int | None       # block index, None for the embedding, final norm and head
  kind: str               # how `hf_view` lays the mot array out


def arch_of(hf: dict, where: str) -> Arch:
  """The supported architecture of a config.json (`where` names the file in errors)."""
  names = hf.get("architectures")
  name = names[0] if isinstance(names, list) and len(names) == 1 else names
  if name not in ARCHITECTURES:
    raise ConfigError(f"{where} has architectures={names!r}: mot converts only "
                      f"{', '.join(ARCHITECTURES)}")
  if name == QWEN3_VL:
    text = hf.get("text_config")
    if not isinstance(text, dict):
      raise ConfigError(f"{where} has no text_config: not a complete {QWEN3_VL} config")
    # The top-level flag decides for the whole model (Qwen3VLConfig); False is its default.
    return Arch(name, text, "model.language_model.", "model.visual.",
                bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))))
  # Qwen2Config and Qwen3Config default to untied embeddings.
  return Arch(name, hf, "model.", "", bool(hf.get("tie_word_embeddings", False)))


def _require(text: dict, key: str, where: str, kind=int):
  value = text.get(key)
  if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
    raise ConfigError(f"{where} has {key}={value!r}: a positive "
                      f"{'integer' if kind is int else 'number'} is needed")
  return value


def rope_settings(arch: Arch, where: str) -> tuple[float, dict]:
  """(rope_theta, rope parameters) from either config form: transformers 4's top-level
  rope_theta + rope_scaling, or transformers 5's rope_parameters."""
  text = arch.text
  params = text.get("rope_parameters") or text.get("rope_scaling") or {}
  theta = text.get("rope_theta", params.get("rope_theta"))
  if not isinstance(theta, (int, float)) or theta <= 0:
    raise ConfigError(f"{where} has no usable rope_theta (top level or in rope_parameters)")
  kind = params.get("rope_type", params.get("type", "default"))
  if kind != "default":
    raise ConfigError(f"{where} uses RoPE scaling {kind!r}: mot implements plain RoPE only")
  return float(theta), params


def _check_attention(arch: Arch, where: str) -> None:
  text = arch.text
  if text.get("hidden_act", "silu") != "silu":
    raise ConfigError(f"{where} has hidden_act={text.get('hidden_act')!r}: mot's MLP is SwiGLU")
  if text.get("use_sliding_window"):
    raise ConfigError(f"{where} sets use_sliding_window: mot attends to the whole sequence")
  kinds = set(text.get("layer_types") or ["full_attention"])
  if kinds != {"full_attention"}:
    raise ConfigError(f"{where} has layer_types {sorted(kinds)}: mot implements "
                      "full_attention only")
  if arch.name != QWEN2 and text.get("attention_bias"):
    raise ConfigError(f"{where} sets attention_bias: mot has no output-projection bias")


def rope_sections(head_dim: int) -> tuple[int, int, int]:
  """M-RoPE (t, h, w) split of head_dim // 2 in Qwen3-VL's proportions ((24, 20, 20) at
  head_dim 128): text reads plain RoPE whatever the split, media get all three axes."""
  half = head_dim // 2
  hw = half * 5 // 16
  return (half - 2 * hw, hw, hw)


def model_fields(arch: Arch, where: str) -> dict[str, Any]:
  """mot.config.ModelConfig fields of the language model (vocab_size: the checkpoint's)."""
  _check_attention(arch, where)
  text = arch.text
  heads = _require(text, "num_attention_heads", where)
  hidden = _require(text, "hidden_size", where)
  head_dim = text.get("head_dim") or hidden // heads
  theta, rope = rope_settings(arch, where)
  sections = rope_sections(head_dim)
  if arch.name == QWEN3_VL:
    sections = tuple(int(s) for s in rope.get("mrope_section", sections))
  return {
      "vocab_size": _require(text, "vocab_size", where),
      "d_model": hidden,
      "num_layers": _require(text, "num_hidden_layers", where),
      "num_heads": heads,
      "num_kv_heads": text.get("num_key_value_heads") or heads,
      "head_dim": head_dim,
      "mlp_dim": _require(text, "intermediate_size", where),
      "rope_theta": theta,
      "rope_sections": sections,
      "rope_interleaved": True if arch.name != QWEN3_VL else bool(
          rope.get("mrope_interleaved", True)),
      "norm_eps": float(_require(text, "rms_norm_eps", where, (int, float))),
      "qkv_bias": arch.name == QWEN2,
      "qk_norm": arch.name != QWEN2,
      "tie_embeddings": arch.tie,
  }


def export_arch(cfg: ModelConfig) -> str:
  """The Hugging Face architecture that computes mot's text path: Qwen3 (QK-norm) or
  Qwen2 (q/k/v biases)."""
  if cfg.qk_norm and not cfg.qkv_bias:
    return QWEN3
  if cfg.qkv_bias and not cfg.qk_norm:
    return QWEN2
  raise ConfigError(f"a model with qk_norm={cfg.qk_norm} and qkv_bias={cfg.qkv_bias} has no "
                    "Hugging Face architecture: Qwen3 has QK-norm, Qwen2 q/k/v biases")


def hf_config(cfg: ModelConfig, vocab_size: int, original: dict | None, dtype: str) -> dict:
  """config.json of the exported language model: the original's (its other fields, e.g.
  token ids and context length, kept; a Qwen3-VL's text_config) with the numerics from
  `cfg`, in the original's rope form (transformers 4's top-level rope_theta by default)."""
  name = export_arch(cfg)
  base = dict(original or {})
  if base.get("architectures") != [name]:   # none, or a Qwen3-VL's: a text model's defaults
    base = {"max_position_embeddings": 32768, "hidden_act": "silu", "use_sliding_window": False}
  base.update({
      "architectures": [name], "model_type": MODEL_TYPES[name], "vocab_size": vocab_size,
      "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "intermediate_size": cfg.mlp_dim, "rms_norm_eps": cfg.norm_eps,
      "tie_word_embeddings": cfg.tie_embeddings,
      "layer_types": ["full_attention"] * cfg.num_layers})
  if name == QWEN3:
    base["attention_bias"] = False
  if "rope_parameters" in base:
    base["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  else:
    base.update(rope_theta=cfg.rope_theta, rope_scaling=None)
  base.pop("torch_dtype" if "dtype" in base else "dtype", None)
  base["dtype" if "dtype" in base else "torch_dtype"] = dtype
  return base


def tensor_table(arch_prefix: str, cfg: ModelConfig) -> list[Entry]:
  """Every tensor of the checkpoint (language model only) and where it goes."""
  per_layer = dict(LAYER_TENSORS)
  if cfg.qk_norm:
    per_layer.update(QK_NORM_TENSORS)
  if cfg.qkv_bias:
    per_layer.update(QKV_BIAS_TENSORS)
  entries = [Entry(f"{arch_prefix}embed_tokens.weight", EMBEDDING, None, "rows"),
             Entry(f"{arch_prefix}norm.weight", FINAL_NORM, None, "vector")]
  if not cfg.tie_embeddings:
    entries.append(Entry("lm_head.weight", UNEMBED, None, "columns"))
  for i in range(cfg.num_layers):
    entries += [Entry(f"{arch_prefix}layers.{i}.{name}", path, i, kind)
                for name, (path, kind) in per_layer.items()]
  return entries


def _reshaped(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """`a` reshaped without a copy (a writable view); AttributeError if it needs one."""
  view = a.view()
  view.shape = shape
  return view


KV = {"key": 0, "value": 1, "key_bias": 0, "value_bias": 1, "gate": 0, "up": 1}


def hf_view(kind: str, a: np.ndarray, vocab: int) -> np.ndarray:
  """The view of mot array `a` (one layer's and one expert's slice for block weights)
  that has the Hugging Face tensor's layout; `vocab` rows of the embedding are the
  checkpoint's (mot appends its special tokens after them)."""
  if kind == "vector":
    return a
  if kind == "rows":                                          # [V', d] -> [V, d]
    return a[:vocab]
  if kind == "columns":                                       # [d, V'] -> [V, d]
    return a[:, :vocab].T
  if kind == "query":                                         # [d, H, D] -> [H*D, d]
    return _reshaped(a, (a.shape[0], -1)).T
  if kind in ("key", "value"):                                # [d, 2, K, D] -> [K*D, d]
    return _reshaped(a[:, KV[kind]], (a.shape[0], -1)).T
  if kind == "out":                                           # [H, D, d] -> [d, H*D]
    return _reshaped(a, (-1, a.shape[-1])).T
  if kind in ("gate", "up"):                                  # [d, 2, F] -> [F, d]
    return a[:, KV[kind]].T
  if kind == "down":                                          # [F, d] -> [d, F]
    return a.T
  if kind == "query_bias":                                    # [H, D] -> [H*D]
    return _reshaped(a, (-1,))
  if kind in ("key_bias", "value_bias"):                      # [2, K, D] -> [K*D]
    return _reshaped(a[KV[kind]], (-1,))
  raise ValueError(f"unknown tensor kind {kind!r}")


def _node(params: dict, path: tuple[str, ...]) -> Any:
  for key in path:
    params = params[key]
  return params


def mot_array(params: dict, cfg: ModelConfig, entry: Entry, expert: int = 0) -> np.ndarray:
  """The mot array (a view) an entry maps to: its layer's and `expert`'s slice of a block
  weight (stacked layers with `cfg.scan_layers`), else the whole parameter."""
  if entry.layer is None:
    return _node(params, entry.path)
  if cfg.scan_layers:
    a = _node(params, ("backbone", "layers", "block", *entry.path))[entry.layer]
  else:
    a = _node(params, ("backbone", f"layers_{entry.layer}", *entry.path))
  return a if cfg.experts == "shared" else a[expert]


def expected_shape(entry: Entry, mot_shape: tuple[int, ...], vocab: int) -> tuple[int, ...]:
  """The Hugging Face shape of an entry whose (sliced) mot array has `mot_shape`."""
  return hf_view(entry.kind, np.broadcast_to(np.float32(0), mot_shape), vocab).shape
