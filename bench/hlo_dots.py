"""Every matrix product of the compiled train step, from XLA's optimized HLO (no profiler).

  python -m bench.hlo_dots --config configs/bench.py:d512
  python -m bench.hlo_dots --config configs/bench.py:d512 --config.model.matmul_dtype=same

It compiles the step train.py runs (`mot.step.build_training`) for the config and reads
each `dot` of the optimized program: operand dtypes and shapes, the contracting and batch
dims, its model FLOPs (2 x output elements x contracted size) and the op it comes from.
On a CPU whose bf16 matmul peak is far above its float32 one (Intel AMX), what matters is
which share of the FLOPs runs with bf16 operands, and which products are small or
contract an operand's major axis (a transposed operand that a matmul kernel may copy
first). It prints that split and the largest products, then one JSON line:

  flops                 total dot FLOPs of one step
  flops_by_operands     {"bf16 x bf16": ..., "f32 x f32": ...} FLOPs by operand dtypes
  transposed_flops      FLOPs of dots whose lhs contracts its major dim, or whose rhs
                        contracts its minor dim (the layouts oneDNN and YNNPACK copy)
  small_flops           FLOPs of dots with a side (rows, columns or contracted) < 64
  dots                  the number of dot instructions
"""
from __future__ import annotations

import collections
import json
import math
import re

import numpy as np
from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS


def define_flags():
  """Flags only when run as a program (tests import this module beside other benches)."""
  config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/bench.py:d512; override fields with "
      "--config.FIELD=VALUE.", lock_config=True)
  flags.DEFINE_integer("top", 12, "Largest dots to list.")

_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_PARAM = re.compile(r"%([\w.\-]+) = (\w+\[[\d,]*\])")
_DOT = re.compile(r"%([\w.\-]+) = (\w+\[[\d,]*\])\S* dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)")
_DIMS = re.compile(r"(lhs|rhs)_(contracting|batch)_dims=\{([\d,]*)\}")
_OP = re.compile(r'op_name="([^"]+)"')


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
  dtype, dims = _SHAPE.match(text).groups()
  return dtype, tuple(int(d) for d in dims.split(",") if d)


def parse_dots(hlo: str) -> list[dict]:
  """One record per dot instruction of an HLO module's text."""
  types, dots = {}, []
  for line in hlo.splitlines():
    for name, shape in _PARAM.findall(line):
      types[name] = _shape(shape)
    m = _DOT.search(line)
    if not m:
      continue
    _, out, lhs, rhs, rest = m.groups()
    dims = {f"{side}_{kind}": tuple(int(d) for d in v.split(",") if d)
            for side, kind, v in _DIMS.findall(rest)}
    (lt, ls), (rt, rs) = types[lhs], types[rhs]
    contracted = math.prod(ls[d] for d in dims.get("lhs_contracting", ()))
    op = _OP.search(rest)
    dots.append({
        "operands": f"{lt} x {rt}", "lhs": ls, "rhs": rs, "out": _shape(out)[1],
        "flops": 2 * math.prod(_shape(out)[1]) * contracted,
        "transposed": (dims.get("lhs_contracting", (len(ls) - 1,))[-1] != len(ls) - 1
                       or dims.get("rhs_contracting", (0,))[0]
                       == len(rs) - 1 and len(rs) - len(dims.get("rhs_batch", ())) > 1),
        "small": min([contracted, *(_shape(out)[1][-2:] or (1,))]) < 64,
        "op": op.group(1).split("/")[-2] if op else "?"})
  return dots


def compiled_step_hlo(config) -> str:
  """The optimized HLO text of the jitted train step for `config` (nothing is run)."""
  import jax  # lazy: after tune_malloc, like every entry point
  from mot import sharding
  from mot import step as step_lib
  training = step_lib.build_training(config)
  dummy = step_lib.dummy_batch(training.model.cfg, config.data.seq_len)
  batch = {k: np.zeros((config.batch_size, *v.shape[1:]), v.dtype) for k, v in dummy.items()}
  with jax.set_mesh(training.mesh):
    lowered = training.p_train_step.lower(
        training.state, sharding.global_batch(training.mesh, batch, config.batch_size),
        training.step_rng)
    return lowered.compile().as_text()


def summarize(dots: list[dict]) -> dict:
  """Totals of `parse_dots` records (see the module docstring)."""
  by_operands = collections.Counter()
  for d in dots:
    by_operands[d["operands"]] += d["flops"]
  return {"flops": sum(d["flops"] for d in dots), "flops_by_operands": dict(by_operands),
          "transposed_flops": sum(d["flops"] for d in dots if d["transposed"]),
          "small_flops": sum(d["flops"] for d in dots if d["small"]), "dots": len(dots)}


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  with cli.clean_errors():
    dots = parse_dots(compiled_step_hlo(FLAGS.config))
  result = summarize(dots)
  total = max(result["flops"], 1)
  print(f"{result['dots']} dots, {result['flops'] / 1e9:.2f} GFLOP per step")
  for operands, flops in sorted(result["flops_by_operands"].items(), key=lambda kv: -kv[1]):
    print(f"  {operands:<14} {100 * flops / total:5.1f} % of the FLOPs")
  print(f"  transposed operand: {100 * result['transposed_flops'] / total:.1f} %; a side "
        f"< 64: {100 * result['small_flops'] / total:.1f} %")
  for d in sorted(dots, key=lambda d: -d["flops"])[:FLAGS.top]:
    print(f"  {100 * d['flops'] / total:5.1f} %  {d['operands']:<12} {d['lhs']} . {d['rhs']} "
          f"-> {d['out']}{'  T' if d['transposed'] else ''}  {d['op']}")
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  define_flags()
  cli.run(main)
