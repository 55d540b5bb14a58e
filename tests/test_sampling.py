"""Sampling: the KV-cached paths equal uncached forward passes, the ODE samplers integrate
a flow with a known answer, batching and seeds change nothing they should not."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot import diffusion, sampling, tokenizer
from mot.data.builder import SequenceBuilder
from mot.model import inputs_from_batch
from mot.errors import InputError
from mot.pipeline import Pipeline


def make_pipe(experts="shared", media_pos_embed="none", patch_mixing="none"):
  """A Pipeline over the tiny config with random parameters, float32 matmul operands:
  these tests hold cached and uncached passes equal to float32 rounding, and bf16
  operands would round their last-bit differences to the neighbouring bf16 value."""
  from configs import digits as digits_config
  config = digits_config.get_config("tiny")
  config.model.experts = experts
  config.model.media_pos_embed = media_pos_embed
  config.model.patch_mixing = patch_mixing
  config.model.matmul_dtype = "same"
  shell = Pipeline(config, None)
  inputs = inputs_from_batch(_as_batch(_full_example(shell, [20, 21])))
  return Pipeline(config, random_params(shell.model, inputs))


@pytest.fixture(scope="module")
def pipe():
  return make_pipe()


def random_params(model, inputs, seed=0):
  """Random parameters of every shape `model.init` makes, without compiling init (slow
  on CPU); nothing zero-initialised, so every parameter matters."""
  import flax.linen as nn
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return jnp.asarray(base + 0.1 * rng.standard_normal(leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, shapes["params"])


def test_sampling_context_is_the_larger_of_row_length_and_sample_context_length():
  """The digits default trains rows of 44 tokens (one example each) but reads prompts up
  to config.sample.context_length: a reading prompt plus 16 new tokens (54) fits; without
  the field it would not, and says so in one line."""
  from configs import digits as digits_config
  config = digits_config.get_config()
  assert config.data.seq_len == 44 and Pipeline(config, None).context_length == 128
  config.sample.context_length = 0
  shell = Pipeline(config, None)
  assert shell.context_length == 44
  with pytest.raises(InputError, match=r"needs 5\d tokens but the model's context is 44"):
    shell.reason("What digit is this?", images=np.zeros((8, 8), np.float32), shifts=0)


def test_reasoning_prompt_reads_images_as_the_reading_task_trained():
  # With data.read_window the prompt's patches are the training example's windows:
  # the same prefix, token for token and dim for dim.
  from configs import digits as digits_config
  from mot.data import tasks
  config = digits_config.get_config("tiny")
  config.data.read_window, config.data.patch_dim = 4, 16
  pipe = Pipeline(config, None)
  image = _image(3)
  prompt = pipe.prompts.reasoning_prompt("What digit is this?", image)
  from mot.media import to_model_scale
  train = tasks.reasoning_example(to_model_scale(image), 3, 2, 16, read_window=4)
  n = len(prompt["tokens"])
  for key in set(prompt) - {"ar_targets", "ar_weights"}:   # the prompt has no answer
    np.testing.assert_array_equal(prompt[key], train[key][:n], err_msg=key)
  assert np.any(prompt["patches"][:, 4:] != 0)


def _as_batch(*examples, length=None):
  """Unpadded examples -> one RIGHT-padded [B, L] batch dict for `inputs_from_batch`
  (segment 1 on real tokens, 0 on padding): the plain, uncached layout of training."""
  length = length or max(len(ex["tokens"]) for ex in examples)
  out = {}
  for key in examples[0]:
    rows = [np.pad(ex[key], [(0, length - len(ex[key]))] + [(0, 0)] * (ex[key].ndim - 1))
            for ex in examples]
    out[key] = jnp.asarray(np.stack(rows))
  out["segment_ids"] = jnp.asarray(np.stack(
      [np.arange(length) < len(ex["tokens"]) for ex in examples]).astype(np.int32))
  return out


def _full_example(pipe, generated, image=None, text="What digit is this?"):
  """The reading prompt followed by `generated` text tokens, built by SequenceBuilder."""
  b = SequenceBuilder(pipe.model_cfg.patch_dim)
  prompt = pipe.prompts.reasoning_prompt(text, image)
  b.add_text([tokenizer.BOS])
  if image is not None:
    from mot.data import digits
    from mot.media import to_model_scale
    b.add_image(digits.patchify(to_model_scale(image), pipe.patch_size), noised=False)
  b.add_text(pipe.tokenizer.encode(text))
  b.add_text(list(generated))
  ex = b.build()
  assert np.array_equal(ex["tokens"][:len(prompt["tokens"])], prompt["tokens"])
  return ex


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, inputs):
  return model.apply({"params": params}, inputs)


def _full_forward(pipe, examples, t=0.0, hide_cond=False):
  """(logits, velocity) of the uncached model over whole examples (right-padded to 48,
  one compile for every use): noised tokens at time t, cond tokens hidden if asked."""
  batch = _as_batch(*examples, length=48)
  timesteps = jnp.where(batch["dm_mask"] > 0, t, 0.0)
  keep = ~(batch["cond_mask"] > 0) if hide_cond else None
  logits, velocity, _ = _apply(pipe.model, pipe.params,
                               inputs_from_batch(batch, timesteps=timesteps, keep=keep))
  return np.asarray(logits), np.asarray(velocity)


def _image(seed):
  return np.random.default_rng(seed).uniform(0, 1, (8, 8)).astype(np.float32)


# ----------------------------------------------------------------------------------------
# AR: cached decoding == uncached forward, batching, sampling filters.
# ----------------------------------------------------------------------------------------
def test_cached_decoding_matches_full_forward_at_every_step(pipe):
  # Different lengths (left padding in the batch); text continues after the image at
  # the block's largest M-RoPE position + 1, as SequenceBuilder places it.
  prompts = [pipe.prompts.reasoning_prompt("digit?", _image(0)),
             pipe.prompts.reasoning_prompt("hi")]
  n = 6
  batch = sampling.pad_left(prompts, length=32, batch=8)  # the Pipeline's bucket: compiled once
  tokens, logits = sampling.decode(pipe.model, pipe.params, batch, n, stop_tokens=[])
  assert tokens.shape == (8, n) and logits.shape == (8, n, tokenizer.VOCAB_SIZE)
  assert np.all(tokens[2:] == tokenizer.PAD)  # filler rows are stopped from the start
  full = [_full_example(pipe, tokens[0, :-1], _image(0), "digit?"),
          _full_example(pipe, tokens[1, :-1], None, "hi")]
  ref = _full_forward(pipe, full)[0]
  for row, prompt in enumerate(prompts):
    start = len(prompt["tokens"]) - 1
    np.testing.assert_allclose(logits[row], ref[row, start:start + n], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tokens[row], np.argmax(ref[row, start:start + n], -1))


def test_batched_prompts_of_different_lengths_equal_one_at_a_time(pipe):
  images = np.stack([_image(1), _image(2)])
  prompts = ["digit?", "which one?"]  # short: every call here shares one 32-token bucket
  batched = pipe.reason(prompts, images=images, max_new_tokens=5)
  single = [pipe.reason(p, images=im, max_new_tokens=5) for p, im in zip(prompts, images)]
  assert batched == single
  texts = ["the digit after 3 is", "a", "the digit before 9"]
  assert pipe.reason(texts, max_new_tokens=4) == [pipe.reason(t, max_new_tokens=4)
                                                  for t in texts]


def test_sampled_decoding_is_reproducible_and_chunk_independent(pipe, monkeypatch):
  texts = ["the digit after 3 is", "a", "the digit before 9"]
  kw = dict(max_new_tokens=4, temperature=1.0, top_k=20, top_p=0.9, seed=3)
  whole = pipe.reason(texts, **kw)
  assert whole == pipe.reason(texts, **kw)
  assert whole[0] == pipe.reason(texts[0], **kw)
  from mot import pipeline
  monkeypatch.setattr(pipeline, "MAX_DECODE_BATCH", 2)   # rows split over two calls
  assert pipe.reason(texts, **kw) == whole


def test_ensemble_decoding_follows_the_views_mean_log_probabilities(pipe):
  # Two groups of three views: every row of a group gets the same tokens, each drawn
  # from the group's mean log-softmax, which the uncached forward reproduces.
  prompts = [pipe.prompts.reasoning_prompt("digit?", _image(i)) for i in range(6)]
  n = 4
  batch = sampling.pad_left(prompts, length=32, batch=6)
  tokens, logits = sampling.decode(pipe.model, pipe.params, batch, n, stop_tokens=[],
                                   views=3)
  chex.assert_shape(logits, (6, n, tokenizer.VOCAB_SIZE))
  for g in (0, 3):
    np.testing.assert_array_equal(tokens[g], tokens[g + 1])
    np.testing.assert_array_equal(tokens[g], tokens[g + 2])
    full = [_full_example(pipe, tokens[g, :-1], _image(i), "digit?") for i in range(g, g + 3)]
    ref = jax.nn.log_softmax(_full_forward(pipe, full)[0], -1)
    start = len(prompts[g]["tokens"]) - 1  # same length for every view
    mean = np.asarray(ref[:, start:start + n]).mean(0)
    np.testing.assert_allclose(logits[g], mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tokens[g], np.argmax(mean, -1))
  with pytest.raises(ValueError, match="views=4"):
    sampling.decode(pipe.model, pipe.params, batch, n, views=4)


def test_reading_with_test_time_shifts(pipe, monkeypatch):
  images = np.stack([_image(1), _image(2), _image(3)])
  plain = pipe.reason("digit?", images=images, max_new_tokens=3, shifts=0)
  shifted = pipe.reason("digit?", images=images, max_new_tokens=3, shifts=1)
  assert len(shifted) == 3 and all(isinstance(a, str) for a in shifted)
  assert pipe.default_reason_shifts == 1   # configs/digits.py; None takes it
  assert pipe.reason("digit?", images=images, max_new_tokens=3) == shifted
  assert plain == [pipe.reason("digit?", images=im, max_new_tokens=3, shifts=0)
                   for im in images]
  # One image alone, or its nine views split over several decode calls: the same answer.
  assert pipe.reason("digit?", images=images[1], max_new_tokens=3, shifts=1) == shifted[1]
  from mot import pipeline
  monkeypatch.setattr(pipeline, "MAX_DECODE_BATCH", 9)   # one image's views per call
  assert pipe.reason("digit?", images=images, max_new_tokens=3, shifts=1) == shifted
  # The views are the training shifts: a 1-pixel move, background-filled.
  from mot.data import tasks
  img = np.zeros((8, 8), np.float32)
  img[0, 0] = img[3, 4] = 1.0
  moved = tasks.shift_image(img, 1, -1, background=0.0)
  assert moved[4, 3] == 1.0 and moved.sum() == 1.0   # the corner pixel left the frame
  for bad in (-1, 3, 1.5):
    with pytest.raises(InputError, match="shifts="):
      pipe.reason("digit?", images=images[0], shifts=bad)
  with pytest.raises(InputError, match="no image"):
    pipe.reason("hello", shifts=1)


def test_decoding_stops_at_stop_tokens(pipe):
  batch = sampling.pad_left([pipe.prompts.reasoning_prompt("hi"),
                             pipe.prompts.reasoning_prompt("hello")],
                            length=32, batch=8)
  tokens, _ = sampling.decode(pipe.model, pipe.params, batch, 5,
                              stop_tokens=range(tokenizer.VOCAB_SIZE))
  assert np.all(tokens[:, 1:] == tokenizer.PAD)  # the first token stops every row


def test_sample_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  draw = jax.jit(sampling.sample_logits)
  freq = lambda t, k, p: np.bincount(np.asarray(draw(logits, keys, t, k, p)), minlength=4) / 4000
  np.testing.assert_array_equal(freq(0.0, 0, 1.0), [1, 0, 0, 0])         # greedy
  np.testing.assert_allclose(freq(1.0, 0, 1.0), [0.5, 0.3, 0.15, 0.05], atol=0.03)
  np.testing.assert_allclose(freq(1.0, 2, 1.0), [0.625, 0.375, 0, 0], atol=0.03)  # top-k
  np.testing.assert_allclose(freq(1.0, 0, 0.7), [0.625, 0.375, 0, 0], atol=0.03)  # top-p
  assert freq(1.0, 1, 1.0)[0] == 1.0


# ----------------------------------------------------------------------------------------
# DM: cached-prefix velocity == uncached, CFG rows, seeds, batching.
# ----------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _cached_velocity(model, params, prefix, block, keep, x, t):
  return sampling.cached_block_velocity(model, params, prefix, block, keep)(x, t)


@pytest.mark.parametrize("branch,experts,media_pos_embed,patch_mixing", [
    ("cond", "shared", "none", "none"), ("uncond", "shared", "none", "none"),
    ("cond", "mode", "none", "none"), ("cond", "shared", "sincos", "none"),
    ("cond", "shared", "none", "neighbours")])
def test_cached_denoising_step_matches_full_forward(pipe, branch, experts, media_pos_embed,
                                                    patch_mixing):
  """Also with experts="mode": the block's tokens (noised) take the generation expert
  in the cached step as in the full forward, the cached prefix the understanding one.
  And with media_pos_embed or patch_mixing: the block alone (left-padded prefix in the
  cache) finds the same grid coordinates and neighbours as in the full row."""
  if (experts, media_pos_embed, patch_mixing) != ("shared", "none", "none"):
    pipe = make_pipe(experts, media_pos_embed, patch_mixing)
  examples = [pipe.prompts.generation_example("a handwritten digit 7"),
              pipe.prompts.generation_example("a 1")]
  split = [sampling.split_block(ex) for ex in examples]
  prefix = sampling.pad_left([p for p, _ in split], length=32)
  block = sampling.block_arrays([b for _, b in split])
  m, p = block["modality"].shape[1], pipe.model_cfg.patch_dim
  x = np.random.default_rng(0).normal(size=(2, m, p)).astype(np.float32)
  t = 0.7
  keep = np.ones(prefix["tokens"].shape, bool)
  if branch == "uncond":
    keep = sampling.uncond_keep(prefix)
  v = _cached_velocity(pipe.model, pipe.params, prefix, block, keep, x, t)

  starts = [int(np.flatnonzero(ex["dm_mask"])[0]) for ex in examples]
  full = [dict(ex, patches=ex["patches"].copy()) for ex in examples]
  for row, (ex, start) in enumerate(zip(full, starts)):
    ex["patches"][start:start + m] = x[row]
  ref = _full_forward(pipe, full, t, hide_cond=branch == "uncond")[1]
  for row, start in enumerate(starts):
    np.testing.assert_allclose(v[row], ref[row, start:start + m], rtol=1e-4, atol=1e-4)
  if branch == "uncond":  # hiding the caption must change the velocity
    cond = _cached_velocity(pipe.model, pipe.params, prefix, block, np.ones_like(keep), x, t)
    assert not np.allclose(v, cond, atol=1e-3)


def test_generation_is_reproducible_and_batch_independent(pipe):
  kw = dict(steps=3, cfg_scale=2.0, sampler="heun")
  a = pipe.generate(["a handwritten digit 7", "a 1"], num_samples=2, seed=5, **kw)
  b = pipe.generate(["a handwritten digit 7", "a 1"], num_samples=2, seed=5, **kw)
  assert a.shape == (4, 8, 8) and a.dtype == np.float32
  assert a.min() >= 0 and a.max() <= 1
  np.testing.assert_array_equal(a, b)                    # same seed, same images
  first = pipe.generate("a handwritten digit 7", num_samples=2, seed=5, **kw)
  np.testing.assert_allclose(first, a[:2], atol=1e-5)    # alone == in a batch
  other = pipe.generate(["a handwritten digit 7", "a 1"], num_samples=2, seed=6, **kw)
  assert not np.allclose(other, a)


def test_diffusion_classifier_errors_are_the_uncached_velocity_errors(pipe, monkeypatch):
  """bench.diffusion_classifier: image i's error under caption k is the mean, over its
  own draws, of the full (uncached) forward's squared velocity error; chunking and the
  other images in a call change nothing."""
  from bench import diffusion_classifier as dc
  from mot.data import digits
  from mot.media import to_model_scale
  monkeypatch.setattr(dc, "MAX_ROWS", 4)  # two images per call: chunks split the batch
  images = np.stack([_image(1), _image(2), _image(3)])
  captions = ["a handwritten digit 7", "a 1"]
  errors = dc.caption_errors(pipe, images, captions, draws=2, seed=3)
  assert errors.shape == (3, 2) and np.all(errors > 0)
  alone = dc.caption_errors(pipe, images[2:], captions, draws=2, seed=3, first_index=2)
  np.testing.assert_allclose(alone[0], errors[2], rtol=1e-5)
  assert not np.allclose(errors[:, 0], errors[:, 1])          # the caption is read
  for i in (0, 2):
    for c, caption in enumerate(captions):
      ex = pipe.prompts.generation_example(caption)
      start = int(np.flatnonzero(ex["dm_mask"])[0])
      m, pd = int(np.sum(ex["dm_mask"] > 0)), pipe.model_cfg.patch_dim
      dims = sampling.patch_dims(pipe.model, ex["modality"][None, start:start + m])[0]
      x0 = np.zeros((m, pd), np.float32)
      x0[:, :4] = digits.patchify(to_model_scale(images[i]), 2).reshape(m, 4)
      ts, noise = dc.noise_draws(3, i, 2, (m, pd))
      ref = []
      for t, eps in zip(ts, noise * dims):
        full = dict(ex, patches=ex["patches"].copy())
        full["patches"][start:start + m] = (1 - t) * x0 + t * eps
        v = _full_forward(pipe, [full], float(t))[1][0, start:start + m]
        ref.append(np.sum(np.square((v - (eps - x0)) * dims)))
      np.testing.assert_allclose(errors[i, c], np.mean(ref), rtol=1e-4)
  result = dc.probe(pipe, draws=1, num_images=3)
  assert result["images"] == 3 and len(result["misread"]) == round(3 * (1 - result["accuracy"]))
  assert set(result["both_misread"]) <= {m["index"] for m in result["misread"]}


def test_think_then_draw(pipe):
  kw = dict(steps=3, cfg_scale=2.0, sampler="heun", max_new_tokens=3)  # compiled above
  answer, images = pipe.think_then_draw("draw the digit after 3:", num_samples=2, **kw)
  assert isinstance(answer, str) and images.shape == (2, 8, 8)
  answers, images = pipe.think_then_draw(["draw the digit after 3:", "draw 5"], **kw)
  assert len(answers) == 2 and images.shape == (2, 8, 8)


@pytest.mark.parametrize("call", [
    lambda p: p.generate(""),
    lambda p: p.generate("x", num_samples=0),
    lambda p: p.generate("x", steps=0),
    lambda p: p.generate("x", cfg_scale=float("nan")),
    lambda p: p.generate("x", sampler="rk4"),
    lambda p: p.generate("x" * 200),
    lambda p: p.reason("x" * 200),
    lambda p: p.reason("x", images=np.full((8, 8), np.nan)),
    lambda p: p.reason("x", images=-np.ones((8, 8))),
    lambda p: p.reason(["a", "b"], images=np.zeros((3, 8, 8))),
    lambda p: p.reason("x", top_p=0.0),
])
def test_bad_inputs_raise_one_line_input_errors(pipe, call):
  with pytest.raises(InputError) as e:
    call(pipe)
  assert "\n" not in str(e.value)


def test_image_inputs_are_converted(tmp_path):
  from PIL import Image
  from mot.media import to_unit_images
  digit = np.zeros((8, 8), np.float32)
  digit[2:6, 3:5] = 16.0
  unit, single = to_unit_images(digit, 8)
  assert single and unit.shape == (1, 8, 8) and unit.max() == 1.0
  # A large RGB file with dark ink on white paper: grayscale, shrunk, inverted.
  big = np.full((64, 64, 3), 255, np.uint8)
  big[16:48, 24:40] = 0
  Image.fromarray(big, "RGB").save(tmp_path / "ink.png")
  Image.fromarray(big[..., 0], "L").convert("RGBA").save(tmp_path / "ink_rgba.png")
  unit, single = to_unit_images([str(tmp_path / "ink.png"), tmp_path / "ink_rgba.png"], 8)
  assert not single and unit.shape == (2, 8, 8)
  np.testing.assert_allclose(unit[0], digit / 16.0, atol=1e-6)
  np.testing.assert_allclose(unit[1], digit / 16.0, atol=1e-6)


# ----------------------------------------------------------------------------------------
# The ODE samplers on a flow whose answer is known exactly.
# ----------------------------------------------------------------------------------------
def gaussian_velocity(mu, s):
  """Optimal rectified-flow velocity E[noise - x0 | x_t] for data N(mu, s^2).

  x_t = (1 - t) x0 + t n is Gaussian with mean (1 - t) mu and variance
  (1 - t)^2 s^2 + t^2; the flow maps noise z at t = 1 to mu + s z at t = 0.
  """
  def v(x, t):
    a = 1.0 - t
    var = a * a * s * s + t * t
    return (t - a * s * s) / var * (x - a * mu) - mu
  return v


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_samplers_integrate_gaussian_flow(shift):
  """x0 from the ODE vs the exact transport mu + s z; shift 3 crowds the steps near t = 1,
  where this flow is nearly straight, so it is less accurate at equal steps."""
  mu, s = 1.5, 0.4
  z = jnp.linspace(-2.5, 2.5, 11)
  exact = mu + s * z
  errors = {}
  for name, sampler in diffusion.SAMPLERS.items():
    for steps in (8, 32):
      x0 = jax.jit(lambda x: sampler(gaussian_velocity(mu, s), x, steps, shift))(z)
      errors[name, steps] = float(jnp.max(jnp.abs(x0 - exact)))
  tol = {1.0: (0.07, 0.01), 3.0: (0.15, 0.04)}[shift]
  assert errors["euler", 32] < tol[0], errors
  assert errors["heun", 32] < tol[1], errors
  assert errors["euler", 32] < errors["euler", 8]          # converges
  assert errors["heun", 8] < errors["euler", 8]             # second order beats first
  assert errors["heun", 32] < errors["euler", 32]
