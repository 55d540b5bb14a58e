"""Settings x seeds of `train.py`, run side by side; one table of their evaluations.

  python -m bench.seed_sweep --workdir runs/sweep --seeds 0,1,2,3 \
      --setting default= --setting "smooth=--config.ar_label_smoothing=0.1"
  # choose on a validation split (the last 297 training digits), never the held-out 297:
  python -m bench.seed_sweep --workdir runs/tune --args=--config.data.validation_size=297 ...
  # on a GPU: several runs share it (each allocates on demand)
  python -m bench.seed_sweep --workdir runs/sweep --parallel 8 ...

Why: one run's held-out reading moves by 1-1.5 points with the seed alone
(docs/results.md), as much as most settings do. A setting is only better if it is better across
seeds, and a choice made on the held-out digits flatters the chosen one, so this command
runs every (setting, seed) pair of `python train.py --config CONFIG --workdir
DIR/NAME/seed_S --config.seed=S ARGS SETTING_ARGS` (up to --parallel at a time), reads
each run's eval.json, and prints per setting the mean, range and per-seed figures of the
issue's three targets and how many seeds meet all three, with the digits every seed
misread. `--args=--config.data.validation_size=N` makes every run train without the last
N training digits and measure on them (mot.evaluate), so settings can be picked there and
only the pick run on the held-out digits.

A finished run leaves DIR/NAME/seed_S/sweep_run.json and is not run again: an interrupted
sweep resumes where it stopped (an unfinished run resumes from its own checkpoint, as
train.py does). Writes DIR/sweep.json and ends with one JSON line. A failing run is
reported with its log and the sweep goes on; the command then exits 1.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

from absl import flags

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_FILE = "sweep_run.json"
SUMMARY_FILE = "sweep.json"
TARGETS = {"reasoning_accuracy": 0.98, "generation_accuracy": 0.98, "frechet_ratio": 1.2}


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Sweep directory: one run per DIR/NAME/seed_S.")
  flags.DEFINE_string("sweep_config", "configs/digits.py", "The --config of every run.")
  flags.DEFINE_multi_string("setting", ["default="], "NAME=ARGS: a setting and its train.py "
                            "overrides (shell-quoted), e.g. 'lr3=--config.learning_rate=3e-3'"
                            "; repeat for more. 'default=' runs the config as it is.")
  flags.DEFINE_string("seeds", "0,1,2,3", "Comma-separated config.seed values.")
  flags.DEFINE_string("args", "", "Overrides for every run, before each setting's own.")
  flags.DEFINE_integer("parallel", 1, "Runs at a time (a CPU's cores are shared by them).")
  flags.DEFINE_integer("timeout", 7200, "Seconds allowed for each run.")
  flags.DEFINE_string("train_script", "train.py", "The training entry point (relative "
                      "paths: from the repository root; tests pass a stand-in).")
  flags.mark_flag_as_required("workdir")


class SweepError(Exception):
  """Bad flags: one line, for cli.fail."""


class _Children:
  """The running train.py processes, so that SIGTERM / SIGINT reaches them too: each one
  saves a checkpoint and stops (train.py's own handling), and a rerun resumes it."""

  def __init__(self):
    self.lock, self.procs, self.stopped = threading.RLock(), set(), None
    self.signalled = set()

  def start(self, command, **kwargs) -> subprocess.Popen | None:
    with self.lock:
      if self.stopped:
        return None
      proc = subprocess.Popen(command, **kwargs)  # pylint: disable=consider-using-with
      self.procs.add(proc)
      return proc

  def done(self, proc: subprocess.Popen) -> None:
    with self.lock:
      self.procs.discard(proc)

  def stop(self, signum, frame) -> None:
    """The signal handler. `timeout` signals its whole process group, so a second signal
    can arrive while the first is handled, in the same (main) thread: return at once."""
    del frame
    if self.stopped:
      return
    self.stopped = signal.Signals(signum).name
    with self.lock:
      for proc in self.procs:
        proc.send_signal(signal.SIGTERM)
        self.signalled.add(proc)


CHILDREN = _Children()


def parse_settings(specs: list[str]) -> dict[str, list[str]]:
  """{'name': [train.py args]} from NAME=ARGS strings."""
  settings = {}
  for spec in specs:
    name, sep, args = spec.partition("=")
    name = name.strip()
    if not sep or not name or not all(ch.isalnum() or ch in "._-" for ch in name):
      raise SweepError(f"--setting={spec!r} must be NAME=ARGS with NAME of letters, digits, "
                       "'.', '_' or '-' (e.g. 'lr3=--config.learning_rate=3e-3', 'default=')")
    if name in settings:
      raise SweepError(f"--setting name {name!r} is given twice: names must differ")
    settings[name] = split_args(args, f"--setting={spec!r}")
  return settings


def split_args(text: str, where: str) -> list[str]:
  try:
    return shlex.split(text)
  except ValueError as e:
    raise SweepError(f"{where} is not a shell-quoted argument list ({e}): check its "
                     "quotes") from None


def parse_seeds(text: str) -> list[int]:
  try:
    seeds = [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    seeds = []
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise SweepError(f"--seeds={text!r} must be distinct non-negative integers, "
                     "comma-separated (e.g. 0,1,2,3)")
  return seeds


def run_dir(name: str, seed: int) -> str:
  return os.path.join(FLAGS.workdir, name, f"seed_{seed}")


def train_command(workdir: str, seed: int, args: list[str]) -> list[str]:
  return [sys.executable, FLAGS.train_script, "--config", FLAGS.sweep_config, "--workdir",
          workdir, f"--config.seed={seed}", *split_args(FLAGS.args, "--args"), *args]


def run_one(name: str, seed: int, args: list[str]) -> dict:
  """Trains and evaluates one (setting, seed) unless it already finished; its record."""
  workdir = run_dir(name, seed)
  done = os.path.join(workdir, RUN_FILE)
  if os.path.exists(done):
    try:
      with open(done) as f:
        return {**json.load(f), "reused": True}
    except ValueError:
      pass  # a damaged record: run again (train.py resumes from the checkpoint)
  os.makedirs(workdir, exist_ok=True)
  command = train_command(workdir, seed, args)
  env = dict(os.environ)
  if FLAGS.parallel > 1:  # JAX on a GPU takes 75 % of its memory per process by default
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  start = time.perf_counter()
  record = {"setting": name, "seed": seed, "command": shlex.join(command[1:])}
  log_path = os.path.join(workdir, "train.log")
  with open(log_path, "w") as log:
    proc = CHILDREN.start(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    if proc is None:
      return {**record, "error": f"not started: the sweep got {CHILDREN.stopped}"}
    try:
      rc = proc.wait(timeout=FLAGS.timeout)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGTERM)  # train.py saves a checkpoint and stops
      rc = "timeout"
      try:
        proc.wait(timeout=120)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
      CHILDREN.done(proc)
  record["wall_s"] = round(time.perf_counter() - start, 1)
  latest = _latest_eval(workdir)
  why = (f"ran longer than --timeout={FLAGS.timeout} s" if rc == "timeout" else
         f"stopped by {CHILDREN.stopped}" if proc in CHILDREN.signalled else
         f"exit {rc}" if rc != 0 else
         "no eval.json (set config.eval_samples_per_digit > 0)" if latest is None else None)
  if why:
    return {**record, "error": f"{why}: {_last_line(log_path)} (log: {log_path})"}
  record.update(_figures(latest))
  with open(done + ".tmp", "w") as f:
    json.dump(record, f, indent=1)
  os.replace(done + ".tmp", done)
  return record


def _latest_eval(workdir: str) -> dict | None:
  try:
    with open(os.path.join(workdir, "eval.json")) as f:
      return json.load(f)["latest"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _last_line(path: str) -> str:
  with open(path, errors="replace") as f:
    lines = [l.strip() for l in f.read().splitlines() if l.strip()]
  return (lines or ["(no output)"])[-1][:300]


def _figures(latest: dict) -> dict:
  keys = ("step", "split", "reasoning_accuracy", "reasoning_accuracy_single_view",
          "generation_accuracy", "frechet_ratio", "frechet", "frechet_floor")
  out = {k: latest.get(k) for k in keys}
  out["reasoning_misread"] = [m["index"] for m in latest.get("reasoning_misread", [])]
  out["meets_targets"] = meets_targets(out)
  return out


def meets_targets(r: dict) -> bool:
  """The issue's three targets, from one run's figures."""
  return (r["reasoning_accuracy"] >= TARGETS["reasoning_accuracy"]
          and r["generation_accuracy"] >= TARGETS["generation_accuracy"]
          and r["frechet_ratio"] <= TARGETS["frechet_ratio"])


def summarise(records: list[dict]) -> dict:
  """Per setting: mean / min / max / per-seed of each figure; seeds meeting the targets."""
  by_setting = {}
  for r in records:
    by_setting.setdefault(r["setting"], []).append(r)
  out = {}
  for name, runs in by_setting.items():
    good = sorted((r for r in runs if "error" not in r), key=lambda r: r["seed"])
    entry = {"runs": len(runs), "failed": len(runs) - len(good),
             "seeds": [r["seed"] for r in good]}
    if good:
      entry["split"] = good[0]["split"]
      for key in ("reasoning_accuracy", "reasoning_accuracy_single_view",
                  "generation_accuracy", "frechet_ratio"):
        values = [r[key] for r in good]
        entry[key] = {"mean": statistics.fmean(values), "min": min(values),
                      "max": max(values), "per_seed": values}
      entry["meets_targets"] = sum(r["meets_targets"] for r in good)
      entry["misread_by_every_seed"] = sorted(
          set.intersection(*(set(r["reasoning_misread"]) for r in good)))
    out[name] = entry
  return out


def format_row(name: str, e: dict) -> str:
  if "reasoning_accuracy" not in e:
    return f"{name}: every run failed"
  ra, sv = e["reasoning_accuracy"], e["reasoning_accuracy_single_view"]
  ga, fr = e["generation_accuracy"], e["frechet_ratio"]
  seeds = " ".join(f"{100 * v:.1f}" for v in ra["per_seed"])
  return (f"{name} [{e['split']}; seeds {','.join(map(str, e['seeds']))}]: reasoning "
          f"{100 * ra['mean']:.2f} % (min {100 * ra['min']:.1f}, max {100 * ra['max']:.1f}; "
          f"{seeds}) | single view {100 * sv['mean']:.1f} % | generation "
          f"{100 * ga['mean']:.1f} % | Fréchet {fr['mean']:.2f}x | all three targets met by "
          f"{e['meets_targets']} of {len(e['seeds'])}")


def sweep() -> dict:
  settings, seeds = parse_settings(FLAGS.setting), parse_seeds(FLAGS.seeds)
  split_args(FLAGS.args, "--args")
  if FLAGS.parallel < 1:
    raise SweepError(f"--parallel={FLAGS.parallel} must be at least 1")
  jobs = [(name, seed) for seed in seeds for name in settings]  # seed-major: early rows
  records = []                                                 # cover every setting
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, CHILDREN.stop)
  with concurrent.futures.ThreadPoolExecutor(FLAGS.parallel) as pool:
    futures = {pool.submit(run_one, n, s, settings[n]): (n, s) for n, s in jobs}
    for future in concurrent.futures.as_completed(futures):
      r = future.result()
      records.append(r)
      what = (f"error: {r['error']}" if "error" in r else
              f"reasoning {100 * r['reasoning_accuracy']:.1f} % (single view "
              f"{100 * r['reasoning_accuracy_single_view']:.1f} %), generation "
              f"{100 * r['generation_accuracy']:.1f} %, Fréchet {r['frechet_ratio']:.2f}x"
              + (" (finished earlier)" if r.get("reused") else f" ({r['wall_s']:.0f} s)"))
      print(f"[{len(records)}/{len(jobs)}] {r['setting']} seed {r['seed']}: {what}",
            flush=True)
  records.sort(key=lambda r: (list(settings).index(r["setting"]), r["seed"]))
  result = {"bench": "seed_sweep", "config": FLAGS.sweep_config, "args": FLAGS.args,
            "settings": {n: shlex.join(a) for n, a in settings.items()}, "seeds": seeds,
            "targets": TARGETS, "summary": summarise(records), "runs": records}
  path = os.path.join(FLAGS.workdir, SUMMARY_FILE)
  with open(path + ".tmp", "w") as f:
    json.dump(result, f, indent=1)
  os.replace(path + ".tmp", path)
  return result


def main(argv):
  from mot import cli  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  try:
    result = sweep()
  except SweepError as e:
    cli.fail(str(e))
  for name, entry in result["summary"].items():
    print(format_row(name, entry))
  print(json.dumps(result), flush=True)
  failed = [r for r in result["runs"] if "error" in r]
  if CHILDREN.stopped:
    cli.fail(f"stopped by {CHILDREN.stopped}: {len(result['runs']) - len(failed)} of "
             f"{len(result['runs'])} runs finished (the others saved checkpoints); run the "
             "same command again to resume")
  if failed:
    cli.fail(f"{len(failed)} of {len(result['runs'])} runs failed; first: "
             f"{failed[0]['setting']} seed {failed[0]['seed']}: {failed[0]['error']}")


if __name__ == "__main__":
  from mot import cli
  define_flags()
  cli.run(main)
