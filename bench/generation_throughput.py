"""Images per second of `Pipeline.generate` (cached prompt, CFG rows in one batch).

  python -m bench.generation_throughput                        # digits model, random weights
  python -m bench.generation_throughput --workdir runs/digits  # a trained checkpoint
  python -m bench.generation_throughput --steps 16,32 --samples_per_prompt 20 --cfg_scale 2

Generates --samples_per_prompt images for each of the ten prompts "a handwritten digit k"
(the evaluation's request) at each --steps, with guidance (--cfg_scale != 1 runs the
conditional and unconditional rows together: twice the rows of a plain step). For each:
  images_per_s   images / fastest wall time of --reps calls (after one untimed call that
                 compiles), end to end: prompt building, prefill, the ODE loop, unpatchify;
                 the fastest, since on a shared machine contention only adds time.
  ms_per_step    the same time / steps (one guided model call over the block's tokens).
Prints a table, then one JSON line. The machine may be shared: loadavg is reported.
"""
from __future__ import annotations

import json
import os
import time

from absl import app, flags

import bench

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Flags only when run as a program (tests import this module beside other benches)."""
  flags.DEFINE_string("workdir", None, "Checkpoint workdir (default: random weights of --config).")
  flags.DEFINE_string("config", "", "Variant of configs/digits.py for random weights ('' or tiny).")
  flags.DEFINE_list("steps", ["16", "32"], "Denoising steps to measure.")
  flags.DEFINE_integer("samples_per_prompt", 20, "Images per digit prompt (10 prompts).")
  flags.DEFINE_float("cfg_scale", 2.0, "Guidance scale (!= 1: conditional + unconditional rows).")
  flags.DEFINE_enum("sampler", "euler", ["euler", "heun"], "ODE sampler (heun: 2 calls a step).")
  flags.DEFINE_integer("reps", 3, "Timed repetitions per figure (the fastest is reported).")


def main(argv):
  del argv
  import jax

  pipe = bench.load_pipeline(FLAGS.workdir, FLAGS.config)
  prompts = [f"a handwritten digit {k}" for k in range(10)]
  count = len(prompts) * FLAGS.samples_per_prompt
  load_start = os.getloadavg()[0]
  rows = []
  for steps in (int(s) for s in FLAGS.steps):
    def run():
      return pipe.generate(prompts, FLAGS.samples_per_prompt, steps, FLAGS.cfg_scale,
                           FLAGS.sampler, seed=0)
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    times = []
    for _ in range(FLAGS.reps):
      start = time.perf_counter()
      run()
      times.append(time.perf_counter() - start)
    best = min(times)
    rows.append({"steps": steps, "images": count, "images_per_s": count / best,
                 "seconds": best, "ms_per_step": 1e3 * best / steps,
                 "first_call_s": first})
    print(f"{steps:3d} steps, {count} images, cfg {FLAGS.cfg_scale}: "
          f"{count / best:8.1f} images/s ({best:.2f} s, {1e3 * best / steps:.1f} "
          f"ms/step; first call with compile {first:.1f} s)", flush=True)
  result = {"benchmark": "generation_throughput", "sampler": FLAGS.sampler,
            "cfg_scale": FLAGS.cfg_scale, "device": str(jax.devices()[0].platform),
            "model": {k: getattr(pipe.model_cfg, k) for k in ("d_model", "num_layers",
                                                              "num_heads", "head_dim")},
            "rows": rows, "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0]}
  print(json.dumps(result))


if __name__ == "__main__":
  define_flags()
  from mot import cli
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  app.run(main)
