"""Fine-tune a converted pretrained language model (mot.convert) on the bundled digits.

The model's fields and its tokenizer come from the workdir `init_from` names: they are
placeholders here, and a value set on the command line that differs from the checkpoint's
is refused (mot.warm_start). Everything else (task mix, data, optimisation, sampling) is
configs/digits.py's unless changed below. docs/pretrained.md has the whole recipe.

  python -m mot.convert from_hf --hf_dir ~/models/Qwen3-0.6B --workdir runs/qwen3 --experts mode
  python train.py --config configs/pretrained.py --workdir runs/qwen3_digits \
      --config.init_from=runs/qwen3 [--config.freeze_understanding=True]
  python train.py --config configs/pretrained.py:tiny --workdir /tmp/ft \
      --config.init_from=/tmp/converted                         # seconds, for tests

Variants (the part after ':'): "" (default) and "tiny" (configs/digits.py's tiny run), or
the data and training of another bundled config, "shapes" or "shapes:tiny"; convert with
the same base (`mot.convert from_hf --config configs/shapes.py[:tiny]`) so that the
fields the checkpoint does not fix (patch_dim, modality_patch_dims, time_embed_dim) agree:

  python -m mot.convert from_hf --hf_dir ~/models/Qwen3-0.6B --workdir runs/qwen3_shapes \
      --config configs/shapes.py
  python train.py --config configs/pretrained.py:shapes --workdir runs/qwen3_shapes_ft \
      --config.init_from=runs/qwen3_shapes
"""
import ml_collections
from ml_collections.config_dict import placeholder

from configs import digits, shapes

BASES = {"digits": digits, "shapes": shapes}   # configs whose data and training this takes


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  name, _, variant = arg.partition(":")
  if name not in BASES:              # "" and "tiny": configs/digits.py's variants
    if arg not in ("", "tiny"):
      raise ValueError(f"configs/pretrained.py has no variant {arg!r}: use '', 'tiny', "
                       "'shapes' or 'shapes:tiny'")
    name, variant = "digits", arg
  c = BASES[name].get_config(variant)  # every other field, documented there
  c.init_from = ""                   # the mot.convert workdir (or training workdir) to start
                                     # from: required by the placeholders below
  c.tokenizer = placeholder(str)     # from init_from: its tokenizer.json

  # ---- Optimisation: a pretrained backbone moves less than a fresh one. ----
  if c.variant == "default":
    c.learning_rate = 3e-4           # peak AdamW learning rate (the DM head starts fresh)
    c.warmup_steps = 100             # linear warm-up steps, then cosine decay

  # ---- Model: the parameters' fields come from init_from (mot.warm_start.FROM_INIT). ----
  m = c.model
  m.vocab_size = placeholder(int)    # from init_from: the tokenizer's ids
  m.d_model = placeholder(int)       # from init_from: residual width
  m.num_layers = placeholder(int)    # from init_from: transformer blocks
  m.num_heads = placeholder(int)     # from init_from: query heads
  m.num_kv_heads = placeholder(int)  # from init_from: key/value heads
  m.head_dim = placeholder(int)      # from init_from: per-head width
  m.mlp_dim = placeholder(int)       # from init_from: SwiGLU hidden width
  m.modality_patch_dims = placeholder(tuple)  # from init_from: real patch dims per modality
  m.rope_sections = placeholder(tuple)  # from init_from: M-RoPE (t, h, w) frequencies
  m.rope_theta = placeholder(float)  # from init_from: RoPE base
  m.rope_interleaved = placeholder(bool)  # from init_from: Qwen3-VL frequency layout
  m.time_embed_dim = placeholder(int)  # from init_from: sinusoidal timestep features
  m.experts = placeholder(str)       # from init_from: "shared" | "mode" (convert --experts)
  m.scan_layers = placeholder(bool)  # from init_from: stacked layers
  m.param_dtype = placeholder(str)   # from init_from: parameter dtype
  m.norm_eps = placeholder(float)    # from init_from: RMSNorm epsilon
  m.qkv_bias = placeholder(bool)     # from init_from: q/k/v biases (Qwen2)
  m.qk_norm = placeholder(bool)      # from init_from: QK-norm (Qwen3)
  m.tie_embeddings = placeholder(bool)  # from init_from: tied input/output embeddings
  # model.patch_dim stays tied to data.patch_dim (the base's): init_from must agree.
  # The run's own choices (how it computes, not what the weights are):
  m.scan_unroll = 1                  # one block per scan-loop iteration: a deep model
                                     # compiles in seconds, not minutes
  m.dtype = "float32"                # compute dtype
  m.matmul_dtype = "same"            # float32 matmul operands, as the converted model;
                                     # "bfloat16" runs about 2x faster on bf16 hardware
  return c
