"""Mixture-of-Transformers experts: routing, grouping at dense cost, and what a token's
output may depend on (docs/design.md §3)."""
import dataclasses
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mot import experts, layers
from mot.config import ModelConfig
from tests._models import model_config
from mot.model import MoT, init_cache, inputs_from_batch

CFG = model_config(d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                  rope_sections=(2, 3, 3), mlp_dim=64, time_embed_dim=16)
MODE = dataclasses.replace(CFG, experts="mode")


def layout_batch(noised: bool = True, action: bool = False):
  """Two packed rows. Row 0: [BOS t t BOI p p p p EOI t t] (2x2 image block, noised if
  asked); row 1: text only, or [BOS t t t a a a t t t t] with a 3-step action chunk."""
  n = 11
  tokens = np.array([[1, 20, 21, 3, 0, 0, 0, 0, 4, 22, 23],
                     [1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]], np.int32)
  modality = np.zeros((2, n), np.int32)
  block = np.zeros((2, n), np.int32)
  modality[0, 4:8] = 1
  block[0, 4:8] = 1
  pos = np.zeros((2, n, 3), np.int32)
  pos[0, :4] = np.arange(4)[:, None]
  for k, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    pos[0, 4 + k] = (4, 4 + r, 4 + c)
  pos[0, 8:] = (6 + np.arange(3))[:, None]
  pos[1] = np.arange(n)[:, None]
  if action:
    tokens[1, 4:7] = 0
    modality[1, 4:7] = 3
    block[1, 4:7] = 1
  rng = np.random.default_rng(0)
  patches = np.where(modality[..., None] > 0, rng.normal(size=(2, n, 4)), 0).astype(np.float32)
  dm_mask = np.zeros((2, n), np.float32)
  dm_mask[0, 4:8] = float(noised)
  return {"tokens": tokens, "patches": patches, "modality": modality, "positions": pos,
          "segment_ids": np.ones((2, n), np.int32), "block_ids": block, "dm_mask": dm_mask,
          "cond_mask": np.zeros((2, n), np.float32)}


def model_inputs(batch, t=0.6):
  batch = jax.tree.map(jnp.asarray, batch)
  return inputs_from_batch(batch, timesteps=jnp.where(batch["dm_mask"] > 0, t, 0.0))


def param_shapes(cfg):
  return nn.meta.unbox(jax.eval_shape(MoT(cfg).init, jax.random.PRNGKey(0),
                                      model_inputs(layout_batch())))["params"]


def init_params(cfg, seed=0):
  """Random parameters of every shape `init` makes (without compiling init: slow on CPU);
  nothing zero, so every parameter matters. numpy arrays."""
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return (base + 0.2 * rng.standard_normal(leaf.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(fill, param_shapes(cfg))


@functools.partial(jax.jit, static_argnums=0)
def forward(cfg, params, inputs):
  logits, velocity, _ = MoT(cfg).apply({"params": params}, inputs)
  return logits, velocity


def perturb_expert(params, cfg, expert, where=lambda names: True, layer=None):
  """params with expert `expert`'s block weights (those whose path `where` accepts, in
  `layer` or every layer) moved by noise."""
  def move(path, p):
    names = [getattr(k, "key", None) for k in path]
    axis = experts.expert_axis(path, cfg)
    if axis is None or not where(names):
      return p
    idx = [slice(None)] * p.ndim
    idx[axis] = expert
    if layer is not None:
      idx[0] = layer
    p = np.array(p)
    p[tuple(idx)] += 0.5 * rng.standard_normal(p[tuple(idx)].shape)
    return p
  rng = np.random.default_rng(7)
  return jax.tree_util.tree_map_with_path(move, params)


is_mlp = lambda names: "mlp" in names


# ----------------------------------------------------------------------------------------
# Routing and grouping.
# ----------------------------------------------------------------------------------------
def test_routing_mode_and_modality():
  b = layout_batch(noised=True, action=True)
  inputs = model_inputs(b)
  mode = experts.expert_ids(MODE, inputs.modality, inputs.mask_ids.noised)
  np.testing.assert_array_equal(mode, b["dm_mask"].astype(np.int32))  # noised -> 1
  modality = experts.expert_ids(dataclasses.replace(CFG, experts="modality"),
                                inputs.modality, inputs.mask_ids.noised)
  np.testing.assert_array_equal(modality, b["modality"])
  assert experts.group_tokens(CFG, inputs.modality, inputs.mask_ids.noised) is None


@pytest.mark.parametrize("impl, tile, shards", [("tiled", 4, 1), ("tiled", 256, 1),
                                               ("ragged", 1, 1), ("tiled", 4, 2),
                                               ("ragged", 1, 2)])
def test_grouping_is_a_stable_sort_into_single_expert_tiles(impl, tile, shards):
  """Each shard of rows (one data shard of the batch) is grouped on its own: every row of
  its buffer holds one of its own tokens."""
  e = jnp.asarray(np.random.default_rng(0).integers(0, 3, size=(4, 7)), jnp.int32)
  g = jax.jit(experts.group_by_expert, static_argnums=(1, 2, 3, 4))(e, 3, impl, tile, shards)
  assert g.src.shape[0] == shards
  for s in range(shards):
    flat = np.asarray(e).reshape(shards, -1)[s]
    src, valid, dest = np.asarray(g.src[s]), np.asarray(g.valid[s]), np.asarray(g.dest[s])
    assert valid.sum() == flat.size and np.array_equal(src[dest], np.arange(flat.size))
    row_expert = np.repeat(np.asarray(g.tile_expert[s]), g.tile)
    np.testing.assert_array_equal(row_expert[dest], flat)         # every row's tile = expert
    for k in range(3):                                             # token order kept
      rows = dest[flat == k]
      assert np.all(np.diff(rows) > 0)
    np.testing.assert_array_equal(g.group_sizes[s], np.bincount(flat, minlength=3))
    if impl == "tiled":                                            # bounded padding
      assert len(src) <= -(-flat.size // g.tile) * g.tile + 2 * g.tile
  x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 7, 5)), jnp.float32)
  buf = jax.jit(lambda g, x: g.dispatch(x))(g, x)
  assert buf.shape[:2] == (shards, g.src.shape[1])
  np.testing.assert_array_equal(buf[0, np.asarray(g.dest[0])],
                                np.asarray(x).reshape(shards, -1, 5)[0])
  np.testing.assert_array_equal(jax.jit(lambda g, b: g.combine(b))(g, buf), x)


@pytest.mark.parametrize("impl", ["tiled", "ragged"])
@pytest.mark.parametrize("in_dims, shards", [(1, 1), (2, 1), (1, 2)])
def test_grouped_matmul_equals_per_token_select(impl, in_dims, shards):
  """Grouped matmul (and its gradients) == the naive reference that gathers every
  token's own expert's kernel, for the whole batch grouped at once or per shard."""
  rng = np.random.default_rng(0)
  e = jnp.asarray(rng.integers(0, 3, size=(2, 9)), jnp.int32)
  in_shape = (4,) if in_dims == 1 else (2, 3)
  x = jnp.asarray(rng.normal(size=(2, 9, *in_shape)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, *in_shape, 5)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(2, 9, 5)), jnp.float32)
  sub = "xy"[:in_dims]

  def grouped(x, w):
    g = experts.group_by_expert(e, 3, impl, tile=4, shards=shards)
    return jnp.sum(g.combine(experts.grouped_matmul(g.dispatch(x), w, g, in_dims)) * ct)

  def reference(x, w):
    return jnp.sum(jnp.einsum(f"bl{sub},bl{sub}o->blo", x, w[e]) * ct)

  both = jax.jit(lambda x, w: (jax.value_and_grad(grouped, (0, 1))(x, w),
                               jax.value_and_grad(reference, (0, 1))(x, w)))
  got, want = both(x, w)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------
# The model: "mode" with identical experts == "shared"; what outputs depend on.
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("experts_mode, impl", [("mode", "tiled"), ("mode", "ragged"),
                                               ("modality", "tiled")])
def test_identical_experts_equal_shared(experts_mode, impl):
  shared = CFG
  mot_cfg = dataclasses.replace(shared, experts=experts_mode, expert_impl=impl)
  params = init_params(shared)
  expanded = experts.expand_shared(params, mot_cfg)
  # The expert tree is the shared one (names and shapes) plus an axis.
  chex.assert_trees_all_equal_shapes(param_shapes(mot_cfg), expanded)
  inputs = model_inputs(layout_batch(noised=True, action=True))
  chex.assert_trees_all_close(forward(shared, params, inputs),
                              forward(mot_cfg, expanded, inputs), atol=1e-5, rtol=1e-5)


# Gradients run the layer loop (not scan) under remat: scan + experts is covered above.
LOOP_REMAT = dataclasses.replace(CFG, scan_layers=False, remat_policy="nothing_saveable")
MODE_LOOP_REMAT = dataclasses.replace(LOOP_REMAT, experts="mode")


@functools.partial(jax.jit, static_argnums=0)
def _loss_and_grads(cfg, params, inputs, w_logits, w_velocity):
  """Loss sum(w_logits * sin(logits)) + sum(w_velocity * v^2) over tokens [B, L], and its
  gradients: one compile per config for every choice of weights."""
  def loss(p):
    logits, v, _ = MoT(cfg).apply({"params": p}, inputs)
    return (jnp.sum(w_logits[..., None] * jnp.sin(logits))
            + jnp.sum(w_velocity[..., None] * v ** 2))
  return jax.value_and_grad(loss)(params)


def test_identical_experts_equal_shared_gradients():
  """Layer loop + remat: the loss matches, and each shared gradient is the sum of its
  experts' gradients."""
  params = init_params(LOOP_REMAT)
  inputs = model_inputs(layout_batch(noised=True, action=True))
  w = np.full((2, 11), 0.1, np.float32)
  loss, grads = _loss_and_grads(LOOP_REMAT, params, inputs, w, w)
  mot_loss, mot_grads = _loss_and_grads(
      MODE_LOOP_REMAT, experts.expand_shared(params, MODE_LOOP_REMAT), inputs, w, w)
  np.testing.assert_allclose(loss, mot_loss, rtol=1e-5)
  summed = jax.tree_util.tree_map_with_path(
      lambda path, g: g if experts.expert_axis(path, MODE_LOOP_REMAT) is None else g.sum(0),
      mot_grads)
  chex.assert_trees_all_close(grads, summed, atol=1e-5, rtol=1e-4)


def test_unused_expert_changes_nothing():
  """A text-only row never reads the generation expert: its outputs are bit-identical
  when expert 1's weights change."""
  params = init_params(MODE)
  inputs = model_inputs(layout_batch(noised=False))   # no noised token anywhere
  a = forward(MODE, params, inputs)
  b = forward(MODE, perturb_expert(params, MODE, 1), inputs)
  chex.assert_trees_all_equal(a, b)
  c = forward(MODE, perturb_expert(params, MODE, 0), inputs)
  assert not np.allclose(a[0], c[0])


def test_understanding_never_reads_the_generation_expert():
  """Mixed rows: no token reads a noised block (the mask rule), so every understanding
  token's output is independent of all of expert 1's weights, in every layer."""
  params = init_params(MODE)
  b = layout_batch(noised=True)
  inputs = model_inputs(b)
  und = b["dm_mask"] == 0
  la, va = forward(MODE, params, inputs)
  lb, vb = forward(MODE, perturb_expert(params, MODE, 1), inputs)
  np.testing.assert_array_equal(np.asarray(la)[und], np.asarray(lb)[und])
  np.testing.assert_array_equal(np.asarray(va)[und], np.asarray(vb)[und])
  assert not np.allclose(np.asarray(vb)[~und], np.asarray(va)[~und])


def test_other_experts_mlp_reaches_a_token_only_through_attention():
  """Generation tokens read the understanding tokens (the caption): expert 0's MLP in the
  LAST layer feeds no attention any more, so it cannot change them; in the first layer it
  changes the keys/values they read, so it does."""
  params = init_params(MODE)
  b = layout_batch(noised=True)
  inputs = model_inputs(b)
  gen = b["dm_mask"] > 0
  _, v = forward(MODE, params, inputs)
  last = MODE.num_layers - 1
  _, v_last = forward(MODE, perturb_expert(params, MODE, 0, is_mlp, layer=last), inputs)
  np.testing.assert_array_equal(np.asarray(v)[gen], np.asarray(v_last)[gen])
  _, v_first = forward(MODE, perturb_expert(params, MODE, 0, is_mlp, layer=0), inputs)
  assert not np.allclose(np.asarray(v)[gen], np.asarray(v_first)[gen], atol=1e-4)


def _expert_grads(params, inputs, token, head):
  """Block gradients {layer: tree [E, ...]} of one token's loss (head 0: logits,
  1: velocity) in row 0, and the gradient's size per expert."""
  w = np.zeros((2, 11), np.float32)
  w[0, token] = 1.0
  zeros = np.zeros_like(w)
  _, grads = _loss_and_grads(MODE_LOOP_REMAT, params, inputs, *((w, zeros) if head == 0
                                                                 else (zeros, w)))
  layers = {i: grads["backbone"][f"layers_{i}"] for i in range(MODE.num_layers)}
  size = sum(np.abs(np.asarray(g)).reshape(2, -1).sum(1) for g in jax.tree.leaves(layers))
  return layers, size


def test_token_local_loss_reaches_only_its_experts_weights():
  params = init_params(MODE_LOOP_REMAT)
  # A text token's loss: the understanding expert only (it can read no noised token).
  inputs = model_inputs(layout_batch(noised=True))
  _, size = _expert_grads(params, inputs, 9, 0)
  assert size[0] > 0 and size[1] == 0
  # A noised token in a row of its own block only: the generation expert only.
  b = layout_batch(noised=True)
  b["segment_ids"][0] = np.where(b["block_ids"][0] > 0, 2, 1)
  _, size = _expert_grads(params, model_inputs(b), 5, 1)
  assert size[1] > 0 and size[0] == 0
  # With the caption visible, the caption's keys/values (expert 0) get gradient, but
  # not expert 0's last-layer MLP: the token reads no MLP output of another token there.
  layers, _ = _expert_grads(params, inputs, 5, 1)
  last = layers[MODE.num_layers - 1]
  for g in jax.tree.leaves(last["mlp"]):
    assert float(jnp.sum(jnp.abs(g[0]))) == 0 and float(jnp.sum(jnp.abs(g[1]))) > 0
  assert float(jnp.sum(jnp.abs(layers[0]["attention"]["key_value"]["kernel"][0]))) > 0


def test_modality_experts_follow_the_modality():
  cfg = dataclasses.replace(CFG, experts="modality")
  params = init_params(cfg)
  b = layout_batch(noised=False, action=True)
  inputs = model_inputs(b)
  logits, _ = forward(cfg, params, inputs)
  # Video (2) is absent: its expert changes nothing.
  chex.assert_trees_all_equal(forward(cfg, perturb_expert(params, cfg, 2), inputs)[0], logits)
  # The action expert (3) changes row 1 from the action chunk on, and nothing in row 0.
  moved = np.asarray(forward(cfg, perturb_expert(params, cfg, 3), inputs)[0])
  np.testing.assert_array_equal(moved[0], np.asarray(logits)[0])
  np.testing.assert_array_equal(moved[1, :4], np.asarray(logits)[1, :4])
  assert not np.allclose(moved[1, 4:], np.asarray(logits)[1, 4:])


# ----------------------------------------------------------------------------------------
# Cached decoding routes every token to its own expert.
# ----------------------------------------------------------------------------------------
def test_cached_prefix_then_tokens_equal_full_forward(cfg=MODE):
  """Prefill the first 4 tokens, then the noised/clean block (4 tokens at once, as the DM
  sampler does), then the rest one token at a time (as AR decoding): every output equals
  the uncached forward's."""
  params = init_params(cfg)
  b = jax.tree.map(jnp.asarray, layout_batch(noised=cfg.experts == "mode", action=True))
  full = model_inputs(b)
  want_logits, want_v = forward(cfg, params, full)
  ids = full.mask_ids
  cache = init_cache(cfg, 2, 11)
  step = jax.jit(lambda p, inp, c, i: MoT(cfg).apply({"params": p}, inp, cache=c,
                                                      cache_index=i, cache_ids=ids))
  for start, stop in [(0, 4), (4, 8)] + [(i, i + 1) for i in range(8, 11)]:
    part = jax.tree.map(lambda x: x[:, start:stop], full)
    logits, v, cache = step(params, part, cache, start)
    np.testing.assert_allclose(logits, want_logits[:, start:stop], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(v, want_v[:, start:stop], atol=2e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------
# BAGEL's options: generation expert initialised from understanding; frozen understanding.
# ----------------------------------------------------------------------------------------
def test_init_generation_from_understanding():
  cfg = dataclasses.replace(MODE, init_generation_from_understanding=True)
  groups = experts.group_by_expert(jnp.array([[0, 1, 1]]), 2)
  x = groups.dispatch(jnp.ones((1, 3, 4, 8)))
  kernel = jax.jit(lambda: nn.meta.unbox(layers.Linear(cfg, (5,), ("heads", "kv", "embed"),
                                                       in_dims=2).init(
      jax.random.PRNGKey(0), x, groups)["params"]["kernel"]))()
  assert kernel.shape == (2, 4, 8, 5)
  np.testing.assert_array_equal(kernel[0], kernel[1])
  assert np.std(kernel[0]) > 0


def test_freeze_understanding_updates_only_the_generation_path():
  from configs import digits
  config = digits.get_config("tiny")
  config.model.experts = "mode"
  config.freeze_understanding = True
  cfg = ModelConfig.from_config(config.model)
  from mot import step as step_lib
  tx = step_lib.make_optimizer(config)
  params = init_params(cfg)

  @jax.jit
  def two_steps(params):  # the first step's learning rate is 0 (warm-up)
    opt_state = tx.init(params)
    for _ in range(2):
      updates, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
      params = optax.apply_updates(params, updates)
    return params

  new = two_steps(params)
  for old, upd in zip(jax.tree.leaves(params["backbone"]), jax.tree.leaves(new["backbone"])):
    np.testing.assert_array_equal(old[:, 0], upd[:, 0])
    assert not np.array_equal(old[:, 1], upd[:, 1])
  np.testing.assert_array_equal(params["embed"]["token_embedding"],
                                new["embed"]["token_embedding"])
  assert not np.array_equal(params["dm_head"]["out"]["kernel"], new["dm_head"]["out"]["kernel"])


def test_weight_decay_mask_ignores_stacked_axes():
  """Norm scales are vectors per layer and per expert: never decayed, whatever stacks them."""
  from configs import digits
  from mot import step as step_lib
  config = digits.get_config("tiny")
  config.update({"grad_clip_norm": 1e9, "learning_rate": 1.0, "warmup_steps": 0,
                 "num_train_steps": 10, "min_lr_ratio": 1.0, "weight_decay": 0.5})
  config.model.update({"experts": "mode", "scan_layers": True})
  tx = step_lib.make_optimizer(config)
  params = {"backbone": {"scale": jnp.ones((2, 2, 4)), "kernel": jnp.ones((2, 2, 4, 4))},
            "head": {"scale": jnp.ones((4,))}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(lambda p: tx.update(zeros, tx.init(p), p))(params)
  assert float(jnp.abs(updates["backbone"]["scale"]).max()) == 0
  assert float(jnp.abs(updates["head"]["scale"]).max()) == 0
  assert float(jnp.abs(updates["backbone"]["kernel"]).min()) > 0


@pytest.mark.parametrize("impl", ["tiled", "ragged"])
def test_grouped_matmul_with_bf16_operands(impl):
  """operand_dtype=bf16 (model.matmul_dtype): the product of the bf16-rounded operands in
  float32, and float32 gradients: the tiled path's from the rounded cotangent too (as
  mot.matmul's dense layers), the ragged path's those of autodiff through the roundings."""
  rng = np.random.default_rng(0)
  e = jnp.asarray(rng.integers(0, 3, size=(2, 9)), jnp.int32)
  x = jnp.asarray(rng.normal(size=(2, 9, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(2, 9, 5)), jnp.float32)
  rounded = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  hi = jax.lax.Precision.HIGHEST

  def grouped(x, w):
    g = experts.group_by_expert(e, 3, impl, tile=4)
    y = experts.grouped_matmul(g.dispatch(x), w, g, 1, jnp.dtype(jnp.bfloat16))
    return jnp.sum(g.combine(y) * ct)

  def reference(x, w):
    return jnp.sum(jnp.einsum("bli,blio->blo", rounded(x), rounded(w)[e], precision=hi) * ct)

  got = jax.jit(jax.value_and_grad(grouped, (0, 1)))(x, w)
  want = jax.jit(jax.value_and_grad(reference, (0, 1)))(x, w)
  if impl == "tiled":
    want = (want[0], (jnp.einsum("blo,blio->bli", rounded(ct), rounded(w)[e], precision=hi),
                      jnp.zeros_like(w).at[e].add(
                          jnp.einsum("bli,blo->blio", rounded(x), rounded(ct), precision=hi))))
  chex.assert_trees_all_equal_dtypes(got, want)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)
