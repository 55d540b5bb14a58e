"""Subprocess half of tests/test_sample_mesh.py: one checkpoint sampled on one device and
on a (2,2,2) mesh of 8 fake CPU devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/_sample_mesh_worker.py \
      WORKDIR OUT

Trains 2 steps of tests/_sharding_worker.py's equality config (every sharded dimension
divisible) on one device and checkpoints them as train.py does, then draws images,
answers questions and runs sample.py's logic with `Pipeline.from_workdir(WORKDIR)` and
`Pipeline.from_workdir(WORKDIR, mesh_shape="(2,2,2)")`. Prints one JSON line; the test
judges.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# First: importing the sharding worker sets the 8 fake devices (before JAX is imported).
from tests._sharding_worker import boxed_state, equality_config, sharding_mismatches  # noqa: E402,I001

import jax  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from mot import checkpoint as ckpt_lib  # noqa: E402
from mot import sample_cli, sharding, train_lib  # noqa: E402
from mot import step as step_lib  # noqa: E402
from mot.data import digits  # noqa: E402
from mot.pipeline import Pipeline  # noqa: E402

MESH = "(2,2,2)"
PROMPTS = ["a handwritten digit 3", "a handwritten digit 7"]


def make_checkpoint(workdir: str) -> None:
  config = equality_config("(1,1,1)")
  t = step_lib.build_training(config, jax.devices()[:1])
  data_iter = iter(train_lib.process_train_dataset(config, t.mesh))
  state = t.state
  with jax.set_mesh(t.mesh):
    for _ in range(2):
      batch = sharding.global_batch(t.mesh, next(data_iter), config.batch_size)
      state, _ = t.p_train_step(state, batch, t.step_rng)
  manager = ckpt_lib.make_manager(workdir)
  ckpt_lib.save(manager, 2, {"state": state, "rng": t.step_rng}, data_iter, config.to_dict(),
                {"history": []})
  manager.close()


def draws(pipe: Pipeline) -> dict:
  images = digits.to_pixels(digits.load_digits_split()[0][:6])  # 0..16, as load_digits
  return {
      "generated": pipe.generate(PROMPTS, num_samples=2, steps=4, cfg_scale=2.0, seed=3),
      "answers": pipe.reason(images=images, shifts=0, max_new_tokens=4),
  }


def cli_images(workdir: str, out: str, mesh_shape) -> np.ndarray:
  sample_cli.run_sample(sample_cli.Request(
      workdir=workdir, mode="generate", prompts=PROMPTS, out=out, steps=4, seed=5,
      mesh_shape=mesh_shape), stdout=open(os.devnull, "w"))
  names = sorted(n for n in os.listdir(out) if n.endswith(".png") and n != "grid.png")
  return np.stack([np.asarray(Image.open(os.path.join(out, n)), np.float32) for n in names])


def main(workdir: str, out: str):
  make_checkpoint(workdir)
  one = Pipeline.from_workdir(workdir)
  mesh = Pipeline.from_workdir(workdir, mesh_shape=MESH)
  rules = sharding.logical_rules(mesh.config)
  errors, named = sharding_mismatches(boxed_state().params, mesh.params, mesh.mesh, rules)
  whole = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_flatten_with_path(
      mesh.params)[0] if x.addressable_shards[0].data.shape == x.shape and x.size > 1024]
  a, b = draws(one), draws(mesh)
  cli_one = cli_images(workdir, os.path.join(out, "one"), None)
  cli_mesh = cli_images(workdir, os.path.join(out, "mesh"), MESH)
  print("RESULT " + json.dumps({
      "mesh_devices": mesh.mesh.size, "sharding_errors": errors, "named_leaves": named,
      "whole_large_leaves": whole,
      "generated_max_abs_diff": float(np.max(np.abs(a["generated"] - b["generated"]))),
      "generated_shape": list(a["generated"].shape),
      "answers": [a["answers"], b["answers"]],
      "cli_images": len(cli_one),
      "cli_max_abs_diff": float(np.max(np.abs(cli_one - cli_mesh))),
  }))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
