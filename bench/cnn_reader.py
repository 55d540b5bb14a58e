"""How well does a dedicated CNN read the 297 held-out digits? (docs/results.md §1.)

  python -m bench.cnn_reader [--seeds 0,1,2,3,4] [--steps 3000] [--shift_pixels 1]

Issue #4 asks the unified model to read >= 98 % of the held-out digits and gives an RBF
SVM (~95 %) and 3-nearest-neighbours (~96 %) for scale. This is the stronger reference:
a small convolutional classifier trained only to read (three 3x3 convolutions, a 2x2
max-pool, dropout, a 256-wide hidden layer) on the same 1,500 training digits, with the
unified model's reading augmentation (random shifts of up to `shift_pixels`) and its
read-out (mean log-probabilities over the (2 k + 1)^2 shifted views, as
`sample.reason_shifts` = k). If a model built for nothing but this task misreads the same
digits, those digits are hard for what the training writers teach, not for the unified
model's architecture or its task mix.

Prints one JSON line: per seed `accuracy` (the views' answer), `accuracy_single_view`,
`misread` (held-out indices); `ensemble_accuracy` and `ensemble_misread` (the seeds'
summed log-probabilities); `always_misread` (misread at every seed); `seconds`.
"""
from __future__ import annotations

import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

FLAGS = flags.FLAGS
NUM_CLASSES = 10


def _define_flags() -> None:
  """Flags only when run as a script (tests import the module beside other benches)."""
  flags.DEFINE_string("seeds", "0,1,2,3,4", "Comma-separated seeds (init, data order, "
                      "dropout).")
  flags.DEFINE_integer("steps", 3000, "Optimizer steps per seed.")
  flags.DEFINE_integer("batch_size", 128, "Images per step.")
  flags.DEFINE_float("learning_rate", 2e-3, "Peak AdamW learning rate (cosine decay).")
  flags.DEFINE_integer("width", 32, "Channels of the first convolution (x2, x4 after).")
  flags.DEFINE_integer("shift_pixels", 1, "Training shifts and read-out views: up to this "
                       "many pixels (0: no augmentation, one view).")


class CNNReader(nn.Module):
  """float [B, 8, 8] images in [-1, 1] -> [B, 10] logits."""
  width: int = 32
  dropout_rate: float = 0.3

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    x = x[..., None]
    x = nn.relu(nn.Conv(self.width, (3, 3))(x))
    x = nn.relu(nn.Conv(2 * self.width, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = nn.relu(nn.Conv(4 * self.width, (3, 3))(x))
    x = x.reshape(x.shape[0], -1)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(nn.Dense(256)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(NUM_CLASSES)(x)


def shifted_views(images: np.ndarray, shift_pixels: int) -> np.ndarray:
  """float [V, N, H, W]: every image moved by each (dy, dx) in [-k, k]^2 (V = (2k + 1)^2,
  row-major in (dy, dx)), uncovered pixels set to the background, as the unified model's
  reading augmentation and `Pipeline.reason`'s views."""
  from mot.data import tasks
  r = range(-shift_pixels, shift_pixels + 1)
  return np.stack([tasks.shift_image(images, dy, dx) for dy in r for dx in r])


def train_reader(seed: int, images: np.ndarray, labels: np.ndarray, steps: int,
                 batch_size: int = 128, learning_rate: float = 2e-3, width: int = 32,
                 shift_pixels: int = 1):
  """Trains one CNNReader on (images float [N, 8, 8], labels int [N]); each step draws
  `batch_size` images with replacement, each at a random shift of up to `shift_pixels`.
  Returns (model, params)."""
  model = CNNReader(width)
  key = jax.random.PRNGKey(seed)
  params = model.init(key, jnp.zeros((1, *images.shape[1:]), jnp.float32), False)
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, min(100, steps // 10 + 1), steps, 0.05 * learning_rate)
  opt = optax.adamw(schedule, weight_decay=0.01)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, x, y, dropout_key):
    def loss(p):
      logits = model.apply(p, x, True, rngs={"dropout": dropout_key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    grads = jax.grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  views = shifted_views(images, shift_pixels)
  rng = np.random.default_rng(seed)
  for s in range(steps):
    idx = rng.integers(0, len(images), batch_size)
    view = rng.integers(0, len(views), batch_size)
    params, opt_state = step(params, opt_state, jnp.asarray(views[view, idx]),
                             jnp.asarray(labels[idx]), jax.random.fold_in(key, s))
  return model, params


def read_views(model: CNNReader, params, images: np.ndarray, shift_pixels: int
               ) -> np.ndarray:
  """float [V, N, 10]: log-probabilities of each of `shifted_views` (the unshifted view is
  the middle one, V // 2)."""
  views = shifted_views(images, shift_pixels)
  logits = model.apply(params, jnp.asarray(views.reshape(-1, *images.shape[1:])), False)
  return np.asarray(jax.nn.log_softmax(logits)).reshape(*views.shape[:2], NUM_CLASSES)


def run(seeds: list[int], steps: int, batch_size: int = 128, learning_rate: float = 2e-3,
        width: int = 32, shift_pixels: int = 1) -> dict:
  """The module doc's figures."""
  from mot.data import digits
  train_x, train_y, held_x, held_y = digits.load_digits_split()
  start = time.perf_counter()
  per_seed, total = [], np.zeros((len(held_y), NUM_CLASSES))
  for seed in seeds:
    model, params = train_reader(seed, train_x, train_y, steps, batch_size, learning_rate,
                                 width, shift_pixels)
    log_probs = read_views(model, params, held_x, shift_pixels)
    views, single = log_probs.sum(axis=0), log_probs[len(log_probs) // 2]
    total += views
    wrong = np.flatnonzero(views.argmax(-1) != held_y)
    per_seed.append({"seed": seed, "accuracy": 1.0 - len(wrong) / len(held_y),
                     "accuracy_single_view": float(np.mean(single.argmax(-1) == held_y)),
                     "misread": wrong.tolist()})
  ensemble_wrong = np.flatnonzero(total.argmax(-1) != held_y)
  always = set.intersection(*(set(r["misread"]) for r in per_seed))
  return {"seeds": per_seed, "ensemble_accuracy": 1.0 - len(ensemble_wrong) / len(held_y),
          "ensemble_misread": ensemble_wrong.tolist(), "always_misread": sorted(always),
          "steps": steps, "shift_pixels": shift_pixels, "views": (2 * shift_pixels + 1) ** 2,
          "seconds": time.perf_counter() - start}


def main(argv):
  from mot import cli
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: bench.cnn_reader takes only flags (--help)")
  from bench.seed_sweep import SweepError, parse_seeds
  try:
    seeds = parse_seeds(FLAGS.seeds)
  except SweepError as e:
    cli.fail(str(e))
  if FLAGS.steps < 1 or FLAGS.batch_size < 1 or FLAGS.width < 1:
    cli.fail("--steps, --batch_size and --width must be >= 1")
  if FLAGS.shift_pixels < 0 or FLAGS.learning_rate <= 0:
    cli.fail("--shift_pixels must be >= 0 and --learning_rate > 0")
  print(json.dumps(run(seeds, FLAGS.steps, FLAGS.batch_size, FLAGS.learning_rate,
                       FLAGS.width, FLAGS.shift_pixels)))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
