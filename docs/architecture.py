"""Draws docs/architecture.png, the README's picture of the model.

  python docs/architecture.py            # writes docs/architecture.png

Boxes are the modules of `mot/model.py`; the mask panel is computed by `mot.masks` on a
real packed example (a caption -> image generation example then an image -> answer
reasoning example), so the picture cannot drift from the code's mask rule.
"""
from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import patches as mpatches  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mot import masks  # pylint: disable=g-import-not-at-top
from mot.data import digits, packing, tasks  # pylint: disable=g-import-not-at-top

UNDERSTANDING, GENERATION, SHARED, HEAD = "#cfe2f3", "#f4cccc", "#e6e6e6", "#d9ead3"


def box(ax, x, y, w, h, text, color, fontsize=9):
  ax.add_patch(mpatches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02",
                                       facecolor=color, edgecolor="#444444", linewidth=1))
  ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def arrow(ax, x0, y0, x1, y1):
  ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
              arrowprops=dict(arrowstyle="->", color="#444444", linewidth=1.2))


def draw_model(ax):
  ax.set_xlim(0, 10)
  ax.set_ylim(0, 10)
  ax.axis("off")
  box(ax, 0.2, 8.4, 2.6, 0.9, "text tokens\n(byte-level)", UNDERSTANDING)
  box(ax, 0.2, 6.9, 2.6, 0.9, "clean media patches\n(image / video / action)", UNDERSTANDING)
  box(ax, 0.2, 5.4, 2.6, 0.9, "noised patches x_t\n+ timestep t", GENERATION)
  box(ax, 3.4, 6.6, 2.0, 2.4, "token embedding\n\npatch projection\nper modality\n\n"
      "+ t-embedding", SHARED)
  for y in (8.85, 7.35, 5.85):
    arrow(ax, 2.8, y, 3.4, min(max(y, 6.8), 8.8))
  box(ax, 6.0, 3.0, 3.6, 6.3,
      "N blocks\n\nRMSNorm\nGQA attention\n+ QK-norm\n+ 3-D M-RoPE (t, h, w)\n\n"
      "RMSNorm\nSwiGLU MLP\n\nexperts = shared | mode |\nmodality (MoT): own\n"
      "weights per token group,\nglobal attention", SHARED)
  arrow(ax, 5.4, 7.8, 6.0, 7.8)
  box(ax, 3.2, 1.3, 3.0, 1.1, "AR head\nRMSNorm -> unembed\nnext-token loss", HEAD)
  box(ax, 6.6, 1.3, 3.0, 1.1, "DM head\nadaLN(t) -> linear\nvelocity loss (eps - x0)",
      GENERATION)
  arrow(ax, 7.0, 3.0, 4.7, 2.4)
  arrow(ax, 8.4, 3.0, 8.1, 2.4)
  ax.text(0.2, 0.5, "total loss = ar_loss_weight * AR + dm_loss_weight * DM, one "
          "parameter pytree, one jitted sharded step", fontsize=8.5)
  ax.set_title("mot: one backbone, two heads", fontsize=12)


def example_mask() -> tuple[np.ndarray, np.ndarray]:
  """(allowed [L, L], modality/noised code [L]) of one packed two-example row."""
  x_train, y_train, _, _ = digits.load_digits_split()
  gen = tasks.generation_example(x_train[0], y_train[0], 2, 4)
  read = tasks.reasoning_example(x_train[1], y_train[1], 2, 4)
  row = packing.pack_examples([gen, read], len(gen["tokens"]) + len(read["tokens"]))[0]
  ids = masks.MaskIds.from_fields(row["segment_ids"][None], row["block_ids"][None],
                                  row["dm_mask"][None] > 0)
  allowed = np.asarray(masks.attention_mask(ids, ids))[0, 0]
  code = np.where(row["dm_mask"] > 0, 2, np.where(row["modality"] > 0, 1, 0))
  return allowed, code


def draw_mask(ax):
  allowed, code = example_mask()
  colors = np.array([[0.55, 0.55, 0.55], [0.35, 0.55, 0.85], [0.85, 0.35, 0.35]])
  img = np.ones((*allowed.shape, 3))
  key_code = np.broadcast_to(code[None, :], allowed.shape)  # colour by the key's kind
  img[allowed] = colors[key_code[allowed]]
  ax.imshow(img, interpolation="nearest")
  ax.set_title("attention mask of one packed row\n(query rows, key columns)", fontsize=10)
  ax.set_xticks([])
  ax.set_yticks([])
  handles = [mpatches.Patch(color=c, label=l) for c, l in
             zip(colors, ("text (causal)", "clean image (bidirectional block)",
                          "noised image (bidirectional, unread later)"))]
  ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8,
            frameon=False)
  ax.text(0.02, 0.98, "caption -> image", transform=ax.transAxes, va="top", fontsize=8)
  ax.text(0.98, 0.45, "image -> answer", transform=ax.transAxes, ha="right", fontsize=8)


def main(out: str = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "architecture.png")) -> str:
  fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6),
                                    gridspec_kw={"width_ratios": [1.45, 1]})
  draw_model(left)
  draw_mask(right)
  fig.tight_layout()
  fig.savefig(out, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return out


if __name__ == "__main__":
  print(main(*sys.argv[1:]))
