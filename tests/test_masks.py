"""The one mask rule of docs/design.md §1, case by case."""
import jax.numpy as jnp
import numpy as np

from mot import masks


def mask_of(seg, blk, noised=None, keep=None):
  seg = jnp.asarray([seg], jnp.int32)
  blk = jnp.asarray([blk], jnp.int32)
  noised = jnp.zeros_like(seg, bool) if noised is None else jnp.asarray([noised], bool)
  keep = None if keep is None else jnp.asarray([keep], bool)
  ids = masks.MaskIds.from_fields(seg, blk, noised, keep)
  m = masks.attention_mask(ids, ids)
  assert m.shape == (1, 1, seg.shape[1], seg.shape[1])
  return np.asarray(m[0, 0])


def brute_force(seg, blk, noised, keep):
  n = len(seg)
  out = np.zeros((n, n), bool)
  for i in range(n):
    for j in range(n):
      out[i, j] = (seg[i] == seg[j] > 0 and (j <= i or blk[i] == blk[j] > 0)
                   and not (noised[j] and blk[j] != blk[i]) and keep[j])
  return out


def test_causal_text():
  m = mask_of([1] * 5, [0] * 5)
  np.testing.assert_array_equal(m, np.tril(np.ones((5, 5), bool)))


def test_block_is_bidirectional_and_causal_to_the_past():
  # text text [img img img] text
  m = mask_of([1] * 6, [0, 0, 1, 1, 1, 0])
  assert m[2:5, 2:5].all()              # inside the block: everything
  assert m[2:5, :2].all()               # the block reads the prefix
  assert not m[:2, 2:5].any()           # the prefix never reads the block
  assert m[5, :6].all()                 # a clean block is read later


def test_packing_isolation_and_padding():
  seg = [1, 1, 1, 2, 2, 0, 0]
  m = mask_of(seg, [0, 1, 1, 0, 1, 0, 0])
  assert not m[3:5, :3].any() and not m[:3, 3:].any()
  assert not m[5:].any() and not m[:, 5:].any()


def test_noised_block_never_read_from_outside():
  seg = [1] * 7
  blk = [0, 1, 1, 0, 2, 2, 0]
  noised = [0, 1, 1, 0, 0, 0, 0]
  m = mask_of(seg, blk, noised)
  assert m[1:3, 1:3].all()              # the noised block sees itself
  assert not m[3:, 1:3].any()           # nothing after it reads it
  assert m[4:6, 4:6].all() and m[6, 4:6].all()  # a clean block is readable


def test_dropped_keys_are_hidden():
  m = mask_of([1] * 4, [0, 0, 1, 1], keep=[1, 0, 1, 1])
  assert not m[:, 1].any() and m[2:, 0].all()


def test_matches_brute_force_on_random_layouts():
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = 24
    seg = np.sort(rng.integers(0, 4, n))[::-1]
    blk = rng.integers(0, 4, n) * (rng.random(n) < 0.6)
    noised = (blk > 0) & (blk % 2 == 1)
    keep = rng.random(n) < 0.9
    np.testing.assert_array_equal(mask_of(seg, blk, noised, keep),
                                  brute_force(seg, blk, noised, keep))


def test_query_and_key_ids_separate_for_a_cache():
  # Keys: a 6-token cache; queries: the last 2 tokens (indices 4, 5).
  seg = jnp.ones((1, 6), jnp.int32)
  blk = jnp.asarray([[0, 0, 0, 0, 1, 1]], jnp.int32)
  keys = masks.MaskIds.from_fields(seg, blk, jnp.zeros((1, 6), bool))
  queries = masks.MaskIds.from_fields(seg[:, 4:], blk[:, 4:], jnp.zeros((1, 2), bool),
                                      offset=4)
  full = masks.attention_mask(keys, keys)[:, :, 4:]
  np.testing.assert_array_equal(masks.attention_mask(queries, keys), full)
