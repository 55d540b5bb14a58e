"""Blockwise attention (`model.attention_impl="blockwise"`) equals the dense path.

Random packed rows come from the real builder and packer: text, CFG-droppable captions,
images, clips as one block or frame by frame, action chunks, noised blocks, hidden
(keep=False) tokens and padding. Equality is checked in float32 for the kernel (forward
and the gradients of q, k, v), for the whole model (outputs, parameter and input
gradients), for several block sizes (some dividing no length) and for the KV-cached path.
Memory is checked from XLA's own analysis of the compiled programs, not from timings.
"""
import dataclasses
import functools
import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot import attention, blockwise, masks, sampling
from mot.config import ConfigError, ModelConfig, validate_model
from mot.data import packing
from mot.data.builder import SequenceBuilder
from mot.model import MoT, inputs_from_batch
from tests._models import model_config

CFG = model_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                   rope_sections=(1, 1, 2), mlp_dim=64, time_embed_dim=16, patch_dim=4)


def random_example(rng: np.random.Generator) -> dict:
  """One example of 1-3 random parts after a caption (conditioning), mostly after BOS
  (without it, a blanked caption's first tokens may read no key at all)."""
  b = SequenceBuilder(4)
  if rng.random() < 0.7:
    b.add_text([1])
  b.add_text(rng.integers(20, 200, rng.integers(1, 5)), cond=True)
  for _ in range(rng.integers(1, 4)):
    kind = rng.integers(0, 5)
    noised = bool(rng.random() < 0.5)
    if kind == 0:
      b.add_text(rng.integers(20, 200, rng.integers(1, 6)), loss=True)
    elif kind == 1:
      b.add_image(rng.normal(size=(2, rng.integers(1, 3), 4)), noised=noised)
    elif kind == 2:
      b.add_video(rng.normal(size=(2, 2, 1, 4)), noised=noised)
    elif kind == 3:
      t = int(rng.integers(2, 4))
      roles = [str(r) for r in rng.choice(["given", "clean", "noised", "forced"], t)]
      b.add_video_frames(rng.normal(size=(t, 1, 2, 4)), roles)
    else:
      b.add_action(rng.normal(size=(rng.integers(1, 4), 2)), noised=noised)
  return b.build()


def random_batch(seed: int, rows: int = 2, length: int = 61) -> dict:
  """Packed rows (ending in padding) and a `keep` that blanks some examples' captions."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(rows):
    examples = [random_example(rng) for _ in range(8)]
    row, _ = packing.pack_examples(examples, length - int(rng.integers(1, 8)))
    row = {k: np.pad(v, [(0, length - len(v))] + [(0, 0)] * (v.ndim - 1))
           for k, v in row.items()}
    dropped = rng.random(10) < 0.4   # one coin per packed example, as cfg_dropout
    row["keep"] = ~(dropped[row["segment_ids"]] & (row["cond_mask"] > 0))
    out.append(row)
  return {k: np.stack([r[k] for r in out]) for k in out[0]}


def batch_ids(batch) -> masks.MaskIds:
  return masks.MaskIds.from_fields(jnp.asarray(batch["segment_ids"]),
                                   jnp.asarray(batch["block_ids"]),
                                   jnp.asarray(batch["dm_mask"] > 0),
                                   jnp.asarray(batch["keep"]))


def qkv(seed, b, lq, lk, h=4, kv=2, d=8):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return f(b, lq, h, d), f(b, lk, kv, d), f(b, lk, kv, d), f(b, lq, h, d)


def test_the_random_layouts_hold_every_case():
  batch = random_batch(0)
  allowed = np.asarray(masks.attention_mask(batch_ids(batch), batch_ids(batch)))[:, 0]
  assert np.any(batch["segment_ids"] == 0) and batch["segment_ids"].max() >= 3
  assert np.any(batch["dm_mask"] > 0) and np.any(batch["modality"] == 2)
  assert np.any(~batch["keep"] & (batch["segment_ids"] > 0))
  assert np.any(~allowed.any(-1) & (batch["segment_ids"] > 0))   # real queries that see
  assert np.any(~allowed.any(-1) & (batch["segment_ids"] == 0))  # nothing, and padding


@pytest.mark.parametrize("block_q,block_kv", [(8, 8), (16, 5), (7, 13), (64, 128), (1, 61)])
def test_kernel_equals_dense_forward_and_gradients(block_q, block_kv):
  ids = batch_ids(random_batch(1))
  q, k, v, w = qkv(0, 2, 61, 61)

  @jax.jit
  def outputs_and_grads(q, k, v, w):
    mask = masks.attention_mask(ids, ids)
    dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask)
    tiled = lambda q, k, v: blockwise.attention(q, k, v, ids, ids, block_q, block_kv)
    return [jax.value_and_grad(lambda *x, f=f: jnp.sum(f(*x) * w), argnums=(0, 1, 2))(q, k, v)
            + (f(q, k, v),) for f in (dense, tiled)]

  (want_loss, want_grads, want), (got_loss, got_grads, got) = outputs_and_grads(q, k, v, w)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
  for a, b in zip(want_grads, got_grads):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)


def test_live_tiles_cover_every_allowed_pair_and_skip_the_rest():
  """The tile summary may keep a tile the rule masks, never drop one it allows; on
  packed rows it drops most (other examples' tiles, later blocks of causal text)."""
  for seed in range(4):
    batch = random_batch(seed, rows=1, length=64)
    ids = batch_ids(batch)
    block = 8
    allowed = np.asarray(masks.attention_mask(ids, ids))[0, 0]
    exact = allowed.reshape(8, block, 8, block).any(axis=(1, 3))
    blocked = jax.tree.map(lambda a: a.reshape(1, 8, block), ids)
    live = np.asarray(blockwise.live_tiles(blocked, blocked))
    assert np.all(live[exact]), seed
    assert live.sum() <= 0.6 * live.size, (seed, live.sum())


def random_params(model: MoT, inputs, seed: int = 0):
  """Random parameters of every shape `model.init` makes, without compiling init (slow
  on a CPU); nothing zero-initialised, so every parameter matters."""
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs))
  rng = np.random.default_rng(seed)
  fill = lambda path, leaf: jnp.asarray(
      ("scale" in jax.tree_util.keystr(path)) + 0.1 * rng.standard_normal(leaf.shape),
      leaf.dtype)
  return jax.tree_util.tree_map_with_path(fill, shapes["params"])


@functools.lru_cache(maxsize=8)
def _model_outputs_and_grads(impl, block_q=16, block_kv=16, changes=()):
  """Outputs and (parameter, patch) gradients of a loss over every position of
  `random_batch(2, length=50)`; cached, so the dense reference is computed once."""
  batch = random_batch(2, length=50)
  cfg = dataclasses.replace(CFG, attention_impl=impl, attention_block_q=block_q,
                            attention_block_kv=block_kv, **dict(changes))
  model = MoT(cfg)
  b = jax.tree.map(jnp.asarray, batch)
  t = jnp.where(b["dm_mask"] > 0, 0.6, 0.0)
  params = random_params(model, inputs_from_batch(b))

  def loss(p, patches):
    inputs = inputs_from_batch(b, patches=patches, timesteps=t, keep=b["keep"])
    logits, velocity, _ = model.apply({"params": p}, inputs)
    return jnp.sum(logits ** 2) * 1e-3 + jnp.sum(velocity ** 2), (logits, velocity)

  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
  (_, outputs), grads = fn(params, b["patches"])
  return outputs, grads


@pytest.mark.parametrize("block_q,block_kv,changes", [
    (16, 16, ()), (12, 20, ()),
    (24, 9, (("remat_policy", "nothing_saveable"), ("scan_layers", False)))])
def test_model_equals_dense_outputs_and_param_and_input_gradients(block_q, block_kv, changes):
  want_out, want_grads = _model_outputs_and_grads("xla", changes=changes)
  got_out, got_grads = _model_outputs_and_grads("blockwise", block_q, block_kv, changes)
  for want, got in zip(want_out, got_out):   # every position, padding included
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  for want, got in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)):
    scale = np.abs(np.asarray(want)).max() + 1e-6
    assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-4 * scale


def test_the_trunk_builds_no_dense_mask_for_blockwise():
  batch = jax.tree.map(jnp.asarray, random_batch(3, rows=1, length=40))
  ids = batch_ids(batch)
  for impl, dense in (("xla", True), ("blockwise", False)):
    mask = attention.make_mask(dataclasses.replace(CFG, attention_impl=impl), ids, ids)
    assert mask.impl == impl and (mask.dense is not None) == dense
    assert (mask.q_ids is None) == dense


def _attention_temp_bytes(impl: str, length: int) -> int:
  """XLA's temporary bytes of one attention forward + backward at `length` tokens."""
  ids = masks.MaskIds.from_fields(jnp.ones((1, length), jnp.int32),
                                  jnp.zeros((1, length), jnp.int32),
                                  jnp.zeros((1, length), bool))

  def loss(q, k, v):
    if impl == "blockwise":
      out = blockwise.attention(q, k, v, ids, ids, 128, 128)
    else:
      out = jax.nn.dot_product_attention(q, k, v, mask=masks.attention_mask(ids, ids))
    return jnp.sum(out * out)

  shape = lambda h: jax.ShapeDtypeStruct((1, length, h, 16), jnp.float32)
  fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  return fn.lower(shape(2), shape(1), shape(1)).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_memory_grows_linearly_where_dense_grows_quadratically():
  """4x the tokens: the dense program's temporaries grow ~16x (the L x L scores, mask and
  probabilities, kept for the backward pass), blockwise's at most ~4x (O(L * block))."""
  dense = _attention_temp_bytes("xla", 2048) / _attention_temp_bytes("xla", 512)
  tiled = _attention_temp_bytes("blockwise", 2048) / _attention_temp_bytes("blockwise", 512)
  assert dense > 12, dense
  assert tiled < 4.5, tiled
  assert _attention_temp_bytes("blockwise", 2048) < _attention_temp_bytes("xla", 2048) / 20


# ----------------------------------------------------------------------------------------
# The choice, and its config fields.
# ----------------------------------------------------------------------------------------
def test_auto_runs_blockwise_from_the_configured_length_off_gpu_and_tpu():
  if jax.default_backend() in ("gpu", "tpu"):
    pytest.skip("auto picks cuDNN or splash there")
  cfg = dataclasses.replace(CFG, attention_blockwise_min_length=64)
  q = lambda n: jax.ShapeDtypeStruct((1, n, 4, 8), jnp.float32)
  assert attention.attention_implementation(cfg, q(63)) == "xla"
  assert attention.attention_implementation(cfg, q(64)) == "blockwise"
  assert attention.attention_implementation(cfg, q(1), kv_length=64) == "blockwise"


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_auto_runs_cached_calls_blockwise_from_the_configured_length_on_every_backend(backend):
  """Issue #41: a long KV cache (decoding, cached-prefix denoising) takes blockwise on a TPU
  and a GPU too: splash and cuDNN have no cached path, and XLA would hold [Lq, Lk] scores.
  The backend is a parameter, so each one's choice is checked on any machine."""
  cfg = dataclasses.replace(CFG, attention_blockwise_min_length=64, dtype="bfloat16")
  choose = functools.partial(attention.attention_implementation, cfg, backend=backend)
  step = jax.ShapeDtypeStruct((1, 1, 4, 8), jnp.bfloat16)         # one decoded token
  assert choose(step, kv_length=63, cached=True) == "xla"
  assert choose(step, kv_length=64, cached=True) == "blockwise"
  assert choose(jax.ShapeDtypeStruct((1, 64, 4, 8), jnp.bfloat16), cached=True) == "blockwise"
  # Uncached rows keep their kernel: splash on a TPU; blockwise where cuDNN cannot run
  # (float32 compute), as on a CPU.
  row = jax.ShapeDtypeStruct((1, 64, 4, 8), jnp.float32)
  assert choose(row) == ("splash" if backend == "tpu" else "blockwise")


def test_bad_block_fields_and_splash_off_tpu_are_config_errors():
  for name in ("attention_block_q", "attention_block_kv", "attention_blockwise_min_length"):
    for bad in (0, -8, 1.5, True):
      with pytest.raises(ConfigError, match=f"config.model.{name}={bad!r} must be a positive"):
        validate_model(dataclasses.replace(CFG, **{name: bad}))
  validate_model(dataclasses.replace(CFG, attention_impl="blockwise"))
  if jax.default_backend() != "tpu":
    with pytest.raises(ConfigError, match="attention_impl='splash' needs a TPU"):
      validate_model(dataclasses.replace(CFG, attention_impl="splash"))


@pytest.mark.parametrize("name,arg", [("digits", ""), ("digits", "tiny"), ("bench", "peer"),
                                      ("bench", "d512"), ("image_folder", ""),
                                      ("moving_digits", ""), ("moving_digits", "tiny")])
def test_every_config_declares_the_attention_fields(name, arg):
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  for field in ("attention_impl", "attention_block_q", "attention_block_kv",
                "attention_blockwise_min_length"):
    assert field in config.model, (name, field)
  if name == "image_folder":   # widths left to the data (mot.data.auto_config): as if RGB
    config.model.patch_dim, config.model.modality_patch_dims = 48, (0, 48, 48, 2)
  validate_model(ModelConfig.from_config(config.model))


# ----------------------------------------------------------------------------------------
# The KV-cached path.
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache_index,new,block", [(0, 9, 4), (30, 1, 8), (41, 20, 16)])
def test_cached_blockwise_equals_dense_cached(cache_index, new, block):
  batch = random_batch(4, length=61)
  ids = batch_ids(batch)
  q, _, _, _ = qkv(1, 2, new, 61)
  _, ck, cv, _ = qkv(2, 2, 61, 61)
  _, nk, nv, _ = qkv(3, 2, new, new)
  cache, new_kv = {"k": ck, "v": cv}, {"k": nk, "v": nv}
  q_ids = jax.tree.map(lambda a: a[:, cache_index:cache_index + new], ids)

  @jax.jit
  def both(q, new_kv, cache):
    return (attention.cached_attention(q, new_kv, cache, cache_index,
                                       masks.attention_mask(q_ids, ids)),
            attention.blockwise_cached_attention(q, new_kv, cache, cache_index, q_ids, ids,
                                                 block, block))

  want, got = both(q, new_kv, cache)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)


def _sampling_model(impl: str) -> MoT:
  return MoT(dataclasses.replace(CFG, attention_impl=impl, attention_block_q=8,
                                 attention_block_kv=8))


def _prompts(seed: int, n: int) -> list[dict]:
  rng = np.random.default_rng(seed)
  cut = lambda ex, n: {k: v[:n] for k, v in ex.items()}
  return [cut(random_example(rng), int(rng.integers(10, 30))) for _ in range(n)]


def test_cached_decoding_blockwise_equals_dense():
  dense, tiled = _sampling_model("xla"), _sampling_model("blockwise")
  batch = sampling.pad_left(_prompts(5, 3), length=40, batch=4)
  params = random_params(dense, sampling.prompt_inputs(
      jax.tree.map(jnp.asarray, batch)))
  want_tokens, want_logits = sampling.decode(dense, params, batch, 12, stop_tokens=[])
  got_tokens, got_logits = sampling.decode(tiled, params, batch, 12, stop_tokens=[])
  np.testing.assert_array_equal(got_tokens, want_tokens)
  np.testing.assert_allclose(got_logits, want_logits, atol=1e-4, rtol=1e-4)


def test_cached_prefix_denoising_blockwise_equals_dense():
  dense, tiled = _sampling_model("xla"), _sampling_model("blockwise")
  b = SequenceBuilder(4)
  b.add_text([1, 30, 31, 32], cond=True)
  b.add_image(np.zeros((3, 3, 4)), noised=True)
  prefix, block = sampling.split_block(b.build())
  prefix = sampling.pad_left([prefix, _prompts(6, 1)[0]], length=40)
  block = sampling.block_arrays([block, block])
  noise = np.random.default_rng(0).normal(size=(2, 9, 4)).astype(np.float32)
  params = random_params(dense, sampling.prompt_inputs(
      jax.tree.map(jnp.asarray, prefix)), seed=1)
  kw = dict(steps=3, cfg_scale=2.0)
  want = sampling.denoise(dense, params, prefix, block, noise, **kw)
  got = sampling.denoise(tiled, params, prefix, block, noise, **kw)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

