"""Train the unified AR + diffusion model.

  python train.py --config configs/digits.py --workdir runs/digits
  python train.py --config configs/digits.py --workdir runs/digits --config.num_train_steps=300

Resumes from the newest checkpoint in --workdir. All logic lives in mot.train_lib.
On Linux it first tunes glibc malloc so that XLA's per-step CPU scratch memory is reused,
not page-faulted afresh (mot.cli.tune_malloc; MOT_MALLOC=default turns that off, and a
tcmalloc preloaded with LD_PRELOAD is left alone; docs/performance.md).
"""
from absl import flags
from ml_collections import config_flags

from mot import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/digits.py or configs/digits.py:tiny; "
    "override fields with --config.FIELD=VALUE.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics.jsonl and samples "
                    "(created if missing; resumed if it holds a checkpoint).")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 "
                    "(or set JAX_COORDINATOR_ADDRESS).")
flags.DEFINE_integer("num_processes", None, "Multi-host: total number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: index of this process.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag (see --help)")
  cli.maybe_initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                   FLAGS.process_id)
  from mot import train_lib  # after jax.distributed: importing is cheap, initializing not
  cli.configure_logging()
  with cli.clean_errors():
    train_lib.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  cli.run(main)
