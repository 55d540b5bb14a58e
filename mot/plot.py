"""Loss curves of a run as a PNG: training losses, and held-out losses when evaluated.

  python -m mot.plot --workdir runs/digits                 # writes runs/digits/curves.png
  python -m mot.plot --workdir runs/digits --out /tmp/digits.png

Reads DIR/metrics.jsonl (written by training). From Python: `plot_metrics(workdir)`.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence

TRAIN_KEYS = ("loss", "ar_loss", "dm_loss")
EVAL_KEYS = ("eval_ar_loss", "eval_dm_loss")
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
  """(training records, evaluation records) of a metrics.jsonl, sorted by step.

  A step logged twice keeps its last record (a resumed run rewrites what it redoes); a
  line that is not a JSON record with a "step" (e.g. cut short by a crash) is skipped.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} does not exist: train first (python train.py "
                            f"--workdir {os.path.dirname(path) or '.'} ...), or pass the "
                            "run's --workdir")
  train, evals, skipped = {}, {}, 0
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
        step = int(record["step"])
      except (ValueError, KeyError, TypeError):
        skipped += line.strip() != ""
        continue
      if any(k in record for k in TRAIN_KEYS):
        train[step] = record
      if any(k in record for k in EVAL_KEYS):
        evals[step] = record
  if skipped:
    logging.warning("%s: skipped %d unreadable line(s)", path, skipped)
  return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def plot_metrics(workdir: str, out: str | None = None) -> str:
  """Writes the loss curves of `workdir` (default DIR/curves.png); returns the PNG's path.

  Raises:
    FileNotFoundError: no DIR/metrics.jsonl.
    ValueError: it holds no training record yet.
  """
  # Figure + Agg canvas, not pyplot: no global backend, no display needed.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: slow, end of run only
  from matplotlib.figure import Figure  # lazy: slow to import, needed at the end of a run

  path = os.path.join(workdir, METRICS_FILE)
  train, evals = read_metrics(path)
  if not train:
    raise ValueError(f"{path} has no training records yet: plot after the first "
                     "logged step (config.log_every_steps)")
  fig = Figure(figsize=(11 if evals else 6, 4), layout="constrained")
  FigureCanvasAgg(fig)
  panels = [("training", train, TRAIN_KEYS)] + ([("held-out", evals, EVAL_KEYS)]
                                                if evals else [])
  first = None
  for i, (title, records, keys) in enumerate(panels):
    ax = fig.add_subplot(1, len(panels), i + 1, sharex=first)  # Same steps, side by side.
    first = first or ax
    _plot_panel(ax, records, keys)
    ax.set_title(f"{title} loss")
  out = out or os.path.join(workdir, CURVES_FILE)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=120)
  return out


def _plot_panel(ax, records: list[dict], keys: Sequence[str]) -> None:
  positive = True
  for key in keys:
    points = [(r["step"], float(r[key])) for r in records
              if isinstance(r.get(key), (int, float))]
    if not points:
      continue
    steps, values = zip(*points)
    positive &= all(v > 0 for v in values if math.isfinite(v))
    ax.plot(steps, values, label=key, marker="o" if len(points) < 20 else None,
            markersize=3)
  if positive:  # Losses span decades early on; a log axis keeps the tail readable.
    from matplotlib import ticker  # lazy: as the imports above
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  ax.set_xlabel("step")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m mot.plot", description=__doc__.split(
      "\n")[0])
  parser.add_argument("--workdir", required=True, help="run directory holding metrics.jsonl")
  parser.add_argument("--out", default=None,
                      help="PNG to write (default: WORKDIR/curves.png)")
  args = parser.parse_args(argv)
  try:
    out = plot_metrics(args.workdir, args.out)
  except (OSError, ValueError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
