"""Where a train step's time goes: a jax.profiler trace of it, ops grouped by kind.

  python -m bench.profile_step --config configs/bench.py:peer
  python -m bench.profile_step --config configs/digits.py --steps 3 --top 15

Builds the state and the jitted step as train.py does (`step_lib.build_training`), runs
`--warmup` steps (compiles), traces `--steps` more with `jax.profiler`, then reads the
trace back in this process
(`jax.profiler.ProfileData`, no TensorBoard needed). XLA's worker threads (the lines whose
name starts with "tf_XLA" and not "tf_XLAPjRt") run the compiled program's ops; their time
per step is summed by op kind: the op's name without its numeric suffix
("ynn_fusion.14" -> "ynn_fusion": XLA:CPU's YNNPACK matmul fusions; "copy_bitcast_fusion":
transposed copies; ...). Beside each kind's time it gives its time "alone": while no other
worker thread ran any *traced* op. That is an upper bound on the step's serial part, not a
measure of it: an op that splits itself over the pool (a YNNPACK matmul does) runs its
helper tasks on the other threads without trace events, so those threads look idle while
they work (a lone jitted 1364x656 @ 656x256 dot shows on one thread in a trace, yet runs
1.7x faster on two cores than under `taskset -c 0`). To measure how a step scales over
cores, time it pinned: `taskset -c 0 python -m bench.train_throughput ...`, or both sides
of the peer comparison with `python -m bench.peer_ratio --cpus 0`; under `taskset -c 0`
this bench's table is exact, every op running on the one traced thread.

Prints a short table, then one JSON line: wall ms per step, XLA thread ms per step, the
busy fraction (thread time / (threads x wall)), the alone ms per step, and the `--top` op
kinds with their ms per step, share of the thread time and alone ms. The trace directory
is kept (`--trace_dir`) for TensorBoard / Perfetto.
"""
import bisect
import collections
import json
import os
import re
import tempfile
import time

import jax
from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Only when run as a script: importing op_kind and friends (tests) next to the other
  benchmarks, which define --config too, must not define flags twice."""
  config_flags.DEFINE_config_file("config", "configs/bench.py:peer", "Config file (and "
                                  "overrides).", lock_config=True)
  flags.DEFINE_integer("steps", 3, "Traced steps (after the warm-up).")
  flags.DEFINE_integer("warmup", 2, "Untraced steps first (the first one compiles).")
  flags.DEFINE_integer("top", 12, "Op kinds listed, largest first.")
  flags.DEFINE_string("trace_dir", None, "Where the trace goes (default: a new temp dir).")


def op_kind(name: str) -> str:
  """'ynn_fusion.14' -> 'ynn_fusion'; 'while.124' -> 'while'."""
  return re.sub(r"\.\d+$", "", name)


def is_xla_worker(line_name: str) -> bool:
  """XLA:CPU's worker threads (the ones that run ops), not the client's waiting thread."""
  return line_name.startswith("tf_XLA") and not line_name.startswith("tf_XLAPjRt")


# Events on the worker threads that wrap others (a whole program run, a wait, a loop such
# as nn.scan's, whose body's ops are events of their own): counting them would count the
# ops inside twice.
WRAPPERS = ("ThunkExecutor::Execute", "SlinkyThreadPool::Await")
CONTROL_FLOW = ("while", "conditional", "call")


Interval = tuple[int, int, str]   # (start ns, end ns, op kind) of one op on one thread


def worker_ops(xplane_path: str) -> dict[tuple[str, str], list[Interval]]:
  """The ops each of XLA's worker threads ran, by (plane, thread), sorted by start."""
  profile = jax.profiler.ProfileData.from_file(xplane_path)
  ops = collections.defaultdict(list)
  for plane in profile.planes:
    for line in plane.lines:
      if not is_xla_worker(line.name):
        continue
      for event in line.events:
        if event.name.startswith(WRAPPERS) or op_kind(event.name) in CONTROL_FLOW:
          continue
        ops[(plane.name, line.name)].append(
            (event.start_ns, event.start_ns + event.duration_ns, op_kind(event.name)))
  return {thread: sorted(events) for thread, events in ops.items()}


def op_times(ops: dict[object, list[Interval]]) -> dict[str, float]:
  """Total ns per op kind over all threads."""
  totals = collections.Counter()
  for events in ops.values():
    for start, end, kind in events:
      totals[kind] += end - start
  return dict(totals)


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
  merged = []
  for start, end in sorted(intervals):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], end))
    else:
      merged.append((start, end))
  return merged


def alone_times(ops: dict[object, list[Interval]]) -> dict[str, float]:
  """ns per op kind during which no other thread ran any traced op. An upper bound on the
  step's serial part (untraced helper tasks of a pool-splitting op, e.g. a YNNPACK
  matmul's, make a working thread look idle; see the module docstring). With one thread
  every op runs alone."""
  alone = collections.Counter()
  for thread, events in ops.items():
    others = _union([(s, e) for other, evs in ops.items() if other != thread
                     for s, e, _ in evs])
    starts = [s for s, _ in others]
    for start, end, kind in events:
      busy = 0
      i = max(bisect.bisect_right(starts, start) - 1, 0)
      while i < len(others) and others[i][0] < end:
        busy += max(0, min(end, others[i][1]) - max(start, others[i][0]))
        i += 1
      alone[kind] += (end - start) - busy
  return dict(alone)


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  with cli.clean_errors():
    profile_step()


def profile_step() -> None:
  """Traces FLAGS.steps train steps and prints the op-kind table and the JSON line."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from mot import config as config_lib, sharding, train_lib  # pylint: disable=g-import-not-at-top
  from mot import step as step_lib
  config = FLAGS.config
  if FLAGS.steps < 1 or FLAGS.warmup < 1:
    raise config_lib.ConfigError("--steps and --warmup must be at least 1")
  t = step_lib.build_training(config)
  data = iter(train_lib.process_train_dataset(config, t.mesh))
  batches = [sharding.global_batch(t.mesh, next(data), config.batch_size)
             for _ in range(FLAGS.warmup + FLAGS.steps)]   # input work stays out of the trace
  trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="mot_profile_")
  state = t.state
  with jax.set_mesh(t.mesh), nn.logical_axis_rules(t.rules):
    for batch in batches[:FLAGS.warmup]:
      state, _ = t.p_train_step(state, batch, t.step_rng)
    jax.block_until_ready(state)
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    for batch in batches[FLAGS.warmup:]:
      state, _ = t.p_train_step(state, batch, t.step_rng)
      jax.block_until_ready(state)
    wall_s = time.perf_counter() - start
    jax.profiler.stop_trace()
  paths = sorted(os.path.join(d, f) for d, _, files in os.walk(trace_dir)
                 for f in files if f.endswith(".xplane.pb"))
  if not paths:
    cli.fail(f"jax.profiler wrote no .xplane.pb under {trace_dir}: is the profiler "
             "plugin of this jaxlib working? (see jax.profiler's docs)")
  ops = worker_ops(paths[-1])
  threads = len(ops)
  per_step = {k: v / 1e6 / FLAGS.steps for k, v in op_times(ops).items()}
  alone = {k: v / 1e6 / FLAGS.steps for k, v in alone_times(ops).items()}
  thread_ms = sum(per_step.values())
  alone_ms = sum(alone.values())
  wall_ms = 1e3 * wall_s / FLAGS.steps
  top = sorted(per_step.items(), key=lambda kv: -kv[1])[:FLAGS.top]
  print("  ms/step  share  alone  op kind   "
        "(alone: ms/step no other thread ran a traced op; an upper bound)")
  for kind, ms in top:
    print(f"{ms:9.1f} {100 * ms / max(thread_ms, 1e-9):5.1f} % {alone[kind]:6.1f}  {kind}")
  print(json.dumps({
      "bench": "profile_step", "config": config.variant, "backend": jax.default_backend(),
      "steps": FLAGS.steps, "wall_ms_per_step": round(wall_ms, 2),
      "xla_thread_ms_per_step": round(thread_ms, 2), "xla_threads": threads,
      "busy_fraction": round(thread_ms / max(threads * wall_ms, 1e-9), 3),
      "alone_ms_per_step": round(alone_ms, 2),
      "top_ops": [{"op": k, "ms_per_step": round(ms, 2),
                   "share": round(ms / max(thread_ms, 1e-9), 3),
                   "alone_ms_per_step": round(alone[k], 2)} for k, ms in top],
      "trace_dir": trace_dir, "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  define_flags()
  cli.run(main)
