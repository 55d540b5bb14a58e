"""Writes a random Qwen3-shaped Hugging Face checkpoint of about 1 B parameters, to measure
the memory and time of `python -m mot.convert from_hf` (docs/pretrained.md).

  python tools/make_synthetic_qwen.py --out /tmp/qwen3-1b
  /usr/bin/time -v python -m mot.convert from_hf --hf_dir /tmp/qwen3-1b --workdir /tmp/q1b
  rm -rf /tmp/qwen3-1b /tmp/q1b

Shapes are Qwen3-1.7B's (hidden 2048, 16 query / 8 key-value heads of 128, SwiGLU 6144,
vocabulary 151,936, tied embeddings) with 14 layers instead of 28: 1.015 B parameters,
4.06 GB in float32. Weights are bfloat16 as published, in shards of about 1 GB with
model.safetensors.index.json; values are small Gaussians (the conversion does not look at
them). The tokenizer is a tiny byte-level BPE (the vocabulary size is what matters).
Needs about 2 GB of disk and, while writing, one tensor's memory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mot import hf_io  # noqa: E402  (the repository's own safetensors writer)

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 14,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "rope_scaling": None, "tie_word_embeddings": True,
    "attention_bias": False, "use_sliding_window": False, "torch_dtype": "bfloat16",
}
SHARD_BYTES = 1 << 30


def tensor_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
  d, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
  q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
  out = [("model.embed_tokens.weight", (c["vocab_size"], d)), ("model.norm.weight", (d,))]
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    out += [(p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.k_proj.weight", (kv, d)),
            (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, q)),
            (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
            (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
            (p + "mlp.down_proj.weight", (d, f)), (p + "input_layernorm.weight", (d,)),
            (p + "post_attention_layernorm.weight", (d,))]
  return out


def shards(shapes: list) -> list[list]:
  groups, size = [[]], 0
  for name, shape in shapes:
    n = int(np.prod(shape)) * 2
    if groups[-1] and size + n > SHARD_BYTES:
      groups.append([])
      size = 0
    groups[-1].append((name, shape))
    size += n
  return groups


def write_tokenizer(out: str) -> None:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator([__doc__], trainers.BpeTrainer(
      vocab_size=300, show_progress=False, special_tokens=["<|endoftext|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(os.path.join(out, "tokenizer.json"))
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder to write (new)")
  args = parser.parse_args()
  os.makedirs(args.out)
  rng = np.random.default_rng(0)
  groups = shards(tensor_shapes(CONFIG))
  weight_map, total = {}, 0
  for k, group in enumerate(groups):
    name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    items = [(t, shape, lambda shape=shape: rng.standard_normal(shape, np.float32) * 0.02)
             for t, shape in group]
    hf_io.write_safetensors(os.path.join(args.out, name), items, "bfloat16")
    weight_map.update({t: name for t, _ in group})
    total += sum(int(np.prod(s)) for _, s in group)
    print(f"wrote {name}", flush=True)
  with open(os.path.join(args.out, hf_io.INDEX), "w") as f:
    json.dump({"metadata": {"total_size": 2 * total}, "weight_map": weight_map}, f)
  with open(os.path.join(args.out, hf_io.CONFIG), "w") as f:
    json.dump(CONFIG, f, indent=2)
  write_tokenizer(args.out)
  print(f"{total / 1e9:.3f} B parameters ({4 * total / 1e9:.2f} GB in float32) in {args.out}")


if __name__ == "__main__":
  main()
