"""mot's training throughput against the peer's, alternated in one command: the ratio.

  bash bench/peer_setup.sh                       # once: the peer's venv in /tmp/peer
  python -m bench.peer_ratio                     # 3 pairs, configs/bench.py:peer vs the peer
  python -m bench.peer_ratio --pairs 5 --steps 30
  python -m bench.peer_ratio --cpus 0            # both sides on one core: the per-core ratio
  python -m bench.peer_ratio --mot_args=--config.model.dtype=bfloat16 \
      --peer_python=python3 --peer_args="--device cuda --warmup 5"   # on a GPU machine

Why a command of its own: on a shared machine a run's figure moves by tens of per cent
from one minute to the next, and mot's compiled, matmul-bound step moves with the load
far more than the peer's eager one. A ratio of two runs made at different times says
little; a ratio of adjacent runs, repeated, says how far apart the two really are. Each
pair runs `python -m bench.train_throughput` and the peer's `bench/peer_transfusion.py`
(in its own interpreter, --peer_python) as subprocesses, one after the other; the order
flips every pair (mot first, then the peer first, ...), so a machine that slows down or
speeds up through the command does not favour either side.

Per pair it prints both figures and their ratios; then one JSON line:

  tokens_per_s_ratio   median over pairs of mot tokens/s / peer tokens/s (the issue's
                       measure), with its min and max and every pair's value.
  tokens_per_s_ratio_p10   the same from each run's fastest tenth of steps (tokens per
                       step / step_ms_p10): what each side reaches when the machine lets it,
                       less sensitive to a busy minute than the medians.
  step_ratio           median over pairs of peer step_ms / mot step_ms: both do 16
                       examples a step in the `peer` setting, so this is the ratio of
                       examples per second. Our examples are 40-41 real tokens, the
                       peer's are counted as 48 (32 text + 16 image), so the tokens/s ratio
                       is the lower, more conservative one of the two.
  mot, peer            per pair: tokens_per_s, step_ms, step_ms_p10 (and mot's mfu,
                       peak_flops_per_s, cpus; the peer's threads).
  cpu, loadavg_start/end   which machine, and how busy it was.
  cpus                 the CPUs both sides were pinned to (--cpus), or "all".

`--cpus 0` runs both sides on one core: the per-core ratio. Beside the all-core ratio it
says whether a gap comes from how each side scales over cores or from its per-core speed.

The figures depend on the machine (docs/performance.md); no test asserts them.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

from absl import flags

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_HINT = "run `bash bench/peer_setup.sh` (it creates /tmp/peer) or pass --peer_python"


def define_flags() -> None:
  flags.DEFINE_integer("pairs", 3, "Alternated (mot, peer) pairs; the ratio is their median.")
  flags.DEFINE_integer("steps", 20, "Timed steps of each run (each reports its median).")
  flags.DEFINE_string("mot_config", "configs/bench.py:peer", "mot's config: the --config "
                      "of bench.train_throughput (overrides go in --mot_args).")
  flags.DEFINE_string("mot_args", "", "More arguments for bench.train_throughput, e.g. "
                      "'--config.model.dtype=bfloat16 --warmup 5'.")
  flags.DEFINE_string("peer_python", "/tmp/peer/bin/python", "Interpreter with torch and "
                      "transfusion-pytorch (bash bench/peer_setup.sh).")
  flags.DEFINE_string("peer_script", "bench/peer_transfusion.py", "The peer's benchmark "
                      "script (relative paths: from the repository root).")
  flags.DEFINE_string("peer_args", "", "More arguments for the peer's script, e.g. "
                      "'--device cuda'.")
  flags.DEFINE_string("cpus", "", "Run both sides on these CPUs only (their affinity, "
                      "as `taskset -c`): e.g. '0' for one core, '0-3' or '0,2'. Empty: all.")
  flags.DEFINE_integer("timeout", 1800, "Seconds allowed for each run.")


class BenchError(Exception):
  """A run that failed or printed no result: one line, for cli.fail."""


def last_json_line(stdout: str) -> dict | None:
  """The last stdout line that parses as a JSON object (both benches end with one)."""
  for line in reversed(stdout.strip().splitlines()):
    try:
      value = json.loads(line)
    except ValueError:
      continue
    if isinstance(value, dict):
      return value
  return None


def run_one(name: str, command: list[str], timeout: int) -> dict:
  """Runs one benchmark subprocess; its result dict, or BenchError naming what went wrong."""
  try:
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
  except FileNotFoundError:
    raise BenchError(f"{name}: {command[0]} does not exist; "
                     + (SETUP_HINT if name == "peer" else "is mot installed?")) from None
  except subprocess.TimeoutExpired:
    raise BenchError(f"{name} ran longer than --timeout={timeout} s: lower --steps or "
                     "raise --timeout") from None
  result = last_json_line(proc.stdout)
  if proc.returncode != 0 or result is None or "tokens_per_s" not in result:
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
    hint = (f"; {SETUP_HINT}" if name == "peer" and "No module named" in proc.stderr else "")
    raise BenchError(f"{name} failed (exit {proc.returncode}): {tail}{hint}")
  return result


def split_args(flag: str) -> list[str]:
  try:
    return shlex.split(getattr(FLAGS, flag))
  except ValueError as e:
    raise BenchError(f"--{flag}={getattr(FLAGS, flag)!r} is not a shell-quoted argument "
                     f"list ({e}): check its quotes") from None


def commands() -> dict[str, list[str]]:
  steps = ["--steps", str(FLAGS.steps)]
  return {
      "mot": [sys.executable, "-m", "bench.train_throughput", "--config", FLAGS.mot_config,
              *steps, *split_args("mot_args")],
      "peer": [FLAGS.peer_python, FLAGS.peer_script, *steps, *split_args("peer_args")],
  }


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def summarise(pairs: list[dict]) -> dict:
  """The JSON result from the pairs' (mot, peer) result dicts."""
  token_ratios = [p["mot"]["tokens_per_s"] / p["peer"]["tokens_per_s"] for p in pairs]
  step_ratios = [p["peer"]["step_ms"] / p["mot"]["step_ms"] for p in pairs]
  # Tokens/s of each run's fastest tenth of steps: tokens per step / step_ms_p10.
  fast = lambda r: r["tokens_per_s"] * r["step_ms"] / r["step_ms_p10"]
  fast_ratios = [fast(p["mot"]) / fast(p["peer"]) for p in pairs]
  keep = {"mot": ("tokens_per_s", "step_ms", "step_ms_p10", "mfu", "peak_flops_per_s", "cpus"),
          "peer": ("tokens_per_s", "step_ms", "step_ms_p10", "threads")}
  return {
      "bench": "peer_ratio", "pairs": len(pairs), "steps": FLAGS.steps,
      "mot_config": FLAGS.mot_config, "mot_args": FLAGS.mot_args, "peer_args": FLAGS.peer_args,
      "tokens_per_s_ratio": round(statistics.median(token_ratios), 3),
      "tokens_per_s_ratio_min": round(min(token_ratios), 3),
      "tokens_per_s_ratio_max": round(max(token_ratios), 3),
      "tokens_per_s_ratios": [round(r, 3) for r in token_ratios],
      "tokens_per_s_ratio_p10": round(statistics.median(fast_ratios), 3),
      "step_ratio": round(statistics.median(step_ratios), 3),
      "step_ratios": [round(r, 3) for r in step_ratios],
      "order": [p["order"] for p in pairs],
      **{side: [{k: p[side].get(k) for k in keys} for p in pairs]
         for side, keys in keep.items()},
      "cpu": cpu_name(),
  }


def parse_cpus(spec: str) -> set[int]:
  """'0' / '0,2' / '0-3' (taskset -c's list syntax) -> {0} / {0, 2} / {0, 1, 2, 3}."""
  cpus = set()
  try:
    for part in spec.split(","):
      first, _, last = part.strip().partition("-")
      cpus.update(range(int(first), int(last or first) + 1))
  except ValueError:
    raise BenchError(f"--cpus={spec!r} is not a CPU list: write e.g. 0 or 0,2 or 0-3") from None
  if not cpus:
    raise BenchError(f"--cpus={spec!r} names no CPU: write e.g. 0 or 0-3")
  return cpus


def pin_to_cpus(spec: str) -> list[int]:
  """Pins this process, and so both benchmark subprocesses it starts, to the CPUs in spec.

  Why: how a step scales from one core to all is a property of each side that the ratio on
  all cores mixes in; `--cpus 0` measures the per-core ratio, free of it. The subprocesses
  inherit the affinity; XLA and torch both size their thread pools by it."""
  cpus = parse_cpus(spec)
  if not hasattr(os, "sched_setaffinity"):
    raise BenchError("--cpus needs an OS with CPU affinity (Linux); leave it empty here")
  try:
    os.sched_setaffinity(0, cpus)
  except (OSError, ValueError) as e:
    raise BenchError(f"--cpus={spec!r}: cannot run on CPUs {sorted(cpus)} ({e}); this "
                     f"process may use {sorted(os.sched_getaffinity(0))}") from None
  return sorted(os.sched_getaffinity(0))


def measure() -> dict:
  if FLAGS.pairs < 1 or FLAGS.steps < 1:
    raise BenchError("--pairs and --steps must be at least 1")
  cpus = pin_to_cpus(FLAGS.cpus) if FLAGS.cpus else None
  if os.sep in FLAGS.peer_python and not os.path.exists(FLAGS.peer_python):
    raise BenchError(f"the peer's interpreter {FLAGS.peer_python} does not exist; "
                     + SETUP_HINT)
  loadavg_start = os.getloadavg()
  cmds, pairs = commands(), []
  for i in range(FLAGS.pairs):
    order = ("mot", "peer") if i % 2 == 0 else ("peer", "mot")
    pair = {"order": "-".join(order)}
    for name in order:
      pair[name] = run_one(name, cmds[name], FLAGS.timeout)
    mot, peer = pair["mot"], pair["peer"]
    print(f"pair {i + 1} ({pair['order']}): mot {mot['tokens_per_s']:,.0f} tokens/s "
          f"(step {mot['step_ms']:.1f} ms), peer {peer['tokens_per_s']:,.0f} tokens/s "
          f"(step {peer['step_ms']:.1f} ms): {mot['tokens_per_s'] / peer['tokens_per_s']:.2f}x "
          f"tokens/s, {peer['step_ms'] / mot['step_ms']:.2f}x steps", flush=True)
    pairs.append(pair)
  result = summarise(pairs)
  result["cpus"] = cpus if cpus is not None else "all"
  result["loadavg_start"] = [round(x, 2) for x in loadavg_start]
  result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
  return result


def main(argv):
  from mot import cli  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  try:
    result = measure()
  except BenchError as e:
    cli.fail(str(e))
  print(f"mot / peer: {result['tokens_per_s_ratio']:.2f}x tokens/s (median of "
        f"{result['pairs']} pairs; {result['tokens_per_s_ratio_min']:.2f}-"
        f"{result['tokens_per_s_ratio_max']:.2f}x), {result['step_ratio']:.2f}x steps/s, "
        f"on {result['cpu']} (CPUs: {result['cpus']})")
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  from mot import cli
  define_flags()
  cli.run(main)
