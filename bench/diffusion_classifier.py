"""Does the DM head read the digits the AR head misreads? (docs/results.md §2.)

  python -m bench.diffusion_classifier --workdir runs/digits [--draws 32] [--seed 0]
      [--num_images N]

The generation head as a classifier (Li et al. 2023, "Your diffusion model is secretly
a zero-shot classifier"): each held-out digit x0 is noised at `draws` (t, noise) pairs,
x_t = (1 - t) x0 + t noise, and the model's velocity is compared with the true one
(noise - x0) under each caption "a handwritten digit k"; the caption with the smallest
mean squared error is the answer. Every caption sees the same draws (only the caption
differs), and the times are stratified over (0, 1), so the comparison is paired.

It is a second reader of the same checkpoint that shares no decoding with the AR head:
if it misses the same held-out digits (`both_misread`), those digits are hard for what
the model learned of the training writers, not for the AR read-out. Prints one JSON line:
`accuracy` (the DM head as classifier), `misread` [{index, label, answer}],
`reasoning_accuracy` and `reasoning_misread` (the AR head as mot.evaluate reads, with
config.sample.reason_shifts), `both_misread` (indices), `draws`, `seconds`.
"""
from __future__ import annotations

import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
MAX_ROWS = 320  # (image, caption) rows per jitted call: 32 images x 10 captions


def _define_flags() -> None:
  """Flags only when run as a script (tests import the module beside other benches)."""
  flags.DEFINE_string("workdir", None, "Digits training workdir (newest checkpoint, EMA).")
  flags.DEFINE_integer("draws", 32, "(t, noise) draws per held-out digit, shared by the "
                       "ten captions.")
  flags.DEFINE_integer("seed", 0, "Seed of the draws.")
  flags.DEFINE_integer("num_images", None, "Read only the first N held-out digits "
                       "(default: all 297).")


def noise_draws(seed: int, image_index: int, draws: int, shape: tuple[int, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
  """(t float32 [draws], noise float32 [draws, *shape]) of one image: stratified times
  (one in each of `draws` equal bins of (0, 1)); they depend only on (seed, image_index),
  not on which other images are scored with it."""
  rng = np.random.default_rng([seed, image_index])
  t = (np.arange(draws) + rng.uniform(size=draws)) / draws
  return t.astype(np.float32), rng.standard_normal((draws, *shape)).astype(np.float32)


@functools.partial(jax.jit, static_argnums=0)
def _errors(model, params, prefix, block, x0, noise, t, dims):
  """float [draws, B]: squared velocity error of every row at each draw (x0 [B, M, P],
  noise [draws, B, M, P], t [draws, B])."""
  from mot import sampling
  keep = jnp.ones(prefix["tokens"].shape, bool)
  velocity = sampling.cached_block_velocity(model, params, prefix, block, keep)

  def one(draw):
    eps, t_row = draw
    x_t = (1.0 - t_row[:, None, None]) * x0 + t_row[:, None, None] * eps
    # Each image's rows have their own t (its draws); the model takes one t per token.
    v = velocity(x_t, t_row[:, None])
    return jnp.sum(jnp.square((v - (eps - x0)) * dims), axis=(1, 2))

  return jax.lax.map(one, (noise, t))


def caption_errors(pipe, images: np.ndarray, captions: list[str], draws: int = 32,
                   seed: int = 0, first_index: int = 0) -> np.ndarray:
  """float [N, K]: image i's mean squared velocity error under caption k, over the
  image's `noise_draws(seed, first_index + i, draws)` (the same draws for every caption).

  images: float [N, H, W] in [0, 1] (the pipeline's image size).
  """
  from mot import sampling
  from mot.data import digits
  from mot.media import to_model_scale
  if pipe.is_video:
    raise ValueError("caption_errors scores still images; this is a video checkpoint")
  p, width = pipe.patch_size, pipe.patch_size ** 2
  x0 = digits.patchify(to_model_scale(images), p)
  x0 = x0.reshape(len(images), -1, width)
  m, pd = x0.shape[1], pipe.model_cfg.patch_dim
  x0 = np.pad(x0, ((0, 0), (0, 0), (0, pd - width))).astype(np.float32)
  split = [sampling.split_block(pipe.prompts.generation_example(c)) for c in captions]
  length = sampling.length_bucket(max(len(prefix["tokens"]) for prefix, _ in split))
  k = len(captions)
  per_call = max(1, MAX_ROWS // k)
  out = np.zeros((len(images), k), np.float32)
  for start in range(0, len(images), per_call):
    idx = np.arange(start, min(start + per_call, len(images)))
    rows = per_call * k  # a fixed batch: one compile for every chunk
    prefix = sampling.pad_left([split[c][0] for _ in idx for c in range(k)], length, rows)
    block = sampling.block_arrays([split[c][1] for _ in idx for c in range(k)], rows)
    dims = sampling.patch_dims(pipe.model, block["modality"])
    t = np.zeros((draws, rows), np.float32)
    noise = np.zeros((draws, rows, m, pd), np.float32)
    x = np.zeros((rows, m, pd), np.float32)
    for j, i in enumerate(idx):
      t_i, eps = noise_draws(seed, first_index + int(i), draws, (m, pd))
      t[:, j * k:(j + 1) * k] = t_i[:, None]
      noise[:, j * k:(j + 1) * k] = eps[:, None]
      x[j * k:(j + 1) * k] = x0[i]
    err = np.asarray(_errors(pipe.model, pipe.params, prefix, block, x, noise * dims, t, dims))
    out[idx] = err[:, :len(idx) * k].mean(axis=0).reshape(len(idx), k)
  return out


def probe(pipe, draws: int = 32, seed: int = 0, num_images: int | None = None) -> dict:
  """The module doc's figures over the first `num_images` held-out digits (all: None)."""
  from mot import eval_digits
  from mot.data import digits, tasks
  from mot.media import to_unit_images
  _, _, held_x, held_y = digits.load_digits_split()
  held_px, held_y = digits.to_pixels(held_x)[:num_images], held_y[:num_images]
  unit, _ = to_unit_images(held_px, pipe.image_size)
  start = time.perf_counter()
  errors = caption_errors(pipe, unit, [tasks.caption(k) for k in range(10)], draws, seed)
  seconds = time.perf_counter() - start
  answers = [tasks.answer(int(k)) for k in errors.argmin(axis=1)]
  misread = eval_digits.misreadings(answers, held_y)
  reading, ar_answers = eval_digits.reasoning_accuracy(pipe, held_px, held_y)
  ar_misread = eval_digits.misreadings(ar_answers, held_y)
  both = sorted({m["index"] for m in misread} & {m["index"] for m in ar_misread})
  return {"step": pipe.step, "images": len(held_y),
          "accuracy": 1.0 - len(misread) / len(held_y), "misread": misread,
          "reasoning_accuracy": reading, "reasoning_misread": ar_misread,
          "both_misread": both, "draws": draws, "seed": seed, "seconds": seconds}


def main(argv):
  del argv
  from mot import cli
  from mot.checkpoint import CheckpointError
  from mot.pipeline import Pipeline
  if FLAGS.draws < 1:
    cli.fail(f"--draws={FLAGS.draws} must be >= 1")
  if FLAGS.num_images is not None and FLAGS.num_images < 1:
    cli.fail(f"--num_images={FLAGS.num_images} must be >= 1 (or left out: all digits)")
  try:
    pipe = Pipeline.from_workdir(FLAGS.workdir)
  except CheckpointError as e:
    cli.fail(cli.one_line(e))
  if pipe.config.data.dataset != "digits":
    cli.fail(f"bench.diffusion_classifier reads the held-out digits; this checkpoint trained "
             f"on config.data.dataset={pipe.config.data.dataset!r}: give a digits workdir")
  print(json.dumps(probe(pipe, FLAGS.draws, FLAGS.seed, FLAGS.num_images)))


if __name__ == "__main__":
  from mot import cli as _cli
  _cli.tune_malloc()  # keep XLA's per-step CPU scratch memory (see mot/cli.py)
  _define_flags()
  flags.mark_flag_as_required("workdir")
  app.run(main)
