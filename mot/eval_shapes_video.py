"""The Shapes video protocol (issue #39, deliverable 5) for a checkpoint of
config.data.dataset "shapes_video". Every set is fixed (`mot.data.shapes_video.eval_clip`),
in-distribution and held-out pairs apart; every judge is the Shapes detector on each frame
(`mot.shapes_video_metrics`):

- caption -> clip: `samples_per_caption` clips for each of `eval_set_size` captions
  ("a red circle moving left and a blue square moving up"): the fraction of frames that
  hold exactly the named objects, identity kept (every frame frame 0's objects), each
  object's direction (frame 0 -> 1), and `correct` (all of these);
- clip QA: `eval_set_size` questions per type ("direction": "Which way is the red circle
  moving?"; "count"; "count_color"), exact match, and `overall` the mean over types;
- world model (action-conditioned prediction): from `context_frames` true frames, the
  agent's name and its actions, the drawn frames against the simulator's: the agent's
  centre error (px) and the fraction within 1 px, every object found with its colour and
  shape and within 1 px, frames read exactly;
- inverse dynamics: the agent's actions drawn from the clip, rounded, against the true
  ones (per step exact, and mean absolute error in px);
- `real`: the same judges on the simulator's own clips (all 1.0 by construction: the
  detector reads the Shapes contract exactly).

`_images` (generated clips, [N, T, S, S, 3] in [0, 1]) and `_world_model_clips` (real,
predicted) give evaluate.py its grid and GIFs.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from mot import shapes_video_metrics as metrics
from mot.data import shapes
from mot.data import shapes_video as sv
from mot.data import shapes_video_tasks as vt
from mot.eval_digits import sampling_record
from mot.eval_shapes import to_uint8

SPLITS = shapes.SPLITS
ANSWER_TOKENS = 8          # decode budget of the answers ("right", a count) + end token
GRID_CLIPS = 4             # generated clips per split in the sample grid


def clips_for(family: str, split: str, n: int, options: vt.VideoTaskOptions) -> list:
  """The first n clips of a fixed evaluation set."""
  return [sv.eval_clip(family, split, i, options.scene, options.num_frames)
          for i in range(n)]


def unit(clips) -> np.ndarray:
  """float32 [N, T, S, S, 3] in [0, 1] of simulated clips."""
  return np.stack([c.frames() for c in clips]).astype(np.float32) / 255.0


def generation(pipe, clips, per, sampling) -> tuple[dict, np.ndarray]:
  """(caption -> clip scores, uint8 clips [N * per, T, S, S, 3])."""
  captions = [sv.caption(c) for c in clips]
  drawn = to_uint8(pipe.generate(captions, num_samples=per, **sampling))
  scores = [metrics.caption_scores(cap, d)
            for cap, d in zip([c for c in captions for _ in range(per)], drawn)]
  return {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}, drawn


def qa_items(qtype: str, split: str, n: int, options) -> list[tuple[sv.VideoClip, str, str]]:
  """n (clip, question, answer) of `qtype` from the fixed "mixed" set (held-out: about a
  held-out object where the type names one)."""
  items, i = [], 0
  while len(items) < n:
    if i > 100 * (n + 1):
      raise ValueError(f"the {split} clips ask too few {qtype!r} questions: check the options")
    clip = sv.eval_clip("mixed", split, i, options.scene, options.num_frames)
    pairs = sv.clip_questions(clip, options.scene.colors)[qtype]
    if split == "heldout" and qtype == "direction":
      pairs = [(q, a) for q, a in pairs
               if any(options.scene.is_heldout((c, s)) for c, s in
                      [q.removeprefix("Which way is the ").removesuffix(" moving?").split()])]
    if pairs:
      items.append((clip, *pairs[i % len(pairs)]))
    i += 1
  return items


def qa(pipe, split: str, n: int, options) -> dict[str, float]:
  """Exact-match accuracy per question type and their mean."""
  out = {}
  for qtype in sv.QTYPES:
    items = qa_items(qtype, split, n, options)
    answers = pipe.reason([q for _, q, _ in items], video=unit([c for c, _, _ in items]),
                          max_new_tokens=ANSWER_TOKENS)
    out[qtype] = float(np.mean([a.strip() == w for a, (_, _, w) in zip(answers, items)]))
  out["overall"] = float(np.mean([out[q] for q in sv.QTYPES]))
  return out


def predict_clips(pipe, clips, options, steps=None, cfg_scale=None, sampler=None,
                  seed: int = 0) -> np.ndarray:
  """World model: float32 [N, T, S, S, 3] in [0, 1]: each clip's `context_frames` true
  frames, then the frames drawn from them, its agent's name and its actions."""
  steps, cfg_scale, sampler = pipe.sampling_settings(1, steps, cfg_scale, sampler)
  k = options.context_frames
  given = unit(clips)[:, :k]
  drawn = pipe.draw_clips(
      lambda r, d: vt.world_model_prompt(sv.agent_text(clips[r]), clips[r].actions,
                                         given[r], d, options),
      len(clips), options.num_frames - k, steps, cfg_scale, sampler, seed)
  return np.concatenate([given, drawn], axis=1)


def infer_actions(pipe, clips, options, steps=None, sampler=None, seed: int = 0
                  ) -> np.ndarray:
  """Inverse dynamics: float32 [N, T - 1, 2] the agent's (dx, dy) drawn from each clip
  (no guidance)."""
  steps, _, sampler = pipe.sampling_settings(1, steps, 1.0, sampler)
  examples = [vt.inverse_dynamics_example(c.frames(), sv.actions_prompt(c),
                                          np.zeros_like(c.actions), options) for c in clips]
  x0 = pipe.denoise(examples, 1, steps, 1.0, sampler, seed)
  return x0[..., :sv.ACTION_DIM].astype(np.float32)


def dynamics(pipe, clips, options, sampling) -> tuple[dict, np.ndarray]:
  """(world-model and inverse-dynamics figures, predicted clips in [0, 1])."""
  predicted = predict_clips(pipe, clips, options, **sampling)
  tracks = [metrics.track_scores(c, to_uint8(p), first=options.context_frames)
            for c, p in zip(clips, predicted)]
  inferred = infer_actions(pipe, clips, options, sampling["steps"], sampling["sampler"],
                           sampling["seed"])
  actions = np.stack([c.actions for c in clips])
  return {"world_model": metrics.summarise_tracks(tracks),
          "inverse_dynamics": {
              "step_accuracy": float(np.mean(np.all(np.round(inferred) == actions, -1))),
              "mae_px": float(np.mean(np.abs(inferred - actions)))}}, predicted


def real_scores(sets: list) -> dict:
  """The judges on the simulator's clips: tracks of every set, captions of the caption
  sets (all 1.0 when the detector reads the contract exactly)."""
  every = [c for clips in sets for c in clips]
  captions = [metrics.caption_scores(sv.caption(c), c.frames())["correct"] for c in sets[0]]
  return {**metrics.summarise_tracks([metrics.track_scores(c, c.frames()) for c in every]),
          "caption_correct": float(np.mean(captions))}


def evaluate_split(pipe, split, n, per, options, sampling) -> tuple[dict, dict, tuple]:
  """(figures of one split, seconds per part, (generated clips, real and predicted
  world-model clips))."""
  seconds, start = {}, time.perf_counter()
  caption_clips = clips_for("caption", split, n, options)
  action_clips = clips_for("action", split, n, options)
  gen, drawn = generation(pipe, caption_clips, per, sampling)
  seconds["generation"], start = time.perf_counter() - start, time.perf_counter()
  answers = qa(pipe, split, n, options)
  seconds["qa"], start = time.perf_counter() - start, time.perf_counter()
  dyn, predicted = dynamics(pipe, action_clips, options, sampling)
  seconds["dynamics"], start = time.perf_counter() - start, time.perf_counter()
  real = real_scores([caption_clips, action_clips])
  seconds["real"] = time.perf_counter() - start
  figures = {"generation": gen, "qa": answers, **dyn, "real": real}
  return figures, seconds, (drawn, unit(action_clips), predicted)


def headline(r: dict[str, Any]) -> dict[str, float | None]:
  """The flat scalars train.py logs (and format_line prints)."""
  ind, held = r["in_distribution"], r["heldout"]
  return {
      "caption_clip_accuracy": ind["generation"]["correct"],
      "caption_clip_heldout_accuracy": held["generation"]["correct"],
      "qa_accuracy": ind["qa"]["overall"],
      "qa_heldout_accuracy": held["qa"]["overall"],
      "world_model_agent_within_1px": ind["world_model"]["agent_within_1px"],
      "world_model_agent_error_px": ind["world_model"]["agent_error_px"],
      "world_model_objects_within_1px": ind["world_model"]["objects_within_1px"],
      "inverse_dynamics_step_accuracy": ind["inverse_dynamics"]["step_accuracy"],
      "real_frames_exact": min(ind["real"]["frames_exact"], held["real"]["frames_exact"]),
  }


def evaluate_shapes_video(pipe, samples_per_caption: int = 1, steps=None, cfg_scale=None,
                          sampler=None, seed: int = 0, set_size: int | None = None
                          ) -> dict[str, Any]:
  """The protocol (module docstring) of one set of parameters and sampling settings;
  `set_size` items per set and split (None: config.eval_set_size)."""
  options = vt.validate(pipe.config.data, pipe.tokenizer)
  n = int(pipe.config.eval_set_size if set_size is None else set_size)
  sampling = dict(zip(("steps", "cfg_scale", "sampler"),
                      pipe.sampling_settings(1, steps, cfg_scale, sampler)), seed=seed)
  result = {"step": pipe.step, "split": "held-out", "shapes_video": True}
  seconds, shown, world = {}, [], None
  for split in SPLITS:
    result[split], seconds[split], (drawn, real, predicted) = evaluate_split(
        pipe, split, n, samples_per_caption, options, sampling)
    shown.append(drawn[:GRID_CLIPS] / 255.0)
    world = world or (real[:GRID_CLIPS], predicted[:GRID_CLIPS])
  result.update(eval_set_size=n, samples_per_caption=samples_per_caption,
                num_frames=options.num_frames, context_frames=options.context_frames,
                sampling=sampling_record(pipe, steps, cfg_scale, sampler, seed),
                seconds=seconds, _images=np.concatenate(shown).astype(np.float32),
                _world_model_clips=world)
  result.update(headline(result))
  return result


def format_line(r: dict[str, Any]) -> str:
  """One line of the headline figures (mot.evaluate.format_result)."""
  def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"
  err = r["world_model_agent_error_px"]
  return (f"step {r['step']}: caption->clip {pct(r['caption_clip_accuracy'])} (held-out "
          f"{pct(r['caption_clip_heldout_accuracy'])}) | clip QA {pct(r['qa_accuracy'])} "
          f"(held-out {pct(r['qa_heldout_accuracy'])}) | world model agent within 1 px "
          f"{pct(r['world_model_agent_within_1px'])} (error "
          f"{'n/a' if err is None else f'{err:.2f} px'}), objects within 1 px "
          f"{pct(r['world_model_objects_within_1px'])} | inverse dynamics "
          f"{pct(r['inverse_dynamics_step_accuracy'])} | real clips read exactly "
          f"{pct(r['real_frames_exact'])}")
