"""Latent against pixel diffusion on the Shapes scenes (issue #40; docs/results.md §7).

The latent path trains only on user folders (configs/image_folder.py), so the Shapes
training scenes are first written as one (`export`); a pixel run and a latent run of that
folder, with the same model, steps and tokens per image, are then scored by one yardstick
(`score`): the Shapes detector's GenEval-style generation scores on the fixed Shapes
prompt sets (mot.eval_shapes.generation, in-distribution and held-out pairs apart), the
Fréchet distance of mot.shapes_features beside its real-vs-real floor, the held-out
caption exact match their eval.json holds, tokens per image, the training step time
(metrics.jsonl) and the wall time; and, as a third column, real scenes of the same
prompts through the latent run's VAE: the ceiling its decoder sets. --grid_dir also
writes each column's sample grid (one row per split and category, as
mot.eval_shapes.grid_rows lays it out).

  python -m bench.latent_vs_pixel export --out DIR --scenes 6000 --seed 0
  python -m mot.data.user_data DIR CACHE --vae VAE
  python train.py --config configs/image_folder.py --workdir PIX --config.data.path=DIR \\
      --config.data.patch_size=8                                     # 16 tokens an image
  python train.py --config configs/image_folder.py --workdir LAT --config.data.path=DIR \\
      --config.data.patch_size=2 --config.latent.vae=VAE --config.data.latent_cache=CACHE
  python -m bench.latent_vs_pixel score --pixel PIX --latent LAT --out table.json \\
      --pixel_wall_s 1200 --latent_wall_s 1100 --grid_dir grids/

Prints a markdown table, then writes every figure as JSON to --out.
"""
from __future__ import annotations

import json
import os
import time

from absl import app
from absl import flags
import numpy as np

from mot import eval_shapes
from mot import latent
from mot import media
from mot import shapes_features
from mot import shapes_metrics
from mot import vae as vae_lib
from mot.data import shapes_export
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import DEFAULT_OPTIONS
from mot.pipeline import Pipeline

FLAGS = flags.FLAGS
COMMANDS = ("export", "score")
RUNS = ("pixel", "latent")


def define_flags() -> None:
  flags.DEFINE_string("out", None, "export: the folder to write; score: the JSON file.")
  flags.DEFINE_integer("scenes", 6000, "export: training scenes written.")
  flags.DEFINE_integer("seed", 0, "export: the scenes' seed; score: the sampling seed.")
  flags.DEFINE_string("pixel", None, "score: the pixel run's workdir.")
  flags.DEFINE_string("latent", None, "score: the latent run's workdir.")
  flags.DEFINE_float("pixel_wall_s", None, "score: the pixel run's train.py wall time.")
  flags.DEFINE_float("latent_wall_s", None, "score: the latent run's train.py wall time.")
  flags.DEFINE_integer("set_size", 32, "score: prompts per category and split.")
  flags.DEFINE_integer("samples_per_prompt", 1, "score: images drawn per prompt.")
  flags.DEFINE_integer("steps", None, "score: denoising steps (default: the run's).")
  flags.DEFINE_float("cfg_scale", None, "score: guidance scale (default: the run's).")
  flags.DEFINE_string("grid_dir", None, "score: write NAME_grid.png of each run here.")
  flags.mark_flag_as_required("out")


def tokens_per_image(config) -> int:
  """Tokens the DM head denoises per image: (h / p) * (w / p) of the pixel or latent grid."""
  return latent.image_tokens(config)


def step_seconds(workdir: str) -> float | None:
  """Mean seconds a training step over metrics.jsonl's intervals, the first (with the
  compile) left out: each interval's real tokens a step over its tokens_per_s."""
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  times, previous = [], 0
  for r in records:
    steps, previous = r["step"] - previous, r["step"]
    if steps > 0 and r.get("real_tokens") and r.get("tokens_per_s"):
      times.append(r["real_tokens"] / steps / r["tokens_per_s"])
  times = times[1:] if len(times) > 1 else times
  return sum(times) / len(times) if times else None


def caption_exact_match(workdir: str) -> float | None:
  """The held-out caption exact match of the newest eval.json record (None: none yet)."""
  path = os.path.join(workdir, "eval.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["latest"].get("caption_exact_match")


def score_run(workdir: str, set_size: int, samples_per_prompt: int = 1, steps=None,
              cfg_scale=None, seed: int = 0, wall_s: float | None = None) -> dict:
  """Every figure of one run (module doc); generation as mot.eval_shapes scores it."""
  pipe = Pipeline.from_workdir(workdir)
  start = time.perf_counter()
  geneval, prompts, images = eval_shapes.generation(pipe, set_size, samples_per_prompt, steps,
                                                    cfg_scale, None, seed, DEFAULT_OPTIONS)
  generation_s = time.perf_counter() - start
  return {"workdir": workdir, "step": pipe.step, "latent_vae": latent.vae_dir(pipe.config),
          "patch_size": int(pipe.config.data.patch_size),
          "tokens_per_image": tokens_per_image(pipe.config),
          "geneval": geneval, **shapes_features.frechet(images, prompts, DEFAULT_OPTIONS),
          "caption_exact_match": caption_exact_match(workdir),
          "step_s": step_seconds(workdir), "wall_s": wall_s,
          "generation_s": generation_s,
          "sampling": {"steps": pipe.default_steps if steps is None else steps,
                       "cfg_scale": pipe.default_cfg_scale if cfg_scale is None else cfg_scale,
                       "seed": seed, "set_size": set_size,
                       "samples_per_prompt": samples_per_prompt},
          "_prompts": prompts, "_images": images}


def write_grid(path: str, record: dict) -> None:
  """The run's sample grid: GRID_COLUMNS images of each (split, category), one row each."""
  rows, _ = eval_shapes.grid_rows(record["_prompts"], record["_images"], DEFAULT_OPTIONS)
  media.save_png(path, media.grid(rows, len(rows) // eval_shapes.GRID_COLUMNS, scale=4))


def vae_ceiling(vae_dir: str, set_size: int) -> dict:
  """The same figures for real scenes of the same prompts passed through the VAE (encode,
  decode): what a latent model that drew perfect latents would score, the ceiling the
  VAE sets (the real renders themselves score 100 %: the detector is exact on them)."""
  vae = vae_lib.load_diffusers(vae_dir)
  sets = eval_shapes.generation_prompts(set_size, DEFAULT_OPTIONS)
  prompts = [p for split in eval_shapes.SPLITS for ps in sets[split].values() for p in ps]
  scenes = shapes_features.reference_scenes(prompts, "latent_vs_pixel/ceiling")
  real = np.stack([shapes_scene.render(s) for s in scenes])
  images = vae_lib.output_to_images(vae.decode(vae.encode(vae_lib.images_to_input(real))))
  return {"workdir": None, "step": None, "latent_vae": vae_dir, "patch_size": None,
          "tokens_per_image": None,
          "geneval": shapes_metrics.geneval_scores(prompts, images, DEFAULT_OPTIONS),
          "real_geneval_overall": {split: v["overall"] for split, v in shapes_metrics
                                   .geneval_scores(prompts, real, DEFAULT_OPTIONS).items()
                                   if split != "unscorable"},
          **shapes_features.frechet(images, prompts, DEFAULT_OPTIONS),
          "caption_exact_match": None, "step_s": None, "wall_s": None, "generation_s": None,
          "_prompts": prompts, "_images": images}


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:.1f} %"


def _num(x, fmt: str) -> str:
  return "n/a" if x is None else format(x, fmt)


def table(results: dict[str, dict]) -> str:
  """A markdown table: one column per run, one row per figure."""
  names = list(results)
  rows = [("tokens per image", lambda r: _num(r["tokens_per_image"], "d")),
          ("space", lambda r: ("latent" if r["latent_vae"] else "pixels") + (
              f", {r['patch_size']}x{r['patch_size']} patches" if r["patch_size"] else ""))]
  for split in eval_shapes.SPLITS:
    for c in (*grammar.CATEGORIES, "overall"):
      rows.append((f"GenEval {split} {c}",
                   lambda r, s=split, c=c: _pct(r["geneval"][s].get(c))))
  rows += [("Fréchet distance / its floor", lambda r: f"{r['frechet']:.1f} / "
           f"{r['frechet_floor']:.2f} ({r['frechet_ratio']:.1f}x)"),
           ("held-out caption exact match", lambda r: _pct(r["caption_exact_match"])),
           ("training step (s)", lambda r: _num(r["step_s"], ".2f")),
           ("train.py wall time (s)", lambda r: _num(r["wall_s"], ".0f")),
           ("scoring generation (s)", lambda r: _num(r["generation_s"], ".0f"))]
  lines = ["| figure | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  lines += [f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |"
            for label, f in rows]
  return "\n".join(lines)


def main(argv) -> None:
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"give one command: {' or '.join(COMMANDS)}")
  if argv[1] == "export":
    try:
      lines = shapes_export.export_folder(FLAGS.out, FLAGS.scenes, FLAGS.seed)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
    print(f"wrote {len(lines)} scenes and {shapes_export.CAPTIONS_FILE} to {FLAGS.out}")
    return
  if not (FLAGS.pixel and FLAGS.latent):
    raise app.UsageError("score needs --pixel and --latent workdirs")
  walls = {"pixel": FLAGS.pixel_wall_s, "latent": FLAGS.latent_wall_s}
  results = {name: score_run(getattr(FLAGS, name), FLAGS.set_size, FLAGS.samples_per_prompt,
                             FLAGS.steps, FLAGS.cfg_scale, FLAGS.seed, walls[name])
             for name in RUNS}
  results["vae_ceiling"] = vae_ceiling(results["latent"]["latent_vae"], FLAGS.set_size)
  print(table(results))
  if FLAGS.grid_dir:
    os.makedirs(FLAGS.grid_dir, exist_ok=True)
    for name, record in results.items():
      write_grid(os.path.join(FLAGS.grid_dir, f"{name}_grid.png"), record)
  with open(FLAGS.out, "w") as f:
    json.dump({name: {k: v for k, v in r.items() if not k.startswith("_")}
               for name, r in results.items()}, f, indent=1)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
