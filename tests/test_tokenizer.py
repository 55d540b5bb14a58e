"""Tests for the byte-level tokenizer and the modality registry."""
import numpy as np
import pytest

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
