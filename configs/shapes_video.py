"""Shapes video (issue #39): video and actions on the Shapes scenes.

Clips of T = 6 frames of 32x32 RGB Shapes scenes (docs/shapes.md): objects move with
constant integer velocities and bounce off the walls; in action clips one object, the
agent (named in the text), moves by a given action chunk instead (mot/data/shapes_video.py).
One backbone trains four tasks (mot/data/shapes_video_tasks.py):
  shapes_video_generation       "a red circle moving left and a blue square moving up"
                                -> clip (DM, frame by frame)
  shapes_video_qa               clip + "Which way is the red circle moving?" -> "left",
                                or the object / colour counts (AR)
  shapes_video_world_model      agent text + actions + frames 0-1 -> frames 2.. (DM)
  shapes_video_inverse_dynamics clip + "actions of the red circle:" -> actions (DM)
The held-out pairs blue triangle, yellow circle and magenta square never appear in
training clips; `mot.eval_shapes_video` scores them apart, per frame by the Shapes detector.

  python train.py --config configs/shapes_video.py --workdir runs/shapes_video
  python -m mot.evaluate --workdir runs/shapes_video    # detector per frame, QA, WM, ID
  python sample.py --workdir runs/shapes_video --mode generate \\
      --prompt "a red circle moving left" --out clips/
  python train.py --config configs/shapes_video.py:tiny --workdir /tmp/tiny   # for tests

Variants (the part after ':'): "" (default) and "tiny". Everything not set here is as in
configs/shapes.py (scenes, patches, model) and configs/digits.py (optimiser, mesh,
logging); any field can be overridden on the command line, e.g.
--config.num_train_steps=2000.
"""
import ml_collections

from configs import shapes as shapes_config

FRAMES = 6       # frames per clip
CONTEXT = 2      # frames the world model is given (two show the other objects' velocities)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"configs/shapes_video.py has no variant {arg!r}: use '' or 'tiny'")
  c = shapes_config.get_config(arg)  # shared fields, each documented there
  c.variant = variant                # which variant of this file built the config

  # ---- Optimisation (the run's time and figures: docs/results.md §8). ----
  c.num_train_steps = 1200           # total optimizer steps
  c.batch_size = 16                  # global batch in rows (one clip example a row)
  c.learning_rate = 2e-3             # peak AdamW learning rate
  c.warmup_steps = 100               # linear warm-up steps, then cosine decay
  c.ema_decay = 0.998                # EMA of the parameters used for sampling
  c.ar_loss_weight = 1.0             # weight of the next-token cross-entropy
  c.eval_every_steps = 1200          # held-out losses and the video protocol (at the end)
  c.checkpoint_every_steps = 250     # orbax checkpoint interval (also at the end)
  c.eval_samples_per_digit = 1       # shapes_video: clips per evaluation caption (0: no
                                     # protocol in training)
  c.eval_set_size = 16               # items per evaluation set and split: captions, each
                                     # question type, world-model and inverse-dynamics
                                     # clips (mot.eval_shapes_video)

  # ---- Data (the scene fields, image_size, channels and patches are configs/shapes.py's).
  c.data.dataset = "shapes_video"    # moving Shapes scenes drawn per example
  c.data.vqa_questions = 1           # still-image VQA field (shapes_vqa, not trained here)
  c.data.relation_trace = False      # still-image VQA field (shapes_think, not trained here)
  c.data.layout_plan = False         # still-image generation field (shapes_think, the same)
  c.data.layout_canvas = False       # still-image generation field (shapes_think, the same)
  c.model.dm_prediction = "velocity"  # the DM head as results §8's run trained it (configs/
                                     # shapes.py predicts x0; not yet tried on clips)
  c.model.patch_mixing = "none"      # each patch alone (configs/shapes.py reads grid
                                     # neighbours; on clips they changed nothing at seed
                                     # 0: docs/results.md §8)
  c.data.num_frames = FRAMES         # frames per clip
  c.data.context_frames = CONTEXT    # world model: frames given before the predicted ones
  c.data.video_layout = "frames"     # generated frames: one block a frame, teacher forced
                                     # (the only layout shapes_video trains)
  c.data.seq_len = 256               # row length: the longest example (generation, 11
                                     # frame blocks of 16 tokens) is 247 tokens
  c.data.examples_per_row = 1        # one clip example a row (two would not fit)
  c.data.task_weights = ml_collections.ConfigDict({  # task mix
      "shapes_video_generation": 0.3,        # caption -> clip (DM)
      "shapes_video_qa": 0.3,                # clip -> direction / counts (AR)
      "shapes_video_world_model": 0.25,      # agent, actions, 2 frames -> the rest (DM)
      "shapes_video_inverse_dynamics": 0.15})  # clip -> the agent's actions (DM)

  # ---- Sampling defaults (sample.py, evaluation). ----
  c.sample.steps = 16                # denoising steps a frame
  c.sample.cfg_scale = 2.0           # classifier-free guidance scale
  c.sample.context_length = 256      # longest prompt sampling accepts

  if variant == "tiny":             # configs/shapes.py's tiny model and batch
    c.num_train_steps = 2
    c.log_every_steps = 1
    c.eval_every_steps = 2
    c.checkpoint_every_steps = 2
    c.eval_samples_per_digit = 0     # tests call mot.evaluate themselves
    c.eval_set_size = 2
    c.data.num_frames = 3            # short clips keep the test compile small
    c.data.seq_len = 192             # its longest example (generation) is 151 tokens
    c.sample.context_length = 192
    c.sample.steps = 2
  return c
