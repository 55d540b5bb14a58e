"""Qwen3-shaped backbones (0.6B, 1.7B, 8B) for memory plans and accelerator runs.

  python -m bench.memory_plan --config configs/scale.py:8b --mesh_shape "(1,64,1)"
  python -m bench.memory_plan --config configs/scale.py:0.6b --mesh_shape "(1,1,1)" \\
      --config.batch_size=1
  python -m bench.memory_plan --config configs/scale.py:8b --mesh_shape "(1,64,1)" \\
      --config.model.experts=mode
  python -m bench.train_throughput --config configs/scale.py:0.6b --config.batch_size=1 \\
      --config.mesh_shape="(1,1,1)" --config.data.seq_len=2048 \\
      --config.data.examples_per_row=46 --steps 2 --warmup 1
  python train.py --config configs/scale.py:0.6b --workdir runs/scale_0.6b   # accelerators
  python train.py --config configs/scale.py:tiny --workdir /tmp/scale_tiny   # for tests

The variants take Qwen3's published shapes (config.json of Qwen/Qwen3-0.6B, -1.7B, -8B):
d_model, layers, query and KV heads, head_dim 128, SwiGLU width and the 151,936-token
vocabulary. mot's AR head is its own matrix (Qwen3-0.6B and 1.7B tie it to the embedding),
so the two small shapes hold 156M and 311M more parameters than their names say. The
backbone is mot's: M-RoPE over (t, h, w), both heads, `experts` shared (or "mode" /
"modality" via --config.model.experts, which doubles / quadruples the block weights).

What a real run would use: bf16 activations and matmul operands with float32 parameters,
AdamW state and EMA (a TPU's or a GPU's usual mixed precision), scanned layers (one block
compiled, not 28-36) and full rematerialisation (`nothing_saveable`: only each block's
input is kept for the backward pass). FSDP over every device: "(1,-1,1)" splits every
weight's embed dimension, the batch over the same devices. The data are still the bundled
digits, packed ~93 examples to a 4,096-token row; what matters here is the row length.

Variants (the part after ':'): "0.6b" (default), "1.7b", "8b" and "tiny". Everything not
set here is as in configs/digits.py (losses, logging, data options); any field can be
overridden on the command line.
"""
import ml_collections

from configs import digits

# Qwen3 config.json: hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size (head_dim 128 and vocab_size 151936 in all).
SHAPES = {
    "0.6b": dict(d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8, mlp_dim=3072),
    "1.7b": dict(d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8, mlp_dim=6144),
    "8b": dict(d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8, mlp_dim=12288),
    "tiny": dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=192),
}
VARIANTS = tuple(SHAPES)


def get_config(arg: str = "0.6b") -> ml_collections.ConfigDict:
  variant = arg or "0.6b"
  if variant not in VARIANTS:
    raise ValueError(f"configs/scale.py has no variant {arg!r}: use one of {VARIANTS}")
  c = digits.get_config()            # shared fields, each documented there
  c.variant = variant                # which variant of this file built the config
  c.progress_bar = False             # plain log lines (long runs, redirected output)

  # ---- Optimisation (a plausible pre-training schedule; the memory plan needs none). ----
  c.num_train_steps = 10000          # total optimizer steps
  c.batch_size = 64                  # global batch in rows: one 4k-token row per device of
                                     # the 64-device plan (a multiple of the data devices)
  c.learning_rate = 3e-4             # peak AdamW learning rate (Qwen-sized models)
  c.warmup_steps = 500               # linear warm-up steps, then cosine decay
  c.ema_decay = 0.9999               # EMA of the parameters used for sampling

  # ---- Logging and checkpoints. ----
  c.log_every_steps = 10             # metrics.jsonl interval
  c.eval_every_steps = 1000          # held-out evaluation interval
  c.eval_samples_per_digit = 0       # no sampling protocol inside training (run
                                     # mot.evaluate on a checkpoint instead)
  c.checkpoint_every_steps = 1000    # orbax checkpoint interval

  # ---- Mesh: FSDP over every device (the rules are configs/digits.py's). ----
  c.mesh_shape = "(1,-1,1)"          # (data, fsdp, tensor): weights split over all devices

  # ---- Data: the bundled digits, packed into long rows. ----
  c.data.seq_len = 4096              # row length in tokens (the 4k tokens per row)
  c.data.examples_per_row = 93       # 4096 // 44 (the longest digits example)

  # ---- Model: Qwen3's shape, mot's backbone. ----
  for name, value in SHAPES[variant].items():
    c.model[name] = value            # d_model, num_layers, num_heads, num_kv_heads, mlp_dim
  c.model.head_dim = 128             # per-head width (Qwen3: 128 at every size)
  c.model.vocab_size = 151936        # Qwen3's vocabulary (the byte tokenizer uses 272 of it)
  c.model.rope_sections = (24, 20, 20)  # M-RoPE (t, h, w) frequencies, Qwen3-VL's split
  c.model.rope_theta = 1000000.0     # RoPE base (Qwen3)
  c.model.time_embed_dim = 256       # sinusoidal timestep features
  c.model.experts = "shared"         # "shared" | "mode" | "modality" weight tying
  c.model.expert_impl = "auto"       # experts' grouped matmul: ragged_dot on TPU, tiled
                                     # elsewhere (XLA:CPU expands ragged_dot into dense
                                     # products whose gradient it gathers across the data
                                     # shards: plan "mode" with tiled; docs/performance.md)
  c.model.scan_layers = True         # nn.scan over blocks: one block compiled
  c.model.scan_unroll = 1            # a loop over the layers (unrolling 28-36 blocks of this
                                     # size only lengthens the compile)
  c.model.remat_policy = "nothing_saveable"  # keep each block's input only; recompute the
                                     # rest in the backward pass
  c.model.dtype = "bfloat16"         # activations in bf16
  c.model.matmul_dtype = "same"      # matmul operands in the compute dtype (bf16), products
                                     # accumulated in float32
  c.model.param_dtype = "float32"    # parameters, their gradients, AdamW moments and EMA

  if variant == "tiny":               # the same fields at test size (seconds to compile)
    c.batch_size = 2
    c.data.seq_len = 256
    c.data.examples_per_row = 5
    c.model.head_dim = 32
    c.model.vocab_size = 512
    c.model.rope_sections = (6, 5, 5)
    c.model.time_embed_dim = 64
  return c
