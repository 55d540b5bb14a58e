"""Training throughput of the peer: lucidrains' transfusion-pytorch, on the CPU build of torch.

Not a dependency of mot: it runs in its own virtual environment (bench/peer_setup.sh):

  bash bench/peer_setup.sh                   # once: /tmp/peer with torch 2.13.0 (CPU)
  /tmp/peer/bin/python bench/peer_transfusion.py
  /tmp/peer/bin/python bench/peer_transfusion.py --steps 30 --batch 16
  python3 bench/peer_transfusion.py --device cuda --steps 50   # on a GPU machine's torch

The setting (shared/STACK.md's anchor, matched by `configs/bench.py:peer`): d_model 256,
6 layers, 4 heads x 64 (its defaults otherwise: GEGLU feed-forward of inner width
int(4 * 2/3 * 256) = 682, adaptive norms, value gates, U-Net skips, QK-norm), byte text
vocabulary (256), batch 16 examples, each 32 text tokens then one 8x8 single-channel
image cut into 2x2 patches, given as a channel-last (4, 4, 4) latent: 16 image tokens of
4 values. AdamW (lr 3e-4). Random data: the step's cost does not depend on the values.

One step = forward (its flow + text losses), backward, AdamW step, zero_grad. Prints one
JSON line: tokens_per_s (32 + 16 = 48 tokens per example, like STACK.md; the begin/end
markers it adds around an image are not counted), step_ms (median of --steps after
--warmup), parameters, threads, autocast, the LD_PRELOADed allocator if any,
os.getloadavg(). `--autocast bfloat16` runs its forward under torch's mixed precision.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from transfusion_pytorch import Transfusion


def make_model(dim: int, depth: int, heads: int, dim_head: int) -> Transfusion:
  return Transfusion(
      num_text_tokens=256,              # bytes
      dim_latent=4,                     # a 2x2 patch of a single-channel image
      channel_first_latent=False,
      modality_default_shape=(4, 4),    # 8x8 image -> 4x4 patches
      transformer=dict(dim=dim, depth=depth, heads=heads, dim_head=dim_head))


def make_batch(batch: int, text_len: int, generator: torch.Generator) -> list:
  return [[torch.randint(0, 256, (text_len,), generator=generator),
           torch.randn(4, 4, 4, generator=generator)] for _ in range(batch)]


def synchronize(device: torch.device) -> None:
  if device.type == "cuda":
    torch.cuda.synchronize(device)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20, help="timed steps (median)")
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
  parser.add_argument("--batch", type=int, default=16, help="examples per step")
  parser.add_argument("--text_len", type=int, default=32, help="text tokens per example")
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--depth", type=int, default=6)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--dim_head", type=int, default=64)
  parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
  parser.add_argument("--threads", type=int, default=0,
                      help="torch.set_num_threads (0: torch's default, all cores)")
  parser.add_argument("--autocast", default="", choices=["", "bfloat16"],
                      help="bfloat16: the forward under torch.autocast, torch's mixed "
                      "precision (bf16 matmuls, f32 parameters), to set beside mot's "
                      "bf16 matmul operands; '' (default): float32 throughout")
  args = parser.parse_args()
  if args.threads:
    torch.set_num_threads(args.threads)
  loadavg_start = os.getloadavg()
  torch.manual_seed(0)
  generator = torch.Generator().manual_seed(0)
  device = torch.device(args.device)
  model = make_model(args.dim, args.depth, args.heads, args.dim_head).to(device)
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
  model.train()

  times, losses = [], []
  for i in range(args.warmup + args.steps):
    batch = [[x.to(device) for x in example]
             for example in make_batch(args.batch, args.text_len, generator)]
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(args.autocast)):
      loss = model(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)                 # a GPU runs asynchronously: time the work, not the launch
    elapsed = time.perf_counter() - start
    if i >= args.warmup:
      times.append(elapsed)
      losses.append(loss.item())

  tokens = args.batch * (args.text_len + 16)
  step = statistics.median(times)
  result = {
      "peer": "transfusion-pytorch",
      "torch": torch.__version__,
      "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
      "threads": torch.get_num_threads(),
      "autocast": args.autocast or "off",
      "tokens_per_s": round(tokens / step, 1),
      "step_ms": round(step * 1e3, 2),
      "step_ms_p10": round(sorted(times)[len(times) // 10] * 1e3, 2),
      "step_ms_p90": round(sorted(times)[(9 * len(times)) // 10] * 1e3, 2),
      "steps": args.steps,
      "tokens_per_step": tokens,
      "params": sum(p.numel() for p in model.parameters()),
      "malloc": os.environ.get("LD_PRELOAD", "") or "default",
      "loss": round(losses[-1], 4),
      "loadavg_start": [round(x, 2) for x in loadavg_start],
      "loadavg_end": [round(x, 2) for x in os.getloadavg()],
  }
  print(f"transfusion-pytorch: {result['tokens_per_s']:.0f} tokens/s, step "
        f"{result['step_ms']:.1f} ms, {result['params'] / 1e6:.2f}M parameters, "
        f"{result['threads']} threads, load {result['loadavg_start']}")
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
