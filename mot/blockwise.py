"""Blockwise (flash-style) attention from mask ids, in plain JAX.

Queries and keys are cut into tiles of `block_q` x `block_kv` tokens. The mask rule of
`mot.masks` is evaluated per tile from the tiles' ids (never an L x L array), and a
summary of every tile, O((L / block)^2) booleans from per-block ranges of the ids, says
which tiles may hold an allowed pair: for each query block a loop runs over only those
key blocks (a `while_loop` whose trip count is the number of live tiles), keeping an
online softmax (running max, sum and weighted values). Tiles of other packed examples,
and causal text's tiles of later blocks, cost nothing.

The backward pass is a custom VJP (FlashAttention-2's): it keeps q, k, v, the output and
each query's log-sum-exp, recomputes every live tile's probabilities, and loops over key
blocks with an inner loop over their live query blocks. Both passes hold O(L * block)
memory.

Semantics equal `jax.nn.dot_product_attention` with the dense mask, including its
convention for a query that may read no key (a padding token): the masked logits are all
equal there, so its output is the uniform average of every value (of the L real keys).

  out = blockwise.attention(q, k, v, q_ids, k_ids, block_q=512, block_kv=512)
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from mot import masks

Array = jax.Array
_FAR = 2 ** 30  # beyond every id and index: marks an empty range


# ----------------------------------------------------------------------------------------
# Which tiles may hold an allowed pair.
# ----------------------------------------------------------------------------------------
def _lo(x: Array, where: Array) -> Array:
  return jnp.min(jnp.where(where, x, _FAR), axis=-1)


def _hi(x: Array, where: Array) -> Array:
  return jnp.max(jnp.where(where, x, -_FAR), axis=-1)


def live_tiles(q_ids: masks.MaskIds, k_ids: masks.MaskIds) -> Array:
  """bool [nq, nk] from ids blocked as [B, n, block]: False where the rule allows no pair
  of the tile in any row (a superset of the live tiles, from per-block ranges).

  A pair needs the same segment (segment ranges overlap), a key that is kept, and either
  an earlier key that the causal part may read (not noised, or outside every block) or a
  shared block (block ranges overlap).
  """
  q_real = q_ids.segment > 0
  k_real = (k_ids.segment > 0) & k_ids.keep
  k_causal = k_real & (~k_ids.noised | (k_ids.block == 0))
  q_blocked, k_blocked = q_real & (q_ids.block > 0), k_real & (k_ids.block > 0)
  qs = lambda a: a[:, :, None]   # [B, nq] -> [B, nq, 1]
  ks = lambda a: a[:, None, :]   # [B, nk] -> [B, 1, nk]
  same_segment = ((qs(_lo(q_ids.segment, q_real)) <= ks(_hi(k_ids.segment, k_real)))
                  & (ks(_lo(k_ids.segment, k_real)) <= qs(_hi(q_ids.segment, q_real))))
  earlier = ks(_lo(k_ids.index, k_causal)) <= qs(_hi(q_ids.index, q_real))
  same_block = ((qs(_lo(q_ids.block, q_blocked)) <= ks(_hi(k_ids.block, k_blocked)))
                & (ks(_lo(k_ids.block, k_blocked)) <= qs(_hi(q_ids.block, q_blocked))))
  return jnp.any(same_segment & (earlier | same_block), axis=0)


def live_order(live: Array) -> tuple[Array, Array]:
  """(order int32 [n, m], count int32 [n]): row r's live columns first, ascending."""
  order = jnp.argsort(~live, axis=1, stable=True).astype(jnp.int32)
  return order, jnp.sum(live, axis=1, dtype=jnp.int32)


# ----------------------------------------------------------------------------------------
# Layout: [B, L, ...] <-> blocks [n, B, block, ...].
# ----------------------------------------------------------------------------------------
def _pad_to(x: Array, length: int, value=0) -> Array:
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, length - x.shape[1])
  return jnp.pad(x, pad, constant_values=value)


def _blocks(x: Array, block: int) -> Array:
  """[B, n * block, ...] -> [n, B, block, ...]."""
  b, l = x.shape[:2]
  return jnp.moveaxis(x.reshape((b, l // block, block) + x.shape[2:]), 1, 0)


def _unblocks(x: Array) -> Array:
  """[n, B, block, ...] -> [B, n * block, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape((x.shape[0], -1) + x.shape[3:])


def _blocked_ids(ids: masks.MaskIds, block: int) -> masks.MaskIds:
  """Ids padded to a multiple of `block` (padding: segment 0, kept by nothing) and blocked
  [n, B, block]."""
  length = -(-ids.segment.shape[1] // block) * block
  padded = masks.MaskIds(index=_pad_to(ids.index, length), segment=_pad_to(ids.segment, length),
                         block=_pad_to(ids.block, length), noised=_pad_to(ids.noised, length),
                         keep=_pad_to(ids.keep, length, False))
  return jax.tree.map(lambda a: _blocks(a, block), padded)


def _summary_layout(ids: masks.MaskIds) -> masks.MaskIds:
  """Blocked ids [n, B, block] -> [B, n, block] for `live_tiles`."""
  return jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), ids)


def _take(ids: masks.MaskIds, i) -> masks.MaskIds:
  return jax.tree.map(lambda a: a[i], ids)


class Tiles(NamedTuple):
  """Blocked operands: q [nq, B, bq, K, G, D]; k, v [nk, B, bk, K, D]; ids [n, B, b]."""
  q: Array
  k: Array
  v: Array
  q_ids: masks.MaskIds
  k_ids: masks.MaskIds


def query_blocks(x: Array, block: int, kv_heads: int) -> Array:
  """Queries [B, L, H, ...] -> [nq, B, block, K, G, ...] (padded; heads grouped by kv head)."""
  b, l, h = x.shape[:3]
  length = -(-l // block) * block
  grouped = _pad_to(x, length).reshape((b, length, kv_heads, h // kv_heads) + x.shape[3:])
  return _blocks(grouped, block)


def unquery_blocks(x: Array, length: int) -> Array:
  """[nq, B, block, K, G, ...] -> [B, length, K * G, ...]."""
  x = _unblocks(x)
  return x.reshape(x.shape[:2] + (-1,) + x.shape[4:])[:, :length]


def tile(q: Array, k: Array, v: Array, q_ids, k_ids, block_q: int, block_kv: int) -> Tiles:
  """[B, L, ...] operands -> `Tiles` (lengths padded to the blocks)."""
  k_len = -(-k.shape[1] // block_kv) * block_kv
  return Tiles(q=query_blocks(q, block_q, k.shape[2]),
               k=_blocks(_pad_to(k, k_len), block_kv), v=_blocks(_pad_to(v, k_len), block_kv),
               q_ids=_blocked_ids(q_ids, block_q), k_ids=_blocked_ids(k_ids, block_kv))


def untile(x: Array, length: int) -> Array:
  """Blocked stats layout [nq, B, K, G, bq, ...] -> [B, length, K * G, ...]."""
  return unquery_blocks(jnp.moveaxis(x, 4, 2), length)


def _tile_logits(qt: Array, kt: Array, qid, kid, scale: float) -> tuple[Array, Array]:
  """Scaled logits float32 [B, K, G, bq, bk] and the rule's bool [B, 1, 1, bq, bk]."""
  s = jnp.einsum("bqkgd,bskd->bkgqs", qt, kt, preferred_element_type=jnp.float32) * scale
  return s, masks.attention_mask(qid, kid)[:, :, None]


# ----------------------------------------------------------------------------------------
# Forward: online softmax over the live key blocks of every query block.
# ----------------------------------------------------------------------------------------
def softmax_stats(tiles: Tiles, order: Array, count: Array, scale: float):
  """Per query block, over its `count` live key blocks (in `order`): the running max m,
  the sum l of exp(logit - m) and the weighted values acc, all float32, as
  ([nq, B, K, G, bq], [nq, B, K, G, bq], [nq, B, K, G, bq, D]). m is -inf and l 0 where a
  query may read no key."""
  nq, b, bq, kh, g, d = tiles.q.shape

  def one_query_block(xs):
    qt, qid, row_order, row_count = xs

    def body(j, carry):
      m, l, acc = carry
      c = row_order[j]
      vt = tiles.v[c]
      s, allowed = _tile_logits(qt, tiles.k[c], qid, _take(tiles.k_ids, c), scale)
      s = jnp.where(allowed, s, -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)   # no allowed key yet
      p = jnp.exp(s - m_safe[..., None])
      alpha = jnp.exp(m - m_safe)
      pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(vt.dtype), vt,
                      preferred_element_type=jnp.float32)
      return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

    init = (jnp.full((b, kh, g, bq), -jnp.inf, jnp.float32),
            jnp.zeros((b, kh, g, bq), jnp.float32),
            jnp.zeros((b, kh, g, bq, d), jnp.float32))
    return jax.lax.fori_loop(0, row_count, body, init)

  return jax.lax.map(one_query_block, (tiles.q, tiles.q_ids, order, count))


def stats(q, k, v, q_ids, k_ids, block_q: int, block_kv: int):
  """`softmax_stats` of q [B, Lq, H, D] over k, v [B, Lk, K, D] (blocks dividing neither
  length are fine: padded), skipping the tiles `live_tiles` rules out."""
  tiles = tile(q, k, v, q_ids, k_ids, block_q, block_kv)
  order, count = live_order(live_tiles(_summary_layout(tiles.q_ids),
                                       _summary_layout(tiles.k_ids)))
  return softmax_stats(tiles, order, count, q.shape[-1] ** -0.5)


def merge_stats(a, b):
  """Online-softmax stats of two key sets -> those of their union."""
  (ma, la, acca), (mb, lb, accb) = a, b
  m = jnp.maximum(ma, mb)
  m_safe = jnp.where(m == -jnp.inf, 0.0, m)
  wa, wb = jnp.exp(ma - m_safe), jnp.exp(mb - m_safe)
  return m, wa * la + wb * lb, wa[..., None] * acca + wb[..., None] * accb


def normalise(m, l, acc, fallback: Array):
  """Blocked stats -> (out float32 [nq, B, K, G, bq, D], lse [nq, B, K, G, bq], seen);
  a query that read no key gets `fallback` [B, K, D] (the uniform average)."""
  seen = l > 0
  out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None],
                  fallback[None, :, :, None, None, :])
  lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
  return out, lse, seen


# ----------------------------------------------------------------------------------------
# The differentiable attention.
# ----------------------------------------------------------------------------------------
def attention(q: Array, k: Array, v: Array, q_ids: masks.MaskIds, k_ids: masks.MaskIds,
              block_q: int, block_kv: int) -> Array:
  """Masked attention of q [B, Lq, H, D] over k, v [B, Lk, K, D] (H % K == 0), mask rule
  from the ids ([B, Lq] and [B, Lk]); returns [B, Lq, H, D] in v's dtype. Blocks larger
  than a length shrink to it; lengths that are not multiples of a block are padded."""
  block_q, block_kv = min(block_q, q.shape[1]), min(block_kv, k.shape[1])
  return _attention(q, k, v, q_ids, k_ids, block_q, block_kv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, q_ids, k_ids, block_q, block_kv):
  return _forward(q, k, v, q_ids, k_ids, block_q, block_kv)[0]


def _forward(q, k, v, q_ids, k_ids, block_q, block_kv):
  out, lse, seen = normalise(*stats(q, k, v, q_ids, k_ids, block_q, block_kv),
                             fallback=jnp.mean(v.astype(jnp.float32), axis=1))
  out = untile(out, q.shape[1]).astype(v.dtype)
  return out, (q, k, v, q_ids, k_ids, out, lse, seen)


def _attention_fwd(q, k, v, q_ids, k_ids, block_q, block_kv):
  return _forward(q, k, v, q_ids, k_ids, block_q, block_kv)


def _attention_bwd(block_q, block_kv, residuals, d_out):
  q, k, v, q_ids, k_ids, out, lse, seen = residuals
  lq, lk = q.shape[1], k.shape[1]
  tiles = tile(q, k, v, q_ids, k_ids, block_q, block_kv)
  live = live_tiles(_summary_layout(tiles.q_ids), _summary_layout(tiles.k_ids))
  order_t, count_t = live_order(live.T)
  d_out = d_out.astype(jnp.float32)
  kh = k.shape[2]
  d_tiles = query_blocks(d_out, block_q, kh)                          # [nq, B, bq, K, G, D]
  delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)          # [B, Lq, H]
  delta = jnp.moveaxis(query_blocks(delta, block_q, kh), 2, 4)       # [nq, B, K, G, bq]
  dq, dk, dv = _backward_loops(tiles, d_tiles, lse, delta, order_t, count_t,
                               q.shape[-1] ** -0.5)
  dq = unquery_blocks(dq, lq)
  dk, dv = _unblocks(dk)[:, :lk], _unblocks(dv)[:, :lk]
  # A query that read no key averaged every value uniformly: 1 / Lk of its gradient each.
  unseen = jnp.moveaxis(~seen, 4, 2)                                  # [nq, B, bq, K, G]
  d_mean = jnp.einsum("nbqkg,nbqkgd->bkd", unseen.astype(jnp.float32), d_tiles) / lk
  dv = dv + d_mean[:, None]
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


def _backward_loops(tiles: Tiles, d_tiles, lse, delta, order_t, count_t, scale):
  """FlashAttention-2's backward: for every key block, over its live query blocks,
  recompute p = exp(s - lse) and accumulate dk, dv (loop carry) and dq (in place)."""

  def one_key_block(dq, xs):
    kt, vt, kid, col_order, col_count = xs

    def body(j, carry):
      dq, dk, dv = carry
      r = col_order[j]
      qt, dot = tiles.q[r], d_tiles[r]
      s, allowed = _tile_logits(qt, kt, _take(tiles.q_ids, r), kid, scale)
      p = jnp.where(allowed, jnp.exp(s - lse[r][..., None]), 0.0)     # [B, K, G, bq, bk]
      dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p, dot)
      dp = jnp.einsum("bqkgd,bskd->bkgqs", dot, vt.astype(jnp.float32))
      ds = p * (dp - delta[r][..., None]) * scale
      dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qt.astype(jnp.float32))
      dq = dq.at[r].add(jnp.einsum("bkgqs,bskd->bqkgd", ds, kt.astype(jnp.float32)))
      return dq, dk, dv

    zeros = jnp.zeros(kt.shape, jnp.float32)
    dq, dk, dv = jax.lax.fori_loop(0, col_count, body, (dq, zeros, zeros))
    return dq, (dk, dv)

  dq = jnp.zeros(tiles.q.shape, jnp.float32)
  dq, (dk, dv) = jax.lax.scan(one_key_block, dq,
                              (tiles.k, tiles.v, tiles.k_ids, order_t, count_t))
  return dq, dk, dv


_attention.defvjp(_attention_fwd, _attention_bwd)
