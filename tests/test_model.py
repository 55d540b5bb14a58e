"""End-to-end properties of the model: causality, block bidirectionality, scan == loop."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot.config import ConfigError, ModelConfig, validate_model
from tests._models import model_config
from mot.model import MoT, inputs_from_batch

CFG = model_config(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  rope_sections=(2, 3, 3), mlp_dim=128, time_embed_dim=32)


def layout_batch(noised_block: bool):
  """[BOS t t BOI p p p p EOI t t] with a 2x2 image block; patch dim 4."""
  tokens = np.array([[1, 20, 21, 3, 0, 0, 0, 0, 4, 22, 23]], np.int32)
  n = tokens.shape[1]
  modality = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0]], np.int32)
  block = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0]], np.int32)
  pos = np.zeros((1, n, 3), np.int32)
  pos[0, :4] = np.arange(4)[:, None]
  for k, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    pos[0, 4 + k] = (4, 4 + r, 4 + c)
  pos[0, 8:] = (6 + np.arange(3))[:, None]
  rng = np.random.default_rng(0)
  patches = np.where(modality[..., None] == 1, rng.normal(size=(1, n, 4)), 0).astype(np.float32)
  return {"tokens": tokens, "patches": patches, "modality": modality, "positions": pos,
          "segment_ids": np.ones((1, n), np.int32), "block_ids": block,
          "dm_mask": (block > 0).astype(np.float32) * noised_block,
          "cond_mask": np.zeros((1, n), np.float32)}


@pytest.fixture(scope="module")
def model_and_params():
  model = MoT(CFG)
  batch = jax.tree.map(jnp.asarray, layout_batch(False))
  params = model.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  # adaLN-zero starts the DM head's modulation at zero; perturb it so the test sees it.
  params = jax.tree.map(lambda p: p + 0.02 * jax.random.normal(jax.random.PRNGKey(1), p.shape),
                        params)
  apply = jax.jit(lambda p, b, t: model.apply({"params": p}, inputs_from_batch(b, timesteps=t)))
  return apply, params


def run(apply, params, batch, t=None):
  t = jnp.zeros(batch["tokens"].shape) if t is None else t
  logits, velocity, _ = apply(params, jax.tree.map(jnp.asarray, batch), t)
  return np.asarray(logits), np.asarray(velocity)


def test_output_shapes(model_and_params):
  apply, params = model_and_params
  logits, velocity = run(apply, params, layout_batch(False))
  chex.assert_shape(logits, (1, 11, CFG.vocab_size))
  chex.assert_shape(velocity, (1, 11, CFG.patch_dim))
  assert np.isfinite(logits).all() and np.isfinite(velocity).all()


def test_later_text_does_not_change_earlier_logits(model_and_params):
  apply, params = model_and_params
  a = layout_batch(False)
  b = layout_batch(False)
  b["tokens"][0, 10] = 99
  la, _ = run(apply, params, a)
  lb, _ = run(apply, params, b)
  np.testing.assert_allclose(la[0, :10], lb[0, :10], atol=1e-5)
  assert not np.allclose(la[0, 10], lb[0, 10], atol=1e-4)


def test_one_patch_changes_every_output_of_its_block(model_and_params):
  apply, params = model_and_params
  a = layout_batch(True)
  b = layout_batch(True)
  b["patches"][0, 7] += 1.0          # the last patch of the block
  t = jnp.where(jnp.asarray(a["dm_mask"]) > 0, 0.5, 0.0)
  _, va = run(apply, params, a, t)
  _, vb = run(apply, params, b, t)
  for i in range(4, 8):              # every patch of the block, also those before it
    assert not np.allclose(va[0, i], vb[0, i], atol=1e-5), i
  np.testing.assert_allclose(va[0, :4], vb[0, :4], atol=1e-5)
  # The block is noised: nothing after it may read it.
  np.testing.assert_allclose(va[0, 8:], vb[0, 8:], atol=1e-5)


def test_clean_block_is_read_by_later_text(model_and_params):
  apply, params = model_and_params
  a = layout_batch(False)
  b = layout_batch(False)
  b["patches"][0, 5] += 1.0
  la, _ = run(apply, params, a)
  lb, _ = run(apply, params, b)
  np.testing.assert_allclose(la[0, :4], lb[0, :4], atol=1e-5)
  assert not np.allclose(la[0, 9], lb[0, 9], atol=1e-5)


def test_swiglu_custom_gradient_equals_autodiff():
  import flax.linen as nn
  from mot.layers import swiglu
  gate_up = 3 * jax.random.normal(jax.random.PRNGKey(0), (2, 7, 2, 24))
  weights = jax.random.normal(jax.random.PRNGKey(1), (2, 7, 24))
  plain = lambda a: nn.silu(a[..., 0, :]) * a[..., 1, :]
  chex.assert_trees_all_close(swiglu(gate_up), plain(gate_up), rtol=1e-6)
  grad = lambda f: jax.grad(lambda a: jnp.sum(f(a) * weights))(gate_up)
  chex.assert_trees_all_close(grad(swiglu), grad(plain), rtol=1e-5, atol=1e-6)


def square_loss(model, params, batch):
  """A scalar that depends on every logit and velocity: gradients reach both heads."""
  logits, v, _ = model.apply({"params": params}, inputs_from_batch(batch))
  return jnp.mean(logits ** 2) + jnp.mean(v ** 2)


def same_init_loss_and_grads(cfg_a: ModelConfig, cfg_b: ModelConfig):
  """Checks that two configs' models draw the same initial parameters, and returns those
  parameters (perturbed so that the adaLN-zero DM head's modulation matters) and each
  model's jitted value_and_grad of `square_loss` on `layout_batch(True)`."""
  batch = jax.tree.map(jnp.asarray, layout_batch(True))
  a, b = MoT(cfg_a), MoT(cfg_b)
  params = a.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  chex.assert_trees_all_equal(b.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"],
                              params)
  params = jax.tree.map(lambda p: p + 0.02 * jax.random.normal(jax.random.PRNGKey(1), p.shape),
                        params)
  return params, *(jax.jit(jax.value_and_grad(lambda p, m=m: square_loss(m, p, batch)))
                   for m in (a, b))


def test_scan_and_loop_agree():
  import dataclasses
  batch = jax.tree.map(jnp.asarray, layout_batch(False))
  scanned = MoT(CFG)
  looped = MoT(dataclasses.replace(CFG, scan_layers=False))
  params = scanned.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  from flax import linen as nn
  params = nn.meta.unbox(params)
  layer_params = params["backbone"]["layers"]["block"]
  loop_params = dict(params)
  loop_params["backbone"] = {f"layers_{i}": jax.tree.map(lambda p: p[i], layer_params)
                             for i in range(CFG.num_layers)}
  out_s = scanned.apply({"params": params}, inputs_from_batch(batch))
  out_l = looped.apply({"params": loop_params}, inputs_from_batch(batch))
  chex.assert_trees_all_close(out_s[:2], out_l[:2], atol=1e-5)


@pytest.mark.parametrize("unroll", [-1, 2])
def test_scan_unroll_keeps_parameters_and_gradients(unroll):
  """Unrolling the layer scan changes the program, not the model: the same initial
  parameters (same layout, same draws) and the same loss and gradients; fully unrolled
  (-1, or as many as the layers), the compiled step has no loop left."""
  import dataclasses
  cfg = dataclasses.replace(CFG, num_layers=5)
  params, looped, unrolled = same_init_loss_and_grads(
      cfg, dataclasses.replace(cfg, scan_unroll=unroll))
  grads = {"looped": looped, "unrolled": unrolled}
  chex.assert_trees_all_close(grads["unrolled"](params), grads["looped"](params),
                              rtol=1e-5, atol=1e-6)
  loops = {name: " while(" in g.lower(params).compile().as_text() for name, g in grads.items()}
  # 5 layers, 2 per iteration: a loop of two iterations, then the fifth block.
  assert loops == {"looped": True, "unrolled": unroll == 2}, loops


def test_remat_policy_gives_same_gradients():
  import dataclasses
  batch = jax.tree.map(jnp.asarray, layout_batch(True))
  base = MoT(CFG)
  remat = MoT(dataclasses.replace(CFG, remat_policy="nothing_saveable"))
  params = base.init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  g1 = jax.grad(lambda p: square_loss(base, p, batch))(params)
  g2 = jax.grad(lambda p: square_loss(remat, p, batch))(params)
  chex.assert_trees_all_close(g1, g2, atol=1e-5)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_dropout_only_with_a_dropout_rng(scan_layers):
  """Residual dropout changes outputs only when a "dropout" rng is passed (training)."""
  import dataclasses
  batch = jax.tree.map(jnp.asarray, layout_batch(True))
  plain = MoT(dataclasses.replace(CFG, scan_layers=scan_layers))
  dropped = MoT(dataclasses.replace(CFG, scan_layers=scan_layers, dropout_rate=0.3))
  inputs = inputs_from_batch(batch)
  params = plain.init(jax.random.PRNGKey(0), inputs)["params"]
  reference = plain.apply({"params": params}, inputs)[:2]
  # No rng (sampling, evaluation): exactly the model without dropout.
  chex.assert_trees_all_equal(dropped.apply({"params": params}, inputs)[:2], reference)
  train = lambda seed: dropped.apply({"params": params}, inputs,
                                     rngs={"dropout": jax.random.PRNGKey(seed)})[:2]
  a, b = train(1), train(2)
  chex.assert_trees_all_equal(a, train(1))  # a given key is reproducible
  for x, y, z in zip(a, b, reference):
    assert np.abs(np.asarray(x - y)).max() > 1e-3   # keys differ -> masks differ
    assert np.abs(np.asarray(x - z)).max() > 1e-3   # and differ from no dropout


@pytest.mark.parametrize("cache_index,new", [(0, 5), (7, 1), (9, 3)])
def test_cached_attention_equals_attention_over_updated_cache(cache_index, new):
  """The cache path never writes the cache itself; its output must equal plain
  attention over the cache with the new keys/values written in, for GQA and any mask
  (a query that may see nothing only has to stay finite)."""
  from mot import attention
  rng = np.random.default_rng(0)
  b, lmax, h, kv, d = 2, 12, 4, 2, 8
  q = jnp.asarray(rng.standard_normal((b, new, h, d)), jnp.float32)
  cache = {n: jnp.asarray(rng.standard_normal((b, lmax, kv, d)), jnp.float32)
           for n in ("k", "v")}
  new_kv = {n: jnp.asarray(rng.standard_normal((b, new, kv, d)), jnp.float32)
            for n in ("k", "v")}
  mask = rng.random((b, 1, new, lmax)) < 0.6
  mask[0, 0, 0] = False  # a query with no allowed key
  mask = jnp.asarray(mask)
  # Full float32 matmuls: on a GPU JAX's default is TF32 (10-bit mantissa), and the two
  # paths' different contraction orders then differ by ~1e-4 (seen on an H200).
  with jax.default_matmul_precision("float32"):
    got = attention.cached_attention(q, new_kv, cache, cache_index, mask)
    full = {n: jax.lax.dynamic_update_slice(cache[n], new_kv[n], (0, cache_index, 0, 0))
            for n in ("k", "v")}
    want = jax.nn.dot_product_attention(q, full["k"], full["v"], mask=mask)
  # Rows that may see some key agree exactly; a row that sees nothing (a padding query,
  # whose output is never used) is a uniform average in both, over different key sets.
  seen = np.asarray(mask[:, 0].any(-1))  # [B, L]
  chex.assert_trees_all_close(np.asarray(got)[seen], np.asarray(want)[seen], atol=1e-5,
                              rtol=1e-5)
  assert not seen[0, 0] and np.all(np.isfinite(np.asarray(got)))


# ---- Fields for pretrained checkpoints (Qwen2 biases, Qwen3 QK-norm, tied embeddings). ----
def param_shapes(cfg):
  from flax import linen as nn
  batch = jax.tree.map(jnp.asarray, layout_batch(False))
  params = jax.eval_shape(lambda r: nn.meta.unbox(
      MoT(cfg).init(r, inputs_from_batch(batch))["params"]), jax.random.PRNGKey(0))
  return {"/".join(str(k.key) for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


BLOCK = "backbone/layers/block/"
# The parameter tree of every checkpoint written before these fields existed (CFG's sizes):
# their defaults must keep it, so that old checkpoints restore.
DEFAULT_TREE = {
    "ar_head/norm/scale": (64,), "ar_head/unembed/kernel": (64, 272),
    BLOCK + "attention/key_norm/scale": (2, 16),
    BLOCK + "attention/key_value/kernel": (2, 64, 2, 2, 16),
    BLOCK + "attention/out/kernel": (2, 4, 16, 64),
    BLOCK + "attention/query/kernel": (2, 64, 4, 16),
    BLOCK + "attention/query_norm/scale": (2, 16),
    BLOCK + "attention_norm/scale": (2, 64), BLOCK + "mlp/wi/kernel": (2, 64, 2, 128),
    BLOCK + "mlp/wo/kernel": (2, 128, 64), BLOCK + "mlp_norm/scale": (2, 64),
    "dm_head/modulation/bias": (128,), "dm_head/modulation/kernel": (64, 128),
    "dm_head/out/kernel": (64, 4), "dm_head/out_bias": (4,),
    "embed/patch_projection": (4, 4, 64), "embed/token_embedding": (272, 64),
    "time_embedding/fc1/bias": (64,), "time_embedding/fc1/kernel": (32, 64),
    "time_embedding/fc2/bias": (64,), "time_embedding/fc2/kernel": (64, 64),
}


def test_default_fields_keep_the_parameter_tree():
  assert param_shapes(CFG) == DEFAULT_TREE


def test_pretrained_fields_change_only_their_parameters():
  import dataclasses
  qwen2 = param_shapes(dataclasses.replace(CFG, qkv_bias=True, qk_norm=False))
  expected = {k: v for k, v in DEFAULT_TREE.items() if "_norm/scale" not in k
              or "attention_norm" in k or "mlp_norm" in k}
  expected.update({BLOCK + "attention/query/bias": (2, 4, 16),
                   BLOCK + "attention/key_value/bias": (2, 2, 2, 16)})
  assert qwen2 == expected
  tied = param_shapes(dataclasses.replace(CFG, tie_embeddings=True))
  assert tied == {k: v for k, v in DEFAULT_TREE.items() if k != "ar_head/unembed/kernel"}


def test_tied_head_unembeds_with_the_token_embedding():
  import dataclasses
  cfg = dataclasses.replace(CFG, tie_embeddings=True)
  batch = jax.tree.map(jnp.asarray, layout_batch(False))
  model = MoT(cfg)
  from flax import linen as nn
  params = jax.jit(lambda r: nn.meta.unbox(
      model.init(r, inputs_from_batch(batch))["params"]))(jax.random.PRNGKey(0))
  logits, h = jax.jit(lambda p: (model.apply({"params": p}, inputs_from_batch(batch))[0],
                                 model.apply({"params": p}, inputs_from_batch(batch),
                                             method=MoT.trunk)[0]))(params)
  h = np.asarray(h, np.float64)
  normed = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + cfg.norm_eps)
  normed *= np.asarray(params["ar_head"]["norm"]["scale"])
  expected = normed @ np.asarray(params["embed"]["token_embedding"], np.float64).T
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)


def test_qkv_biases_route_per_expert_like_the_shared_model():
  """A "mode" model whose experts both equal a shared model's block (biases included)
  computes what the shared model computes, noised tokens (the generation expert) too."""
  import dataclasses
  from flax import linen as nn
  from mot import experts
  shared_cfg = dataclasses.replace(CFG, qkv_bias=True, qk_norm=False)
  mode_cfg = dataclasses.replace(shared_cfg, experts="mode")
  batch = jax.tree.map(jnp.asarray, layout_batch(True))
  shared = jax.jit(lambda r: nn.meta.unbox(MoT(shared_cfg).init(
      r, inputs_from_batch(batch))["params"]))(jax.random.PRNGKey(0))
  shared = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(2), p.shape),
                        shared)   # non-zero biases and modulation
  out_shared = jax.jit(lambda p: MoT(shared_cfg).apply({"params": p},
                                                       inputs_from_batch(batch)))(shared)
  out_mode = jax.jit(lambda p: MoT(mode_cfg).apply({"params": p}, inputs_from_batch(batch)))(
      experts.expand_shared(shared, mode_cfg))
  chex.assert_trees_all_close(out_mode[:2], out_shared[:2], atol=1e-5)


def test_x_prediction_returns_the_velocity_its_x0_implies(model_and_params):
  """dm_prediction "x": the head's output is x0, returned as (x_t - x0) / max(t, t_min)."""
  _, params = model_and_params
  batch = jax.tree.map(jnp.asarray, layout_batch(True))
  t = jnp.asarray([[0.0] * 4 + [0.7, 0.3, 0.01, 1.0] + [0.0] * 3])
  x_cfg = dataclasses.replace(CFG, dm_prediction="x", dm_min_time=0.05)
  head_out = run_with(MoT(CFG), params, batch, t)   # the same weights' raw head output
  v_x = run_with(MoT(x_cfg), params, batch, t)
  expected = (np.asarray(batch["patches"]) - head_out) / np.maximum(np.asarray(t), 0.05)[..., None]
  np.testing.assert_allclose(v_x, expected, rtol=1e-5, atol=1e-5)
  assert not np.allclose(v_x, head_out)
  v_method, _ = MoT(x_cfg).apply({"params": params}, inputs_from_batch(batch, timesteps=t),
                                 method=MoT.velocity)
  np.testing.assert_allclose(v_method, v_x, rtol=1e-6, atol=1e-6)


def run_with(model, params, batch, t):
  return np.asarray(model.apply({"params": params}, inputs_from_batch(batch, timesteps=t))[1])


@pytest.mark.parametrize("field,value,message", [
    ("dm_prediction", "eps", "dm_prediction='eps' is unknown: use one of"),
    ("dm_min_time", 0.0, "dm_min_time=0.0 must be in \\(0, 1\\)")])
def test_a_bad_dm_head_field_is_one_line(field, value, message):
  with pytest.raises(ConfigError, match=message) as e:
    validate_model(dataclasses.replace(CFG, **{field: value}))
  assert "\n" not in str(e.value)
