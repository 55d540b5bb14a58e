"""The logic of sample.py: check every input, load the checkpoint, sample, then write.

Nothing is written (files or stdout) before all inputs are checked and all sampling has
succeeded; every user error is an InputError / CheckpointError with one line.

Image checkpoints: --mode reason answers about --images (or text-only prompts);
--mode generate and think_then_draw write one PNG per sample, grid.png and manifest.json
(think_then_draw reads --images as the context images a Shapes prompt is about).
Video checkpoints: --mode generate writes one GIF per clip (caption -> clip, or with
--actions and --images FIRST_FRAME the world model's prediction); --mode reason reads each
--images item (a GIF or a folder of frames) as one clip.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence

import numpy as np

from mot import media
from mot import sample_options as opts
from mot.data import clip_files
from mot.errors import InputError
from mot.pipeline import Pipeline

MODES = ("reason", "generate", "think_then_draw")


@dataclasses.dataclass
class Request:
  """What sample.py was asked for (its flags), checked by `check_request`."""
  workdir: str
  mode: str
  images: Sequence[str] = ()
  prompts: Sequence[str] = ()
  as_json: bool = False
  num_samples: int = 1
  out: str | None = None
  steps: int | None = None
  cfg_scale: float | None = None
  sampler: str | None = None
  seed: int = 0
  actions: str | None = None
  num_frames: int | None = None
  reason_shifts: int | None = None
  max_new_tokens: int | None = None
  mesh_shape: str | None = None      # sample on this mesh (Pipeline.from_workdir)


def check_out_dir(out: str | None, mode: str) -> None:
  """--out: needed by the modes that write images, and not an existing file."""
  if mode == "reason":
    return
  if not out:
    raise InputError(f"--mode {mode} writes images: give --out DIR")
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--out {out} is a file, not a directory")


def _check_actions(r: Request) -> np.ndarray | None:
  if r.actions is None:
    return None
  if r.mode != "generate":
    raise InputError(f"--actions is for --mode generate (with --images FIRST_FRAME), "
                     f"not {r.mode}")
  actions = opts.parse_actions(r.actions)
  if not r.images:
    raise InputError("--actions needs the first frame(s): give --images FIRST_FRAME.png")
  if r.prompts:
    raise InputError("--actions predicts from a first frame, not a --prompt: drop --prompt")
  return actions


def check_request(r: Request) -> np.ndarray | None:
  """Every check that needs no checkpoint; returns the parsed --actions (or None)."""
  if r.mode not in MODES:
    raise InputError(f"--mode {r.mode!r} is unknown: use one of {MODES}")
  if r.reason_shifts is not None:
    if r.mode != "reason":
      raise InputError(f"--reason_shifts is for --mode reason, not --mode {r.mode}: drop it")
    opts.check_shifts(r.reason_shifts)
  actions = _check_actions(r)
  if r.num_frames is not None and (r.mode != "generate" or actions is not None):
    raise InputError("--num_frames is for --mode generate from a --prompt (with --actions "
                     "the clip has one frame per action plus the first)")
  if r.num_frames is not None and r.num_frames < 1:
    raise InputError(f"--num_frames={r.num_frames} must be >= 1")
  if r.max_new_tokens is not None:
    if r.mode == "generate":
      raise InputError("--max_new_tokens bounds answers (--mode reason or think_then_draw), "
                       "not --mode generate: drop it")
    opts.check_decoding(r.max_new_tokens, 0.0, 0, 1.0)
  if not r.prompts and r.mode != "reason" and actions is None:
    raise InputError(f"--mode {r.mode} needs --prompt")
  if r.prompts:
    opts.prompt_list(list(r.prompts))
  opts.check_seed(r.seed)
  if r.images and r.mode == "generate" and actions is None:
    raise InputError("--images is for --mode reason, think_then_draw (the context images of "
                     "Shapes prompts) or generate with --actions, not generate alone")
  if r.mode != "reason":
    if r.num_samples < 1:
      raise InputError(f"--num_samples={r.num_samples} must be >= 1")
    if r.steps is not None and r.steps < 1:
      raise InputError(f"--steps={r.steps} must be >= 1")
    if r.cfg_scale is not None and not math.isfinite(r.cfg_scale):
      raise InputError(f"--cfg_scale={r.cfg_scale} must be a finite number")
  check_out_dir(r.out, r.mode)
  return actions


def run_sample(request: Request, stdout=None) -> None:
  """sample.py: validates every input, loads the checkpoint, samples, then writes."""
  stdout = stdout or sys.stdout
  actions = check_request(request)
  paths = media.image_paths(request.images)
  for path in paths:  # every file is read (and checked) before the checkpoint is
    check_input_file(path)
  pipe = Pipeline.from_workdir(request.workdir, mesh_shape=request.mesh_shape)
  if not pipe.is_video and (actions is not None or request.num_frames is not None):
    pipe.require_video("--actions" if actions is not None else "--num_frames")
  settings = {"workdir": os.path.abspath(request.workdir), "checkpoint_step": pipe.step,
              "mode": request.mode, "seed": request.seed}
  if pipe.is_video:
    if request.reason_shifts:
      raise InputError("--reason_shifts moves still images; this is a video checkpoint: "
                       "drop it")
    run_video(pipe, request, settings, actions, stdout)
  elif request.mode == "reason":
    reason_images(pipe, request, paths, stdout)
  else:
    draw_images(pipe, request, settings, stdout)


def check_input_file(path: str) -> None:
  """Reads an --images file once (a clip file: its frames counted), so a bad one fails
  before the checkpoint loads."""
  if not clip_files.is_video_file(path):
    media.load_image(path, None)
    return
  try:
    clip_files.check_clip(path)
  except ValueError as e:
    raise InputError(str(e)) from None


def reason_images(pipe: Pipeline, r: Request, paths: list[str], stdout) -> None:
  """--mode reason on an image checkpoint: every prompt (default: the question the run
  trained on) about every image (or text)."""
  prompts = list(r.prompts) or [pipe.question]
  if paths:
    pairs = [(path, p) for path in paths for p in prompts]
    answers = pipe.reason([p for _, p in pairs], seed=r.seed,
                          images=[path for path in paths for _ in prompts],
                          shifts=r.reason_shifts, max_new_tokens=r.max_new_tokens)
  else:
    pairs = [(None, p) for p in prompts]
    answers = pipe.reason(prompts, seed=r.seed, shifts=r.reason_shifts,
                          max_new_tokens=r.max_new_tokens)
  print_answers(pairs, answers, r.as_json, stdout, "image")


def draw_images(pipe: Pipeline, r: Request, settings: dict, stdout) -> None:
  """--mode generate / think_then_draw on an image checkpoint: PNGs, grid, manifest."""
  prompts = list(r.prompts)
  steps, cfg_scale, sampler = pipe.sampling_settings(r.num_samples, r.steps, r.cfg_scale,
                                                     r.sampler)
  settings.update(steps=steps, cfg_scale=cfg_scale, sampler=sampler)
  answers = None
  if r.mode == "generate":
    images = pipe.generate(prompts, r.num_samples, steps, cfg_scale, sampler, r.seed)
  else:
    contexts = media.image_paths(r.images) or None   # Shapes: one per prompt, or one
    answers, images = pipe.think_then_draw(
        prompts, r.num_samples, max_new_tokens=r.max_new_tokens, steps=steps,
        cfg_scale=cfg_scale, sampler=sampler, seed=r.seed, images=contexts)
  records = []
  for k in range(len(images)):
    i, s = divmod(k, r.num_samples)
    record = {"file": f"sample_{k:04d}.png", "prompt": prompts[i], "prompt_index": i,
              "sample_index": s}
    if answers is not None:
      record["answer"] = answers[i]
    records.append(record)
  write_samples(r.out, images, records, len(prompts), settings)
  print_records(r.out, records, r.as_json, stdout)
  if not r.as_json:
    for p, a in zip(prompts, answers or ()):
      print(f"{p}\t{a}", file=stdout)
    print(f"wrote {len(records)} samples, grid.png and manifest.json to {r.out}", file=stdout)


def run_video(pipe: Pipeline, r: Request, settings: dict, actions: np.ndarray | None,
              stdout) -> None:
  """sample.py on a video checkpoint (inputs already checked; `settings` is the
  manifest's record of the run, filled in further here)."""
  if r.mode == "think_then_draw":
    raise InputError("--mode think_then_draw draws images; this is a video checkpoint: "
                     "use --mode generate or --mode reason")
  if r.mode == "reason":
    reason_clips(pipe, r, stdout)
    return
  steps, cfg_scale, sampler = pipe.sampling_settings(r.num_samples, r.steps, r.cfg_scale,
                                                     r.sampler)
  settings.update(steps=steps, cfg_scale=cfg_scale, sampler=sampler)
  records = []
  if actions is not None:
    paths = media.image_paths(r.images)
    pipe.require_video("--actions", actions=True)
    first = pipe.unit_images(paths)[0]
    clips = pipe.predict(first, actions, r.num_samples, steps, cfg_scale, sampler, r.seed)
    settings["actions"] = actions.tolist()
    for k in range(len(clips)):
      i, s = divmod(k, r.num_samples)
      records.append({"file": f"clip_{k:04d}.gif", "first_frame": paths[i],
                      "first_frame_index": i, "sample_index": s})
  else:
    prompts = list(r.prompts)
    clips = pipe.generate(prompts, r.num_samples, steps, cfg_scale, sampler, r.seed,
                          num_frames=r.num_frames)
    for k in range(len(clips)):
      i, s = divmod(k, r.num_samples)
      records.append({"file": f"clip_{k:04d}.gif", "prompt": prompts[i], "prompt_index": i,
                      "sample_index": s})
  settings["num_frames"] = int(clips.shape[1])
  write_clips(r.out, clips, records, settings)
  print_records(r.out, records, r.as_json, stdout)
  if not r.as_json:
    print(f"wrote {len(records)} clips (GIF), grid.png and manifest.json to {r.out}",
          file=stdout)


def reason_clips(pipe: Pipeline, r: Request, stdout) -> None:
  """--mode reason on a video checkpoint: each --images item is one clip (default prompt:
  the question the run trained on)."""
  prompts = list(r.prompts) or [pipe.question]
  clips = [pipe.load_clip(item) for item in r.images]
  if clips:
    pairs = [(item, p) for item in r.images for p in prompts]
    answers = []
    for clip in clips:  # clips may differ in length: one batched call per clip
      answers += pipe.reason(prompts, video=clip, seed=r.seed,
                             max_new_tokens=r.max_new_tokens)
  else:
    pairs = [(None, p) for p in prompts]
    answers = pipe.reason(prompts, seed=r.seed, max_new_tokens=r.max_new_tokens)
  print_answers(pairs, answers, r.as_json, stdout, "clip")


def write_samples(out: str, images: np.ndarray, records: list[dict], rows: int,
                  settings: dict) -> list[dict]:
  """One PNG per sample, grid.png (one row per prompt) and manifest.json in `out`."""
  os.makedirs(out, exist_ok=True)
  for image, record in zip(images, records):
    media.save_png(os.path.join(out, record["file"]), image)
  media.save_png(os.path.join(out, "grid.png"), media.grid(images, rows))
  _write_manifest(out, settings, records)
  return records


def write_clips(out: str, clips: np.ndarray, records: list[dict], settings: dict
                ) -> list[dict]:
  """One GIF per clip [T, H, W], grid.png (one row per clip, one column per frame) and
  manifest.json in `out`."""
  os.makedirs(out, exist_ok=True)
  for clip, record in zip(clips, records):
    media.save_gif(os.path.join(out, record["file"]), clip)
  n, t = clips.shape[:2]
  media.save_png(os.path.join(out, "grid.png"),
                 media.grid(clips.reshape(n * t, *clips.shape[2:]), n))
  _write_manifest(out, settings, records)
  return records


def _write_manifest(out: str, settings: dict, records: list[dict]) -> None:
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(dict(settings, grid="grid.png", samples=records), f, indent=1)


def print_answers(pairs, answers, as_json, stdout, key) -> None:
  """One line per (input, prompt) answer: tab-separated, or a JSON object."""
  for (path, p), a in zip(pairs, answers):
    if as_json:
      print(json.dumps({key: path, "prompt": p, "answer": a}), file=stdout)
    else:
      print(f"{path if path is not None else p}\t{a}", file=stdout)


def print_records(out, records, as_json, stdout) -> None:
  """--json: one JSON object per written sample, its file path in full."""
  for record in records:
    if as_json:
      print(json.dumps(dict(record, file=os.path.join(out, record["file"]))), file=stdout)
