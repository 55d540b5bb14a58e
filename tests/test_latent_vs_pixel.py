"""bench.latent_vs_pixel: the Shapes scenes written as a user image folder (training
scenes only, captions the detector confirms in the PNGs, deterministic by seed) and the
scoring of a run of it (a tiny latent model, two steps), with equal tokens per image for
pixels and latents; tests/golden/vae_sd is a random 4-channel VAE with 4x downsampling."""
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


def run_config(folder, cache="", patch_size=8):
  c = image_folder.get_config("tiny")
  c.data.path, c.data.patch_size, c.data.num_heldout = folder, patch_size, 2
  c.data.seq_len = 192
  if cache:
    c.latent.vae, c.data.latent_cache = VAE, cache
  return c


def test_patch_8_pixels_and_patch_2_latents_give_equal_tokens(folder):
  pixel, lat = run_config(folder), run_config(folder, "unused", patch_size=2)
  pixel.data.image_size = lat.data.image_size = (32, 32)   # what train.py fills in
  assert bench.tokens_per_image(pixel) == bench.tokens_per_image(lat) == 16
  pixel.data.patch_size, lat.data.patch_size = 4, 1
  assert bench.tokens_per_image(pixel) == bench.tokens_per_image(lat) == 64


def test_a_latent_run_is_scored_by_the_shapes_yardstick(folder, tmp_path, monkeypatch):
  """One tiny latent run (the pixel run takes the same code path without the VAE). The
  Fréchet judge is replaced by a recorder: fitting its classifier takes longer than the
  rest (tests/test_shapes_eval.py tests it); here it must get the images drawn."""
  seen = []
  monkeypatch.setattr(bench.shapes_features, "frechet", lambda images, prompts, options: (
      seen.append((images, list(prompts))) or {"frechet": 5.0, "frechet_floor": 2.0,
                                                "frechet_ratio": 2.5}))
  cache = str(tmp_path / "cache")
  user_data.main([folder, cache, "--vae", VAE])
  c = run_config(folder, cache, patch_size=2)
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 2
  c.log_every_steps = 1
  train_lib.train_and_evaluate(c, str(tmp_path / "run"))
  lat = bench.score_run(str(tmp_path / "run"), set_size=1, steps=1)
  assert lat["tokens_per_image"] == 16 and lat["latent_vae"] == VAE
  for split in ("in_distribution", "heldout"):
    counts = lat["geneval"][split]["num_images"]
    assert sum(counts.values()) == len(shapes_grammar.CATEGORIES)  # one prompt each
    assert 0.0 <= lat["geneval"][split]["overall"] <= 1.0
  assert lat["step_s"] > 0 and lat["caption_exact_match"] is None   # no protocol ran
  assert lat["_images"].shape == (2 * len(shapes_grammar.CATEGORIES), 32, 32, 3)
  assert seen[0][0] is lat["_images"] and seen[0][1] == lat["_prompts"]
  assert lat["frechet_ratio"] == 2.5
  bench.write_grid(str(tmp_path / "grid.png"), lat)
  with Image.open(tmp_path / "grid.png") as png:   # one row per (split, category)
    assert png.mode == "RGB" and png.height > 2 * len(shapes_grammar.CATEGORIES) * 32 * 4
  ceiling = bench.vae_ceiling(VAE, set_size=1)   # real scenes through the (random) VAE
  assert ceiling["real_geneval_overall"] == {"in_distribution": 1.0, "heldout": 1.0}
  assert ceiling["geneval"]["heldout"]["num_images"] == lat["geneval"]["heldout"]["num_images"]
  text = bench.table({"latent": lat, "vae_ceiling": ceiling})
  assert "| tokens per image | 16 | n/a |" in text and "GenEval heldout overall" in text


def test_caption_match_and_step_time_come_from_the_run_files(tmp_path):
  (tmp_path / "eval.json").write_text(json.dumps(
      {"latest": {"step": 4, "caption_exact_match": 0.25}, "evaluations": []}))
  records = [{"step": 2, "real_tokens": 100, "tokens_per_s": 1.0},   # compile: left out
             {"step": 4, "real_tokens": 300, "tokens_per_s": 50.0},  # 150 tokens a step
             {"step": 6, "real_tokens": 200, "tokens_per_s": 100.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert bench.caption_exact_match(str(tmp_path)) == 0.25
  assert bench.step_seconds(str(tmp_path)) == pytest.approx((3.0 + 1.0) / 2)
  assert bench.caption_exact_match(str(tmp_path / "none")) is None
