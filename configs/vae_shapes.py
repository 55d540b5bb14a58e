"""A small KL autoencoder (diffusers' AutoencoderKL layout) for 32x32 RGB scenes.

32x32x3 images -> 8x8x4 latents (f = 4), trained in minutes on a 2-core CPU, exported as
a diffusers folder WORKDIR/vae/ for the latent-diffusion path (mot.vae.load_diffusers).

  python -m mot.vae_train --config configs/vae_shapes.py --workdir runs/vae_shapes
  python -m mot.vae_train --config configs/vae_shapes.py:tiny --workdir /tmp/vae_tiny  # seconds

Variants (the part after ':'): "" (default) and "tiny" (for tests). Any field can be
overridden on the command line, e.g. --config.num_train_steps=500.
"""
import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"configs/vae_shapes.py has no variant {arg!r}: use '' or 'tiny'")
  c = ml_collections.ConfigDict()
  c.variant = variant                # which variant of this file built the config
  c.seed = 0                         # seeds init, the training pool, batch order and noise

  # ---- Optimisation. ----
  c.num_train_steps = 2000           # total optimizer steps
  c.batch_size = 32                  # images a step
  c.learning_rate = 2e-3             # peak AdamW learning rate
  c.warmup_steps = 100               # linear warm-up steps, then cosine decay
  c.min_lr_ratio = 0.05              # final learning rate as a fraction of the peak
  c.weight_decay = 0.0               # AdamW decoupled weight decay
  c.adam_b1 = 0.9                    # AdamW beta1
  c.adam_b2 = 0.99                   # AdamW beta2
  c.grad_clip_norm = 1.0             # global-norm gradient clipping

  # ---- Loss. ----
  c.recon_loss = "l2"                # "l2": mean squared error (what PSNR measures; L1 kept
                                     # the mostly black scenes black for hundreds of steps) |
                                     # "l1": mean |x - x_hat|
  c.kl_weight = 1e-5                 # weight of the mean KL per latent element
  c.latent_stats = "shift_and_scale"  # exported scaling: "shift_and_scale" (FLUX-style:
                                     # shift = mean, scale = 1/std of held-out latents) |
                                     # "scale" (SD-style: 1/RMS, no shift) | "none" (config.vae)

  # ---- Logging, evaluation and checkpoints. ----
  c.log_every_steps = 100            # metrics.jsonl interval
  c.eval_every_steps = 500           # held-out PSNR / KL interval (and at the end)
  c.checkpoint_every_steps = 500     # orbax checkpoint interval (and at the end)
  c.keep_checkpoints = 2             # newest checkpoints kept

  # ---- Data. ----
  c.data = ml_collections.ConfigDict()
  c.data.source = "shapes"           # images(split, n, seed) of mot.vae_train_lib.SOURCES:
                                     # "shapes" (training stream; held out: the evaluation
                                     # scenes, half of them with held-out pairs)
  c.data.image_size = 32             # images are image_size x image_size RGB
  c.data.num_train = 10000           # training pool drawn once (one permutation per epoch)
  c.data.num_heldout = 512           # held-out images for PSNR / KL and the latent statistics

  # ---- The autoencoder (diffusers AutoencoderKL fields). ----
  c.vae = ml_collections.ConfigDict()
  c.vae.block_out_channels = (16, 32, 32)  # channels per level; 3 levels: f = 4
  c.vae.layers_per_block = 1         # resnets per encoder block (decoder: one more)
  c.vae.latent_channels = 4          # SD-style 4-channel latents
  c.vae.norm_num_groups = 8          # GroupNorm groups (divides every channel count)
  c.vae.act_fn = "silu"              # activation
  c.vae.use_quant_conv = True        # 1x1 conv on the moments (SD-style)
  c.vae.use_post_quant_conv = True   # 1x1 conv before the decoder (SD-style)
  c.vae.mid_block_add_attention = True  # self-attention at the lowest resolution
  c.vae.scaling_factor = 1.0         # used as is only with latent_stats="none"
  c.vae.shift_factor = ml_collections.config_dict.placeholder(float)  # ... likewise
                                     # (None: no shift)

  if variant == "tiny":
    c.num_train_steps = 6
    c.batch_size = 4
    c.warmup_steps = 1
    c.log_every_steps = 2
    c.eval_every_steps = 3
    c.checkpoint_every_steps = 3
    c.data.num_train = 16
    c.data.num_heldout = 8
    c.vae.block_out_channels = (8, 8, 16)
    c.vae.norm_num_groups = 4
  return c
