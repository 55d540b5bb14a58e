"""Writes the golden fixtures of the Qwen import tests (tests/golden/): tiny random
Hugging Face checkpoints and what `transformers` computes with them.

Run with the golden-fixture environment (never a dependency of mot or its tests):

  python -m venv /work/venv-golden
  /work/venv-golden/bin/pip install torch==2.13.0 transformers==5.25.0 tokenizers==0.23.3 \
      safetensors==0.8.0 --extra-index-url https://download.pytorch.org/whl/cpu
  /work/venv-golden/bin/python tools/make_golden_qwen.py --mot_python /work/venv/bin/python

Fixtures (each folder: config.json, safetensors weights, tokenizer.json,
tokenizer_config.json, generation_config.json, golden.npz):
  qwen3_tied    Qwen3ForCausalLM, tied embeddings, explicit head_dim (query width 128 >
                hidden 48), GQA, QK-norm, rope_theta 1e6; transformers 5 config form
                (rope_parameters); one model.safetensors. Its tokenizer_config names EOS
                and PAD (mot appends BOS and the markers).
  qwen2_untied  Qwen2ForCausalLM (Qwen2.5 style: q/k/v biases, no QK-norm), untied, GQA,
                rms_norm_eps 1e-5; transformers 4 config form (top-level rope_theta,
                torch_dtype); sharded (model.safetensors.index.json). Its tokenizer_config
                names EOS only.
  qwen3_vl      Qwen3VLForConditionalGeneration: a one-block vision tower (which mot leaves
                out) and a Qwen3 language model with interleaved M-RoPE sections (4, 2, 2),
                untied, in the transformers 4 form of published Qwen3-VL configs
                (text_config's rope_theta and rope_scaling). Its rows are text only.
The weights are random but not trivial (no zero biases, norm weights around 1, not 1);
the tokenizers are byte-level BPE trained here with `tokenizers` on TEXT below (no
download); vocab_size leaves unused rows past the tokenizer, as published Qwen models do.

golden.npz: `tokens` int32 [2, 640] (row 0: TEXT tokenized, row 1: random ids over the
whole vocabulary), float32 logits on the fixed id columns `columns` ([2, 640, 48]: the
whole [2, 640, V] would not keep a fixture small), the full vocabulary's `logsumexp` and
`argmax` [2, 640] with the top-1/top-2 `margin`; a greedy continuation (`generate`,
do_sample=False, no EOS) `prompt` -> `greedy` [24] with each step's logits
`greedy_logits` [24, V] and `greedy_margin` (the script tries prompts until every margin
exceeds 1e-3, so float32 rounding cannot flip a token, and the continuation is not one
repeated token).

With --mot_python it also converts each fixture with mot (from_hf, then to_hf), loads the
export with `from_pretrained` and prints the max |logit difference| from the original.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden")
ROW = 640
COLUMNS = 48
NEW_TOKENS = 24
MIN_MARGIN = 1e-3
MIN_DISTINCT = 12   # distinct tokens in a greedy continuation (not one repeated token)

TEXT = """\
A unified model reads and writes text and images with one transformer. Its backbone is
shared: every token, whether a word or a patch of pixels, passes through the same stack of
blocks, and attention runs over the whole sequence. Two heads sit on top. The
autoregressive head predicts the next word from the words before it, exactly as a language
model does; the diffusion head takes a noisy patch and predicts the velocity that carries
it back towards the clean image. Training mixes the two tasks in every batch: a caption
followed by the image it describes, an image followed by the answer to a question about
it, plain text, and interleaved examples that think first and then draw.

Starting from a pretrained language model saves most of the work. The weights of a model
that has read a large part of the web already know grammar, facts and some reasoning; the
new model keeps them for its understanding path and learns only what images need. Some
recipes copy the understanding weights into a second expert that handles the noisy image
tokens, so the two paths start equal and then specialise. Others freeze the language
weights entirely and train the image path alone, which keeps every answer the language
model gave before the images arrived.

Checking a conversion is a matter of numbers. The same tokens must give the same logits,
position by position, up to the rounding of single-precision floats, and greedy decoding
with a key-value cache must produce the very same continuation. A converter that reads the
weights one tensor at a time needs little more memory than the parameters themselves, and
one that writes them back lets the community load the result with the tools it already
uses. Small random models make these checks fast: two layers, a few heads, a vocabulary
of a few hundred pieces, and rows long enough that the rotary positions reach far beyond
the first few dozen tokens, where errors in the frequencies would show.
"""
PROMPTS = ("A unified model", "The weights of", "Checking a conversion", "Small random",
           "Two heads sit", "Starting from")

FIXTURES = {
    "qwen3_tied": dict(
        cls="Qwen3", tokens=300, seed=1, gain=2.0,
        config=dict(vocab_size=320, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        specials=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"), shard=None),
    "qwen2_untied": dict(
        cls="Qwen2", tokens=280, seed=2, gain=1.0,
        config=dict(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        specials=dict(eos_token="<|endoftext|>"), shard="100KB"),
    "qwen3_vl": dict(
        cls="Qwen3VL", tokens=300, seed=4, gain=2.0,
        config=dict(
            tie_word_embeddings=False,
            text_config=dict(
                vocab_size=320, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=1024, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                 "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=48, patch_size=4, spatial_merge_size=2,
                               temporal_patch_size=2, deepstack_visual_indexes=[0],
                               num_position_embeddings=16)),
        specials=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"), shard=None),
}


def train_tokenizer(vocab: int) -> tokenizers.Tokenizer:
  """Byte-level BPE (Qwen's kind) with Qwen's chat specials, trained on TEXT."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([TEXT] * 4, trainer)
  return tok


def randomize(model: torch.nn.Module, seed: int, gain: float) -> None:
  """Non-trivial random weights: every projection ~ N(0, gain^2/fan_in) (the LM head
  N(0, 1/fan_in), embeddings N(0, 0.5^2)), biases ~ N(0, 0.2^2), norm weights
  ~ 1 + N(0, 0.25^2). A gain above 1 keeps a tiny model's greedy continuation from
  settling on one repeated token."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if "norm" in name:
        p.copy_(1.0 + 0.25 * noise)
      elif name.endswith("bias"):
        p.copy_(0.2 * noise)
      elif "embed_tokens" in name:
        p.copy_(0.5 * noise)
      else:
        p.copy_(noise * (gain if "proj" in name else 1.0) / p.shape[-1] ** 0.5)


def write_v4_config(folder: str) -> None:
  """Rewrites config.json in the transformers 4 form most published checkpoints have
  (a Qwen3-VL's text_config keeps its M-RoPE fields in rope_scaling)."""
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  text = cfg.get("text_config", cfg)
  rope = text.pop("rope_parameters")
  text["rope_theta"] = rope.pop("rope_theta")
  text["rope_scaling"] = rope if "mrope_section" in rope else None
  cfg["torch_dtype"] = cfg.pop("dtype")
  text.pop("layer_types", None)
  cfg["transformers_version"] = "4.57.0"
  with open(path, "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)


def model_class(name: str):
  """The transformers class of an architecture name (from config.json)."""
  return getattr(transformers, name)


def logit_stats(model, tokens: np.ndarray, columns: np.ndarray) -> dict[str, np.ndarray]:
  with torch.no_grad():
    logits = model(torch.from_numpy(tokens).long()).logits.float()
  top2 = torch.topk(logits, 2, dim=-1).values
  return {"logits": logits[..., torch.from_numpy(columns).long()].numpy(),
          "logsumexp": torch.logsumexp(logits, -1).numpy(),
          "argmax": logits.argmax(-1).numpy().astype(np.int32),
          "margin": (top2[..., 0] - top2[..., 1]).numpy()}


def greedy(model, tok: tokenizers.Tokenizer) -> dict[str, np.ndarray]:
  """The first prompt whose greedy continuation has every top-1/top-2 margin > 1e-3 and
  MIN_DISTINCT distinct tokens; with every step's logits [NEW_TOKENS, V]."""
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  for text in PROMPTS:
    prompt = np.asarray([tok.encode(text).ids], np.int64)
    out = model.generate(torch.from_numpy(prompt), max_new_tokens=NEW_TOKENS, do_sample=False,
                         min_new_tokens=NEW_TOKENS, output_scores=True,
                         return_dict_in_generate=True)
    scores = torch.stack(out.scores, 1)[0]
    top2 = torch.topk(scores, 2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).numpy()
    new = out.sequences[0, prompt.shape[1]:].numpy().astype(np.int32)
    if margin.min() > MIN_MARGIN and len(set(new.tolist())) >= MIN_DISTINCT:
      return {"prompt": prompt[0].astype(np.int32), "greedy": new, "greedy_margin": margin,
              "greedy_logits": scores.numpy().astype(np.float32)}
  raise SystemExit("no prompt gave a greedy continuation with clear margins: change seed")


def make_fixture(name: str, spec: dict) -> str:
  folder = os.path.join(OUT, name)
  shutil.rmtree(folder, ignore_errors=True)
  tok = train_tokenizer(spec["tokens"])
  hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **spec["specials"])
  hf_tok.save_pretrained(folder)
  torch.manual_seed(spec["seed"])
  config = getattr(transformers, f"{spec['cls']}Config")(**spec["config"])
  cls = model_class(config.architectures[0] if config.architectures else
                    f"{spec['cls']}ForConditionalGeneration" if spec["cls"] == "Qwen3VL"
                    else f"{spec['cls']}ForCausalLM")
  model = cls(config).eval()
  randomize(model, spec["seed"], spec["gain"])
  model.save_pretrained(folder, max_shard_size=spec["shard"] or "50MB")
  if spec["cls"] in ("Qwen2", "Qwen3VL"):
    write_v4_config(folder)
  # Reloaded from the folder: the fixture is what that config computes.
  model = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
  rng = np.random.default_rng(spec["seed"])
  vocab = spec["config"].get("text_config", spec["config"])["vocab_size"]
  text_ids = (tok.encode(TEXT).ids * 2)[:ROW]
  tokens = np.stack([text_ids, rng.integers(0, vocab, ROW)]).astype(np.int32)
  columns = np.sort(rng.choice(vocab, COLUMNS, replace=False)).astype(np.int32)
  golden = {"tokens": tokens, "columns": columns, **logit_stats(model, tokens, columns),
            **greedy(model, tok)}
  np.savez_compressed(os.path.join(folder, "golden.npz"), **golden)
  size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
  print(f"{name}: {size / 1e6:.2f} MB, logits std {golden['logits'].std():.2f}, greedy "
        f"{golden['greedy'].tolist()} (min margin {golden['greedy_margin'].min():.2e})")
  return folder


def check_export(folder: str, mot_python: str) -> float:
  """from_hf then to_hf with mot; the max |logit difference| of the export's logits from
  the original's on the fixture rows (both loaded with from_pretrained)."""
  golden = np.load(os.path.join(folder, "golden.npz"))
  with tempfile.TemporaryDirectory() as tmp:
    work, out = os.path.join(tmp, "work"), os.path.join(tmp, "export")
    for args in (["from_hf", "--hf_dir", folder, "--workdir", work],
                 ["to_hf", "--workdir", work, "--out", out]):
      subprocess.run([mot_python, "-m", "mot.convert", *args], cwd=ROOT, check=True,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
    tokens = torch.from_numpy(golden["tokens"]).long()
    logits = []
    for f in (folder, out):
      with open(os.path.join(f, "config.json")) as c:
        cls = model_class(json.load(c)["architectures"][0])
      with torch.no_grad():
        logits.append(cls.from_pretrained(f, attn_implementation="eager",
                                          dtype=torch.float32).eval()(tokens).logits)
    tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  return float((logits[0] - logits[1]).abs().max())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mot_python", help="a Python with mot's requirements: also check "
                      "that to_hf's export loads and computes the same logits")
  args = parser.parse_args()
  torch.set_num_threads(2)
  for name, spec in FIXTURES.items():
    folder = make_fixture(name, spec)
    if args.mot_python:
      print(f"{name}: export max |logit difference| {check_export(folder, args.mot_python):.3e}")


if __name__ == "__main__":
  sys.exit(main())
