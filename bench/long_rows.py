"""Long packed rows: dense ("xla") against blockwise attention, peak memory and step time.

  python -m bench.long_rows                         # 1k, 4k and 16k tokens, both kernels
  python -m bench.long_rows --lengths 1024,4096 --steps 5
  python -m bench.long_rows --impl blockwise --seq_len 16384   # one case, in this process

Every case trains `configs/digits.py:tiny` on one packed row (`batch_size=1`) of
`seq_len` tokens holding 300 examples per 16,384 tokens, as `train.py` runs it
(`mot.train_lib.build_training`, the grain pipeline, `mot.cli.tune_malloc`), in a fresh
subprocess, so that its peak resident memory (getrusage's ru_maxrss: compilation
included) is its own. A case
first compiles the train step and reads XLA's memory analysis (arguments + outputs -
donated + temporaries); when that exceeds --max_gb it is reported as not fitting, with
the bytes it needs, and not run (the machine may be shared). Otherwise --warmup untimed
steps, then the median of --steps timed ones (input wait included).

The last line is one JSON object: {"cases": [...]} with, per case, impl, seq_len,
real_tokens, xla_gb, fits and, when run, step_s, tokens_per_s, peak_rss_gb and loss.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import flags


def define_flags() -> None:
  """The command line (defined when run, so tests may import this module beside other
  benchmarks that define flags of the same names)."""
  flags.DEFINE_string("impl", None, "Run one case in this process: 'xla' or 'blockwise'.")
  flags.DEFINE_integer("seq_len", 16384, "Tokens per row of the one case (with --impl).")
  flags.DEFINE_string("lengths", "1024,4096,16384", "Row lengths of the full comparison.")
  flags.DEFINE_string("impls", "xla,blockwise", "Attention kernels of the full comparison.")
  flags.DEFINE_integer("steps", 3, "Timed steps (the median is reported).")
  flags.DEFINE_integer("warmup", 1, "Untimed steps after the compilation.")
  flags.DEFINE_float("max_gb", 6.0, "Run a case only if XLA's memory analysis of its step "
                     "is below this many GB.")
  flags.DEFINE_integer("timeout_s", 1800, "Per-case subprocess time limit.")


FLAGS = flags.FLAGS
EXAMPLES_PER_16K = 300   # the row: 300 digit examples in 16,384 tokens
GB = 2 ** 30


def case_config(impl: str, seq_len: int):
  from configs import digits
  config = digits.get_config("tiny")
  config.data.seq_len = seq_len
  config.data.examples_per_row = max(1, round(EXAMPLES_PER_16K * seq_len / 16384))
  config.batch_size = 1
  config.model.attention_impl = impl
  return config


def run_case(impl: str, seq_len: int, steps: int, warmup: int, max_gb: float) -> dict:
  """Compiles (and, if it fits, times) one case in this process."""
  import jax
  from mot import sharding, train_lib
  config = case_config(impl, seq_len)
  t = train_lib.build_training(config)
  data = iter(train_lib.process_train_dataset(config, t.mesh))
  local = next(data)
  result = {"impl": impl, "seq_len": seq_len,
            "examples_per_row": config.data.examples_per_row,
            "real_tokens": int((local["segment_ids"] > 0).sum())}
  with jax.set_mesh(t.mesh):
    batch = sharding.global_batch(t.mesh, local, config.batch_size)
    start = time.perf_counter()
    step = t.p_train_step.lower(t.state, batch, t.step_rng).compile()
    result["compile_s"] = round(time.perf_counter() - start, 1)
    m = step.memory_analysis()
    need = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)
    result.update(xla_gb=round(need / GB, 3), xla_temp_gb=round(m.temp_size_in_bytes / GB, 3),
                  fits=need < max_gb * GB)
    if not result["fits"]:
      return result
    state, times = t.state, []
    for i in range(warmup + steps):
      begin = time.perf_counter()
      if i:
        batch = sharding.global_batch(t.mesh, next(data), config.batch_size)
      state, metrics = step(state, batch, t.step_rng)
      jax.block_until_ready((state, metrics))
      if i >= warmup:
        times.append(time.perf_counter() - begin)
  step_s = statistics.median(times)
  result.update(step_s=round(step_s, 3), tokens_per_s=round(result["real_tokens"] / step_s),
                loss=round(float(metrics["loss"]), 4),
                peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                  * 1024 / GB, 3))
  return result


def run_subprocess(impl: str, seq_len: int) -> dict:
  """One case in a fresh interpreter; its last stdout line is its JSON."""
  cmd = [sys.executable, "-m", "bench.long_rows", "--impl", impl, "--seq_len", str(seq_len),
         "--steps", str(FLAGS.steps), "--warmup", str(FLAGS.warmup),
         "--max_gb", str(FLAGS.max_gb)]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                          timeout=FLAGS.timeout_s)
  except subprocess.TimeoutExpired:
    return {"impl": impl, "seq_len": seq_len, "error": f"timed out after {FLAGS.timeout_s}s"}
  if proc.returncode:
    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"impl": impl, "seq_len": seq_len, "error": f"exit {proc.returncode}: {tail}"}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def table(cases: list[dict], max_gb: float) -> str:
  """Markdown table of the cases (`max_gb`: the bar a case that was not run missed)."""
  lines = ["| kernel | tokens/row (real) | XLA memory of the step | peak RSS | step time "
           "| tokens/s |", "|---|---|---|---|---|---|"]
  for c in cases:
    head = f"| {c['impl']} | {c['seq_len']:,} ({c.get('real_tokens', 0):,}) "
    if "error" in c:
      lines.append(head + f"| - | - | {c['error']} | - |")
    elif not c["fits"]:
      lines.append(head + f"| {c['xla_gb']:.2f} GB | does not fit (> {max_gb:g} GB): "
                   "not run | - | - |")
    else:
      lines.append(head + f"| {c['xla_gb']:.2f} GB | {c['peak_rss_gb']:.2f} GB "
                   f"| {c['step_s']:.2f} s | {c['tokens_per_s']:,} |")
  return "\n".join(lines)


def main(argv):
  del argv
  if FLAGS.impl is not None:
    print(json.dumps(run_case(FLAGS.impl, FLAGS.seq_len, FLAGS.steps, FLAGS.warmup,
                              FLAGS.max_gb)), flush=True)
    return
  cases = []
  for seq_len in (int(x) for x in FLAGS.lengths.split(",")):
    for impl in FLAGS.impls.split(","):
      cases.append(run_subprocess(impl, seq_len))
      print(json.dumps(cases[-1]), file=sys.stderr, flush=True)
  print(table(cases, FLAGS.max_gb))
  print(f"load average {os.getloadavg()[0]:.2f} at the end, {os.cpu_count()} CPUs")
  print(json.dumps({"cases": cases}), flush=True)


if __name__ == "__main__":
  define_flags()
  from mot import cli
  cli.tune_malloc()  # as train.py: measure the memory a training run uses (mot/cli.py)
  cli.run(main)
