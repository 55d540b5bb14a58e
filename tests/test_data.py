"""Tests for the sequence builder, digits, tasks, packing and the grain input_pipeline."""
import ml_collections
import numpy as np
import pytest

from configs import digits as digits_config
from mot import modalities
from mot import tokenizer as tok
from mot.data import builder as builder_lib
from mot.data import digits
from mot.data import packing
from mot.data import input_pipeline
from mot.data import tasks

T = tok.ByteTokenizer()
OPTIONS = tasks.TaskOptions(patch_size=2, patch_dim=4)


def data_config(**overrides):
  """configs/digits.py:tiny's data section with these tests' task mix and `overrides`."""
  cfg = digits_config.get_config("tiny").data.to_dict()
  cfg.update(dataset="digits", seq_len=128, examples_per_row=3, patch_size=2, patch_dim=4,
             task_weights=dict(generation=0.45, reasoning=0.45, text=0.1), shift_pixels=1)
  cfg.update(overrides)
  return ml_collections.ConfigDict(cfg)


# ------------------------------------------------------------------------- builder


def test_text_positions_are_1d_rope():
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_text(T.encode("hello"))
  ex = b.build()
  np.testing.assert_array_equal(ex["positions"], np.repeat(np.arange(5)[:, None], 3, 1))
  assert b.next_position == 5 and len(b) == 5
  assert {k: v.dtype for k, v in ex.items()} == builder_lib.FIELDS
  assert ex["patches"].shape == (5, 4) and not ex["patches"].any()


def test_image_positions_and_fields():
  b = builder_lib.SequenceBuilder(patch_dim=6)
  b.add_text(T.encode("ab"))
  patches = np.arange(4 * 4 * 4, dtype=np.float32).reshape(4, 4, 4) + 1
  b.add_image(patches, noised=True)
  b.add_text(T.encode("c"))
  ex = b.build()
  # a b <image> 16 patches </image> c
  assert len(ex["tokens"]) == 2 + 1 + 16 + 1 + 1
  assert ex["tokens"][2] == T.begin("image") and ex["tokens"][19] == T.end("image")
  np.testing.assert_array_equal(ex["positions"][2], [2, 2, 2])  # begin marker
  s = 3
  img = slice(3, 19)
  row, col = np.divmod(np.arange(16), 4)
  np.testing.assert_array_equal(ex["positions"][img], np.stack([np.full(16, s), s + row,
                                                                s + col], -1))
  # After the block: max position in block (s + 3) + 1 = s + max(hp, wp).
  np.testing.assert_array_equal(ex["positions"][19], [s + 4] * 3)
  np.testing.assert_array_equal(ex["positions"][20], [s + 5] * 3)
  assert b.next_position == s + 6
  np.testing.assert_array_equal(ex["block_ids"], [0] * 3 + [1] * 16 + [0] * 2)
  np.testing.assert_array_equal(ex["modality"], [0] * 3 + [modalities.IMAGE] * 16 + [0] * 2)
  np.testing.assert_array_equal(ex["dm_mask"], [0] * 3 + [1] * 16 + [0] * 2)
  assert not ex["tokens"][img].any()
  np.testing.assert_array_equal(ex["patches"][img, :4], patches.reshape(16, 4))
  assert not ex["patches"][img, 4:].any() and not ex["patches"][:3].any()


def test_non_square_image_continues_at_max_side():
  b = builder_lib.SequenceBuilder(patch_dim=1)
  b.add_image(np.zeros((2, 5, 1)), noised=False)
  ex = b.build()
  assert ex["positions"][1:11, 1].max() == 1 + 1 and ex["positions"][1:11, 2].max() == 1 + 4
  np.testing.assert_array_equal(ex["positions"][-1], [1 + 5] * 3)
  assert not ex["dm_mask"].any()


def test_video_positions():
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_text([tok.BOS])
  frames = np.random.default_rng(0).normal(size=(3, 2, 2, 4)).astype(np.float32)
  b.add_video(frames, noised=False)
  ex = b.build()
  s = 2  # BOS at 0, begin marker at 1.
  assert ex["tokens"][1] == T.begin("video") and ex["tokens"][-1] == T.end("video")
  frame, row, col = np.meshgrid(np.arange(3), np.arange(2), np.arange(2), indexing="ij")
  expected = s + np.stack([frame, row, col], -1).reshape(-1, 3)
  np.testing.assert_array_equal(ex["positions"][2:14], expected)
  np.testing.assert_array_equal(ex["positions"][-1], [s + 3] * 3)  # s + max(T, hp, wp)
  np.testing.assert_array_equal(ex["patches"][2:14], frames.reshape(12, 4))
  assert (ex["modality"][2:14] == modalities.VIDEO).all()
  assert (ex["block_ids"][2:14] == 1).all()


def test_action_positions_and_block_numbering():
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_image(np.zeros((2, 2, 4)), noised=False)        # block 1: tokens 1..4, end at 5
  b.add_action(np.ones((5, 2)), noised=True, cond=False)  # begin 6, block 2: 7..11
  ex = b.build()
  # Positions: image begin 0, image at 1 + (row, col), end 1 + 2 = 3, action begin 4.
  s = 5
  np.testing.assert_array_equal(ex["positions"][7:12],
                                np.stack([s + np.arange(5), np.full(5, s), np.full(5, s)], -1))
  np.testing.assert_array_equal(ex["positions"][12], [s + 5] * 3)
  assert b.next_position == s + 6 and b.num_blocks == 2
  assert (ex["block_ids"][1:5] == 1).all() and (ex["block_ids"][7:12] == 2).all()
  assert (ex["modality"][7:12] == modalities.ACTION).all()
  np.testing.assert_array_equal(ex["patches"][7:12], [[1, 1, 0, 0]] * 5)
  np.testing.assert_array_equal(ex["dm_mask"], (ex["block_ids"] == 2).astype(np.float32))


def test_ar_targets_and_weights_alignment():
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_text([tok.BOS])
  b.add_text(T.encode("ab"), loss=True, cond=True)
  b.add_image(np.zeros((2, 2, 4)), noised=True)
  b.add_text(T.encode("q"))
  b.add_text(T.encode("z") + [tok.EOS], loss=True)
  ex = b.build()
  loss_token = np.zeros(len(ex["tokens"]), bool)
  loss_token[[1, 2, len(loss_token) - 2, len(loss_token) - 1]] = True
  np.testing.assert_array_equal(ex["ar_targets"][:-1], ex["tokens"][1:])
  np.testing.assert_array_equal(ex["ar_weights"][:-1], loss_token[1:])
  assert ex["ar_targets"][-1] == 0 and ex["ar_weights"][-1] == 0
  np.testing.assert_array_equal(ex["cond_mask"], np.isin(np.arange(len(loss_token)), [1, 2]))
  # Markers (3 = image begin, 4 = image end) are never targets.
  targeted = ex["ar_targets"][ex["ar_weights"] > 0]
  assert not np.isin(targeted, [T.begin("image"), T.end("image"), tok.PAD]).any()


def test_build_padding_and_overflow():
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_text([tok.BOS])
  b.add_image(np.ones((2, 2, 4)), noised=True)
  ex = b.build(seq_len=12)
  assert all(v.shape[0] == 12 for v in ex.values())
  n = len(b)
  assert all(not v[n:].any() for v in ex.values())
  with pytest.raises(ValueError, match=r"7 tokens but seq_len is 6"):
    b.build(seq_len=6)
  with pytest.raises(ValueError, match="exceeds the builder's patch_dim"):
    b.add_image(np.ones((2, 2, 5)), noised=False)
  empty = builder_lib.SequenceBuilder(patch_dim=4).build(seq_len=3)
  assert empty["patches"].shape == (3, 4) and empty["positions"].shape == (3, 3)


# -------------------------------------------------------------------------- digits


def test_digits_split_and_scaling():
  train, train_labels, held, held_labels = digits.load_digits_split()
  assert train.shape == (1500, 8, 8) and held.shape == (297, 8, 8)
  assert train.dtype == np.float32 and train_labels.shape == (1500,)
  assert held_labels.shape == (297,) and set(np.unique(train_labels)) == set(range(10))
  assert train.min() == -1 and train.max() == 1
  pixels = digits.to_pixels(held)
  np.testing.assert_allclose(pixels, np.round(pixels))  # Original integer levels.
  assert digits.to_pixels(np.array([-3.0, 5.0])).tolist() == [0, 16]


def test_digits_are_scikit_learns_with_or_without_importing_it(monkeypatch):
  from sklearn.datasets import load_digits
  want = load_digits()
  table = digits._digits_table()
  np.testing.assert_array_equal(table[:, :-1], want.data)
  np.testing.assert_array_equal(table[:, -1], want.target)
  # Where the file is not where it was read from, load_digits itself is used.
  monkeypatch.setattr(digits.os.path, "isfile", lambda path: False)
  np.testing.assert_array_equal(digits._digits_table(), table)


def test_patchify_round_trip_and_layout():
  img = np.arange(64, dtype=np.float32).reshape(8, 8)
  p = digits.patchify(img, 2)
  assert p.shape == (4, 4, 4)
  np.testing.assert_array_equal(p[0, 1], [2, 3, 10, 11])  # Row-major inside the patch.
  np.testing.assert_array_equal(digits.unpatchify(p, 2), img)
  batch = np.stack([img, -img])
  np.testing.assert_array_equal(digits.unpatchify(digits.patchify(batch, 4), 4), batch)
  with pytest.raises(ValueError, match="divisible"):
    digits.patchify(img, 3)


# --------------------------------------------------------------------------- tasks


def test_patchify_window_is_patchify_plus_the_neighbourhood():
  img = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
  win = digits.patchify_window(img, 2, 4)
  assert win.shape == (4, 4, 16) and win.dtype == np.float32
  # The own pixels first, as patchify has them; 0 (or the patch size) is patchify.
  np.testing.assert_array_equal(win[..., :4], digits.patchify(img, 2))
  np.testing.assert_array_equal(digits.patchify_window(img, 2, 0), digits.patchify(img, 2))
  # Every window holds the 4x4 square centred on its patch, background beyond the border.
  padded = np.pad(img, 1, constant_values=digits.BACKGROUND)
  for i in range(4):
    for j in range(4):
      square = padded[2 * i:2 * i + 4, 2 * j:2 * j + 4]
      np.testing.assert_array_equal(np.sort(win[i, j]), np.sort(square.ravel()))
      assert set(win[i, j, 4:]) == set(square.ravel()) - set(win[i, j, :4])
  assert np.sum(win[0, 0] == digits.BACKGROUND) == 7        # a corner: 7 outside
  # Batched images give the same windows; bad windows are refused.
  np.testing.assert_array_equal(digits.patchify_window(np.stack([img, img]), 2, 4)[1], win)
  for bad in (1, 3):
    with pytest.raises(ValueError, match="window"):
      digits.patchify_window(img, 2, bad)
  # The reading task carries the windows; generation targets stay plain patches.
  opts = tasks.TaskOptions(patch_size=2, patch_dim=16, read_window=4)
  read = tasks.build_example("reasoning", img, 3, opts, np.random.default_rng(0))
  block = read["block_ids"] > 0
  np.testing.assert_array_equal(read["patches"][block], win.reshape(16, 16))
  gen = tasks.build_example("generation", img, 3, opts, np.random.default_rng(0))
  gen_block = gen["patches"][gen["block_ids"] > 0]
  np.testing.assert_array_equal(gen_block[:, :4], digits.patchify(img, 2).reshape(16, 4))
  assert not gen_block[:, 4:].any()


def test_task_layouts_and_lengths():
  img = digits.load_digits_split()[0][0]
  gen = tasks.generation_example(img, 7, 2, 4)
  rea = tasks.reasoning_example(img, 7, 2, 4)
  txt = tasks.text_example(3, 4, variant=1)
  assert [len(gen["tokens"]), len(rea["tokens"]), len(txt["tokens"])] == [41, 40, 25]
  assert tasks.caption(7) == "a handwritten digit 7"
  assert T.decode(gen["tokens"]) == "a handwritten digit 7"
  assert gen["dm_mask"].sum() == 16 and rea["dm_mask"].sum() == 0
  assert T.decode(gen["ar_targets"][gen["ar_weights"] > 0]) == tasks.caption(7)
  assert gen["ar_targets"][gen["ar_weights"] > 0][-1] == tok.EOS
  assert T.decode(gen["tokens"][gen["cond_mask"] > 0]) == tasks.caption(7)
  assert T.decode(rea["tokens"]) == "What digit is this?7"
  assert T.decode(txt["tokens"]) == "the digit before 3 is 2"
  np.testing.assert_array_equal(
      digits.unpatchify(gen["patches"][gen["modality"] == 1].reshape(4, 4, 4), 2), img)
  prompt, target = tasks.split_prompt(rea)
  assert T.decode(prompt["tokens"]) == tasks.QUESTION and target == T.encode("7") + [tok.EOS]
  assert tasks.max_example_length("text", OPTIONS) == 25


def test_build_example_draws_variants_and_shift():
  img = digits.load_digits_split()[0][0]
  rng = np.random.default_rng(0)
  texts = {T.decode(tasks.build_example("text", img, 0, OPTIONS, rng)["tokens"])
           for _ in range(20)}
  assert texts == {"the digit after 0 is 1", "the digit before 0 is 9"}
  shifted = [tasks.build_example("reasoning", img, 0, OPTIONS, rng, shift_pixels=2)
             for _ in range(10)]
  assert any(not np.array_equal(s["patches"], shifted[0]["patches"]) for s in shifted)
  gen = tasks.build_example("generation", img, 0, OPTIONS, rng, shift_pixels=2)
  np.testing.assert_array_equal(gen["patches"], tasks.generation_example(img, 0, 2, 4)["patches"])


def test_random_shift():
  img = np.full((8, 8), -1.0, np.float32)
  img[3, 4] = 1.0
  rng = np.random.default_rng(1)
  for _ in range(20):
    out = tasks.random_shift(img, 2, rng)
    (y,), (x,) = np.nonzero(out == 1.0)
    assert abs(y - 3) <= 2 and abs(x - 4) <= 2 and (out == -1).sum() == 63
  np.testing.assert_array_equal(tasks.random_shift(img, 0, rng), img)


def test_random_rotate_scale():
  img = digits.load_digits_split()[0][0]
  rng = np.random.default_rng(2)
  # No rotation, no zoom: the identity.
  np.testing.assert_allclose(tasks.random_rotate_scale(img, 0.0, 0.0, rng), img, atol=1e-6)
  bar = np.full((8, 8), -1.0, np.float32)
  bar[:, 3:5] = 1.0  # a vertical bar through the centre
  turned = tasks.random_rotate_scale(bar, 45.0, 0.0, np.random.default_rng(5))
  assert turned.shape == (8, 8) and turned.dtype == np.float32
  assert turned.min() >= -1 - 1e-6 and turned.max() <= 1 + 1e-6
  assert not np.allclose(turned, bar)
  # Zooming out leaves background at the border; the bar stays centred (symmetry).
  small = tasks.random_rotate_scale(bar, 0.0, 0.4, np.random.default_rng(3))
  np.testing.assert_allclose(small, small[:, ::-1], atol=1e-5)
  # Training applies it to reading images only, and only when configured.
  opts = tasks.TaskOptions(patch_size=2, patch_dim=4, rotate_degrees=20.0, scale_jitter=0.2)
  reads = [tasks.build_example("reasoning", img, 0, opts, rng)["patches"] for _ in range(5)]
  assert any(not np.allclose(r, reads[0]) for r in reads)
  gen = tasks.build_example("generation", img, 0, opts, rng)
  np.testing.assert_array_equal(gen["patches"], tasks.generation_example(img, 0, 2, 4)["patches"])


def test_random_elastic_bends_reading_images_smoothly_by_alpha_pixels():
  # The field: RMS displacement alpha, smooth (neighbours move together), seeded.
  rng = np.random.default_rng(0)
  field = tasks.elastic_field(8, 8, 0.5, 1.5, rng)
  assert field.shape == (2, 8, 8)
  np.testing.assert_allclose(np.sqrt(np.mean(field ** 2)), 0.5, rtol=1e-9)
  rough = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8))
  rough *= 0.5 / np.sqrt(np.mean(rough ** 2))
  step = lambda f: np.abs(np.diff(f, axis=-1)).mean()
  assert step(field) < 0.5 * step(rough)
  np.testing.assert_array_equal(field, tasks.elastic_field(8, 8, 0.5, 1.5,
                                                           np.random.default_rng(0)))
  # The image: alpha 0 is the identity, a flat image stays flat away from the border,
  # values stay in range, and larger alpha moves more.
  _, _, x, _ = digits.load_digits_split()
  img = x[0]
  np.testing.assert_array_equal(tasks.random_elastic(img, 0.0, 1.5, rng), img)
  flat = np.full((8, 8), 0.25, np.float32)
  bent = tasks.random_elastic(flat, 0.3, 2.0, np.random.default_rng(1))
  np.testing.assert_allclose(bent[3:5, 3:5], 0.25, atol=1e-6)
  change = lambda a: np.mean([np.abs(tasks.random_elastic(img, a, 1.5,
                                                          np.random.default_rng(s)) - img).mean()
                              for s in range(20)])
  assert 0 < change(0.25) < change(0.5) < change(1.0)
  out = tasks.random_elastic(img, 1.0, 1.0, np.random.default_rng(2))
  assert out.dtype == np.float32 and -1 - 1e-6 <= out.min() and out.max() <= 1 + 1e-6
  # Training bends about elastic_prob of the reading images and never a generation target.
  opts = tasks.TaskOptions(patch_size=2, patch_dim=4, elastic_alpha=0.5, elastic_prob=0.5)
  clean = tasks.reasoning_example(img, 0, 2, 4)["patches"]
  reads = [tasks.build_example("reasoning", img, 0, opts, rng)["patches"] for _ in range(200)]
  assert 70 <= sum(not np.array_equal(r, clean) for r in reads) <= 130
  gen = tasks.build_example("generation", img, 0, opts, rng)
  np.testing.assert_array_equal(gen["patches"], tasks.generation_example(img, 0, 2, 4)["patches"])


def test_random_cutout_erases_one_clipped_square_of_reading_images_only():
  img = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8)  # no background pixel
  for seed in range(40):
    out = tasks.random_cutout(img, 3, np.random.default_rng(seed))
    erased = out != img
    ys, xs = np.nonzero(erased)
    # One axis-aligned rectangle, at most 3x3 (less where the square leaves the image),
    # set to background; every other pixel untouched; the input not modified.
    assert 1 <= erased.sum() <= 9 and np.all(out[erased] == digits.BACKGROUND)
    assert erased.sum() == (np.ptp(ys) + 1) * (np.ptp(xs) + 1) <= 9
    np.testing.assert_array_equal(out[~erased], img[~erased])
  assert img.min() >= 0.0
  # Centres are uniform over the image: both full squares and clipped ones occur.
  sizes = {int((tasks.random_cutout(img, 3, np.random.default_rng(s)) != img).sum())
           for s in range(200)}
  assert 9 in sizes and {4, 6} & sizes
  # Training applies it to reading images only, in about cutout_prob of them.
  rng = np.random.default_rng(0)
  opts = tasks.TaskOptions(patch_size=2, patch_dim=4, cutout_size=2, cutout_prob=0.5)
  clean = tasks.reasoning_example(img, 0, 2, 4)["patches"]
  reads = [tasks.build_example("reasoning", img, 0, opts, rng)["patches"] for _ in range(200)]
  cut = sum(not np.array_equal(r, clean) for r in reads)
  assert 70 <= cut <= 130, cut
  gen = tasks.build_example("generation", img, 0, opts, rng)
  np.testing.assert_array_equal(gen["patches"], tasks.generation_example(img, 0, 2, 4)["patches"])
  # cutout_prob 0 turns it off (out-of-range config values: tests/test_bad_inputs.py).
  off = tasks.TaskOptions(patch_size=2, patch_dim=4, cutout_size=2, cutout_prob=0.0)
  assert all(np.array_equal(tasks.build_example("reasoning", img, 0, off, rng)["patches"],
                            clean) for _ in range(20))


# ------------------------------------------------------------------------- packing


def _example(n_text, with_image):
  b = builder_lib.SequenceBuilder(patch_dim=4)
  b.add_text(T.encode("x" * n_text), loss=True)
  if with_image:
    b.add_image(np.ones((2, 2, 4)), noised=True)
    b.add_image(np.ones((1, 1, 4)), noised=False)
  return b.build()


def test_packing_segments_blocks_and_padding():
  exs = [_example(3, True), _example(4, False), _example(2, True)]
  lengths = [len(e["tokens"]) for e in exs]  # 3 + 6 + 3 = 12, 4, 2 + 9 = 11
  row, dropped = packing.pack_examples(exs, seq_len=30)
  assert dropped == 0
  n = sum(lengths)
  np.testing.assert_array_equal(row["segment_ids"], np.repeat([1, 2, 3, 0], lengths + [30 - n]))
  blocks = row["block_ids"]
  # Example 1 has blocks 1, 2; example 3's blocks become 3, 4: unique per row.
  assert sorted(set(blocks[blocks > 0].tolist())) == [1, 2, 3, 4]
  for k in (1, 2, 3, 4):
    assert len(set(row["segment_ids"][blocks == k].tolist())) == 1
  seg3 = row["segment_ids"] == 3
  np.testing.assert_array_equal(row["positions"][seg3], exs[2]["positions"])  # Restart at 0.
  assert all(not v[n:].any() for v in row.values())
  assert row["segment_ids"].dtype == np.int32 and row["patches"].shape == (30, 4)


def test_packing_drops_what_does_not_fit():
  exs = [_example(3, True), _example(20, False), _example(4, False)]  # 12, 20, 4
  row, dropped = packing.pack_examples(exs, seq_len=20)
  assert dropped == 1
  np.testing.assert_array_equal(row["segment_ids"][:16], [1] * 12 + [2] * 4)
  assert not row["segment_ids"][16:].any()
  row, dropped = packing.pack_examples([_example(30, False)], seq_len=20)
  assert dropped == 1 and not any(v.any() for v in row.values())


def test_an_overfull_row_config_warns_once_with_the_fix(caplog):
  from configs import digits as digits_config
  config = digits_config.get_config().data
  config.seq_len, config.examples_per_row = 128, 3   # 3 x 44 (interleaved) > 128 tokens
  input_pipeline._WARNED.clear()
  with caplog.at_level("WARNING"):
    input_pipeline.validate(config)
    input_pipeline.validate(config)
  assert caplog.text.count("examples_per_row=3 x 44 tokens") == 1, caplog.text
  assert "raise seq_len to drop none" in caplog.text
  caplog.clear()
  config.seq_len = 132
  with caplog.at_level("WARNING"):
    input_pipeline.validate(config)
  assert "examples_per_row" not in caplog.text


# ------------------------------------------------------------------------ pipeline


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_same(batches_a, batches_b):
  for a, b in zip(batches_a, batches_b, strict=True):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_batch_shapes_and_dtypes():
  batch = next(iter(input_pipeline.make_train_dataset(data_config(), seed=0, batch_size=4)))
  expected = {**builder_lib.FIELDS, "segment_ids": np.int32}
  assert {k: v.dtype for k, v in batch.items()} == {k: np.dtype(v) for k, v in expected.items()}
  for k, v in batch.items():
    assert v.shape[:2] == (4, 128), k
  assert batch["patches"].shape == (4, 128, 4) and batch["positions"].shape == (4, 128, 3)
  stats = input_pipeline.describe_batch(batch)
  assert stats["examples"] == 4 * 3  # 3 examples of <= 41 tokens always fit in 128.
  assert stats["real_tokens"] == int((batch["segment_ids"] > 0).sum()) > 4 * 3 * 24


def test_deterministic_and_seed_dependent():
  cfg = data_config()
  a = _take(iter(input_pipeline.make_train_dataset(cfg, seed=3, batch_size=4)), 3)
  b = _take(iter(input_pipeline.make_train_dataset(cfg, seed=3, batch_size=4)), 3)
  _assert_same(a, b)
  c = next(iter(input_pipeline.make_train_dataset(cfg, seed=4, batch_size=4)))
  assert not np.array_equal(a[0]["patches"], c["patches"])


def test_resume_from_state():
  ds = input_pipeline.make_train_dataset(data_config(), seed=0, batch_size=4)
  it = iter(ds)
  _take(it, 2)
  state = it.get_state()
  expected = _take(it, 2)
  resumed = iter(input_pipeline.make_train_dataset(data_config(), seed=0, batch_size=4))
  resumed.set_state(state)
  _assert_same(expected, _take(resumed, 2))


def test_shards_are_disjoint_parts_of_the_stream():
  cfg = data_config()
  full = _take(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=1)), 4)
  shard1 = _take(iter(input_pipeline.make_train_dataset(cfg, 0, 1, shard_index=1,
                                                        shard_count=2)), 2)
  _assert_same([full[1], full[3]], shard1)


def _images_and_tasks(batches):
  """Each packed example's task (by its fields) and, if any, its image [8, 8]."""
  images, kinds = [], []
  for batch in batches:
    for r in range(batch["tokens"].shape[0]):
      seg = batch["segment_ids"][r]
      for s in range(1, seg.max() + 1):
        sel = seg == s
        is_image = batch["modality"][r][sel] == modalities.IMAGE
        if batch["dm_mask"][r][sel].any():
          kinds.append("generation")
        elif is_image.any():
          kinds.append("reasoning")
        else:
          kinds.append("text")
        if is_image.any():
          patches = batch["patches"][r][sel][is_image].reshape(4, 4, 4)
          images.append(digits.unpatchify(patches, 2))
  return images, kinds


def test_heldout_never_in_training_and_task_mix():
  cfg = data_config(shift_pixels=0)
  batches = _take(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=25)), 4)
  images, kinds = _images_and_tasks(batches)
  assert len(kinds) == 300
  train, _, held, _ = digits.load_digits_split()
  train_set = {x.tobytes() for x in train}
  held_set = {x.tobytes() for x in held}
  assert images and all(x.astype(np.float32).tobytes() in train_set for x in images)
  assert not any(x.astype(np.float32).tobytes() in held_set for x in images)
  fractions = {k: kinds.count(k) / len(kinds) for k in ("generation", "reasoning", "text")}
  for k, w in cfg.task_weights.items():
    assert abs(fractions[k] - w) < 0.08, fractions


def test_validation_split_is_the_last_training_digits_and_never_trained_on():
  train, train_labels, held, _ = digits.load_digits_split()
  v_train, v_train_labels, v_held, v_held_labels = digits.load_digits_split(200)
  np.testing.assert_array_equal(v_train, train[:1300])
  np.testing.assert_array_equal(v_held, train[1300:])
  np.testing.assert_array_equal(v_held_labels, train_labels[1300:])
  assert v_train_labels.shape == (1300,)
  cfg = data_config(shift_pixels=0, validation_size=200)
  np.testing.assert_array_equal(input_pipeline.heldout_images(cfg), train[1300:])
  batches = _take(iter(input_pipeline.make_train_dataset(cfg, seed=0, batch_size=25)), 4)
  images, _ = _images_and_tasks(batches)
  allowed = {x.tobytes() for x in v_train}
  kept_out = {x.tobytes() for x in v_held} | {x.tobytes() for x in held}
  assert images and all(x.astype(np.float32).tobytes() in allowed for x in images)
  assert not any(x.astype(np.float32).tobytes() in kept_out for x in images)
  for bad in (-1, 751, 2.5, True, "100"):
    with pytest.raises(ValueError, match=r"config.data.validation_size=.* must be an integer"):
      input_pipeline.make_train_dataset(data_config(validation_size=bad), 0, 2)


def test_heldout_examples():
  cfg = data_config()
  examples = input_pipeline.heldout_examples(cfg, "reasoning")
  labels = input_pipeline.heldout_labels(cfg)
  assert len(examples) == len(labels) == 297
  assert [int(T.decode(tasks.split_prompt(e)[1])) for e in examples[:20]] == labels[:20].tolist()
  held = digits.load_digits_split()[2]
  img = digits.unpatchify(examples[5]["patches"][examples[5]["modality"] == 1].reshape(4, 4, 4), 2)
  np.testing.assert_array_equal(img, held[5])  # Never augmented.


def test_config_validation():
  with pytest.raises(ValueError, match=r"config.data.seq_len=40 .* minimum needed is 41"):
    input_pipeline.make_train_dataset(data_config(seq_len=40), seed=0, batch_size=2)
  with pytest.raises(ValueError, match="unknown task"):
    input_pipeline.make_train_dataset(data_config(task_weights={"dance": 1.0}), 0, 2)
  with pytest.raises(ValueError, match="patch_dim"):
    input_pipeline.make_train_dataset(data_config(patch_dim=3), 0, 2)
  with pytest.raises(ValueError, match="patch_size"):
    input_pipeline.make_train_dataset(data_config(patch_size=3, patch_dim=9), 0, 2)
