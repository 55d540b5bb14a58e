"""Modality registry: the one place that names each non-text modality.

Every token of a sequence carries a modality id (docs/design.md §1): it picks the input/output
projections and, with `experts="modality"`, the expert. Media are framed by a begin and an
end marker, which are ordinary (causal) text tokens of the byte-level vocabulary
(`mot.tokenizer`). Adding a modality (audio is reserved) is one entry in `REGISTRY`.
"""
from __future__ import annotations

import dataclasses

TEXT = 0
IMAGE = 1
VIDEO = 2
ACTION = 3
AUDIO = 4  # Reserved: its id and markers (9/10) are kept free; not registered yet.


@dataclasses.dataclass(frozen=True)
class Modality:
  """A continuous modality: its name, its id, and its begin/end marker token ids."""
  name: str
  id: int
  begin_token: int
  end_token: int


REGISTRY: dict[str, Modality] = {
    m.name: m for m in (
        Modality("image", IMAGE, begin_token=3, end_token=4),
        Modality("video", VIDEO, begin_token=5, end_token=6),
        Modality("action", ACTION, begin_token=7, end_token=8),
    )
}

# Number of modality ids in use (text included): the size of per-modality tables.
NUM_MODALITIES = 1 + max(m.id for m in REGISTRY.values())


def get(name: str) -> Modality:
  """The registered modality called `name`; a clear KeyError otherwise."""
  try:
    return REGISTRY[name]
  except KeyError:
    raise KeyError(f"unknown modality {name!r}; registered: {sorted(REGISTRY)}") from None


def by_id(modality_id: int) -> Modality:
  """The registered modality with this id (text, id 0, has no entry: it has no markers)."""
  for m in REGISTRY.values():
    if m.id == modality_id:
      return m
  raise KeyError(f"no registered modality with id {modality_id}; registered ids: "
                 f"{sorted(m.id for m in REGISTRY.values())} (text is {TEXT})")
