"""Training throughput of mot's own train step, against this machine's matmul peak.

  python -m bench.train_throughput --config configs/bench.py:peer
  python -m bench.train_throughput --config configs/bench.py:d512 --steps 30
  python -m bench.train_throughput --config configs/digits.py:tiny --steps 2 --warmup 1

It runs what train.py runs (`mot.train_lib`: `build_training`, the state born sharded and
the jitted step donating it; `process_train_dataset`, the grain pipeline), one loop
iteration per timed step: `next(data_iter)` (the input wait), the host-to-device batch,
the jitted step, blocked until done. It prints the figures, then one JSON line:

  tokens_per_s       mean real (segment_ids > 0) tokens per step / median step time.
  step_ms            median of --steps timed steps, after --warmup untimed ones (the first
                     of which compiles); step_ms_p10 / step_ms_p90 show the spread.
  input_wait_ms      median time spent in next(data_iter) (inside step_ms).
  flops_per_token    model FLOPs as in the PaLM paper (appendix B): 6 N + 12 L (H D) T, with
                     N the parameters a token passes through: every parameter but the token
                     embedding table (a lookup, no FLOPs), since every position goes through
                     the timestep MLP, the patch projection, all blocks and both heads; a
                     parameter with a logical "modality" or "*expert*" axis is selected per
                     token, so it counts 1/size of it. L layers, H x D = heads x head_dim.
                     T, the attended context, is the mean number of keys a real query may
                     attend to, from the timed batches' mask fields under `mot.masks`' rule,
                     on the host (CFG caption dropout, which hides a few keys, is ignored).
                     Remat recomputation is not counted: these are model FLOPs.
  flops_per_s        flops_per_token x tokens_per_s.
  peak_flops_per_s   the machine's limit measured in this process: median of --peak_reps
                     jitted `jnp.dot`s of two --peak_size^2 matrices (2 n^3 FLOPs), their
                     operands in the dtype of the model's matmul operands (peak_dtype:
                     model.matmul_dtype, else the compute dtype) and the products summed in
                     float32, before and after the steps; the larger median is the peak.
  mfu                flops_per_s / peak_flops_per_s.
  compile_s          trace + lowering + XLA compilation of the step (jax.monitoring events
                     of its first call), apart from step time; first_step_s includes its run.
  recompiles         XLA compilations during the timed steps (0 unless shapes or shardings
                     change between steps).
  cpu_ms_per_step    user and system CPU time of the process per timed step (getrusage):
                     user ~ 2 x step_ms when both cores compute; high system time means
                     page faults (minor_faults_per_step) from freshly mapped memory.
  malloc             what mot.cli.tune_malloc did: glibc-tuned, tcmalloc (LD_PRELOAD) or
                     default (MOT_MALLOC=default; docs/performance.md).
  peak_rss_mb        the process's peak resident memory (resource.getrusage).
  xla_memory_mb      the compiled step's `memory_analysis()` (arguments, outputs, aliased by
                     donation, temporaries).
  loadavg_start/end  os.getloadavg(): the machine may be shared; compare runs at like load.
  cpus               CPUs this process may run on (its affinity, e.g. under `taskset -c 0`
                     or `bench.peer_ratio --cpus 0`): XLA sizes its thread pool by them.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import time

from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/bench.py:peer; override fields with "
      "--config.FIELD=VALUE.", lock_config=True)
  flags.DEFINE_integer("steps", 30, "Timed steps (the median is reported; use >= 20).")
  flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first one compiles).")
  flags.DEFINE_integer("peak_size", 2048, "n of the n x n matmul (model.dtype) that measures "
                       "the peak.")
  flags.DEFINE_integer("peak_reps", 10, "Timed repetitions of the peak matmul (median).")


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


class CompileLog:
  """Records JAX's compile events (trace, lowering, XLA compilation) as they happen."""

  def __init__(self):
    import jax
    self.events: list[tuple[str, float, str]] = []
    jax.monitoring.register_event_duration_secs_listener(self._record)

  def _record(self, event: str, duration: float, **kwargs) -> None:
    if event in COMPILE_EVENTS:
      self.events.append((event, duration, str(kwargs.get("fun_name", ""))))

  def mark(self) -> int:
    return len(self.events)

  def seconds_since(self, mark: int) -> float:
    return sum(d for _, d, _ in self.events[mark:])

  def compiles_since(self, mark: int) -> list[str]:
    return [name for e, _, name in self.events[mark:] if e == COMPILE_EVENTS[-1]]


def usable_cpus() -> int:
  """CPUs the process may run on: its affinity where the OS has one (Linux), else all."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def matmul_peak(size: int, reps: int, dtype: str = "float32") -> float:
  """FLOP/s: median time of a jitted [size, size] @ [size, size] of `dtype` operands
  accumulated in float32 (2 size^3 FLOPs). `dtype` is the model's matmul operand dtype
  (`model.matmul_dtype`, else its compute dtype), so a run with bf16 operands is measured
  against the bf16 peak, which an AVX512-BF16 CPU reaches at about twice the f32 rate: on
  such a CPU a bf16 x bf16 -> f32 dot runs at that rate and a bf16 -> bf16 one does not."""
  import jax
  import jax.numpy as jnp
  kx, ky = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, (size, size), jnp.float32).astype(dtype)
  y = jax.random.normal(ky, (size, size), jnp.float32).astype(dtype)
  dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  dot(x, y).block_until_ready()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    dot(x, y).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2.0 * size ** 3 / statistics.median(times)


def active_params(boxed_params) -> tuple[float, int]:
  """(parameters a token passes through, token-embedding parameters) of a boxed tree.

  Leaves carry logical axis names (`nn.LogicallyPartitioned`); a "modality" or "*expert*"
  axis is selected per token, so such a leaf counts size / that axis's length.
  """
  import flax.linen as nn
  import jax
  import numpy as np
  passed, embedding = 0.0, 0
  leaves = jax.tree_util.tree_flatten_with_path(
      boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  for path, leaf in leaves:
    names = tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else ()
    value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
    size = int(np.prod(value.shape))
    if "token_embedding" in jax.tree_util.keystr(path):
      embedding += size
      continue
    for name, dim in zip(names, value.shape):
      if name is not None and (name == "modality" or "expert" in name):
        size /= dim
    passed += size
  return passed, embedding


def attended_context(batch, chunk: int = 1024) -> float:
  """Mean number of keys a real query may attend to, under the model's mask rule
  (`chunk` queries at a time, so a 16k-token row needs no [L, L] array)."""
  import jax
  import numpy as np
  from mot import masks
  ids = masks.MaskIds.from_fields(np.asarray(batch["segment_ids"]),
                                  np.asarray(batch["block_ids"]),
                                  np.asarray(batch["dm_mask"]) > 0)
  length = ids.segment.shape[1]
  counts = np.concatenate([np.asarray(masks.attention_mask(
      jax.tree.map(lambda a, s=start: a[:, s:s + chunk], ids), ids)[:, 0].sum(-1))
      for start in range(0, length, chunk)], axis=1)          # [B, Lq] keys per query
  real = np.asarray(batch["segment_ids"]) > 0
  return float(counts[real].mean())


def measure(config, steps: int = 30, warmup: int = 3, peak_size: int = 2048,
            peak_reps: int = 10) -> dict:
  """Runs the benchmark; returns the figures (see the module docstring)."""
  import flax.linen as nn
  import jax
  import numpy as np
  from mot import config as config_lib
  from mot import sharding, train_lib
  from mot import step as step_lib

  if steps < 1 or warmup < 1:
    raise config_lib.ConfigError("--steps and --warmup must be at least 1")
  compiles = CompileLog()
  loadavg_start = os.getloadavg()

  # ---- Mesh, model, state (born sharded), jitted step: as train_and_evaluate. ----
  t = step_lib.build_training(config)
  mesh, state, step_rng, p_step = t.mesh, t.state, t.step_rng, t.p_train_step
  with jax.set_mesh(mesh), nn.logical_axis_rules(t.rules):
    boxed = jax.eval_shape(step_lib.init_state_fn(t.model, t.tx, config.data.seq_len),
                           jax.random.PRNGKey(0))
  n_passed, n_embedding = active_params(boxed.params)
  n_total = sum(x.size for x in jax.tree.leaves(state.params))
  cfg = t.model.cfg
  del t   # the loop below donates (replaces) the state

  # ---- Input. ----
  data_iter = iter(train_lib.process_train_dataset(config, mesh))

  peak_dtype = str(cfg.matmul_operand_dtype)
  peak_before = matmul_peak(peak_size, peak_reps, peak_dtype)
  step_s, wait_s, real_tokens, mask_fields = [], [], [], []
  with jax.set_mesh(mesh):
    for i in range(warmup + steps):
      timed = i >= warmup
      if i in (0, warmup):  # compiles from the first step on, then from the first timed one
        mark = compiles.mark()
        usage_start = resource.getrusage(resource.RUSAGE_SELF)
      start = time.perf_counter()
      local = next(data_iter)
      got = time.perf_counter()
      batch = sharding.global_batch(mesh, local, config.batch_size)
      state, metrics = p_step(state, batch, step_rng)
      jax.block_until_ready((state, metrics))
      end = time.perf_counter()
      if i == 0:
        first_step_s, compile_s = end - start, compiles.seconds_since(mark)
        first_batch = batch
      if timed:
        step_s.append(end - start)
        wait_s.append(got - start)
        real_tokens.append(train_lib.global_tokens(local, config.batch_size))
        mask_fields.append({k: local[k] for k in ("segment_ids", "block_ids", "dm_mask")})
  usage = resource.getrusage(resource.RUSAGE_SELF)
  recompiled = compiles.compiles_since(mark)
  # After the timed steps: the mask rule runs as (compiling) eager JAX ops.
  context = float(np.mean([attended_context(fields) for fields in mask_fields]))
  loss = float(jax.device_get(metrics["loss"]))
  peak = max(peak_before, matmul_peak(peak_size, peak_reps, peak_dtype))

  # After the timed steps: jit's cache already holds the executable (no second compile),
  # if lowered under the steps' mesh: without it the activation constraints drop out and
  # XLA compiles (~4 s on the tiny config) and analyses a different program.
  with jax.set_mesh(mesh):
    xla = p_step.lower(state, first_batch, step_rng).compile().memory_analysis()
  mb = lambda b: round(b / 2 ** 20, 1)
  xla_memory = None if xla is None else {
      "argument": mb(xla.argument_size_in_bytes), "output": mb(xla.output_size_in_bytes),
      "alias": mb(xla.alias_size_in_bytes), "temp": mb(xla.temp_size_in_bytes)}

  flops_per_token = (6 * n_passed
                     + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context)
  step_median = statistics.median(step_s)
  tokens_per_step = float(np.mean(real_tokens))
  tokens_per_s = tokens_per_step / step_median
  flops_per_s = flops_per_token * tokens_per_s
  quantile = lambda q: float(np.quantile(step_s, q)) * 1e3
  return {
      "config": str(config.get("variant", "")),
      "backend": jax.default_backend(),
      "devices": jax.device_count(),
      "tokens_per_s": round(tokens_per_s, 1),
      "step_ms": round(step_median * 1e3, 2),
      "step_ms_p10": round(quantile(0.1), 2),
      "step_ms_p90": round(quantile(0.9), 2),
      "steps": steps,
      "input_wait_ms": round(statistics.median(wait_s) * 1e3, 3),
      "real_tokens_per_step": round(tokens_per_step, 1),
      "padding_fraction": round(1 - tokens_per_step / (config.batch_size
                                                       * config.data.seq_len), 4),
      "batch_rows": config.batch_size,
      "seq_len": config.data.seq_len,
      "params": int(n_total),
      "params_per_token": int(n_passed),
      "embedding_params": int(n_embedding),
      "attended_context": round(context, 2),
      "flops_per_token": round(flops_per_token),
      "flops_per_s": round(flops_per_s),
      "peak_flops_per_s": round(peak),
      "peak_dtype": peak_dtype,
      "mfu": round(flops_per_s / peak, 4),
      "compile_s": round(compile_s, 2),
      "first_step_s": round(first_step_s, 2),
      "recompiles": len(recompiled),
      "recompiled": sorted(set(recompiled)),
      "cpu_user_ms_per_step": round((usage.ru_utime - usage_start.ru_utime) * 1e3 / steps, 1),
      "cpu_sys_ms_per_step": round((usage.ru_stime - usage_start.ru_stime) * 1e3 / steps, 1),
      "minor_faults_per_step": round((usage.ru_minflt - usage_start.ru_minflt) / steps),
      "malloc": cli.malloc_mode(),
      "cpus": usable_cpus(),
      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
      "xla_memory_mb": xla_memory,
      "loss": round(loss, 4),
      "loadavg_start": [round(x, 2) for x in loadavg_start],
      "loadavg_end": [round(x, 2) for x in os.getloadavg()],
  }


def main(argv):
  from mot import cli
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  with cli.clean_errors():
    result = measure(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.peak_size,
                     FLAGS.peak_reps)
  print(f"{result['config'] or 'config'}: {result['tokens_per_s']:.0f} tokens/s, "
        f"step {result['step_ms']:.1f} ms (p10 {result['step_ms_p10']:.1f}, "
        f"p90 {result['step_ms_p90']:.1f}), input wait {result['input_wait_ms']:.2f} ms")
  print(f"  {result['flops_per_token'] / 1e6:.1f} MFLOP/token "
        f"({result['params_per_token'] / 1e6:.2f}M params/token, attended context "
        f"{result['attended_context']:.1f}) -> {result['flops_per_s'] / 1e9:.1f} GFLOP/s of "
        f"{result['peak_flops_per_s'] / 1e9:.1f} peak: MFU {100 * result['mfu']:.1f}%")
  print(f"  CPU per step: user {result['cpu_user_ms_per_step']:.0f} ms, system "
        f"{result['cpu_sys_ms_per_step']:.0f} ms, {result['minor_faults_per_step']} page faults "
        f"(malloc: {result['malloc']}, {result['cpus']} CPUs)")
  print(f"  compile {result['compile_s']:.1f}s, recompiles {result['recompiles']}, "
        f"peak RSS {result['peak_rss_mb']:.0f} MB, XLA {result['xla_memory_mb']}, "
        f"load {result['loadavg_start']} -> {result['loadavg_end']}")
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  define_flags()
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  cli.run(main)
