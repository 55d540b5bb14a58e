"""Train a small KL autoencoder (VAE) and export it as a diffusers AutoencoderKL folder.

  python -m mot.vae_train --config configs/vae_shapes.py --workdir runs/vae_shapes
  python -m mot.vae_train --config configs/vae_shapes.py:tiny --workdir /tmp/vae_tiny

Resumes from the newest checkpoint in --workdir; writes WORKDIR/vae/ (config.json +
diffusion_pytorch_model.safetensors, read by mot.vae.load_diffusers and diffusers),
eval.json (held-out PSNR and KL), reconstructions.png and metrics.jsonl. All logic lives
in mot.vae_train_lib.
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  from mot import vae_train_lib  # imports JAX: after tune_malloc, and --help stays fast
  cli.configure_logging()
  with cli.clean_errors():
    vae_train_lib.train_and_evaluate(FLAGS.config, FLAGS.workdir)


def _define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/vae_shapes.py or configs/vae_shapes.py:tiny;"
      " override fields with --config.FIELD=VALUE.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics.jsonl and the "
                      "exported vae/ folder (created if missing; resumed if it holds a "
                      "checkpoint).")
  flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  _define_flags()
  cli.run(main)
