"""The one attention-mask rule shared by both heads (docs/design.md §1).

  allowed(i, j) = seg[i] == seg[j] > 0
                  and (j <= i or blk[i] == blk[j] > 0)
                  and not (noised[j] and blk[j] != blk[i])
                  and keep[j]

Text is causal (AR); a block (one image, clip or action chunk) is bidirectional inside and
causal to everything before it (DM, Transfusion); packing never leaks across examples; no
token outside a noised block reads it (BAGEL). `keep[j] = False` hides a key from every
query: classifier-free-guidance dropout blanks the caption that way, in training and in
the sampler's unconditional branch alike, without changing the sequence layout.

The mask is computed from per-token ids by broadcasting inside the jitted step; no
[B, L, L] array ever lives on the host. Queries and keys are described separately so
that the same rule serves a KV cache (keys = the cached prefix + the new tokens).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MaskIds:
  """Per-token ids the rule reads; every field int/bool [B, L]."""
  index: jax.Array      # position in the sequence (orders j <= i); not the mRoPE position
  segment: jax.Array    # packed example id, 0 = padding
  block: jax.Array      # 0 = causal token, k > 0 = member of bidirectional block k
  noised: jax.Array     # bool: this token is a noised diffusion target
  keep: jax.Array       # bool: False hides the token from every query (CFG dropout)

  @classmethod
  def from_fields(cls, segment_ids, block_ids, noised, keep=None, offset=0):
    b, l = segment_ids.shape
    index = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32)[None] + offset, (b, l))
    if keep is None:
      keep = jnp.ones((b, l), bool)
    return cls(index=index, segment=segment_ids, block=block_ids,
               noised=noised.astype(bool), keep=keep.astype(bool))


def attention_mask(q: MaskIds, k: MaskIds) -> jax.Array:
  """bool [B, 1, Lq, Lk]: True where query i may attend to key j."""
  qi = lambda a: a[:, :, None]
  kj = lambda a: a[:, None, :]
  same_segment = (qi(q.segment) == kj(k.segment)) & (kj(k.segment) > 0)
  same_block = (qi(q.block) == kj(k.block)) & (kj(k.block) > 0)
  visible = (kj(k.index) <= qi(q.index)) | same_block
  noised_elsewhere = kj(k.noised) & (kj(k.block) != qi(q.block))
  allowed = same_segment & visible & ~noised_elsewhere & kj(k.keep)
  return allowed[:, None, :, :]
