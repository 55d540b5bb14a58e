"""bench.latent_vs_pixel: the Shapes scenes written as a user image folder (training
scenes only, captions the detector confirms in the PNGs, deterministic by seed) and the
scoring of a pixel and a latent run of it at equal tokens per image (tiny models, one
step; tests/golden/vae_sd is a random 4-channel VAE with 4x downsampling)."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from bench import latent_vs_pixel as bench
from configs import image_folder
from mot import shapes_detector, shapes_metrics, train_lib
from mot.data import shapes, shapes_export, shapes_grammar, user_data
from mot.data.shapes_scene import DEFAULT_OPTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAE = os.path.join(ROOT, "tests", "golden", "vae_sd")
SCENES = 12


def read_folder(folder):
  with open(os.path.join(folder, shapes_export.CAPTIONS_FILE)) as f:
    lines = [json.loads(line) for line in f]
  return [(line["caption"], np.asarray(Image.open(os.path.join(folder, line["image"]))))
          for line in lines]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("shapes_folder"))
  shapes_export.export_folder(out, SCENES, seed=3)
  return out


def test_the_folder_holds_grammar_captions_of_training_scenes(folder):
  pairs = read_folder(folder)
  assert len(pairs) == SCENES
  for caption, image in pairs:
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert shapes_grammar.parse_caption(caption) is not None, caption
    assert shapes_metrics.score_image(caption, image), caption   # the detector agrees
    scene = shapes_detector.detect(image)
    assert not DEFAULT_OPTIONS.scene_is_heldout(scene)          # no held-out pair
  assert len({c for c, _ in pairs}) > 1


def test_the_export_is_deterministic_and_the_stream_of_generation_examples(folder,
                                                                           tmp_path):
  shapes_export.export_folder(str(tmp_path / "again"), SCENES, seed=3)
  shapes_export.export_folder(str(tmp_path / "other"), SCENES, seed=4)
  ours, again = read_folder(folder), read_folder(tmp_path / "again")
  assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(ours, again))
  assert [c for c, _ in ours] != [c for c, _ in read_folder(tmp_path / "other")]
  for i, (caption, _) in enumerate(ours):
    want, scene = shapes.generation_example(3, i)
    assert caption == want and not shapes.is_eval_scene(scene)
  with pytest.raises(ValueError, match="exists"):   # never mixes two exports
    shapes_export.export_folder(folder, 2, seed=0)


def tiny_run(folder, workdir, cache="", patch_size=8):
  c = image_folder.get_config("tiny")
  c.data.path, c.data.patch_size, c.data.num_heldout = folder, patch_size, 2
  c.data.seq_len = 192
  if cache:
    c.latent.vae, c.data.latent_cache = VAE, cache
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 2
  c.log_every_steps = 1
  c.eval_samples_per_digit = 1     # the user protocol: eval.json's caption exact match
  train_lib.train_and_evaluate(c, workdir)
  return workdir


def test_pixel_and_latent_runs_are_scored_alike_at_equal_tokens(folder, tmp_path):
  cache = str(tmp_path / "cache")
  user_data.main([folder, cache, "--vae", VAE])
  pixel = bench.score_run(tiny_run(folder, str(tmp_path / "pix")), set_size=1, steps=1)
  lat = bench.score_run(tiny_run(folder, str(tmp_path / "lat"), cache, patch_size=2),
                        set_size=1, steps=1)
  assert pixel["tokens_per_image"] == lat["tokens_per_image"] == 16   # 8x8 px, 2x2 latent
  assert pixel["latent_vae"] == "" and lat["latent_vae"] == VAE
  for r in (pixel, lat):
    for split in ("in_distribution", "heldout"):
      counts = r["geneval"][split]["num_images"]
      assert sum(counts.values()) == len(shapes_grammar.CATEGORIES)  # one prompt each
      assert 0.0 <= r["geneval"][split]["overall"] <= 1.0
    assert r["step_s"] > 0 and 0.0 <= r["caption_exact_match"] <= 1.0
  text = bench.table({"pixel": pixel, "latent": lat})
  assert "| tokens per image | 16 | 16 |" in text and "GenEval heldout overall" in text
