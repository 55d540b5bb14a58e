"""Which attention kernel runs ("auto" | "xla" | "cudnn"), and that cuDNN's equals XLA's.

The GPU test runs only where JAX sees a GPU (CI has none). tests/conftest.py puts JAX on
the CPU unless JAX_PLATFORMS is set, so on a GPU machine run it as
`JAX_PLATFORMS=cuda python -m pytest -q -n 0 tests/test_attention_impl.py` (as on the H200:
docs/performance.md §4).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot import attention
from mot.config import ConfigError, validate_model
from mot.model import MoT, inputs_from_batch
from tests.test_model import CFG, layout_batch

ON_GPU = jax.default_backend() == "gpu"


def packed_batch(length: int = 32):
  """test_model's example twice in one row, the second's image block noised, then
  padding: every rule of mot.masks (packing, causal text, blocks, noise, padding)."""
  clean, noised = layout_batch(False), layout_batch(True)
  noised["segment_ids"] = 2 * noised["segment_ids"]
  noised["block_ids"] = 2 * noised["block_ids"]
  row = {k: np.concatenate([clean[k], noised[k]], axis=1) for k in clean}
  pad = length - row["tokens"].shape[1]
  return {k: np.pad(v, [(0, 0), (0, pad)] + [(0, 0)] * (v.ndim - 2)) for k, v in row.items()}


def q_of(dtype, length=32, head_dim=16):
  return jnp.zeros((1, length, 4, head_dim), dtype)


@pytest.mark.skipif(ON_GPU, reason="checks the choice on a machine without a GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_auto_is_xla_without_a_gpu(dtype):
  assert attention.attention_implementation(CFG, q_of(dtype)) == "xla"


def test_explicit_choice_is_kept():
  assert attention.attention_implementation(dataclasses.replace(CFG, attention_impl="xla"),
                                         q_of(jnp.bfloat16)) == "xla"


@pytest.mark.parametrize("head_dim,length,dtype", [(16, 32, jnp.float32), (136, 32, jnp.bfloat16),
                                                   (12, 32, jnp.bfloat16), (16, 33, jnp.bfloat16)])
def test_auto_falls_back_to_xla_where_cudnn_does_not_apply(head_dim, length, dtype):
  assert attention.attention_implementation(CFG, q_of(dtype, length, head_dim)) == "xla"


def test_bad_attention_impl_is_a_config_error():
  with pytest.raises(ConfigError, match="attention_impl='flash' is unknown"):
    validate_model(dataclasses.replace(CFG, attention_impl="flash"))
  with pytest.raises(ConfigError, match="attention_impl=None is unknown"):
    validate_model(dataclasses.replace(CFG, attention_impl=None))
  with pytest.raises(ConfigError, match="needs 16-bit compute.*dtype=bfloat16"):
    validate_model(dataclasses.replace(CFG, attention_impl="cudnn"))
  if not ON_GPU:
    with pytest.raises(ConfigError, match="needs a GPU"):
      validate_model(dataclasses.replace(CFG, attention_impl="cudnn", dtype="bfloat16"))


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs a GPU")
def test_cudnn_equals_xla_on_a_packed_row_forward_and_backward():
  batch = jax.tree.map(jnp.asarray, packed_batch())
  cfg16 = dataclasses.replace(CFG, dtype="bfloat16")
  assert attention.attention_implementation(cfg16, q_of(jnp.bfloat16)) == "cudnn"
  params = MoT(cfg16).init(jax.random.PRNGKey(0), inputs_from_batch(batch))["params"]
  params = jax.tree.map(lambda p: p + 0.02 * jax.random.normal(jax.random.PRNGKey(1), p.shape),
                        params)
  t = jnp.where(batch["dm_mask"] > 0, 0.5, 0.0)
  valid = np.asarray(batch["segment_ids"][0] > 0)

  def outputs_and_grads(impl):
    model = MoT(dataclasses.replace(cfg16, attention_impl=impl))
    def loss(p):
      logits, velocity, _ = model.apply({"params": p}, inputs_from_batch(batch, timesteps=t))
      w = batch["segment_ids"][..., None] > 0
      out = (logits.astype(jnp.float32), velocity.astype(jnp.float32))
      return (jnp.sum(jnp.where(w, out[0], 0) ** 2) * 1e-4
              + jnp.sum(jnp.where(w, out[1], 0) ** 2)), out
    fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
    hlo = fn.lower(params).compile().as_text()
    (_, out), grads = fn(params)
    return hlo, out, grads

  xla_hlo, xla_out, xla_grads = outputs_and_grads("xla")
  cudnn_hlo, cudnn_out, cudnn_grads = outputs_and_grads("cudnn")
  assert "cudnn" in cudnn_hlo.lower() and "fmha" not in xla_hlo.lower()
  for a, b in zip(xla_out, cudnn_out):
    np.testing.assert_allclose(np.asarray(b)[0, valid], np.asarray(a)[0, valid],
                               atol=5e-2, rtol=5e-2)
  for a, b in zip(jax.tree.leaves(xla_grads), jax.tree.leaves(cudnn_grads)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    scale = np.abs(a).max() + 1e-6
    assert np.abs(a - b).max() <= 5e-2 * scale, (np.abs(a - b).max(), scale)
