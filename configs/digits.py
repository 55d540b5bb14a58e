"""Default run: the unified model on scikit-learn's bundled 8x8 digits (no download).

Both heads train on one backbone from one task mix: caption -> image (DM), image ->
answer (AR), text only (AR) and interleaved "draw the digit after 3:" -> "4" (AR) -> an
image of a 4 (DM), which `sample.py --mode think_then_draw` samples.

  python train.py --config configs/digits.py --workdir runs/digits
  python train.py --config configs/digits.py:tiny --workdir /tmp/tiny   # seconds, for tests

Variants (the part after ':'): "" (default) and "tiny". Any field can be overridden on the
command line, e.g. --config.num_train_steps=300 --config.model.num_layers=2.
"""
import ml_collections

IMAGE = 8  # the digits are 8x8 pixels


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"configs/digits.py has no variant {arg!r}: use '' or 'tiny'")
  c = ml_collections.ConfigDict()
  c.variant = variant                # which variant of this file built the config
  c.seed = 0                         # seeds init, data order, noise and dropout
  c.tokenizer = "bytes"              # "bytes" (mot.tokenizer.ByteTokenizer, 272 ids) or the
                                     # path of a tokenizer.json (a converted model's)
  c.init_from = ""                   # a workdir whose newest weights, model fields and
                                     # tokenizer start this run (mot.warm_start); "": none

  # ---- Optimisation. ----
  c.num_train_steps = 1200           # total optimizer steps (the run's time and figures:
                                     # docs/results.md)
  c.batch_size = 96                  # global batch in rows (one example each: 96 examples)
  c.learning_rate = 2e-3             # peak AdamW learning rate
  c.warmup_steps = 100               # linear warm-up steps, then cosine decay
  c.min_lr_ratio = 0.05              # final learning rate as a fraction of the peak
  c.weight_decay = 0.01              # AdamW decoupled weight decay (kernels only)
  c.adam_b1 = 0.9                    # AdamW beta1
  c.adam_b2 = 0.98                   # AdamW beta2
  c.grad_clip_norm = 1.0             # global-norm gradient clipping
  c.freeze_understanding = False     # experts="mode": train only the generation path (BAGEL)
  c.ema_decay = 0.999                # EMA of the parameters used for sampling
  c.max_nonfinite_steps = 10         # stop after this many non-finite updates in a row

  # ---- Losses. ----
  c.ar_loss_weight = 3.0             # weight of the next-token cross-entropy (the answer is
                                     # one token in ~25 AR targets: 3 makes reading keep up)
  c.ar_label_smoothing = 0.0         # label smoothing of the AR targets while training (the
                                     # logged ar_loss stays the plain cross-entropy)
  c.dm_loss_weight = 1.0             # lambda: weight of the DM loss
  c.dm_loss_space = "velocity"       # the DM loss's squared error: of the velocity, or of
                                     # the clean estimate x0 = x_t - t v ("x0": t^2 times
                                     # the velocity error, so high noise weighs more)
  c.cond_drop_prob = 0.1             # P(caption blanked) per example, for CFG
  c.timestep_logit_mean = 0.0        # logit-normal timestep sampling (SD3): mean
  c.timestep_logit_std = 1.0         # ... and standard deviation
  c.resolution_shift_tokens = 0      # resolution-dependent timestep shift (SD3): training's t
                                     # and sampling's time grid move toward noise by
                                     # sqrt(tokens of an image / this); 0: off (mot/latent.py)

  # ---- Logging and checkpoints. ----
  c.log_every_steps = 50             # metrics.jsonl / progress-bar interval
  c.eval_every_steps = 1200          # held-out evaluation interval (here: at the end)
  c.eval_samples_per_digit = 20      # images per digit for the accuracy/Fréchet protocol (0: off)
  c.checkpoint_every_steps = 250     # orbax checkpoint interval (also at the end)
  c.keep_checkpoints = 3             # newest checkpoints kept
  c.progress_bar = True              # tqdm bar on process 0

  # ---- Mesh (README, "Scaling out"). ----
  c.mesh_axes = ("data", "fsdp", "tensor")   # named mesh axes
  c.mesh_shape = "(-1,1,1)"          # sizes per axis; one -1 takes the remaining devices
  c.logical_axis_rules = (           # logical axis name -> mesh axis (or None)
      ("activation_batch", ("data", "fsdp")),
      ("activation_length", None),
      ("activation_embed", None),
      ("activation_heads", "tensor"),
      ("activation_kv", None),
      ("activation_mlp", "tensor"),
      ("layers", None),
      ("embed", "fsdp"),
      ("embed_in", None),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("kv", None),
      ("kv_pair", None),
      ("mlp", "tensor"),
      ("mlp_pair", None),
      ("vocab", "tensor"),
      ("modality", None),
      ("neighbour", None),             # model.patch_mixing's 8 grid neighbours
      ("patch", None),
      ("time", None),
      ("norm", None),
      ("expert", None),                # MoT experts' leading weight axis (model.experts)
  )

  # ---- Data. ----
  c.data = ml_collections.ConfigDict()
  c.data.dataset = "digits"          # scikit-learn's bundled digits (1500 train / 297 held out)
  c.data.image_size = IMAGE          # side of the bundled digits (fixed at 8)
  c.data.channels = 1                # grayscale (3: RGB)
  c.data.seq_len = 44                # row length in tokens: the longest example (44)
  c.data.examples_per_row = 1        # examples per row: one, so no attention is spent on
                                     # scores between examples that the mask throws away
  c.data.patch_size = 2              # 8x8 image -> (8/p)^2 patches of p*p pixels
  c.data.patch_dim = 4               # width of the patches field (>= patch_size**2)
  c.data.shift_pixels = 1            # random shift augmentation for the reading task
  c.data.rotate_degrees = 0.0        # ... random rotation up to ± this many degrees (off:
                                     # it did not raise held-out reading, docs/results.md)
  c.data.scale_jitter = 0.0          # ... random zoom by 1 ± this
  c.data.cutout_size = 0             # ... a random square of this many pixels a side
                                     # erased to background (0: off)
  c.data.cutout_prob = 0.5           # ... in this fraction of the reading images
  c.data.elastic_alpha = 0.0         # ... elastic distortion, RMS displacement in pixels
                                     # (0: off; no gain at 0.5, docs/results.md)
  c.data.elastic_sigma = 1.5         # ... its smoothness: Gaussian blur of the field, pixels
  c.data.elastic_prob = 0.5          # ... in this fraction of the reading images
  c.data.read_window = 0             # reading images: each patch token also carries the
                                     # window x window pixels around it (an overlapping,
                                     # conv-stem-like patch embedding; needs patch_dim >=
                                     # window**2; 0: plain patches; no gain beyond seed
                                     # noise, docs/results.md)
  c.data.validation_size = 0         # tuning: > 0 trains without the last N training digits
                                     # and evaluates on them, never on the 297 held out
  c.data.num_threads = 1             # grain threads preparing examples
  c.data.prefetch = 2                # batches grain prepares ahead of the step
  c.data.workers = 0                 # worker processes making batches (0: none; same batches)
  c.data.task_weights = ml_collections.ConfigDict(  # task mix (interleaved: think, then draw)
      {"generation": 0.35, "reasoning": 0.45, "text": 0.1, "interleaved": 0.1})

  # ---- The space the DM head denoises (mot/latent.py, docs/design.md §9). ----
  c.latent = ml_collections.ConfigDict()
  c.latent.vae = ""                  # "": image pixels; a diffusers AutoencoderKL folder: its
                                     # scaled latents (with data.latent_cache)

  # ---- Model (becomes the frozen mot.config.ModelConfig). ----
  c.model = ml_collections.ConfigDict()
  c.model.vocab_size = 272           # token ids: the byte tokenizer's 272 (mot/tokenizer.py)
  c.model.d_model = 256              # residual width
  c.model.num_layers = 4             # transformer blocks
  c.model.num_heads = 4              # query heads
  c.model.num_kv_heads = 2           # key/value heads (grouped-query attention)
  c.model.head_dim = 64              # per-head width
  c.model.mlp_dim = 768              # SwiGLU hidden width
  c.model.patch_dim = c.data.get_ref("patch_dim")  # P, shared with the data
  c.model.modality_patch_dims = (0, 4, 4, 2)  # real patch dims of text/image/video/action
  c.model.rope_sections = (8, 12, 12)  # M-RoPE frequencies for (t, h, w); sum = head_dim/2
  c.model.rope_theta = 10000.0       # RoPE base
  c.model.rope_interleaved = True    # Qwen3-VL layout: every axis gets high frequencies
                                     # (docs/design.md §2)
  c.model.qkv_bias = False           # biases on the q/k/v projections (Qwen2 / Qwen2.5 have them)
  c.model.qk_norm = True             # RMSNorm of every query and key head (Qwen3; Qwen2: off)
  c.model.tie_embeddings = False     # the AR head unembeds with the token embedding table
  c.model.time_embed_dim = 256       # sinusoidal timestep features
  c.model.norm_eps = 1e-6            # RMSNorm epsilon
  c.model.dropout_rate = 0.0         # residual dropout while training (sampling: none)
  c.model.experts = "shared"         # "shared" | "mode" | "modality" weight tying
  c.model.expert_impl = "auto"       # grouped matmul: "tiled" | "ragged" (ragged_dot) | "auto"
  c.model.expert_tile = 256          # rows per tile of the "tiled" grouped matmul
  c.model.init_generation_from_understanding = False  # experts start as copies of expert 0
  c.model.scan_layers = True         # nn.scan over blocks (stacked weights, faster compiles)
  c.model.scan_unroll = -1           # blocks per scan-loop iteration; -1: all of them, i.e.
                                     # straight-line code with the scan's weights and bits
                                     # (faster on a CPU: docs/performance.md)
  c.model.remat_policy = "none"      # "none" or a jax.checkpoint_policies name
  c.model.dtype = "float32"          # compute dtype (bf16 activations are slower on a CPU)
  c.model.matmul_dtype = "bfloat16"  # Linear matmul operands: bf16, with f32 accumulation,
                                     # activations and gradients (a TPU's default precision;
                                     # faster on CPUs with AVX512-BF16 or AMX:
                                     # docs/performance.md); "same": the compute dtype
  c.model.param_dtype = "float32"    # parameter dtype
  c.model.attention_impl = "auto"    # "auto": splash on a TPU, cuDNN flash attention on a GPU
                                     # in bf16, blockwise from attention_blockwise_min_length
                                     # keys, else XLA; or "xla" | "cudnn" | "blockwise" | "splash"
  c.model.attention_block_q = 512    # blockwise/splash: queries per tile
  c.model.attention_block_kv = 512   # blockwise/splash: keys per tile
  c.model.attention_blockwise_min_length = 1024  # "auto": blockwise from this many keys a row
                                     # (docs/performance.md §7)
  c.model.dm_prediction = "velocity"  # DM head output: "velocity" (noise - x0) or "x" (x0,
                                     # turned into the velocity it implies; docs/design.md §4)
  c.model.dm_min_time = 0.05         # "x": v = (x_t - x0) / max(t, this), bounding the
                                     # loss weight near t = 0
  c.model.media_pos_embed = "none"   # absolute (frame, row, col) of media tokens in their
                                     # block: "none" (M-RoPE only) or "sincos" (DiT's fixed
                                     # grid embedding; mot.media_positions)
  c.model.patch_mixing = "none"      # "neighbours": an image/video patch's input projection
                                     # and DM output also span its 3x3 grid neighbours, as
                                     # a convolution (mot.patch_neighbours); "none": each
                                     # patch alone, the rest left to attention

  # ---- Sampling defaults (sample.py, evaluation). ----
  c.sample = ml_collections.ConfigDict()
  c.sample.steps = 32                # denoising steps
  c.sample.sampler = "euler"         # "euler" | "heun"
  c.sample.cfg_scale = 1.0           # classifier-free guidance scale (1 = conditional only)
  c.sample.shift = 1.0               # time-grid shift (SD3): > 1 spends more steps near noise
  c.sample.context_length = 128      # longest prompt + answer sampling accepts (at least
                                     # data.seq_len; positions restart in every packed
                                     # example, so rows of 44 or 128 train the same ones)
  c.sample.reason_shifts = 1         # reading: answer from the 9 views of the image shifted
                                     # by up to 1 px (the training shifts); 0: one view
  c.sample.max_new_tokens = 16       # reading: most answer tokens sample.py decodes
                                     # (--max_new_tokens overrides; stops at EOS)

  if variant == "tiny":
    c.num_train_steps = 4
    c.batch_size = 8
    c.data.seq_len = 128             # 3 examples a row: a third of the rows, so the
    c.data.examples_per_row = 3      # held-out loss takes 25 steps, not 75 (tests' time)
    c.warmup_steps = 1
    c.log_every_steps = 2
    c.eval_every_steps = 4
    c.eval_samples_per_digit = 0     # tests call mot.evaluate themselves
    c.checkpoint_every_steps = 2
    c.progress_bar = False
    c.model.d_model = 64
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 32
    c.model.rope_sections = (4, 6, 6)
    c.model.mlp_dim = 128
    c.model.time_embed_dim = 64
    c.sample.steps = 4
  return c
