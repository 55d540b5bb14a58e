"""Shapes (issue #39): GenEval- and CLEVR-style compositional benchmark on procedural scenes.

32x32 RGB scenes of 1-4 flat-coloured squares, circles and triangles (docs/shapes.md); one
backbone trains caption -> image (DM), image -> answer for every question type and image
-> caption (AR), text only, and think-then-draw ("draw three of the shape that is red:" ->
"three red circles" -> an image of them). The held-out pairs blue triangle, yellow circle
and magenta square never appear in training; `mot.eval_shapes` scores them apart.

  python train.py --config configs/shapes.py --workdir runs/shapes
  python -m mot.evaluate --workdir runs/shapes          # GenEval-style, VQA, captions, FD
  python sample.py --workdir runs/shapes --mode generate --prompt "a red square" \\
      --prompt "two green circles" --num_samples 4 --out samples/
  python train.py --config configs/shapes.py:tiny --workdir /tmp/tiny   # for tests

Variants (the part after ':'): "" (default) and "tiny". Everything not set here is as in
configs/digits.py (optimiser, mesh, logging); any field can be overridden on the command
line, e.g. --config.num_train_steps=600 --config.model.experts=mode.
"""
import ml_collections

from configs import digits as digits_config

IMAGE = 32       # scene side in pixels (the benchmark's contract)
PATCH = 8        # 32x32 scene -> 4x4 grid of 8x8-pixel patches = 16 tokens an image
CHANNELS = 3     # RGB
PATCH_DIM = PATCH * PATCH * CHANNELS  # 192 values an image patch


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"configs/shapes.py has no variant {arg!r}: use '' or 'tiny'")
  c = digits_config.get_config(arg)  # shared fields, each documented there
  c.variant = variant                # which variant of this file built the config

  # ---- Optimisation (whole run, evaluation included: docs/results.md §6). ----
  c.num_train_steps = 1800           # total optimizer steps: the run fills about three quarters
                                     # of the 30-minute budget on 2 cores (docs/results.md §6)
  c.batch_size = 16                  # global batch in packed rows (8 examples a row)
  c.learning_rate = 2e-3             # peak AdamW learning rate
  c.warmup_steps = 100               # linear warm-up steps, then cosine decay
  c.ema_decay = 0.998                # EMA of the parameters used for sampling (horizon
                                     # ~500 steps: the last part of the run)
  c.ar_loss_weight = 1.0             # weight of the next-token cross-entropy (answers and
                                     # captions are many tokens here, unlike one digit)
  c.cond_drop_prob = 0.1             # P(conditioning blanked) per example, for CFG
  c.log_every_steps = 50             # metrics.jsonl / progress-bar interval
  c.eval_every_steps = 1800          # held-out losses and the shapes protocol (at the end)
  c.checkpoint_every_steps = 250     # orbax checkpoint interval (also at the end)
  c.eval_samples_per_digit = 1       # shapes: images per evaluation prompt (0: no protocol)
  c.eval_set_size = 32               # items per evaluation set: per GenEval category, per
                                     # question type, captions and think-then-draw, each
                                     # in-distribution and held-out (mot.eval_shapes)

  # ---- Text: bytes plus one id per word of the Shapes grammar (mot.tokenizer). ----
  c.tokenizer = "bytes+shapes"       # an answer is a token or a few, not one a letter, so
                                     # more examples fit a row (docs/results.md §6)
  c.model.vocab_size = 358           # 272 byte-tokenizer ids + 43 words x (with, without
                                     # a leading space)

  # ---- Data. ----
  c.data = ml_collections.ConfigDict()
  c.data.dataset = "shapes"          # procedural scenes drawn per example (mot.data.shapes)
  c.data.image_size = IMAGE          # scene side in pixels
  c.data.channels = CHANNELS         # RGB
  c.data.shapes = ml_collections.ConfigDict()  # what scenes hold (mot.data.shapes_scene)
  c.data.shapes.min_size = 7         # smallest object box side in pixels
  c.data.shapes.max_size = 11        # largest object box side in pixels
  c.data.shapes.max_objects = 4      # objects per scene (the captions count to four)
  c.data.shapes.colors = ("red", "green", "blue", "yellow", "magenta", "cyan")  # palette
  c.data.shapes.shapes = ("square", "circle", "triangle")  # shapes drawn
  c.data.shapes.heldout_pairs = (    # (colour, shape) pairs never trained on
      ("blue", "triangle"), ("yellow", "circle"), ("magenta", "square"))
  c.data.seq_len = 320               # row length in tokens (the longest examples, VQA with
                                     # three questions and think-then-draw, are 51-55;
                                     # several examples are packed a row)
  c.data.examples_per_row = 8        # examples packed per row (a few rows overflow and drop
                                     # their last example: docs/shapes.md)
  c.data.vqa_questions = 3           # questions (with answers) a shapes_vqa example asks of
                                     # its image: more answers for the same image tokens
                                     # (docs/results.md §6)
  c.data.relation_trace = False      # relation answers first write both objects' places,
                                     # "red circle 2, blue square 7: yes"; sample.py and
                                     # evaluation keep what follows ": " (shapes_think)
  c.data.layout_plan = False         # a caption to draw is followed by its layout plan,
                                     # "a red circle: red circle 1 5", which the AR head
                                     # writes before the DM head draws (shapes_think)
  c.data.layout_canvas = False       # with layout_plan: the plan is also drawn as a canvas
                                     # (a colour mark at each planned place), a clean image
                                     # the DM head reads before drawing (shapes_think)
  c.data.patch_size = PATCH          # 32x32 scene -> (32/8)^2 = 16 patches
  c.data.patch_dim = PATCH_DIM       # width of the patches field (>= patch_size**2 * 3)
  c.data.shift_pixels = 0            # unused: scenes are drawn anew for every example
  c.data.validation_size = 0         # digits only (shapes evaluate on fixed held-out sets)
  c.data.num_threads = 1             # grain threads preparing examples
  c.data.prefetch = 2                # batches grain prepares ahead of the step
  c.data.workers = 0                 # worker processes making batches (0: none; same batches)
  c.data.task_weights = ml_collections.ConfigDict({  # task mix (mot/data/shapes_tasks.py)
      "shapes_generation": 0.35,     # caption -> image (DM)
      "shapes_vqa": 0.35,            # image -> answer, five question types (AR)
      "shapes_caption": 0.1,         # image -> "Describe this image." caption (AR)
      "shapes_text": 0.05,           # relation caption "means" its converse (AR)
      "shapes_think_draw": 0.15,     # context image, prompt -> answer (AR) -> image (DM)
      "shapes_order": 0.0})          # "Which is left of the other, ...?" -> an object: a
                                     # curriculum for relation questions, outside the
                                     # evaluated grammar (mot.data.shapes_order)

  # ---- Model: narrower than configs/digits.py (the CPU budget), with RGB patches. ----
  c.model.d_model = 192              # residual width
  c.model.num_layers = 4             # transformer blocks
  c.model.num_heads = 4              # query heads
  c.model.num_kv_heads = 2           # key/value heads (grouped-query attention)
  c.model.head_dim = 48              # per-head width
  c.model.mlp_dim = 576              # SwiGLU hidden width
  c.model.rope_sections = (8, 8, 8)  # M-RoPE frequencies for (t, h, w); sum = head_dim/2
  c.model.time_embed_dim = 192       # sinusoidal timestep features
  c.model.patch_dim = c.data.get_ref("patch_dim")  # P, shared with the data
  c.model.modality_patch_dims = (0, PATCH_DIM, PATCH_DIM, 2)  # text/image/video/action
  c.model.dm_prediction = "x"        # the DM head predicts x0: a 192-wide patch is as wide as
                                     # the model, and a velocity head paints blocks there
                                     # (docs/results.md §6, docs/design.md §4)
  c.model.patch_mixing = "neighbours"  # patches read and write their 3x3 grid neighbours,
                                     # so objects are no longer cut at patch borders
                                     # (docs/results.md §6 has the figures)

  # ---- Sampling defaults (sample.py, evaluation). ----
  c.sample.steps = 24                # denoising steps
  c.sample.cfg_scale = 1.0           # classifier-free guidance scale (1 = conditional only):
                                     # guidance only moved samples off the data here
                                     # (Fréchet distance; docs/results.md §6)
  c.sample.context_length = 256      # longest prompt + answer sampling accepts
  c.sample.reason_shifts = 0         # scenes are read as given (no test-time shifts)
  c.sample.plan_temperature = 1.0    # layout plans (data.layout_plan) are drawn from the
                                     # AR head's distribution, as images from the DM's

  if variant == "tiny":
    c.num_train_steps = 2
    c.batch_size = 4
    c.log_every_steps = 1
    c.eval_every_steps = 2
    c.checkpoint_every_steps = 2
    c.eval_samples_per_digit = 0     # tests call mot.evaluate themselves
    c.eval_set_size = 2
    c.data.seq_len = 128             # one think-then-draw example (122 tokens) a row
    c.data.examples_per_row = 1
    c.data.vqa_questions = 1         # so that one VQA example fits the 128-token row
    c.sample.context_length = 128
    c.sample.steps = 3
    c.model.d_model = 64             # the digits' tiny model (seconds to compile)
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 32
    c.model.rope_sections = (4, 6, 6)
    c.model.mlp_dim = 128
    c.model.time_embed_dim = 64
  return c
