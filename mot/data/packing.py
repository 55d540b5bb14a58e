"""Packs several examples into one fixed-length row.

Short digit examples (~25-45 tokens) would waste most of a row if each were padded
alone. Packed examples are kept apart by `segment_ids` in the attention mask (docs/design.md §1),
each restarts its positions at 0 (it was built alone), and block ids are renumbered so
the rule `blk[i] == blk[j] > 0` never joins blocks of different examples.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mot.data.builder import FIELDS


def pack_examples(examples: Sequence[dict[str, np.ndarray]],
                  seq_len: int) -> tuple[dict[str, np.ndarray], int]:
  """Greedily packs examples, in order, into one row.

  Args:
    examples: unpadded `SequenceBuilder.build()` dicts, each field [n_k, ...].
  Returns:
    (row, num_dropped): row has every builder field as [seq_len, ...] plus `segment_ids`
    int32 [seq_len] (1, 2, ... per packed example, 0 = padding); padding is zero in
    every field. An example that does not fit in what is left is dropped and counted.
  """
  if not examples:
    raise ValueError("pack_examples needs at least one example (to know field shapes)")
  kept, used, num_dropped, block_offset = [], 0, 0, 0
  for ex in examples:
    n = len(ex["tokens"])
    if used + n > seq_len:
      num_dropped += 1
      continue
    blocks = ex["block_ids"]
    ex = dict(ex, block_ids=np.where(blocks > 0, blocks + block_offset, 0),
              segment_ids=np.full(n, len(kept) + 1))
    block_offset = max(block_offset, int(ex["block_ids"].max(initial=0)))
    kept.append(ex)
    used += n
  row = {}
  for key, dtype in (*FIELDS.items(), ("segment_ids", np.int32)):
    trailing = examples[0][key].shape[1:] if key in examples[0] else ()
    row[key] = np.zeros((seq_len, *trailing), dtype)
    if kept:
      row[key][:used] = np.concatenate([ex[key] for ex in kept])
  return row, num_dropped
