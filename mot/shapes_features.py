"""Fréchet distance for Shapes images in the feature space of a small classifier.

As FID measures Inception features, this measures the hidden layer of a small MLP trained
on rendered training scenes to predict the generator's labels: which (colour, shape) types
a scene holds and how many objects it has. The classifier never sees a generated image
or an evaluation scene; it is fixed by `FEATURE_SEED`, so its features (and distances) are
the same on every call. Report a distance beside its floor: the distance between two real
sets of the same size and captions (`reference_scenes`), so small-sample bias is matched.

numpy and scikit-learn only, like every judge (docs/design.md §6).
"""
from __future__ import annotations

import functools
import typing
import warnings

import numpy as np

from mot import eval_metrics
from mot.data import shapes
from mot.data import shapes_grammar as grammar
from mot.data import shapes_scene
from mot.data.shapes_scene import DEFAULT_OPTIONS
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import ShapesOptions

if typing.TYPE_CHECKING:
  from sklearn.neural_network import MLPClassifier  # annotations only: ~1 s to import

FEATURE_SEED = 20261206   # the classifier's training scenes and initialisation
TRAIN_SCENES = 2000       # rendered training scenes the classifier learns from
HIDDEN = 64               # feature dimensions (the hidden layer)
EPOCHS = 30               # Adam epochs (a fixed budget, so reproducible)
POOL = 2                  # inputs are POOL x POOL average-pooled (16x16x3 for 32x32)


def labels(scene: Scene, options: ShapesOptions = DEFAULT_OPTIONS) -> np.ndarray:
  """float [types + max_objects]: presence of each (colour, shape) of `options`, then a
  one-hot object count."""
  kinds = {o.kind for o in scene.objects}
  present = [float(t in kinds) for t in options.all_types]
  count = [float(len(scene.objects) == n) for n in range(1, options.max_objects + 1)]
  return np.asarray(present + count, np.float32)


def _inputs(images: np.ndarray) -> np.ndarray:
  """uint8 [N, S, S, 3] -> float32 [N, (S/POOL)**2 * 3] in [0, 1], average-pooled."""
  x = np.asarray(images, np.float32) / 255.0
  n, h, w, c = x.shape
  x = x.reshape(n, h // POOL, POOL, w // POOL, POOL, c).mean(axis=(2, 4))
  return x.reshape(n, -1)


def feature_classifier(options: ShapesOptions = DEFAULT_OPTIONS) -> MLPClassifier:
  """The fitted MLP (one hidden ReLU layer of HIDDEN units) on TRAIN_SCENES training
  scenes of `options`, multi-label targets `labels`; fitted once per process."""
  return _fit(options)


@functools.lru_cache(maxsize=2)
def _fit(options: ShapesOptions) -> MLPClassifier:
  from sklearn.exceptions import ConvergenceWarning  # lazy: ~1 s, for fitting only
  from sklearn.neural_network import MLPClassifier  # lazy: ~1 s, for fitting only

  scenes = [shapes.training_scene(FEATURE_SEED, i, options) for i in range(TRAIN_SCENES)]
  x = _inputs(np.stack([shapes_scene.render(s) for s in scenes]))
  y = np.stack([labels(s, options) for s in scenes])
  clf = MLPClassifier(hidden_layer_sizes=(HIDDEN,), max_iter=EPOCHS, batch_size=100,
                      learning_rate_init=1e-3, random_state=FEATURE_SEED % 2**31)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed epoch budget, on purpose
    clf.fit(x, y)
  return clf


def features(images: np.ndarray, options: ShapesOptions = DEFAULT_OPTIONS) -> np.ndarray:
  """float64 [N, HIDDEN]: the classifier's hidden activations of uint8 images [N, S, S, 3]."""
  clf = feature_classifier(options)
  h = _inputs(images) @ clf.coefs_[0] + clf.intercepts_[0]
  return np.maximum(h, 0.0).astype(np.float64)


def label_accuracy(images: np.ndarray, scenes, options: ShapesOptions = DEFAULT_OPTIONS
                   ) -> float:
  """Fraction of the classifier's label bits right on `images` of `scenes`: how well it
  knows what it measures (reported beside the distances)."""
  predicted = feature_classifier(options).predict(_inputs(images))
  truth = np.stack([labels(s, options) for s in scenes])
  return float(np.mean(predicted == truth))


def reference_scenes(prompts, tag: str, options: ShapesOptions = DEFAULT_OPTIONS
                     ) -> list[Scene]:
  """One real scene per prompt (a scene it captions, drawn by rng (tag, i)); prompts
  outside the grammar get none. Two tags give two independent real sets."""
  out = []
  for i, prompt in enumerate(prompts):
    req = grammar.parse_caption(prompt)
    if req is not None:
      out.append(shapes.scene_for(req, shapes_scene.rng_for(tag, i), options))
  return out


def frechet(generated: np.ndarray, prompts, options: ShapesOptions = DEFAULT_OPTIONS
            ) -> dict[str, float]:
  """{"frechet", "frechet_floor", "frechet_ratio", "feature_label_accuracy"}: generated
  uint8 images [N, S, S, 3] (one per prompt, prompts in the grammar) against real scenes
  of the same prompts; the floor is a second real set against the first."""
  real = [shapes_scene.render(s) for s in reference_scenes(prompts, "fd/real", options)]
  floor_scenes = reference_scenes(prompts, "fd/floor", options)
  floor_images = np.stack([shapes_scene.render(s) for s in floor_scenes])
  real_f = features(np.stack(real), options)
  fd = eval_metrics.frechet_distance(features(generated, options), real_f)
  floor = eval_metrics.frechet_distance(features(floor_images, options), real_f)
  return {"frechet": fd, "frechet_floor": floor, "frechet_ratio": fd / max(floor, 1e-12),
          "feature_label_accuracy": label_accuracy(floor_images, floor_scenes, options)}
