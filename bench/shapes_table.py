"""The Shapes ablation table: settings x seeds of finished runs, their seed spread, and
which settings differ from the first by more than it.

  python -m bench.shapes_table --run default=runs/shapes_s0,runs/shapes_s1 \
      --run mode=runs/mode_s0,runs/mode_s1 --run cfg1=runs/shapes_s0_cfg1,runs/shapes_s1_cfg1

Each run directory's eval.json (its newest record, or --step's) is read; a setting's
figure is the mean over its seeds with the range [min, max] beside it. A setting differs
from the first (the baseline) on a figure when their ranges do not overlap: the
difference then exceeds what the seed alone moved. Prints a markdown table, then one JSON
line with every figure.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
# (eval.json key, column title)
FIGURES = (("geneval_overall", "GenEval ID"),
           ("geneval_heldout_overall", "GenEval held-out"),
           ("vqa_overall", "VQA ID"),
           ("vqa_heldout_overall", "VQA held-out"),
           ("caption_match", "captions"),
           ("think_draw_both", "think-then-draw"),
           ("frechet_ratio", "Fréchet / floor"))


def define_flags() -> None:
  flags.DEFINE_multi_string("run", None, "NAME=DIR[,DIR...]: a setting and its runs (one "
                            "per seed); the first --run is the baseline.")
  flags.DEFINE_integer("step", None, "Read the record of this step (default: the newest).")
  flags.mark_flag_as_required("run")


def read_record(workdir: str, step: int | None = None) -> dict:
  """The eval.json record of `step` (None: the newest) of a Shapes run."""
  path = os.path.join(workdir, "eval.json")
  with open(path) as f:
    data = json.load(f)
  records = [data["latest"]] if step is None else [
      r for r in data["evaluations"] if r.get("step") == step]
  if not records or not records[0].get("shapes"):
    raise ValueError(f"{path} has no Shapes record" + (f" of step {step}" if step else ""))
  return records[0]


def summarise(values: list[float]) -> dict:
  """Mean, range and values of one figure over seeds (None where no seed has it)."""
  if not values:
    return {"mean": None, "min": None, "max": None, "values": []}
  return {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
          "values": values}


def settings_table(runs: dict[str, list[str]], step: int | None = None) -> dict:
  """{name: {figure: summary}} of every setting's runs."""
  out = {}
  for name, dirs in runs.items():
    records = [read_record(d, step) for d in dirs]
    out[name] = {key: summarise([float(r[key]) for r in records if r.get(key) is not None])
                 for key, _ in FIGURES}
  return out


def differs(a: dict, b: dict) -> bool:
  """Whether two settings' seed ranges of a figure do not overlap."""
  return bool(a["values"] and b["values"]) and (a["min"] > b["max"] or b["min"] > a["max"])


def markdown(table: dict, runs: dict[str, list[str]]) -> str:
  """The table: mean [min-max] per figure; * where the range clears the baseline's."""
  names = list(table)
  base = table[names[0]]
  lines = ["| setting | seeds | " + " | ".join(t for _, t in FIGURES) + " |",
           "|---|---|" + "---|" * len(FIGURES)]
  for name in names:
    cells = []
    for key, _ in FIGURES:
      s = table[name][key]
      if not s["values"]:
        cells.append("n/a")
        continue
      scale = 1.0 if key == "frechet_ratio" else 100.0
      mark = "*" if name != names[0] and differs(s, base[key]) else ""
      cells.append(f"{scale * s['mean']:.1f} [{scale * s['min']:.1f}-{scale * s['max']:.1f}]"
                   f"{mark}")
    lines.append(f"| {name} | {len(runs[name])} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def parse_runs(specs: list[str]) -> dict[str, list[str]]:
  runs = {}
  for spec in specs:
    name, sep, dirs = spec.partition("=")
    if not sep or not name or not dirs:
      raise ValueError(f"--run {spec!r}: use NAME=DIR[,DIR...]")
    runs[name] = [d for d in dirs.split(",") if d]
  return runs


def main(argv) -> None:
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  try:
    runs = parse_runs(FLAGS.run)
    table = settings_table(runs, FLAGS.step)
  except (OSError, ValueError, KeyError) as e:
    sys.exit(f"error: {e}")
  print(markdown(table, runs))
  print("(* the seed range does not overlap the first setting's)")
  print(json.dumps({"runs": runs, "table": table}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
