"""User data (image folder / JSONL / ArrayRecord) through the grain pipeline."""
import json
import os

import ml_collections
import numpy as np
import pytest
from PIL import Image

from configs import image_folder
from mot import config as config_lib
from mot.data import array_records, auto_config
from mot import modalities
from mot import tokenizer as tok
from mot.data import digits
from mot.data import input_pipeline
from mot.data import user_data

T = tok.ByteTokenizer()
# (size (W, H), mode, file extension): odd sizes, colour modes, alpha, 16-bit, JPEG.
IMAGES = [((20, 12), "RGB", "jpg"), ((8, 8), "L", "png"), ((33, 40), "RGBA", "png"),
          ((16, 16), "P", "png"), ((10, 10), "I;16", "png"), ((64, 48), "1", "png")]


def _save(path, size, mode, seed):
  rng = np.random.default_rng(seed)
  w, h = size
  if mode == "I;16":
    im = Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16))
  else:
    im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).convert(mode)
  im.save(path)


def _name(i):
  return f"sub/img{i}.{IMAGES[i % len(IMAGES)][2]}"


def _write_jsonl(path, pairs):
  with open(path, "w") as f:
    f.writelines(json.dumps({"image": i, "caption": c}) + "\n" for i, c in pairs)


@pytest.fixture
def folder(tmp_path):
  """20 images of mixed sizes/modes in tmp_path/pairs with captions.jsonl."""
  d = tmp_path / "pairs"
  (d / "sub").mkdir(parents=True)
  pairs = []
  for i in range(20):
    size, mode, _ = IMAGES[i % len(IMAGES)]
    name = _name(i)
    _save(d / name, size, mode, i)
    pairs.append((name, f"picture number {i}"))
  _write_jsonl(d / "captions.jsonl", pairs)
  return d


def data_config(path, **overrides):
  """The tiny image-folder data config at the digits' 8x8 grayscale (the fields the
  config leaves to the data set, as `mot.data.auto_config` would)."""
  cfg = image_folder.get_config("tiny").data
  cfg.path = str(path)
  cfg.num_heldout = 2
  cfg.update(dict(image_size=(8, 8), channels=1, patch_dim=4))
  cfg.update(overrides)
  return cfg


def _take(it, n):
  return [next(it) for _ in range(n)]


def _examples(batch):
  """(caption text or None, image [8, 8] or None) of every packed example."""
  out = []
  for r in range(batch["tokens"].shape[0]):
    seg = batch["segment_ids"][r]
    for s in range(1, seg.max() + 1):
      sel = seg == s
      is_image = batch["modality"][r][sel] == modalities.IMAGE
      targets = batch["ar_targets"][r][sel][batch["ar_weights"][r][sel] > 0]
      image = None
      if is_image.any():
        image = digits.unpatchify(batch["patches"][r][sel][is_image].reshape(4, 4, 4), 2)
      out.append((T.decode(targets), image))
  return out


def test_folder_batches_shapes_and_ranges(folder):
  cfg = data_config(folder)
  batches = _take(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=4)), 3)
  for b in batches:
    assert b["tokens"].shape == (4, cfg.seq_len) and b["patches"].shape == (4, cfg.seq_len, 4)
    assert b["positions"].shape == (4, cfg.seq_len, 3)
    assert b["patches"].dtype == np.float32 and np.isfinite(b["patches"]).all()
    assert -1.0 <= b["patches"].min() and b["patches"].max() <= 1.0
  examples = [e for b in batches for e in _examples(b)]
  captions = {c for c, _ in examples}
  train_captions = {f"picture number {i}" for i in range(18)}
  assert captions <= train_captions and len(captions) > 3  # Held-out 18, 19 never seen.
  assert any(img is not None for _, img in examples)


def test_images_match_load_image(folder):
  cfg = data_config(folder)
  held = input_pipeline.heldout_images(cfg)
  assert held.shape == (2, 8, 8) and held.dtype == np.float32
  options = user_data.ImageOptions()
  np.testing.assert_array_equal(held[0], user_data.load_image(folder / _name(18), options))
  assert list(input_pipeline.heldout_labels(cfg)) == ["picture number 18", "picture number 19"]
  ex = input_pipeline.heldout_examples(cfg, "reasoning")
  assert [T.decode(e["ar_targets"][e["ar_weights"] > 0]) for e in ex] == list(
      input_pipeline.heldout_labels(cfg))


def test_iterator_resumes_exactly(folder):
  cfg = data_config(folder)
  it = iter(input_pipeline.make_train_dataset(cfg, seed=3, batch_size=2))
  _take(it, 2)
  state = it.get_state()
  expected = _take(it, 2)
  resumed = iter(input_pipeline.make_train_dataset(cfg, seed=3, batch_size=2))
  resumed.set_state(state)
  for a, b in zip(expected, _take(resumed, 2)):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_tasks_and_sequence_length(folder):
  opts = input_pipeline.validate(data_config(folder))
  gen = user_data.generation_example(np.zeros((8, 8), np.float32), "a cat", opts)
  assert T.decode(gen["tokens"][gen["cond_mask"] > 0]) == "a cat"
  assert gen["dm_mask"].sum() == 16
  text = user_data.text_example("a cat", opts)
  assert T.decode(text["ar_targets"][text["ar_weights"] > 0]) == "a cat"
  # The longest caption (18 bytes) decides the minimum seq_len: 18 + 40 for reasoning.
  need = user_data.max_example_length("reasoning", opts, 8, "picture number 10")
  assert need == 1 + 18 + len(user_data.QUESTION) + len("picture number 10") + 1
  with pytest.raises(ValueError, match=rf"seq_len={need - 1} .* minimum needed is {need} "
                                       r"\(the longest caption has 17 bytes"):
    input_pipeline.validate(data_config(folder, seq_len=need - 1))


def test_load_image_scaling_modes(tmp_path):
  white = tmp_path / "white.png"
  Image.new("RGB", (30, 10), (255, 255, 255)).save(white)
  np.testing.assert_array_equal(user_data.load_image(white, user_data.ImageOptions()), 1.0)
  inv = user_data.ImageOptions(invert=True)
  np.testing.assert_array_equal(user_data.load_image(white, inv), -1.0)
  padded = user_data.load_image(white, user_data.ImageOptions(size=6, resize="pad"))
  assert padded.shape == (6, 6) and padded[0, 0] == -1.0 and padded[3, 3] == 1.0
  clear = tmp_path / "clear.png"  # Transparent pixels composite onto white.
  Image.new("RGBA", (5, 7), (0, 0, 0, 0)).save(clear)
  np.testing.assert_array_equal(user_data.load_image(clear, user_data.ImageOptions(4)), 1.0)
  ramp = np.tile(np.arange(0, 256, 32, dtype=np.uint8), (8, 1))
  Image.fromarray(ramp).save(tmp_path / "ramp.png")
  got = user_data.load_image(tmp_path / "ramp.png", user_data.ImageOptions())
  np.testing.assert_allclose(got, ramp / 255.0 * 2 - 1, atol=1e-6)  # Same size: exact.


def test_jsonl_file_with_absolute_paths(tmp_path, folder):
  pairs = [(str(folder / _name(i)), f"c{i}") for i in range(4)]
  _write_jsonl(tmp_path / "list.jsonl", pairs)
  cfg = data_config(tmp_path / "list.jsonl")
  batch = next(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=2)))
  assert batch["tokens"].shape == (2, cfg.seq_len)
  assert list(input_pipeline.heldout_labels(cfg)) == ["c3"]  # At most a tenth, at least one.


def test_array_record_round_trip(tmp_path, folder):
  rng = np.random.default_rng(0)
  arrays = [rng.integers(0, 255, (12, 9), np.uint8), rng.integers(0, 255, (8, 8, 3), np.uint8),
            rng.integers(0, 255, (5, 5, 4), np.uint8), rng.integers(0, 255, (8, 8, 1), np.uint8)]
  paths = [folder / _name(i) for i in range(4)]
  assert user_data.write_array_record(tmp_path / "a-0.array_record", arrays,
                                      [f"array {i}" for i in range(4)]) == 4
  user_data.write_array_record(str(tmp_path / "a-1.array_record"), paths,
                               ["file 0", "file 1", "ünïcode", "file 3"])
  cfg = data_config(str(tmp_path / "a-*.array_record"), dataset="array_record")
  batches = _take(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=3)), 2)
  assert batches[0]["patches"].shape == (3, cfg.seq_len, 4)
  assert -1 <= min(b["patches"].min() for b in batches)
  assert max(b["patches"].max() for b in batches) <= 1
  assert list(input_pipeline.heldout_labels(cfg)) == ["file 3"]
  options = user_data.ImageOptions()
  np.testing.assert_array_equal(input_pipeline.heldout_images(cfg)[0],
                                user_data.load_image(paths[3], options))
  data = user_data.open_user_data(cfg)
  image, caption = data.train[6]
  assert caption == "ünïcode"
  np.testing.assert_array_equal(image, user_data.load_image(paths[2], options))
  gray = Image.fromarray(arrays[1]).convert("L")
  np.testing.assert_allclose(data.train[1][0], np.asarray(gray) / 255 * 2 - 1, atol=1e-6)
  # The same records in colour at a non-square size: patches of 2x2 RGB pixels.
  rgb = data_config(str(tmp_path / "a-*.array_record"), dataset="array_record",
                    image_size=(8, 6), channels=3, patch_dim=12, resize="stretch")
  image, _ = user_data.open_user_data(rgb).train[1]
  assert image.shape == (8, 6, 3)
  expected = np.asarray(Image.fromarray(arrays[1]).resize((6, 8), Image.Resampling.BOX),
                        np.float32)
  np.testing.assert_allclose(image, expected / 255 * 2 - 1, atol=2e-2)
  batch = next(iter(input_pipeline.make_train_dataset(rgb, seed=0, batch_size=2)))
  assert batch["patches"].shape[-1] == 12


def test_records_are_json_and_image_bytes():
  record = user_data.encode_record(b"\x89PNG...", 'a "quoted"\nline')
  assert record.split(b"\n")[0] == b'{"caption": "a \\"quoted\\"\\nline"}'
  assert user_data.decode_record(record) == ('a "quoted"\nline', b"\x89PNG...")
  with pytest.raises(ValueError, match="f.ar record 3: not a mot image record"):
    user_data.decode_record(b"\x80\x04\x95pickle", "f.ar record 3")


def test_convert_folder_command(tmp_path, folder, capsys):
  out = tmp_path / "conv.array_record"
  user_data.main([str(folder), str(out)])
  assert "wrote 20 records" in capsys.readouterr().out
  cfg = data_config(out, dataset="array_record")
  assert list(input_pipeline.heldout_labels(cfg)) == ["picture number 18", "picture number 19"]


def test_config_file(tmp_path, folder):
  c = image_folder.get_config("tiny")
  with pytest.raises(config_lib.ConfigError, match=r"config.data.image_size is left to the "
                                                   r"data: train.py fills it"):
    config_lib.validate(c)
  with pytest.raises(config_lib.ConfigError, match=r"config.data.path is empty"):
    auto_config.fill_from_data(c)
  c.data.path = str(folder)
  # Six sizes, two of them 4 times each: none is the most common.
  with pytest.raises(config_lib.ConfigError, match=r"no image size is the most common "
                                                   r"\(4 of 12x20, 4 of 8x8, 3 of"):
    auto_config.fill_from_data(c)
  c.data.image_size = (8, 8)
  line = auto_config.fill_from_data(c)
  assert "channels 3 (RGB)" in line and "patch_dim 12" in line and "image_size" not in line
  assert tuple(c.model.modality_patch_dims) == (0, 12, 12, 2) and c.model.patch_dim == 12
  assert c.sample.max_new_tokens == len("picture number 10") + 1
  config_lib.validate(c)
  assert image_folder.get_config().data.dataset == "image_folder"
  with pytest.raises(ValueError, match="no variant 'big'"):
    image_folder.get_config("big")


# ------------------------------------------------------------------- bad inputs


def _bad_inputs(tmp, folder):
  """name -> (data.path, extra fields, regex the one-line error must match)."""
  (tmp / "empty").mkdir()
  (tmp / "nocaptions").mkdir()
  Image.new("L", (4, 4)).save(tmp / "nocaptions" / "a.png")
  (tmp / "blank.jsonl").write_text("\n\n")
  img = folder / _name(1)
  (tmp / "badjson.jsonl").write_text(f'{{"image": "{img}", "caption": "ok"}}\n'
                                     f'{{"image": "{img}", "caption": }}\n')
  (tmp / "nofield.jsonl").write_text('{"image": "sub/img1.png"}\n')
  (tmp / "list.jsonl").write_text('["sub/img1.png", "x"]\n')
  (tmp / "notstr.jsonl").write_text('{"image": "sub/img1.png", "caption": 7}\n')
  (tmp / "missing.jsonl").write_text('{"image": "nowhere.png", "caption": "x"}\n')
  (tmp / "fake.png").write_text("not an image")
  (tmp / "notimage.jsonl").write_text('{"image": "fake.png", "caption": "x"}\n'
                                      '{"image": "fake.png", "caption": "y"}\n')
  (tmp / "one.jsonl").write_text(f'{{"image": "{folder}/sub/img1.png", "caption": "x"}}\n')
  (tmp / "junk.array_record").write_bytes(b"hello" * 20)
  user_data.write_array_record(tmp / "badrec.array_record", [np.zeros((4, 4), np.uint8)] * 2,
                               ["a", "b"])
  from array_record.python import array_record_module
  w = array_record_module.ArrayRecordWriter(str(tmp / "foreign.array_record"), "group_size:1")
  w.write(user_data.encode_record(b"\x00" * 10, "ok"))  # A header, but no image.
  w.close()
  ar = {"dataset": "array_record"}
  return {
      "empty path": ("", {}, r"config.data.path is empty"),
      "no such path": (tmp / "nope", {}, r"config.data.path=.*nope does not exist"),
      "empty folder": (tmp / "empty", {}, r"empty has no captions.jsonl: write one line"),
      "folder without captions": (tmp / "nocaptions", {}, r"nocaptions has no captions.jsonl"),
      "no pairs": (tmp / "blank.jsonl", {}, r"blank.jsonl has no pairs"),
      "bad json": (tmp / "badjson.jsonl", {}, r"badjson.jsonl:2: not valid JSON"),
      "missing field": (tmp / "nofield.jsonl", {}, r"nofield.jsonl:1: missing field.*caption"),
      "not an object": (tmp / "list.jsonl", {}, r"list.jsonl:1: expected a JSON object"),
      "caption not str": (tmp / "notstr.jsonl", {}, r"notstr.jsonl:1: field 'caption' must"),
      "missing image": (tmp / "missing.jsonl", {}, r"missing.jsonl:1: image .*nowhere.png "
                                                   r"does not exist"),
      "not an image": (tmp / "notimage.jsonl", {}, r"fake.png \(from .*notimage.jsonl:1\): "
                                                   r"not an image Pillow can read"),
      "one pair": (tmp / "one.jsonl", {}, r"one.jsonl has 1 pair\(s\): at least 2"),
      "no shard": (tmp / "none-*.array_record", ar, r"none-\*.array_record matches no file"),
      "not array record": (tmp / "junk.array_record", ar, r"junk.array_record: not an "
                                                          r"ArrayRecord file"),
      "foreign record": (tmp / "foreign.array_record", ar, r"foreign.array_record record 0: "
                                                           r"not an image"),
      "interleaved": (folder, {"task_weights": {"interleaved": 1.0}},
                      r"task 'interleaved' needs digit labels"),
      "patch size": (folder, {"image_size": (9, 8)}, r"patch_size=2 must divide the 9x8"),
      "resize": (folder, {"resize": "zoom"}, r"config.data.resize='zoom' is unknown"),
      "validation split": (folder, {"validation_size": 10}, r"validation_size applies to "
                                                           r"the bundled digits.*num_heldout"),
  }


@pytest.fixture
def bad_inputs(tmp_path, folder):
  return _bad_inputs(tmp_path, folder)


BAD_NAMES = ["empty path", "no such path", "empty folder", "folder without captions",
             "no pairs", "bad json", "missing field", "not an object", "caption not str",
             "missing image", "not an image", "one pair", "no shard", "not array record",
             "foreign record", "interleaved", "patch size", "resize", "validation split"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_input_is_one_line_value_error(bad_inputs, name):
  path, extra, pattern = bad_inputs[name]
  cfg = data_config(path, **{k: v for k, v in extra.items() if k != "task_weights"})
  if "task_weights" in extra:
    cfg.task_weights = ml_collections.ConfigDict(extra["task_weights"])
  with pytest.raises(ValueError, match=pattern) as e:
    input_pipeline.make_train_dataset(cfg, seed=0, batch_size=2)  # Fails at construction.
  assert "\n" not in str(e.value)


def test_bad_record_found_at_construction(tmp_path):
  """A record whose image bytes are broken fails when the dataset is built."""
  from array_record.python import array_record_module
  path = tmp_path / "broken.array_record"
  w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
  png = array_records.image_bytes(np.zeros((4, 4), np.uint8), 0)
  good = user_data.encode_record(png, "fine")
  for record in (good, good, user_data.encode_record(b"GIF89a-truncated", "bad")):
    w.write(record)
  w.close()
  with pytest.raises(ValueError, match=r"broken.array_record record 2: not an image"):
    input_pipeline.validate(data_config(path, dataset="array_record"))


def test_write_array_record_rejects_floats(tmp_path):
  with pytest.raises(ValueError, match=r"image 0 is float64 .*pass uint8"):
    user_data.write_array_record(tmp_path / "f.array_record", [np.zeros((4, 4))], ["x"])
  assert os.path.exists(tmp_path / "f.array_record")  # Closed cleanly.
