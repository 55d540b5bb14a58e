"""The unified model: one backbone, an AR head (text) and a DM head (patches).

Inputs follow docs/design.md §1. Text positions embed their token; media positions project their
(possibly noised) patch with a per-modality linear map and add the diffusion timestep's
embedding (t = 0 for clean media). N pre-norm blocks (GQA + QK-norm + M-RoPE, SwiGLU) run
under the one mask rule of `mot.masks`. The AR head is final norm + unembedding; the DM
head is an adaptive (timestep-modulated) final norm + linear map to patch space; it
returns the rectified-flow velocity `noise - x0`, predicted directly
(`dm_prediction="velocity"`) or through the clean patch x0 (`"x"`, docs/design.md §4).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from mot import attention, experts, layers, masks, matmul, media_positions, patch_neighbours
from mot import rope
from mot.config import ModelConfig

Array = jax.Array
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ModelInputs:
  """What the backbone reads for L new tokens (all [B, L] unless noted)."""
  tokens: Array         # int32 text ids, 0 at patch positions
  patches: Array        # float [B, L, P] patch values (already noised where noised)
  modality: Array       # int32 0 text, 1 image, 2 video, 3 action
  positions: Array      # int32 [B, L, 3] M-RoPE (t, h, w)
  timesteps: Array      # float diffusion time per token, 0 for clean media and text
  mask_ids: masks.MaskIds


class Block(nn.Module):
  """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).

  Residual dropout (`cfg.dropout_rate`) applies to both branches only when the caller
  passes a "dropout" rng (training); sampling and evaluation pass none, so they are
  deterministic without a flag threaded through every call.

  With `groups` (experts), x is the grouped buffer [R, d] and every sub-layer but the
  attention itself uses the token's own expert (`mot.experts`).
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, rotary, mask, cache, cache_index, groups=None):
    x = layers.constrain(x, ACTIVATION)
    drop = nn.Dropout(self.cfg.dropout_rate,
                      deterministic=self.cfg.dropout_rate == 0 or not self.has_rng("dropout"))
    attn, new_kv = layers.Attention(self.cfg, name="attention")(
        layers.RMSNorm(self.cfg, axis_name="embed", name="attention_norm")(x, groups),
        rotary, mask, cache, cache_index, groups)
    x = x + drop(attn)
    x = x + drop(layers.SwiGLU(self.cfg, name="mlp")(
        layers.RMSNorm(self.cfg, axis_name="embed", name="mlp_norm")(x, groups), groups))
    return layers.constrain(x, ACTIVATION), new_kv


class ScannedBlock(nn.Module):
  """`Block` with the (carry, scanned) signature `nn.scan` needs."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, cache, rotary, mask, cache_index, groups):
    return Block(self.cfg, name="block")(x, rotary, mask, cache, cache_index, groups)


def _remat(cls, cfg: ModelConfig, static_argnums=()):
  if cfg.remat_policy == "none":
    return cls
  policy = getattr(jax.checkpoint_policies, cfg.remat_policy)
  return nn.remat(cls, policy=policy, prevent_cse=not cfg.scan_layers,
                  static_argnums=static_argnums)


def _scan_unroll(cfg: ModelConfig, cached: bool) -> int:
  """Blocks per iteration of the layer scan's loop: `cfg.scan_unroll`, -1 meaning all;
  1 with a KV cache, where unrolling makes a one-token decode step slower, not faster
  (it then copies every layer's cache slice: docs/performance.md, `bench.decode_latency`)."""
  if cached:
    return 1
  if cfg.scan_unroll == -1:
    return cfg.num_layers
  return min(cfg.scan_unroll, cfg.num_layers)


class Backbone(nn.Module):
  """N blocks, scanned (`cfg.scan_layers`) and rematerialised (`cfg.remat_policy`).

  `cfg.scan_unroll` blocks run per iteration of the scan's loop. Unrolled fully, XLA sees
  straight-line code, as with `scan_layers=False`, and can fuse across layer boundaries
  (on a CPU the loop's slicing of each layer's weights and re-stacking of its gradients
  goes too), while the parameters keep their stacked layout, their initial values and
  every bit of the training arithmetic. Passes with a KV cache keep the loop.

  With `groups` the residual stream enters the grouped buffer once, before the first
  block, and leaves it after the last.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, positions, mask, cache=None, cache_index=None, groups=None):
    cfg = self.cfg
    rotary = rope.rotary_tables(positions, cfg.head_dim, cfg.rope_sections, cfg.rope_theta,
                                cfg.rope_interleaved)   # once, for every layer
    if groups is not None:
      x = groups.dispatch(x)
    if cfg.scan_layers:
      stack = nn.scan(_remat(ScannedBlock, cfg), variable_axes={"params": 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                      length=cfg.num_layers,
                      unroll=_scan_unroll(cfg, cache is not None),
                      metadata_params={nn.PARTITION_NAME: "layers"})
      x, new_kv = stack(cfg, name="layers")(x, cache, rotary, mask, cache_index, groups)
    else:
      new_kvs = []
      block_cls = _remat(Block, cfg)
      for i in range(cfg.num_layers):
        layer_cache = None if cache is None else jax.tree.map(lambda c: c[i], cache)
        x, kv = block_cls(cfg, name=f"layers_{i}")(x, rotary, mask, layer_cache,
                                                   cache_index, groups)
        new_kvs.append(kv)
      new_kv = None if cache is None else jax.tree.map(lambda *c: jnp.stack(c), *new_kvs)
    if groups is not None:
      x = groups.combine(x)
    if cache is None:
      return x, None
    # The layers return only the new tokens' keys/values [layers, B, L, K, D]; one update
    # writes them for all layers (in place when the cache is a loop carry).
    start = (0, 0, cache_index, 0, 0)
    return x, jax.tree.map(lambda c, n: jax.lax.dynamic_update_slice(c, n, start),
                           cache, new_kv)


class InputEmbedding(nn.Module):
  """Token embedding at text positions; patch projection + timestep embedding elsewhere,
  plus the absolute position embedding `cfg.media_pos_embed` names (`mot.media_positions`).

  `attend(h)` unembeds with the same table (tied input/output embeddings).
  """
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.token_embedding = self.param(
        "token_embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0),
                                                        ("vocab", "embed")),
        (cfg.vocab_size, cfg.d_model), cfg.params_dtype)
    self.patch_projection = self.param(
        "patch_projection", layers.dense_init(cfg.patch_dim, ("modality", "patch", "embed")),
        (cfg.num_modalities, cfg.patch_dim, cfg.d_model), cfg.params_dtype)
    if cfg.patch_mixing == "neighbours":   # the 3x3 patches around a token, centre excluded
      k = len(patch_neighbours.OFFSETS)
      self.neighbour_projection = self.param(
          "neighbour_projection",
          layers.dense_init(k * cfg.patch_dim, ("neighbour", "patch", "embed")),
          (k, cfg.patch_dim, cfg.d_model), cfg.params_dtype)

  def __call__(self, inputs: ModelInputs, t_emb: Array) -> Array:
    cfg = self.cfg
    # Looked up whole. A table split over vocab (tensor) or embed (fsdp) while the token
    # ids are split over the batch has no efficient SPMD gather: XLA replicated the
    # gather's result and its gradient instead ("Involuntary full rematerialization").
    # Gathering the table first is what FSDP does for every weight; its gradient is
    # reduce-scattered back to the sharded parameter.
    table = nn.with_logical_constraint(self.token_embedding, (None, None))
    text = jnp.take(table, inputs.tokens, axis=0).astype(cfg.compute_dtype)
    # Every modality's projection of every patch costs M*P*d per token (P is a few dims),
    # far below one block; a one-hot then selects the token's own modality.
    onehot = jax.nn.one_hot(inputs.modality, cfg.num_modalities, dtype=cfg.compute_dtype)
    media = jnp.einsum("blp,mpd,blm->bld", inputs.patches.astype(cfg.compute_dtype),
                       self.patch_projection.astype(cfg.compute_dtype), onehot) + t_emb
    if cfg.patch_mixing == "neighbours":
      around = patch_neighbours.gather(inputs.patches.astype(cfg.compute_dtype),
                                       *neighbours_of(inputs))
      media = media + matmul.linear_matmul(
          around, self.neighbour_projection.astype(cfg.compute_dtype), 2,
          cfg.matmul_operand_dtype, cfg.compute_dtype)
    where = media_positions.embedding(cfg.media_pos_embed, inputs.positions,
                                      inputs.mask_ids.block, cfg.d_model)
    if where is not None:
      media = media + where.astype(cfg.compute_dtype)
    return jnp.where((inputs.modality == 0)[..., None], text, media)

  def attend(self, h: Array) -> Array:
    """h [B, L, d] (normed) -> logits [B, L, V] against the token embedding table."""
    cfg = self.cfg
    dt = cfg.compute_dtype
    return matmul.linear_matmul(h.astype(dt), self.token_embedding.T.astype(dt), 1,
                                cfg.matmul_operand_dtype, dt)


class ARHead(nn.Module):
  """Final RMSNorm + unembedding -> logits float32 [B, L, V]. With tied embeddings
  (`cfg.tie_embeddings`) the caller passes `unembed`, the embedding's `attend`, and the
  head holds only its norm."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, h: Array, unembed=None) -> Array:
    cfg = self.cfg
    h = layers.RMSNorm(cfg, axis_name="embed", name="norm")(h)
    if unembed is not None:
      return unembed(h).astype(jnp.float32)
    logits = layers.Linear(cfg, (cfg.vocab_size,), ("embed", "vocab"), name="unembed")(h)
    return logits.astype(jnp.float32)


def neighbours_of(inputs: ModelInputs) -> tuple[Array, Array]:
  """`patch_neighbours.find` for the tokens of `inputs`: (index, valid) [B, L, 8]."""
  return patch_neighbours.find(inputs.positions, inputs.mask_ids.block, inputs.modality)


class DMHead(nn.Module):
  """Timestep-modulated final norm + linear -> velocity float32 [B, L, P].

  The modulation (shift, scale) is zero-initialised so training starts from a plain
  norm, as DiT's adaLN-zero. With `patch_mixing="neighbours"` a patch's output also
  takes a linear map of each grid neighbour's normed state (`neighbours`, from
  `neighbours_of`), zero-initialised too.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, h: Array, t_emb: Array, neighbours=None) -> Array:
    cfg = self.cfg
    mod = nn.Dense(2 * cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                   kernel_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                            ("embed_in", "embed")),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                   dot_general=matmul.dense_dot_general(cfg), name="modulation")(nn.silu(t_emb))
    shift, scale = jnp.split(mod, 2, axis=-1)
    h32 = h.astype(jnp.float32)
    h32 = h32 * jax.lax.rsqrt(jnp.mean(h32 * h32, -1, keepdims=True) + cfg.norm_eps)
    h = (h32 * (1 + scale) + shift).astype(cfg.compute_dtype)
    v = layers.Linear(cfg, (cfg.patch_dim,), ("embed", "patch"), name="out")(h)
    if cfg.patch_mixing == "neighbours":
      k = len(patch_neighbours.OFFSETS)
      kernel = self.param("neighbour_out", nn.with_logical_partitioning(
          nn.initializers.zeros, ("neighbour", "embed", "patch")),
          (k, cfg.d_model, cfg.patch_dim), cfg.params_dtype)
      v = v + matmul.linear_matmul(patch_neighbours.gather(h, *neighbours),
                                   kernel.astype(cfg.compute_dtype), 2,
                                   cfg.matmul_operand_dtype, cfg.compute_dtype)
    bias = self.param("out_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                               ("patch",)),
                      (cfg.patch_dim,), cfg.params_dtype)
    return v.astype(jnp.float32) + bias.astype(jnp.float32)


class MoT(nn.Module):
  """The whole model. `__call__` returns (ar_logits, dm_velocity, new_cache).

  With `cache` (from `init_cache`) the inputs are the L new tokens written at
  `cache_index`; `cache_ids` are the MaskIds of every cache slot (the caller keeps them:
  the prefix's ids plus these tokens').
  """
  cfg: ModelConfig

  def setup(self):
    self.time_embedding = layers.TimestepEmbedding(self.cfg)
    self.embed = InputEmbedding(self.cfg)
    self.backbone = Backbone(self.cfg)
    self.ar_head = ARHead(self.cfg)
    self.dm_head = DMHead(self.cfg)

  def __call__(self, inputs: ModelInputs, cache=None, cache_index=None,
               cache_ids: masks.MaskIds | None = None):
    h, t_emb, new_cache = self.trunk(inputs, cache, cache_index, cache_ids)
    return self.ar_logits(h), self.dm_velocity(h, t_emb, inputs), new_cache

  def dm_velocity(self, h: Array, t_emb: Array, inputs: ModelInputs) -> Array:
    """The DM head's velocity float32 [B, L, P] at the noised patches of `inputs`.

    With dm_prediction "x" the head predicts the clean patch x0 and the velocity is
    the one it implies at x_t = (1 - t) x0 + t noise: (x_t - x0) / t, with t floored at
    dm_min_time (JiT: a low-dimensional target a narrow head can reach, where noise is
    192-dimensional and full rank). The loss stays the velocity loss.
    """
    neighbours = neighbours_of(inputs) if self.cfg.patch_mixing == "neighbours" else None
    out = self.dm_head(h, t_emb, neighbours)
    if self.cfg.dm_prediction == "velocity":
      return out
    t = jnp.maximum(inputs.timesteps.astype(jnp.float32), self.cfg.dm_min_time)[..., None]
    return (inputs.patches.astype(jnp.float32) - out) / t

  def ar_logits(self, h: Array) -> Array:
    """The AR head on backbone output h [B, L, d]: float32 [B, L, V]."""
    return self.ar_head(h, self.embed.attend if self.cfg.tie_embeddings else None)

  def trunk(self, inputs: ModelInputs, cache=None, cache_index=None, cache_ids=None):
    """Backbone output [B, L, d], timestep embedding [B, L, d], new cache."""
    # Constrained like the residual stream: it meets it in the embedding and in the DM
    # head, and left free its gradient took the weights' (embed-split) layout, which
    # XLA could only reach by replicating it.
    t_emb = layers.constrain(self.time_embedding(inputs.timesteps), ACTIVATION)
    x = self.embed(inputs, t_emb)
    key_ids = inputs.mask_ids if cache is None else cache_ids
    # Once per pass: the dense mask only where a dense kernel runs, else the ids.
    mask = attention.make_mask(self.cfg, inputs.mask_ids, key_ids, cached=cache is not None)
    groups = experts.group_tokens(self.cfg, inputs.modality, inputs.mask_ids.noised)
    h, new_cache = self.backbone(x, inputs.positions, mask, cache, cache_index, groups)
    return h, t_emb, new_cache

  def logits(self, inputs: ModelInputs, cache=None, cache_index=None, cache_ids=None):
    """AR head only (reasoning): float32 [B, L, V] and the new cache."""
    h, _, new_cache = self.trunk(inputs, cache, cache_index, cache_ids)
    return self.ar_logits(h), new_cache

  def velocity(self, inputs: ModelInputs, cache=None, cache_index=None, cache_ids=None):
    """DM head only (generation): float32 [B, L, P] and the new cache."""
    h, t_emb, new_cache = self.trunk(inputs, cache, cache_index, cache_ids)
    return self.dm_velocity(h, t_emb, inputs), new_cache


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> dict[str, Any]:
  """Zeroed KV cache {k, v}: [num_layers, B, max_len, num_kv_heads, head_dim]."""
  shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  dtype = dtype or cfg.compute_dtype
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def text_inputs(tokens, patch_dim: int) -> ModelInputs:
  """ModelInputs of rows of text ids int [B, L]: one causal example a row, nothing
  prepended, positions t = h = w = 0 .. L - 1 (plain RoPE)."""
  tokens = jnp.asarray(tokens, jnp.int32)
  b, l = tokens.shape
  zeros = jnp.zeros((b, l), jnp.int32)
  return ModelInputs(
      tokens=tokens, patches=jnp.zeros((b, l, patch_dim), jnp.float32), modality=zeros,
      positions=jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32)[None, :, None], (b, l, 3)),
      timesteps=jnp.zeros((b, l), jnp.float32),
      mask_ids=masks.MaskIds.from_fields(jnp.ones((b, l), jnp.int32), zeros,
                                         jnp.zeros((b, l), bool)))


def inputs_from_batch(batch: dict, patches=None, timesteps=None, keep=None) -> ModelInputs:
  """ModelInputs from a batch dict of docs/design.md §1 fields (optionally noised patches)."""
  noised = batch["dm_mask"] > 0
  return ModelInputs(
      tokens=batch["tokens"],
      patches=batch["patches"] if patches is None else patches,
      modality=batch["modality"],
      positions=batch["positions"],
      timesteps=(jnp.zeros(batch["tokens"].shape, jnp.float32) if timesteps is None
                 else timesteps),
      mask_ids=masks.MaskIds.from_fields(batch["segment_ids"], batch["block_ids"], noised,
                                         keep))
