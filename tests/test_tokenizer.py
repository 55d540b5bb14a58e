"""Tests for the tokenizers (bytes and tokenizer.json) and the modality registry."""
import os

import numpy as np
import pytest
import tokenizers

from mot import modalities
from mot import tokenizer as tok


@pytest.fixture(name="t")
def _tokenizer():
  return tok.ByteTokenizer()


@pytest.mark.parametrize("text", ["", "a handwritten digit 7", "héllo wörld ✓ 数字 🙂"])
def test_round_trip(t, text):
  ids = t.encode(text)
  assert len(ids) == len(text.encode("utf-8"))
  assert all(tok.BYTE_OFFSET <= i < tok.VOCAB_SIZE for i in ids)
  assert t.decode(ids) == text
  assert t.decode(np.asarray(t.encode(text, bos=True, eos=True), np.int32)) == text


def test_byte_ids_and_specials(t):
  assert t.vocab_size == tok.VOCAB_SIZE == 272
  assert t.encode("A") == [16 + 65]
  assert t.encode("A", bos=True, eos=True) == [tok.BOS, 16 + 65, tok.EOS]
  assert (tok.PAD, tok.BOS, tok.EOS) == (0, 1, 2)
  assert [t.begin("image"), t.end("image")] == [3, 4]
  assert [t.begin("video"), t.end("video")] == [5, 6]
  assert [t.begin("action"), t.end("action")] == [7, 8]
  with pytest.raises(KeyError, match="unknown modality"):
    t.begin("smell")


def test_decode_stops_at_eos_and_skips_specials(t):
  ids = [tok.BOS, t.begin("image"), *t.encode("hi"), tok.PAD, t.end("image"), *t.encode("!"),
         tok.EOS, *t.encode("ignored")]
  assert t.decode(ids) == "hi!"


def test_decode_replaces_invalid_utf8(t):
  ids = t.encode("ok") + [16 + 0xFF]
  assert t.decode(ids) == "ok\ufffd"
  with pytest.raises(ValueError, match="outside the vocabulary"):
    t.decode([tok.VOCAB_SIZE])


def test_modality_registry():
  assert (modalities.TEXT, modalities.IMAGE, modalities.VIDEO, modalities.ACTION) == (0, 1, 2, 3)
  assert set(modalities.REGISTRY) == {"image", "video", "action"}
  assert modalities.NUM_MODALITIES == 4
  for m in modalities.REGISTRY.values():
    assert modalities.by_id(m.id) is m
  markers = [x for m in modalities.REGISTRY.values() for x in (m.begin_token, m.end_token)]
  assert len(set(markers)) == len(markers)
  assert all(tok.EOS < x < tok.BYTE_OFFSET and x not in (tok.AUDIO_BEGIN, tok.AUDIO_END)
             for x in markers)
  with pytest.raises(KeyError):
    modalities.by_id(modalities.TEXT)


# ---- The interface, the tokenizer.json tokenizer and from_config. ----
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def hf(name, vocab):
  return tok.HFTokenizer(os.path.join(GOLDEN, name, "tokenizer.json"), vocab)


def test_both_tokenizers_implement_the_interface():
  for t in (tok.ByteTokenizer(), hf("qwen3_tied", 327)):
    assert isinstance(t, tok.Tokenizer)
    assert {t.bos_id, t.eos_id, t.pad_id} <= set(t.special_ids)
    assert all(0 <= i < t.vocab_size for i in t.special_ids)
    assert t.decode(t.encode("draw a 7", bos=True, eos=True) + t.encode("x")) == "draw a 7"


def test_named_specials_are_kept_and_the_rest_appended():
  # qwen3_tied's tokenizer_config.json names EOS and PAD; the model has 320 rows.
  assert tok.appended_names(os.path.join(GOLDEN, "qwen3_tied", "tokenizer.json")) == [
      "bos", "image_begin", "image_end", "video_begin", "video_end", "action_begin",
      "action_end"]
  t = hf("qwen3_tied", 327)
  vocab = tokenizers.Tokenizer.from_file(os.path.join(GOLDEN, "qwen3_tied", "tokenizer.json"))
  assert (t.eos_id, t.pad_id) == (vocab.token_to_id("<|im_end|>"),
                                  vocab.token_to_id("<|endoftext|>"))
  assert t.text_vocab_size == 320 and t.bos_id == 320
  assert [t.begin("image"), t.end("image"), t.begin("action"), t.end("action")] == [
      321, 322, 325, 326]
  # qwen2_untied's names EOS only: BOS and PAD are appended.
  t = hf("qwen2_untied", 308)
  assert (t.bos_id, t.pad_id, t.begin("image")) == (300, 301, 302)


def test_hf_decode_stops_at_eos_and_skips_specials_and_unused_rows():
  t = hf("qwen3_tied", 327)
  text = "Two heads sit on top."
  ids = t.encode(text)
  assert len(ids) < len(text) and t.decode(ids) == text
  noisy = [t.bos_id, t.begin("image"), *ids[:3], 310, t.pad_id, *ids[3:], t.eos_id, *ids]
  assert t.decode(noisy) == text
  with pytest.raises(ValueError, match="outside the vocabulary"):
    t.decode([327])


def test_from_config_and_its_errors(tmp_path):
  import ml_collections
  config = ml_collections.ConfigDict({"tokenizer": "bytes", "model": {"vocab_size": 272}})
  assert isinstance(tok.from_config(config), tok.ByteTokenizer)
  config.model.vocab_size = 300     # padding rows past the byte ids are allowed
  assert tok.from_config(config) is tok.BYTE_TOKENIZER
  config.model.vocab_size = 200
  with pytest.raises(ValueError, match="byte tokenizer has 272"):
    tok.from_config(config)
  config.model.vocab_size = 300
  config.tokenizer = os.path.join(GOLDEN, "qwen3_tied", "tokenizer.json")
  with pytest.raises(ValueError, match="must cover the tokenizer"):
    tok.from_config(config)        # 300 - 7 appended < the file's 300 tokens
  config.model.vocab_size = 327
  assert tok.from_config(config).vocab_size == 327
  config.tokenizer = str(tmp_path / "nope.json")
  with pytest.raises(ValueError, match="does not exist"):
    tok.from_config(config)
  (tmp_path / "bad.json").write_text("{not json")
  config.tokenizer = str(tmp_path / "bad.json")
  with pytest.raises(ValueError, match="cannot read"):
    tok.from_config(config)


# ------------------------------------------------------------- bytes plus a word list


@pytest.fixture(name="w")
def _word_tokenizer():
  return tok.load("bytes+shapes", 358)


@pytest.mark.parametrize("text", ["", "a red square left of a blue circle", "Is it?",
                                  "  two  spaces,red.", "héllo wörld ✓ 🙂", "squares squarely"])
def test_word_tokenizer_round_trip(w, text):
  assert w.decode(w.encode(text)) == text
  assert w.decode(np.asarray(w.encode(text, bos=True, eos=True), np.int32)) == text


def test_word_tokenizer_ids(w):
  from mot.data import shapes_grammar
  assert w.vocab_size == tok.VOCAB_SIZE + 2 * len(shapes_grammar.WORDS) == 358
  ids = w.encode("How many red objects are there?")
  assert len(ids) == 7 and ids[-1] == tok.BYTE_OFFSET + ord("?")
  assert all(i >= tok.VOCAB_SIZE for i in ids[:-1])       # six words, six ids
  assert w.encode("red") != w.encode(" red")[1:]          # " red" is one id of its own
  assert len(w.encode(" red")) == 1
  # A word not on the list (or a listed word inside a longer one) falls back to bytes.
  assert w.encode("purple") == tok.BYTE_TOKENIZER.encode("purple")
  assert w.encode("squarely") == tok.BYTE_TOKENIZER.encode("squarely")
  # Specials and markers are the byte tokenizer's.
  assert (w.bos_id, w.eos_id, w.pad_id) == (tok.BOS, tok.EOS, tok.PAD)
  assert w.special_ids == tok.BYTE_TOKENIZER.special_ids
  assert [w.begin("image"), w.end("image")] == [3, 4]
  ids = [tok.BOS, *w.encode("a red"), tok.EOS, *w.encode("ignored")]
  assert w.decode(ids) == "a red"
  with pytest.raises(ValueError, match="outside the vocabulary"):
    w.decode([358])


def test_word_tokenizer_errors():
  with pytest.raises(ValueError, match="unknown tokenizer 'bytes\\+klingon'.*'bytes\\+shapes'"):
    tok.load("bytes+klingon", 1000)
  with pytest.raises(ValueError, match="'bytes\\+shapes' tokenizer has 358 ids: set it to 358"):
    tok.load("bytes+shapes", 300)
  assert tok.load("bytes+shapes", 400).vocab_size == 358   # padding rows are allowed
