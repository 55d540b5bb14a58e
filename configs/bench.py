"""Benchmark configs: the peer's setting, and a larger model for MFU.

  python -m bench.train_throughput --config configs/bench.py:peer
  python -m bench.train_throughput --config configs/bench.py:d512
  /tmp/peer/bin/python bench/peer_transfusion.py     # the peer (bash bench/peer_setup.sh)

On a GPU add --config.model.dtype=bfloat16 (attention then runs through cuDNN's fused
kernel; docs/performance.md) and run the peer with --device cuda.

They are configs/digits.py's default run changed only where a field is set below, so
train.py accepts them too. Both inherit its bf16 matmul operands (`model.matmul_dtype`:
bf16 products summed in float32; parameters, activations and gradients stay float32);
--config.model.matmul_dtype=same runs them in float32 throughout, as the peer runs.

On a CPU, glibc's malloc would map and unmap the step's scratch memory every step (a page
fault per 4 KiB page); the benchmarks, like train.py, tune it first (`mot.cli.tune_malloc`).

Variants (the part after ':'):
  peer  lucidrains' transfusion-pytorch benchmark setting (shared/STACK.md, issue 9):
        d_model 256, 6 layers, 4 heads x 64 (num_kv_heads 4: plain multi-head attention,
        as the peer), byte vocabulary, 8x8 single-channel images as 16 patches of 2x2,
        AdamW. The peer's GEGLU is "4x wide" in name only: its inner width is
        int(4 * 2/3 * 256) = 682, three 256x682 matrices like a SwiGLU of hidden 682, so
        mlp_dim = 682 matches its MLP FLOPs (hidden 1024 would be 1.5x more MLP work).
        Examples: the peer's are 32 text + 16 image tokens; ours are the digits tasks with
        one image each, caption -> image (41 tokens: BOS, 21 caption bytes, image begin,
        16 patches, image end, EOS) and image -> answer (40 tokens), half each; the
        text-only task (no image) is off. 16 examples per step, one per row of 41 tokens
        as the peer runs them (about 1 % padding). Packing two per row of 82 would compute
        the attention scores between them only to mask them out.
  d512  d_model 512, 8 layers, 8 heads x 64, SwiGLU hidden 2048 (4x), on packed rows of 3
        examples (seq_len 128) and 16 rows a step: about 1,940 real tokens per step, so
        the per-step costs that do not grow with tokens (AdamW, EMA and the non-finite
        guard over 4 copies of 34.6M parameters) weigh less against the matmuls.
"""
import ml_collections

from configs import digits

VARIANTS = ("peer", "d512")


def get_config(arg: str = "peer") -> ml_collections.ConfigDict:
  variant = arg or "peer"
  if variant not in VARIANTS:
    raise ValueError(f"configs/bench.py has no variant {arg!r}: use one of {VARIANTS}")
  c = digits.get_config()
  c.variant = variant                # which variant of this file built the config
  c.progress_bar = False             # no tqdm bar (benchmarks print their own figures)

  # ---- Data: examples with one image each (the peer's have one image and text). ----
  c.data.task_weights = ml_collections.ConfigDict(  # caption->image, image->answer only
      {"generation": 0.5, "reasoning": 0.5, "text": 0.0, "interleaved": 0.0})

  # ---- Model shared by both variants. ----
  c.model.head_dim = 64              # per-head width
  c.model.rope_sections = (8, 12, 12)  # M-RoPE (t, h, w) frequencies; sum = head_dim/2
  c.model.scan_layers = False        # unrolled blocks: faster steps than nn.scan on a CPU
                                     # (no per-layer slicing and stacking of weights and
                                     # gradients), and the compile stays short
  c.model.remat_policy = "none"      # nothing recomputed: activations fit easily on CPU
  c.model.dtype = "float32"          # activations: bf16 ones are no faster on a CPU
                                     # (docs/performance.md); the matmul operands are bf16

  if variant == "peer":
    c.batch_size = 16                # rows per step: 16 examples, as the peer's batch
    c.data.seq_len = 41              # the longest example (caption -> image, 41 tokens)
    c.data.examples_per_row = 1      # one example per row, as the peer
    c.model.d_model = 256            # residual width
    c.model.num_layers = 6           # transformer blocks
    c.model.num_heads = 4            # query heads
    c.model.num_kv_heads = 4         # key/value heads: multi-head attention, as the peer
    c.model.mlp_dim = 682            # SwiGLU hidden = the peer's GEGLU inner width
  elif variant == "d512":
    c.batch_size = 16                # rows per step (~1,940 real tokens)
    c.data.seq_len = 128             # packed row length
    c.data.examples_per_row = 3      # 3 examples of 40-41 tokens per row (~5 % padding)
    c.model.d_model = 512            # residual width
    c.model.num_layers = 8           # transformer blocks
    c.model.num_heads = 8            # query heads (8 x 64 = d_model)
    c.model.num_kv_heads = 8         # key/value heads: multi-head attention
    c.model.mlp_dim = 2048           # SwiGLU hidden, 4 x d_model
  return c
