"""Linear matmuls with bf16 operands and f32 accumulation (`model.matmul_dtype`)."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mot import matmul
from tests._models import model_config
from tests.test_model import CFG, same_init_loss_and_grads

BF16 = jnp.dtype(jnp.bfloat16)


def rounded(a):
  """a rounded to bf16, back in float32: what the products must see."""
  return a.astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("in_dims", [1, 2])
def test_rounded_matmul_and_its_gradients_use_rounded_operands(in_dims):
  """Forward, input gradient and weight gradient are exact f32 products of bf16-rounded
  operands (the cotangent rounded too), returned in the inputs' float32."""
  rng = np.random.default_rng(0)
  in_shape = (6,) if in_dims == 1 else (2, 3)
  x = jnp.asarray(rng.normal(size=(3, 5, *in_shape)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(*in_shape, 4)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)
  sub = "ij"[:in_dims]
  hi = jax.lax.Precision.HIGHEST

  y, vjp = jax.vjp(lambda x, w: matmul.rounded_matmul(x, w, in_dims, BF16), x, w)
  dx, dw = vjp(ct)
  want_y = jnp.einsum(f"bl{sub},{sub}o->blo", rounded(x), rounded(w), precision=hi)
  want_dx = jnp.einsum(f"blo,{sub}o->bl{sub}", rounded(ct), rounded(w), precision=hi)
  want_dw = jnp.einsum(f"bl{sub},blo->{sub}o", rounded(x), rounded(ct), precision=hi)
  chex.assert_trees_all_equal_dtypes((y, dx, dw), (x[..., :1], x, w))
  chex.assert_trees_all_close((y, dx, dw), (want_y, want_dx, want_dw), rtol=1e-5, atol=1e-5)
  # And not the unrounded products: the rounding really happens.
  assert float(jnp.max(jnp.abs(dw - jnp.einsum(f"bl{sub},blo->{sub}o", x, ct,
                                               precision=hi)))) > 1e-3


def test_same_dtype_is_the_plain_dot():
  """matmul_dtype equal to the operands' dtype is today's dot_general: no custom
  gradient in the program, and the same bits."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
  w = jax.random.normal(jax.random.PRNGKey(1), (8, 5))
  f = lambda x, w: matmul.linear_matmul(x, w, 1, jnp.dtype(jnp.float32), jnp.float32)
  assert "custom_vjp" not in str(jax.make_jaxpr(jax.grad(lambda x, w: f(x, w).sum()))(x, w))
  np.testing.assert_array_equal(jax.jit(f)(x, w), jax.jit(
      lambda x, w: jax.lax.dot_general(x, w, (((2,), (0,)), ((), ()))))(x, w))


@pytest.mark.parametrize("experts", ["shared", "mode"])
def test_model_with_bf16_matmuls(experts):
  """The same parameters (init draws), a loss and gradients within bf16 rounding of the
  float32 model's, float32 gradients, and bf16 x bf16 products in the compiled program."""
  cfg = dataclasses.replace(CFG, experts=experts)
  params, f32, bf16 = same_init_loss_and_grads(
      cfg, dataclasses.replace(cfg, matmul_dtype="bfloat16"))
  (loss, g), (loss32, g32) = bf16(params), f32(params)
  chex.assert_trees_all_equal_dtypes(g, g32)
  np.testing.assert_allclose(loss, loss32, rtol=2e-2)
  cos = lambda a, b: float(jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-30))
  flat, flat32 = jax.tree.leaves(g), jax.tree.leaves(g32)
  assert min(cos(a.ravel(), b.ravel()) for a, b in zip(flat, flat32)) > 0.99
  assert any(not np.array_equal(a, b) for a, b in zip(flat, flat32))
  assert "bf16[" in bf16.lower(params).compile().as_text()
  assert "bf16[" not in f32.lower(params).compile().as_text()


def test_validate_rejects_an_unknown_matmul_dtype():
  from mot.config import ConfigError, validate_model
  validate_model(dataclasses.replace(model_config(), matmul_dtype="bfloat16"))
  with pytest.raises(ConfigError, match="matmul_dtype='int8' is unknown"):
    validate_model(dataclasses.replace(model_config(), matmul_dtype="int8"))
