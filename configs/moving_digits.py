"""Moving digits: a small video + action world model on the bundled digits (no download).

Clips of T = 8 frames of one digit (same 1,500 / 297 split as configs/digits.py) moving
one pixel a frame on a 16x16 canvas, with the per-step action (dx, dy). One backbone
trains four tasks, plus caption -> first frame alone (see mot/data/moving_digits.py):
  video_generation  "a handwritten digit 3 moving right" -> clip (DM)
  video_first_frame the same caption -> the clip's frame 0 (DM; five examples a row)
  video_qa          clip + "Which digit moves, and where?" -> "3, right" (AR)
  video_frame_qa    one frame + "Which digit is this?" -> "3" (AR; six examples a row)
  world_model       first frame + actions -> the other 7 frames (DM)
  inverse_dynamics  clip -> the 7 actions (DM, action head)

  python train.py --config configs/moving_digits.py --workdir runs/moving
  python -m mot.evaluate --workdir runs/moving            # identity, motion error, video QA
  python sample.py --workdir runs/moving --mode generate \\
      --prompt "a handwritten digit 3 moving right" --out clips/
  python train.py --config configs/moving_digits.py:tiny --workdir /tmp/tiny   # for tests

Variants (the part after ':'): "" (default) and "tiny". Everything not set here is as in
configs/digits.py (optimiser, mesh, logging); any field can be overridden on the command
line, e.g. --config.num_train_steps=300.
"""
import ml_collections

from configs import digits as digits_config

CANVAS = 16      # canvas side in pixels (the digits are 8x8)
FRAMES = 8       # frames per clip
PATCH = 4        # 16x16 frame -> 4x4 grid of 4x4-pixel patches = 16 tokens a frame


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"configs/moving_digits.py has no variant {arg!r}: use '' or 'tiny'")
  c = digits_config.get_config(arg)  # shared fields, each documented there
  c.variant = variant                # which variant of this file built the config

  # ---- Optimisation (the run's time and figures: docs/results.md). ----
  c.num_train_steps = 3000           # total optimizer steps (half as many read and draw
                                     # clearly worse: docs/results.md)
  c.batch_size = 16                  # global batch in packed rows (one clip example a row)
  c.learning_rate = 2e-3             # peak AdamW learning rate
  c.warmup_steps = 100               # linear warm-up steps, then cosine decay
  c.eval_every_steps = 3000          # held-out losses and the video protocol (here: at the end)
  c.checkpoint_every_steps = 500     # orbax checkpoint interval (also at the end)

  # ---- Data. ----
  c.data = ml_collections.ConfigDict()
  c.data.dataset = "moving_digits"   # clips of the bundled digits, drawn per example
  c.data.num_frames = FRAMES         # frames per clip (a digit moves 1 px a frame)
  c.data.canvas_size = CANVAS        # frame side in pixels; background -1
  c.data.channels = 1                # grayscale frames
  c.data.video_layout = "frames"     # generated frames: one block a frame, teacher forced,
                                     # drawn frame by frame ("clip": all in one block; see
                                     # mot/data/moving_digits.py and docs/results.md)
  c.data.generation_start = "grid"   # caption -> clip training clips start on the patch
                                     # "grid" or "any"where (other tasks: anywhere)
  c.data.first_frame_weight = 1.0    # caption -> clip: loss weight of frame 0, the one frame
                                     # drawn from the caption alone (the rest move it)
  c.data.seq_len = 288               # row length: the longest example (video generation,
                                     # 15 frame blocks) is 278 tokens
  c.data.examples_per_row = 1        # one clip example a row (two would not fit)
  c.data.patch_size = PATCH          # frame -> (16/4)^2 = 16 patches of 16 pixels
  c.data.patch_dim = PATCH * PATCH   # width of the patches field (>= patch_size**2)
  c.data.shift_pixels = 0            # unused: the motion itself moves the digit around
  c.data.num_threads = 1             # grain threads preparing examples
  c.data.prefetch = 2                # batches grain prepares ahead of the step
  c.data.workers = 0                 # worker processes making batches (0: none; same batches)
  c.data.validation_size = 0         # tuning: > 0 trains without the last N training digits
                                     # and evaluates on their clips, never on the 297 held out
  c.data.task_weights = ml_collections.ConfigDict(  # task mix (docs/results.md compares
      {"video_generation": 0.35, "video_qa": 0.45, "world_model": 0.3,  # mixes)
       "inverse_dynamics": 0.15,
       "video_first_frame": 0.5,      # caption -> frame 0 only, 5 examples a row
       "video_frame_qa": 0.0})        # one frame -> "3", 6 a row (off: it raises QA but
                                      # costs identity and the world model)

  # ---- Model: as configs/digits.py, with wider patches. ----
  c.model.patch_dim = c.data.get_ref("patch_dim")  # P, shared with the data
  c.model.modality_patch_dims = (0, PATCH * PATCH, PATCH * PATCH, 2)  # text/image/video/action
  c.model.matmul_dtype = "same"      # float32 operands, as its results were trained (the
                                     # digits default's bf16 operands are not evaluated on
                                     # video yet: --config.model.matmul_dtype=bfloat16)

  # ---- Sampling defaults (sample.py, evaluation). ----
  c.sample.steps = 24                # denoising steps
  c.sample.cfg_scale = 2.0           # guidance: the best identity before motion error rises
                                     # (the scan is in docs/results.md)
  c.sample.reason_shifts = 0         # clips are read as given (test-time shifts: images only)

  if variant == "tiny":
    c.num_train_steps = 2
    c.batch_size = 4
    c.log_every_steps = 1
    c.eval_every_steps = 2
    c.checkpoint_every_steps = 2
    c.data.num_frames = 3            # short clips keep the test compile small
    c.data.seq_len = 128             # its longest example (generation) is 118 tokens
    c.data.task_weights.video_first_frame = 0.0  # 5 of its 54-token examples need 270
    c.sample.steps = 3
  return c
