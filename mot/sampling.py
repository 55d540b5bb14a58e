"""Sampling from one checkpoint: AR decoding with a KV cache and cached-prefix diffusion.

Both samplers take prompts built by `mot.data.builder.SequenceBuilder` (the layouts of
`mot.data.tasks`), so positions, block ids and conditioning marks come from the one place
that also builds the training data.

AR (`decode`): prompts of different lengths are LEFT-padded with segment 0, so every
row's last prompt token sits in the same cache slot and one scalar `cache_index` serves
the whole batch; the mask rule already hides padding (segment 0) from every query. The
prompt is prefilled once, then one token per step runs inside a jitted `lax.while_loop`
(greedy, temperature, top-k, top-p), which ends early once every row has stopped.

DM (`denoise`): the prefix before the generated block (BOS, caption, begin marker) is
prefilled into the cache once; every ODE step runs only the block's tokens, which read
the cached prefix and each other (bidirectional) and write their own keys at the block's
slots. Classifier-free guidance puts conditional and unconditional rows in one batch: the
unconditional rows hide the `cond_mask` tokens with `keep=False`, exactly as training's
caption dropout, so their prefix cache differs and is prefilled alongside.

  tokens, _ = sampling.decode(model, params, sampling.pad_left(prompts), max_new_tokens=8)
  x0 = sampling.denoise(model, params, prefix, block, noise, steps=32, cfg_scale=2.0)
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mot import diffusion, masks, tokenizer
from mot.model import MoT, ModelInputs, init_cache, text_inputs

Array = jax.Array

# Fields of a padded prompt batch (all [B, L, ...]) that the model reads.
PROMPT_FIELDS = ("tokens", "patches", "modality", "positions", "segment_ids", "block_ids",
                 "dm_mask", "cond_mask")


# ----------------------------------------------------------------------------------------
# Host-side batching.
# ----------------------------------------------------------------------------------------
def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def chunks(n: int, max_batch: int) -> list[tuple[int, int, int]]:
  """(start, stop, padded batch) of near-equal chunks of n rows, each batch padded to a
  multiple of 8 so that a few compiled shapes serve every request."""
  count = max(1, -(-n // max_batch))
  per = -(-n // count)
  return [(s, min(s + per, n), round_up(per, 8)) for s in range(0, n, per)]


def length_bucket(n: int, smallest: int = 32) -> int:
  """Padded prompt length: the next power of two >= n (at least `smallest`), so that
  prompts of similar lengths share one compiled program."""
  return max(smallest, 1 << max(0, int(n) - 1).bit_length())


def pad_left(examples: Sequence[dict[str, np.ndarray]], length: int | None = None,
             batch: int | None = None, row_ids: Sequence[int] | None = None
             ) -> dict[str, np.ndarray]:
  """Left-pads unpadded examples (builder dicts, fields [n, ...]) into one batch.

  Args:
    examples: `SequenceBuilder.build()` dicts (or prefixes of them).
    length: padded length L (default: the longest example).
    batch: padded batch size; extra rows are all padding (segment 0).
    row_ids: per-row ids that seed sampling (default 0, 1, ...), so a row draws the same
      random numbers whichever batch it is in.
  Returns:
    PROMPT_FIELDS as [B, L, ...] arrays (segment 1 on real tokens, 0 on padding), plus
    `next_position` int32 [B] (the M-RoPE index after each prompt) and `row_id` int32 [B].
  """
  if not examples:
    raise ValueError("pad_left needs at least one example")
  longest = max(len(ex["tokens"]) for ex in examples)
  length = longest if length is None else length
  batch = len(examples) if batch is None else batch
  if length < longest or batch < len(examples):
    raise ValueError(f"cannot pad {len(examples)} examples of up to {longest} tokens into "
                     f"[{batch}, {length}]")
  patch_dim = examples[0]["patches"].shape[-1]
  out = {
      "tokens": np.zeros((batch, length), np.int32),
      "patches": np.zeros((batch, length, patch_dim), np.float32),
      "modality": np.zeros((batch, length), np.int32),
      "positions": np.zeros((batch, length, 3), np.int32),
      "segment_ids": np.zeros((batch, length), np.int32),
      "block_ids": np.zeros((batch, length), np.int32),
      "dm_mask": np.zeros((batch, length), np.float32),
      "cond_mask": np.zeros((batch, length), np.float32),
      "next_position": np.zeros((batch,), np.int32),
      "row_id": np.zeros((batch,), np.int32),
  }
  for i, ex in enumerate(examples):
    n = len(ex["tokens"])
    for key in PROMPT_FIELDS:
      if key == "segment_ids":
        out[key][i, length - n:] = 1
      else:
        out[key][i, length - n:] = ex[key]
    out["next_position"][i] = int(np.max(ex["positions"], initial=-1)) + 1
  ids = np.arange(len(examples)) if row_ids is None else np.asarray(row_ids)
  out["row_id"][:len(examples)] = ids
  return out


def split_block(example: dict[str, np.ndarray]) -> tuple[dict, dict]:
  """(prefix, block) of an example whose generated block is its first dm_mask run.

  The prefix is everything before the block (its conditioning, begin marker included);
  the block holds the noised tokens' fields. Tokens after the block are dropped: the
  block cannot read them (causal), so they do not change its velocity.
  """
  noised = np.flatnonzero(example["dm_mask"] > 0)
  if noised.size == 0:
    raise ValueError("example has no dm_mask tokens to generate")
  start, stop = int(noised[0]), int(noised[-1]) + 1
  if noised.size != stop - start:
    raise ValueError("the generated block must be one contiguous run of dm_mask tokens")
  prefix = {k: v[:start] for k, v in example.items()}
  block = {k: v[start:stop] for k, v in example.items()}
  return prefix, block


def stop_mask(stop_tokens: Sequence[int] | None = None,
              vocab_size: int = tokenizer.VOCAB_SIZE) -> np.ndarray:
  """bool [vocab_size]: the ids that end decoding (default: the byte tokenizer's EOS and
  every other special id)."""
  mask = np.zeros(vocab_size, bool)
  if stop_tokens is None:
    mask[:tokenizer.BYTE_OFFSET] = True  # EOS; a marker or BOS also ends a text answer.
  else:
    mask[np.asarray(list(stop_tokens), np.int64)] = True
  return mask


# ----------------------------------------------------------------------------------------
# Token sampling.
# ----------------------------------------------------------------------------------------
def sample_logits(logits: Array, keys: Array, temperature, top_k, top_p) -> Array:
  """int32 [B] next tokens from float [B, V] logits, one PRNG key per row.

  temperature 0 is greedy (argmax); top_k 0 and top_p 1 switch those filters off. All
  three are traced values, so changing them does not recompile.
  """
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  v = logits.shape[-1]
  x = logits / jnp.maximum(temperature, 1e-6)
  desc = -jnp.sort(-x, axis=-1)
  kth = jnp.take_along_axis(desc, jnp.clip(top_k - 1, 0, v - 1)
                            * jnp.ones((x.shape[0], 1), jnp.int32), axis=-1)
  x = jnp.where((top_k > 0) & (x < kth), -jnp.inf, x)
  # Nucleus: keep the smallest prefix of the sorted tokens whose mass reaches top_p.
  desc = -jnp.sort(-x, axis=-1)
  probs = jax.nn.softmax(desc, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  cutoff = jnp.min(jnp.where(before < top_p, desc, jnp.inf), axis=-1, keepdims=True)
  x = jnp.where(x < cutoff, -jnp.inf, x)
  sampled = jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
  return jnp.where(temperature > 0, sampled, greedy)


def _row_keys(rng: Array, row_id: Array, step) -> Array:
  """One key per row and step, from the row's id: independent of batch composition."""
  return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, r), step))(row_id)


# ----------------------------------------------------------------------------------------
# AR decoding.
# ----------------------------------------------------------------------------------------
def prompt_inputs(batch, index_offset: int = 0, keep=None) -> ModelInputs:
  """The ModelInputs of a padded prompt batch at timestep 0: what the prefill of `decode_fn`
  (and a bench timing it) feeds the model; `keep` and `index_offset` go to MaskIds."""
  b, l = batch["tokens"].shape
  noised = batch["dm_mask"] > 0
  return ModelInputs(
      tokens=batch["tokens"], patches=batch["patches"], modality=batch["modality"],
      positions=batch["positions"], timesteps=jnp.zeros((b, l), jnp.float32),
      mask_ids=masks.MaskIds.from_fields(batch["segment_ids"], batch["block_ids"], noised,
                                         keep, offset=index_offset))


def _concat_ids(a: masks.MaskIds, b: masks.MaskIds) -> masks.MaskIds:
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=1), a, b)


def ensemble_logits(logits: Array, views: int) -> Array:
  """float [B, V] -> [B, V]: each group of `views` consecutive rows gets the group's mean
  log-probabilities (a product of experts: every view must find the token likely)."""
  if views == 1:
    return logits
  b, v = logits.shape
  mean = jax.nn.log_softmax(logits, axis=-1).reshape(b // views, views, v).mean(axis=1)
  return jnp.repeat(mean, views, axis=0)


def _generated_ids(batch, n: int) -> masks.MaskIds:
  """MaskIds of the n - 1 generated tokens after a [B, Lp] prompt: causal text of the
  prompt's segment (0 for padding rows), at cache slots Lp, Lp + 1, ..."""
  b, lp = batch["tokens"].shape
  return masks.MaskIds(
      index=jnp.broadcast_to(lp + jnp.arange(n - 1, dtype=jnp.int32), (b, n - 1)),
      segment=jnp.broadcast_to(batch["segment_ids"][:, -1:], (b, n - 1)),
      block=jnp.zeros((b, n - 1), jnp.int32), noised=jnp.zeros((b, n - 1), bool),
      keep=jnp.ones((b, n - 1), bool))


def _token_inputs(tokens: Array, positions: Array, mask_ids: masks.MaskIds,
                  patch_dim: int) -> ModelInputs:
  """ModelInputs of one text token per row: tokens [B, 1] at 1-D positions [B, 1]."""
  b = tokens.shape[0]
  return ModelInputs(
      tokens=tokens, patches=jnp.zeros((b, 1, patch_dim), jnp.float32),
      modality=jnp.zeros((b, 1), jnp.int32),
      positions=jnp.broadcast_to(positions[..., None], (b, 1, 3)).astype(jnp.int32),
      timesteps=jnp.zeros((b, 1), jnp.float32), mask_ids=mask_ids)


@functools.lru_cache(maxsize=8)
def _text_logits_fn(model: MoT):
  return jax.jit(lambda params, tokens: model.apply(
      {"params": params}, text_inputs(tokens, model.cfg.patch_dim), method=MoT.logits)[0])


def text_logits(model: MoT, params, tokens: np.ndarray) -> np.ndarray:
  """AR-head logits float32 [B, L, V] of rows of text ids int [B, L] (`text_inputs`: one
  causal example a row, nothing prepended, positions 0 .. L - 1), in one forward pass."""
  return np.asarray(_text_logits_fn(model)(params, jnp.asarray(tokens, jnp.int32)))


@functools.lru_cache(maxsize=32)
def decode_fn(model: MoT, max_new_tokens: int, views: int = 1, with_logits: bool = True):
  """Jitted (params, batch, rng, temperature, top_k, top_p, stop, limit, pad) -> (tokens,
  logits) for up to `max_new_tokens` (static: shapes) and `limit` (traced) tokens;
  `views` (static) groups rows into ensembles (see `decode`); without `with_logits` the
  logits are not kept ([B, 1, V] zeros: a large vocabulary's [B, N, V] is gigabytes)."""

  def run(params, batch, rng, temperature, top_k, top_p, stop, limit, pad):
    b, lp = batch["tokens"].shape
    n = max_new_tokens
    cache_len = lp + n - 1
    apply = functools.partial(model.apply, {"params": params}, method=MoT.logits)
    gen_ids = _generated_ids(batch, n)
    prompt = prompt_inputs(batch)
    cache_ids = _concat_ids(prompt.mask_ids, gen_ids)
    cache = init_cache(model.cfg, b, cache_len)
    logits, cache = apply(prompt, cache=cache, cache_index=0, cache_ids=cache_ids)

    def pick(logits, step, done):
      # An ensemble's rows share the first row's key, so they draw the same token.
      row_id = jnp.repeat(batch["row_id"][::views], views)
      keys = _row_keys(rng, row_id, step)
      tok = sample_logits(logits, keys, temperature, top_k, top_p)
      tok = jnp.where(done, pad, tok)
      return tok, done | stop[tok]

    # Rows that are all padding (batch filler) count as stopped from the start.
    first = ensemble_logits(logits[:, -1], views)
    tok, done = pick(first, 0, batch["segment_ids"][:, -1] == 0)
    tokens = jnp.zeros((b, n), jnp.int32).at[:, 0].set(tok)
    # The logits each token was drawn from (tests compare them).
    all_logits = jnp.zeros((b, n if with_logits else 1, logits.shape[-1]), jnp.float32)
    all_logits = all_logits.at[:, 0].set(first)

    def cond(carry):
      i, _, _, done, _ = carry
      return (i < limit) & ~jnp.all(done)

    def body(carry):
      i, cache, tokens, done, all_logits = carry
      prev = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)
      pos = batch["next_position"][:, None] + i - 1
      step_ids = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i - 1, 1, axis=1),
                              gen_ids)
      inputs = _token_inputs(prev, pos, step_ids, model.cfg.patch_dim)
      logits, cache = apply(inputs, cache=cache, cache_index=lp + i - 1,
                            cache_ids=cache_ids)
      logits = ensemble_logits(logits[:, -1], views)
      tok, new_done = pick(logits, i, done)
      tokens = jax.lax.dynamic_update_slice_in_dim(tokens, tok[:, None], i, axis=1)
      if with_logits:
        all_logits = jax.lax.dynamic_update_slice_in_dim(all_logits, logits[:, None], i,
                                                         axis=1)
      return i + 1, cache, tokens, new_done, all_logits

    carry = (jnp.int32(1), cache, tokens, done, all_logits)
    _, _, tokens, _, all_logits = jax.lax.while_loop(cond, body, carry)
    return tokens, all_logits

  return jax.jit(run)


def decode(model: MoT, params, batch: dict[str, np.ndarray], max_new_tokens: int,
           rng: Array | int = 0, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, stop_tokens: Sequence[int] | None = None,
           views: int = 1, pad_id: int = tokenizer.PAD, with_logits: bool = True
           ) -> tuple[np.ndarray, np.ndarray | None]:
  """Decodes up to max_new_tokens after each prompt of a `pad_left` batch.

  Returns (tokens int32 [B, max_new_tokens], logits float32 [B, max_new_tokens, V]):
  row b's i-th token was drawn from logits[b, i]. After a row's stop token its remaining
  tokens are `pad_id` (the stop token itself is kept); once every row has stopped the
  loop ends and the remaining logits are zeros (None without `with_logits`).
  `stop_tokens` defaults to the byte tokenizer's special ids; a run with another
  tokenizer passes its `special_ids`.

  views > 1 decodes an ensemble: rows come in consecutive groups of `views` (e.g. one
  image seen shifted several ways, test-time augmentation) that share one answer. Each
  token is drawn from the group's mean log-probabilities, with the group's first row's
  random key, and fed back to every row of the group; `logits` then holds those mean
  log-probabilities. B must be a multiple of views.
  """
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
  if views < 1 or batch["tokens"].shape[0] % views:
    raise ValueError(f"views={views} must be >= 1 and divide the batch "
                     f"({batch['tokens'].shape[0]} rows)")
  if isinstance(rng, int):
    rng = jax.random.PRNGKey(rng)
  # Shapes are bucketed (multiples of 16 tokens) so that most calls share one compile.
  fn = decode_fn(model, round_up(int(max_new_tokens), 16), int(views), bool(with_logits))
  arrays = {k: jnp.asarray(v) for k, v in batch.items()}
  tokens, logits = fn(params, arrays, rng, jnp.float32(temperature), jnp.int32(top_k),
                      jnp.float32(top_p),
                      jnp.asarray(stop_mask(stop_tokens, model.cfg.vocab_size)),
                      jnp.int32(max_new_tokens), jnp.int32(pad_id))
  n = int(max_new_tokens)
  return np.asarray(tokens)[:, :n], np.asarray(logits)[:, :n] if with_logits else None


# ----------------------------------------------------------------------------------------
# Diffusion sampling with a cached prefix.
# ----------------------------------------------------------------------------------------
def uncond_keep(batch: dict[str, np.ndarray]) -> np.ndarray:
  """bool [B, L]: the unconditional branch's `keep` (cond_mask tokens hidden)."""
  return ~(np.asarray(batch["cond_mask"]) > 0)


def block_arrays(blocks: Sequence[dict[str, np.ndarray]], batch: int | None = None
                 ) -> dict[str, np.ndarray]:
  """Stacks the generated blocks' fields [B, M, ...] (all blocks share one layout size M)."""
  m = {len(b["tokens"]) for b in blocks}
  if len(m) != 1:
    raise ValueError(f"generated blocks differ in size {sorted(m)}: generate one media "
                     "shape per call")
  batch = len(blocks) if batch is None else batch
  out = {}
  for key in ("modality", "positions", "block_ids"):
    first = np.asarray(blocks[0][key])
    arr = np.zeros((batch, *first.shape), first.dtype)
    arr[:len(blocks)] = np.stack([b[key] for b in blocks])
    arr[len(blocks):] = first  # Padding rows copy a real layout; their output is dropped.
    out[key] = arr
  return out


def cached_block_velocity(model: MoT, params, prefix, block, keep):
  """Prefills the prefixes once; returns velocity_fn(x [B, M, P], t) -> v [B, M, P].

  Traceable (call it inside jit). Row b's prefix hides the keys where keep[b] is False;
  every call runs only the block's M tokens, which read the cached prefix and write
  their own keys into the block's slots of a copy of the cache.
  """
  b, lp = prefix["tokens"].shape
  m = block["modality"].shape[1]
  block_ids = masks.MaskIds(
      index=jnp.broadcast_to(lp + jnp.arange(m, dtype=jnp.int32), (b, m)),
      segment=jnp.broadcast_to(prefix["segment_ids"][:, -1:], (b, m)),
      block=block["block_ids"], noised=jnp.ones((b, m), bool), keep=jnp.ones((b, m), bool))
  prompt = prompt_inputs(prefix, keep=keep)
  cache_ids = _concat_ids(prompt.mask_ids, block_ids)
  _, _, cache = model.apply({"params": params}, prompt, cache=init_cache(model.cfg, b, lp + m),
                            cache_index=0, cache_ids=cache_ids, method=MoT.trunk)

  def velocity_fn(x, t):
    inputs = ModelInputs(
        tokens=jnp.zeros((b, m), jnp.int32), patches=x, modality=block["modality"],
        positions=block["positions"],
        timesteps=jnp.broadcast_to(jnp.asarray(t, jnp.float32), (b, m)), mask_ids=block_ids)
    v, _ = model.apply({"params": params}, inputs, cache=cache, cache_index=lp,
                       cache_ids=cache_ids, method=MoT.velocity)
    return v

  return velocity_fn


def guided_velocity_fn(model: MoT, params, prefix, block, dims, cfg_scale, use_cfg: bool):
  """velocity_fn(x, t) of the sampler: one model call per step, CFG rows in one batch.

  With `use_cfg` the batch is [cond rows; uncond rows]; the unconditional rows hide
  the prefix's cond_mask tokens (keep=False), as training's caption dropout does, and
  v = v_uncond + cfg_scale * (v_cond - v_uncond).
  """
  b, lp = prefix["tokens"].shape
  keep = jnp.ones((b, lp), bool)
  if use_cfg:
    keep = jnp.concatenate([keep, ~(prefix["cond_mask"] > 0)])
    prefix = jax.tree.map(lambda x: jnp.concatenate([x, x]), prefix)
    block = jax.tree.map(lambda x: jnp.concatenate([x, x]), block)
  velocity = cached_block_velocity(model, params, prefix, block, keep)

  def velocity_fn(x, t):
    if not use_cfg:
      return velocity(x, t) * dims
    v_cond, v_uncond = jnp.split(velocity(jnp.concatenate([x, x]), t), 2)
    return (v_uncond + cfg_scale * (v_cond - v_uncond)) * dims

  return velocity_fn


@functools.lru_cache(maxsize=32)
def _denoise_fn(model: MoT, steps: int, sampler: str, shift: float, use_cfg: bool):
  """Jitted (params, prefix, block, x1, dims, cfg_scale) -> x0 [B, M, P]."""
  integrate = diffusion.SAMPLERS[sampler]

  def run(params, prefix, block, x1, dims, cfg_scale):
    velocity_fn = guided_velocity_fn(model, params, prefix, block, dims, cfg_scale, use_cfg)
    return integrate(velocity_fn, x1, steps, shift)

  return jax.jit(run)


def denoise(model: MoT, params, prefix: dict[str, np.ndarray], block: dict[str, np.ndarray],
            noise: np.ndarray, steps: int, cfg_scale: float = 1.0, sampler: str = "euler",
            shift: float = 1.0) -> np.ndarray:
  """Integrates the generated block from noise (t = 1) to data (t = 0).

  Args:
    prefix: `pad_left` batch of the prefixes (conditioning before each block).
    block: `block_arrays` of the blocks (modality, positions, block_ids) [B, M, ...].
    noise: float [B, M, P] starting noise (zero on each modality's unused patch dims).
    cfg_scale: guidance scale; 1 runs the conditional branch only, anything else runs
      conditional and unconditional rows in one batch.
  Returns:
    float32 [B, M, P] generated patches (model scale).
  """
  if steps < 1:
    raise ValueError(f"steps={steps} must be >= 1")
  if sampler not in diffusion.SAMPLERS:
    raise ValueError(f"unknown sampler {sampler!r}; use one of {sorted(diffusion.SAMPLERS)}")
  use_cfg = float(cfg_scale) != 1.0
  fn = _denoise_fn(model, int(steps), sampler, float(shift), use_cfg)
  dims = patch_dims(model, block["modality"])
  prefix = {k: jnp.asarray(v) for k, v in prefix.items()}
  block = {k: jnp.asarray(v) for k, v in block.items()}
  x0 = fn(params, prefix, block, jnp.asarray(noise, jnp.float32) * dims, dims,
          jnp.float32(cfg_scale))
  return np.asarray(x0)


def patch_dims(model: MoT, modality: np.ndarray) -> np.ndarray:
  """float32 [B, M, P]: 1 on each token's real patch dims (its modality's width)."""
  widths = np.asarray(model.cfg.modality_patch_dims)[np.asarray(modality)]
  return (np.arange(model.cfg.patch_dim) < widths[..., None]).astype(np.float32)


def initial_noise(seed: int, sample_ids: Sequence[int], shape: tuple[int, ...],
                  stream: int | None = None) -> np.ndarray:
  """float32 [len(sample_ids), *shape] N(0, 1) noise; sample i's noise depends only on
  (seed, i) (and `stream`, e.g. the frame a video roll-out draws), so a sample is the
  same whichever batch or chunk it is drawn in (numpy's PCG64 streams: exact on every
  platform, nothing to compile)."""
  if seed < 0:
    raise ValueError(f"seed={seed} must be >= 0")
  extra = [] if stream is None else [int(stream)]
  return np.stack([np.random.default_rng([int(seed), int(i), *extra]).standard_normal(shape)
                   for i in sample_ids]).astype(np.float32)
