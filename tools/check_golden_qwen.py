"""Prints how closely mot reproduces the golden fixtures of tests/golden/ (no transformers
needed): each fixture is converted with mot.convert into a temporary workdir, then

  logits      max |difference| on the fixture's columns of its 640-token rows (float32)
  logsumexp   max |difference| of the whole vocabulary's logsumexp per position
  greedy      tokens of mot's KV-cache greedy decode equal to transformers' generate
  step        max |difference| of the logits each greedy token was drawn from

  python tools/check_golden_qwen.py            # docs/pretrained.md, "Exactness"
"""
from __future__ import annotations

import os
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mot import convert, sampling  # noqa: E402  (the repository's own modules)
from mot.pipeline import Pipeline  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "tests", "golden")


def check(name: str, workdir: str) -> dict[str, float]:
  g = np.load(os.path.join(GOLDEN, name, "golden.npz"))
  convert.from_hf(os.path.join(GOLDEN, name), workdir)
  pipe = Pipeline.from_workdir(workdir)
  vocab = g["greedy_logits"].shape[-1]
  logits = pipe.text_logits(g["tokens"])
  lse = np.asarray(jax.nn.logsumexp(logits[..., :vocab], axis=-1))
  n = len(g["prompt"])
  prompt = {"tokens": g["prompt"], "patches": np.zeros((n, pipe.model_cfg.patch_dim)),
            "modality": np.zeros(n, np.int32), "block_ids": np.zeros(n, np.int32),
            "positions": np.repeat(np.arange(n, dtype=np.int32)[:, None], 3, axis=1),
            "dm_mask": np.zeros(n), "cond_mask": np.zeros(n)}
  tokens, step = sampling.decode(pipe.model, pipe.params, sampling.pad_left([prompt]),
                                 len(g["greedy"]), stop_tokens=[])
  return {"logits": float(np.abs(logits[..., g["columns"]] - g["logits"]).max()),
          "logsumexp": float(np.abs(lse - g["logsumexp"]).max()),
          "greedy": f"{int(np.sum(tokens[0] == g['greedy']))} / {len(g['greedy'])}",
          "step": float(np.abs(step[0, :, :vocab] - g["greedy_logits"]).max())}


def fixtures() -> list[str]:
  """The Qwen fixtures: folders of tests/golden/ with a golden.npz (what transformers
  computed). Other fixtures live there too (the VAEs' vae_sd/, vae_flux/) and are not
  language models."""
  return [name for name in sorted(os.listdir(GOLDEN))
          if os.path.isfile(os.path.join(GOLDEN, name, "golden.npz"))]


def main():
  for name in fixtures():
    with tempfile.TemporaryDirectory() as tmp:
      result = check(name, os.path.join(tmp, "work"))
    print(name, " ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in result.items()), flush=True)


if __name__ == "__main__":
  main()
