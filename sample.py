"""Sample from a trained workdir: read images (AR head), draw them (DM head), or both.

  python sample.py --workdir runs/digits --mode reason --images a.png digits/ --json
  python sample.py --workdir runs/digits --mode generate --prompt "a handwritten digit 7" \\
      --num_samples 8 --out samples/
  python sample.py --workdir runs/digits --mode think_then_draw \\
      --prompt "draw the digit after 3:" --out samples/

Video checkpoints (configs/moving_digits.py): generate writes one GIF per clip; reason
reads each --images item (a GIF, or a folder of frame images) as one clip; --actions
with --images FIRST_FRAME.png runs the world model (action-conditioned prediction):
  python sample.py --workdir runs/moving --mode generate \\
      --prompt "a handwritten digit 3 moving right" --num_samples 4 --out clips/
  python sample.py --workdir runs/moving --mode reason --images clips/clip_0000.gif
  python sample.py --workdir runs/moving --mode generate --images first.png \\
      --actions right,right,right,down,down,down,down --out predicted/

On a mesh (the parameters read sharded as training shards them; 8 fake CPU devices with
XLA_FLAGS=--xla_force_host_platform_device_count=8):
  python sample.py --workdir runs/digits --mode generate --prompt "a handwritten digit 7" \
      --out samples/ --mesh_shape "(2,2,2)"

All logic lives in mot.sample_cli (the command) and mot.pipeline (`mot.Pipeline`).
"""
from absl import flags

from mot import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Training workdir; its newest checkpoint (EMA weights) "
                    "is used.")
flags.DEFINE_enum("mode", "reason", ["reason", "generate", "think_then_draw"],
                  "reason: answer about images; generate: draw images; think_then_draw: "
                  "answer, then draw the answer.")
flags.DEFINE_multi_string("images", [], "Image files and folders to reason about "
                          "(--mode reason; any size and colour mode; a folder written by --mode "
                          "generate is read without its grid.png). Video checkpoints: "
                          "each item is one clip (a GIF or a folder of frames); with "
                          "--actions, the first frame(s) to predict from.")
flags.DEFINE_multi_string("prompt", [], "Prompt text; repeat for several (reason default: "
                          "the question the run trained on, e.g. 'What digit is this?').")
flags.DEFINE_bool("json", False, "Print one JSON object per answer or sample.")
flags.DEFINE_integer("num_samples", 1, "Images drawn per prompt (generate, think_then_draw).")
flags.DEFINE_string("out", None, "Output folder for the PNGs, grid.png and manifest.json "
                    "(generate, think_then_draw).")
flags.DEFINE_integer("steps", None, "Denoising steps (default: the config's sample.steps).")
flags.DEFINE_float("cfg_scale", None, "Classifier-free guidance scale; 1 = conditional only "
                   "(default: the config's sample.cfg_scale).")
flags.DEFINE_enum("sampler", None, ["euler", "heun"], "ODE sampler (default: the config's "
                  "sample.sampler).")
flags.DEFINE_string("actions", None, "Video checkpoints, --mode generate: the action chunk "
                    "for action-conditioned prediction from --images FIRST_FRAME.png. "
                    "Either comma-separated steps of one pixel, from right, left, up, "
                    "down, stay (e.g. right,right,up), or a .json file ([[dx, dy], ...]) "
                    "or .npy file (float [K, 2]) of (dx, dy) pixel steps, y pointing down. "
                    "K actions give a clip of K + 1 frames.")
flags.DEFINE_integer("num_frames", None, "Video checkpoints, --mode generate from a "
                     "--prompt: frames per clip (default: the config's data.num_frames).")
flags.DEFINE_integer("reason_shifts", None, "--mode reason on images: read each image in "
                     "its (2s+1)^2 views shifted by up to s pixels (0-2) and answer from "
                     "their mean log-probabilities (default: the config's "
                     "sample.reason_shifts; 0 reads the image once).")
flags.DEFINE_integer("max_new_tokens", None, "--mode reason / think_then_draw: most tokens "
                     "an answer may have (reason default: the config's sample.max_new_tokens;"
                     " user data: the run's longest caption and its EOS; think_then_draw: 8).")
flags.DEFINE_integer("seed", 0, "Seed of the noise and of token sampling; fixed seed, same output.")
flags.DEFINE_string("mesh_shape", None, "Sample on a mesh of this shape over the config's mesh "
                    "axes, e.g. '(2,2,2)' (data, fsdp, tensor); one -1 takes the remaining "
                    "devices. The parameters are read sharded as training shards them. "
                    "Default: one device.")
flags.mark_flag_as_required("workdir")


def main(argv):
  images = list(FLAGS.images)
  if len(argv) > 1:  # `--images A.png B.png DIR/`: the values after the first are positional.
    if not images:
      cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
    images += argv[1:]
  cli.configure_logging()  # stdout stays clean for --json; library chatter filtered
  with cli.clean_errors():
    from mot import sample_cli  # here, not at the top: --help and flag errors skip JAX's import
    sample_cli.run_sample(sample_cli.Request(
        workdir=FLAGS.workdir, mode=FLAGS.mode, images=images, prompts=FLAGS.prompt,
        as_json=FLAGS.json, num_samples=FLAGS.num_samples, out=FLAGS.out, steps=FLAGS.steps,
        cfg_scale=FLAGS.cfg_scale, sampler=FLAGS.sampler, seed=FLAGS.seed,
        actions=FLAGS.actions, num_frames=FLAGS.num_frames,
        reason_shifts=FLAGS.reason_shifts, max_new_tokens=FLAGS.max_new_tokens,
        mesh_shape=FLAGS.mesh_shape))

if __name__ == "__main__":
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  cli.run(main)
