"""Qwen3 / Qwen2 import and export (mot.convert) against golden fixtures.

tests/golden/* hold tiny random Hugging Face checkpoints and what `transformers` computed
with them (tools/make_golden_qwen.py; transformers is not needed here): the imported
model's float32 logits must equal them within 1e-4, greedy decoding through mot's KV
cache must give `generate`'s tokens, and import -> export -> import must give the same
parameters. Bad inputs are in tests/test_convert_bad_inputs.py.
"""
import importlib.util
import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mot import checkpoint as ckpt_lib
from mot import config as config_lib
from mot import convert, sampling, tokenizer
from mot.errors import InputError
from mot.model import MoT
from mot.pipeline import Pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
FIXTURES = ("qwen3_tied", "qwen2_untied")   # text models: also exported and re-imported
ALL_FIXTURES = FIXTURES + ("qwen3_vl",)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(fixture, experts) -> workdir converted from it (each converted once)."""
  cache = {}

  def get(name, experts="shared"):
    if (name, experts) not in cache:
      workdir = str(tmp_path_factory.mktemp(f"{name}_{experts}") / "work")
      convert.from_hf(os.path.join(GOLDEN, name), workdir, experts)
      cache[name, experts] = workdir
    return cache[name, experts]
  return get


def golden(name):
  return np.load(os.path.join(GOLDEN, name, "golden.npz"))


def load(workdir):
  params, saved, _ = ckpt_lib.restore_params(workdir)
  cfg = config_lib.ModelConfig.from_config(saved["model"])
  return MoT(cfg), params, saved


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_logits_equal_transformers(converted, name):
  """mot.Pipeline.from_workdir(OUT).text_logits: float32, the HF vocabulary first."""
  g = golden(name)
  pipe = Pipeline.from_workdir(converted(name))
  assert pipe.config.model.dtype == "float32" and pipe.config.model.matmul_dtype == "same"
  logits = pipe.text_logits(g["tokens"])
  vocab = g["greedy_logits"].shape[-1]
  assert logits.dtype == np.float32
  assert logits.shape == g["tokens"].shape + (pipe.model_cfg.vocab_size,)
  assert g["tokens"].shape[1] >= 500
  diff = np.abs(logits[..., g["columns"]] - g["logits"]).max()
  assert diff < TOLERANCE, diff
  lse = np.asarray(jax.nn.logsumexp(logits[..., :vocab], axis=-1))
  assert np.abs(lse - g["logsumexp"]).max() < TOLERANCE
  clear = g["margin"] > 10 * TOLERANCE
  np.testing.assert_array_equal(logits[..., :vocab].argmax(-1)[clear], g["argmax"][clear])


def test_text_logits_refuses_bad_ids(converted):
  pipe = Pipeline.from_workdir(converted("qwen3_tied"))
  for bad in ([[0, 1, pipe.model_cfg.vocab_size]], [[-1, 2]], [[0.5, 1.0]], [[]]):
    with pytest.raises(InputError):
      pipe.text_logits(np.asarray(bad))
  assert pipe.text_logits([5, 6, 7]).shape == (1, 3, pipe.model_cfg.vocab_size)


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_greedy_decoding_equals_generate(converted, name):
  g = golden(name)
  model, params, _ = load(converted(name))
  n = len(g["prompt"])
  prompt = {"tokens": g["prompt"], "patches": np.zeros((n, model.cfg.patch_dim), np.float32),
            "modality": np.zeros(n, np.int32), "block_ids": np.zeros(n, np.int32),
            "positions": np.repeat(np.arange(n, dtype=np.int32)[:, None], 3, axis=1),
            "dm_mask": np.zeros(n, np.float32), "cond_mask": np.zeros(n, np.float32)}
  tokens, logits = sampling.decode(model, params, sampling.pad_left([prompt]), len(g["greedy"]),
                                   stop_tokens=[])
  np.testing.assert_array_equal(tokens[0], g["greedy"])
  vocab = g["greedy_logits"].shape[-1]
  assert np.abs(logits[0, :, :vocab] - g["greedy_logits"]).max() < TOLERANCE


def rewrite_config_form(src, dst):
  """Copies fixture `src` to `dst` with config.json in the other transformers form."""
  shutil.copytree(src, dst)
  path = os.path.join(dst, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  if "rope_parameters" in cfg:       # transformers 5 -> 4
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
    cfg["rope_scaling"] = None
  else:                              # 4 -> 5
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    cfg.pop("rope_scaling")
  with open(path, "w") as f:
    json.dump(cfg, f)


def assert_same_params(a, b):
  flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
  flat_b = jax.tree_util.tree_flatten_with_path(b)[0]
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


@pytest.mark.parametrize("name", FIXTURES)
def test_both_config_forms_import_the_same(converted, tmp_path, name):
  other = str(tmp_path / "other_form")
  rewrite_config_form(os.path.join(GOLDEN, name), other)
  convert.from_hf(other, str(tmp_path / "work"))
  _, a, saved_a = load(converted(name))
  _, b, saved_b = load(str(tmp_path / "work"))
  assert saved_a["model"] == saved_b["model"]
  assert_same_params(a, b)


@pytest.mark.parametrize("stored", ["float32", "bfloat16"])
def test_tied_checkpoint_that_stores_its_head(converted, tmp_path, stored):
  """A tied checkpoint with lm_head.weight equal to the embedding (exactly, or rounded to
  a coarser dtype) converts to the same model as one without it: the head is dropped."""
  hf_dir = str(tmp_path / "hf")
  shutil.copytree(os.path.join(GOLDEN, "qwen3_tied"), hf_dir)
  path = os.path.join(hf_dir, "model.safetensors")
  tensors = load_file(path)
  head = tensors["model.embed_tokens.weight"].astype(
      {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[stored])
  assert stored == "float32" or not np.array_equal(head, tensors["model.embed_tokens.weight"])
  save_file({**tensors, "lm_head.weight": head}, path)
  convert.from_hf(hf_dir, str(tmp_path / "work"))
  _, a, saved_a = load(converted("qwen3_tied"))
  _, b, saved_b = load(str(tmp_path / "work"))
  assert saved_b["model"]["tie_embeddings"] and saved_a["model"] == saved_b["model"]
  assert_same_params(a, b)


@pytest.mark.parametrize("name", FIXTURES)
def test_import_export_import_gives_identical_parameters(converted, tmp_path, name):
  exported, again = str(tmp_path / "hf"), str(tmp_path / "again")
  convert.to_hf(converted(name), exported)
  with open(os.path.join(exported, "config.json")) as f:
    with open(os.path.join(GOLDEN, name, "config.json")) as g:
      assert json.load(f)["architectures"] == json.load(g)["architectures"]
  assert os.path.isfile(os.path.join(exported, "tokenizer.json"))
  convert.from_hf(exported, again)
  _, a, _ = load(converted(name))
  _, b, _ = load(again)
  assert_same_params(a, b)


def test_experts_mode_copies_the_understanding_expert(converted):
  g = golden("qwen2_untied")
  shared_model, shared, _ = load(converted("qwen2_untied"))
  mode_model, mode, saved = load(converted("qwen2_untied", "mode"))
  assert saved["model"]["experts"] == "mode"
  blocks = mode["backbone"]["layers"]["block"]
  for path, leaf in jax.tree_util.tree_flatten_with_path(blocks)[0]:
    leaf = np.asarray(leaf)                       # [layers, experts, ...]
    np.testing.assert_array_equal(leaf[:, 0], leaf[:, 1], err_msg=str(path))
  np.testing.assert_array_equal(sampling.text_logits(mode_model, mode, g["tokens"][:, :64]),
                                sampling.text_logits(shared_model, shared,
                                                     g["tokens"][:, :64]))
  # The generation-only parts start fresh, as train.py initialises them.
  assert np.abs(np.asarray(mode["embed"]["patch_projection"])).max() > 0
  assert np.abs(np.asarray(mode["dm_head"]["out"]["kernel"])).max() > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_appended_special_tokens(converted, name):
  """mot's special ids come after the checkpoint's vocabulary, their rows the mean of it."""
  _, params, saved = load(converted(name))
  with open(os.path.join(GOLDEN, name, "config.json")) as f:
    vocab = json.load(f)["vocab_size"]
  tok = tokenizer.from_config(__import__("ml_collections").ConfigDict(saved))
  assert isinstance(tok, tokenizer.HFTokenizer) and tok.text_vocab_size == vocab
  assert tok.vocab_size == saved["model"]["vocab_size"] > vocab
  markers = [f(m) for m in ("image", "video", "action") for f in (tok.begin, tok.end)]
  assert sorted(markers) == markers and min(markers) >= vocab
  table = np.asarray(params["embed"]["token_embedding"])
  np.testing.assert_allclose(table[vocab:], np.broadcast_to(table[:vocab].mean(0),
                                                             table[vocab:].shape), atol=1e-6)
  assert os.path.dirname(tok.path) == os.path.join(converted(name), convert.PRETRAINED)


def test_converting_again_into_the_same_workdir_does_nothing(converted):
  workdir = converted("qwen3_tied")
  def times():
    return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
            for d, _, files in os.walk(workdir) for f in files}
  before = times()
  convert.from_hf(os.path.join(GOLDEN, "qwen3_tied"), workdir)
  assert times() == before


def test_qwen3_vl_language_model(converted, tmp_path):
  """Qwen3-VL: its language model with its interleaved M-RoPE sections, the vision tower
  left out; exported, it is the Qwen3 text model it computes."""
  _, params, saved = load(converted("qwen3_vl"))
  assert saved["model"]["rope_sections"] == [4, 2, 2] and saved["model"]["rope_interleaved"]
  assert saved["model"]["qk_norm"] and not saved["model"]["tie_embeddings"]
  convert.to_hf(converted("qwen3_vl"), str(tmp_path / "hf"))
  with open(tmp_path / "hf" / "config.json") as f:
    assert json.load(f)["architectures"] == ["Qwen3ForCausalLM"]


def test_check_golden_qwen_reports_only_the_qwen_fixtures(monkeypatch, capsys):
  """tools/check_golden_qwen.py prints one row a Qwen fixture and skips the other
  fixtures of tests/golden/ (the VAEs' have no golden.npz: it crashed on them). Its
  conversions are test_logits_equal_transformers' and take half a minute, so `check` is
  stubbed here."""
  spec = importlib.util.spec_from_file_location(
      "check_golden_qwen", os.path.join(ROOT, "tools", "check_golden_qwen.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  assert any(not os.path.isfile(os.path.join(GOLDEN, n, "golden.npz"))
             for n in os.listdir(GOLDEN) if os.path.isdir(os.path.join(GOLDEN, n)))
  assert tool.fixtures() == sorted(ALL_FIXTURES)
  monkeypatch.setattr(tool, "check", lambda name, workdir: {"logits": 0.0, "greedy": "1 / 1"})
  tool.main()
  rows = capsys.readouterr().out.splitlines()
  assert [r.split()[0] for r in rows] == sorted(ALL_FIXTURES), rows
