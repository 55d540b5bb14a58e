"""The Linear layers' matmul, with optional reduced-precision operands.

`model.matmul_dtype="bfloat16"` rounds both operands of every Linear matmul to bf16 and
accumulates in float32 — forward, input gradient and weight gradient alike — while the
activations, the residual stream, the gradients between layers and the parameters stay in
the compute and parameter dtypes (float32 by default). This is what a TPU does with a
float32 matmul at its default precision (one bf16 pass), written out so that every backend
does it: CPUs with AVX512-BF16 (Intel since Cooper Lake, AMD since Zen 4) and GPUs run
bf16 x bf16 -> f32 products faster than f32 ones. Plain `dtype="bfloat16"` is
a different thing: bf16 activations everywhere, and on a CPU a bf16-*output* matmul, which
is no faster than f32.

Why a custom gradient: left to autodiff, the transpose of a bf16 x bf16 -> f32 dot is an
f32 x bf16 dot, which XLA:CPU upcasts to float32 (and rounds the input gradient to bf16).
Here the cotangent is rounded once, both gradient products run bf16 x bf16 -> f32, and
the input gradient returns in the input's dtype.

The weight gradient contracts over the token axis (every leading axis of x). XLA:CPU
hands a 2-D dot that contracts the left operand's *major* axis to Eigen, which has no
bf16 kernel (it upcasts); written as a batch-contracting einsum over a size-1 axis, the
same product is canonicalised with an explicit transpose and runs in YNNPACK's bf16
kernel (rates in docs/performance.md).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

Array = jax.Array


def linear_matmul(x: Array, kernel: Array, in_dims: int, matmul_dtype, out_dtype) -> Array:
  """x [..., *in] @ kernel [*in, *out] -> [..., *out] in out_dtype.

  With matmul_dtype equal to x's and kernel's dtype this is the plain dot_general (same
  program, same bits as before the field existed). Otherwise both operands are rounded to
  matmul_dtype and the products accumulate in float32 (`rounded_matmul`).
  """
  if jnp.dtype(matmul_dtype) == x.dtype == kernel.dtype:
    contract = tuple(range(x.ndim - in_dims, x.ndim))
    return jax.lax.dot_general(x, kernel, ((contract, tuple(range(in_dims))),
                                           ((), ()))).astype(out_dtype)
  return rounded_matmul(x, kernel, in_dims, jnp.dtype(matmul_dtype)).astype(out_dtype)


def dense_dot_general(cfg):
  """`dot_general` for the flax `nn.Dense` layers (timestep MLP, adaLN modulation): None
  (flax's default, lax.dot_general) unless cfg.matmul_dtype differs from the compute
  dtype, then the `rounded_matmul` product, so those per-token matmuls follow the field
  too while their parameters keep flax's names (kernel and bias)."""
  operand = cfg.matmul_operand_dtype
  if operand == cfg.compute_dtype:
    return None

  def dot_general(x, kernel, dimension_numbers, precision=None):
    del precision
    assert dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
    return rounded_matmul(x, kernel, 1, operand).astype(x.dtype)
  return dot_general


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rounded_matmul(x: Array, kernel: Array, in_dims: int, dtype) -> Array:
  """x [..., *in] @ kernel [*in, *out] -> float32 [..., *out] from operands rounded to
  `dtype`; the gradients are computed the same way (module docstring)."""
  return _forward(x, kernel, in_dims, dtype)[0]


def _flat(x: Array, kernel: Array, in_dims: int):
  k_in = math.prod(kernel.shape[:in_dims])
  return x.reshape(-1, k_in), kernel.reshape(k_in, -1)


def _forward(x, kernel, in_dims, dtype):
  x2, k2 = _flat(x, kernel, in_dims)
  x2, k2 = x2.astype(dtype), k2.astype(dtype)
  y2 = jnp.dot(x2, k2, preferred_element_type=jnp.float32)
  y = y2.reshape(*x.shape[:x.ndim - in_dims], *kernel.shape[in_dims:])
  # Zero-size arrays carry the operands' shapes and dtypes to the backward pass.
  return y, (x2, k2, jnp.zeros((0,) + x.shape, x.dtype),
             jnp.zeros((0,) + kernel.shape, kernel.dtype))


def _backward(in_dims, dtype, residuals, g):
  x2, k2, x_like, k_like = residuals
  g2 = g.reshape(x2.shape[0], k2.shape[1]).astype(dtype)
  dx2 = jax.lax.dot_general(g2, k2, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
  dk2 = jnp.einsum("cni,cno->io", x2[None], g2[None], preferred_element_type=jnp.float32)
  return (dx2.reshape(x_like.shape[1:]).astype(x_like.dtype),
          dk2.reshape(k_like.shape[1:]).astype(k_like.dtype))


rounded_matmul.defvjp(lambda x, kernel, in_dims, dtype: _forward(x, kernel, in_dims, dtype),
                      _backward)
