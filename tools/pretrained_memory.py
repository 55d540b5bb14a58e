"""Memory of one training step of configs/pretrained.py on a pretrained model, before any
weight is downloaded: the model's config.json and tokenizer files are enough.

  python tools/pretrained_memory.py --hf_dir ~/models/Qwen3-0.6B --experts mode \
      --remat nothing_saveable --batch_size 96

Builds the run `python train.py --config configs/pretrained.py --config.init_from=...`
would build after `python -m mot.convert from_hf --experts ...` (one device, float32,
configs/digits.py's rows), compiles its jitted train step on abstract inputs (nothing is
allocated) and prints XLA's buffer assignment as one JSON line: the state (parameters,
EMA, AdamW moments: exact), XLA's temporaries (gradients, activations kept for the
backward pass, scratch) and their total. The temporaries are XLA:CPU's, an estimate of
an accelerator's (which fuses more). Compiling a 0.6 B model takes minutes on a CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import pretrained  # noqa: E402  (the repository's own modules)
from mot import config as config_lib  # noqa: E402
from mot import convert, hf_arch, hf_io, sharding  # noqa: E402
from mot import step as step_lib  # noqa: E402
from mot.model import MoT  # noqa: E402

GIB = 2 ** 30


def run_config(hf_dir: str, experts: str, remat: str, batch_size: int):
  """configs/pretrained.py with the model fields a conversion of `hf_dir` would write."""
  where = os.path.join(hf_dir, hf_io.CONFIG)
  arch = hf_arch.arch_of(hf_io.read_config(hf_dir), where)
  fields = hf_arch.model_fields(arch, where)
  fields["vocab_size"] = convert.vocabulary(hf_dir, fields["vocab_size"])
  converted = convert.run_config(fields, experts, os.path.join(hf_dir, convert.TOKENIZER))
  config = pretrained.get_config()
  with config.unlocked():
    config.tokenizer = converted.tokenizer
    for name in config.model.keys():
      if config.model[name] is None:
        config.model[name] = converted.model[name]
    config.model.remat_policy = remat
    config.batch_size = batch_size
    config.freeze_understanding = experts == "mode"
  return config


def plan(config) -> dict:
  model_cfg = config_lib.validate(config)
  mesh, rules = sharding.make_mesh(config), sharding.logical_rules(config)
  model, tx = MoT(model_cfg), step_lib.make_optimizer(config)
  init = step_lib.init_state_fn(model, tx, config.data.seq_len)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       nn.meta.unbox(boxed), shardings)
  batch = {k: jax.ShapeDtypeStruct((config.batch_size,) + v.shape[1:], v.dtype,
                                   sharding=sharding.batch_sharding(mesh, v.ndim))
           for k, v in step_lib.dummy_batch(model_cfg, config.data.seq_len).items()}
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding.replicated(mesh))
  step = step_lib.jit_train_step(model, tx, config, mesh, rules, shardings)
  with jax.set_mesh(mesh):
    xla = step.lower(state, batch, rng).compile().memory_analysis()
  total = (xla.argument_size_in_bytes + xla.output_size_in_bytes - xla.alias_size_in_bytes
           + xla.temp_size_in_bytes)
  return {"experts": model_cfg.experts, "remat_policy": model_cfg.remat_policy,
          "batch_size": config.batch_size, "seq_len": config.data.seq_len,
          "params": sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
          "state_gib": xla.argument_size_in_bytes / GIB, "temp_gib": xla.temp_size_in_bytes / GIB,
          "total_gib": total / GIB}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hf_dir", required=True, help="folder with config.json, tokenizer.json")
  parser.add_argument("--experts", default="mode", choices=convert.EXPERTS)
  parser.add_argument("--remat", default="none", help="'none' or a jax.checkpoint_policies name")
  parser.add_argument("--batch_size", type=int, default=96)
  args = parser.parse_args()
  config = run_config(args.hf_dir, args.experts, args.remat, args.batch_size)
  print(json.dumps(plan(config)), flush=True)


if __name__ == "__main__":
  main()
