"""Shapes training scenes written as a user image folder (issue #40: latent vs pixel).

configs/image_folder.py trains on a folder of PNGs with captions.jsonl; the latent path
(config.latent.vae) exists only there, so comparing latent and pixel diffusion on the
Shapes scenes goes through such a folder. Pair i is `shapes.generation_example(seed, i)`:
a caption category drawn uniformly, a grammar caption of it, then a training scene it
captions, so the folder holds training (colour, shape) types only (no held-out pair) and
no evaluation scene (`shapes.is_eval_scene`), and its captions are drawn as the
generation prompts (`shapes.prompt_set`) are.

  python -m bench.latent_vs_pixel export --out DIR --scenes 6000 --seed 0
"""
from __future__ import annotations

import json
import os

from PIL import Image

from mot.data import shapes
from mot.data import shapes_scene
from mot.data.shapes_scene import DEFAULT_OPTIONS
from mot.data.shapes_scene import ShapesOptions

IMAGE_DIR = "img"              # PNGs live in DIR/img/, named by their index
CAPTIONS_FILE = "captions.jsonl"  # the name mot.data.user_data reads


def export_folder(out: str, num_scenes: int, seed: int,
                  options: ShapesOptions = DEFAULT_OPTIONS) -> list[dict]:
  """Writes pairs 0..num_scenes-1 of `seed` to `out` (PNGs + captions.jsonl) and returns
  the captions.jsonl lines. Deterministic in (num_scenes, seed, options); refuses a
  folder that already has a captions.jsonl rather than mixing two exports."""
  if num_scenes < 1:
    raise ValueError(f"--scenes must be >= 1, not {num_scenes}")
  jsonl = os.path.join(out, CAPTIONS_FILE)
  if os.path.exists(jsonl):
    raise ValueError(f"{jsonl} exists: export into a new or empty folder")
  os.makedirs(os.path.join(out, IMAGE_DIR), exist_ok=True)
  width = max(6, len(str(num_scenes - 1)))
  lines = []
  for i in range(num_scenes):
    caption, scene = shapes.generation_example(seed, i, options)
    name = f"{IMAGE_DIR}/{i:0{width}d}.png"
    Image.fromarray(shapes_scene.render(scene)).save(os.path.join(out, name))
    lines.append({"image": name, "caption": caption})
  tmp = jsonl + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  os.replace(tmp, jsonl)   # captions.jsonl appears only once every PNG is written
  return lines
