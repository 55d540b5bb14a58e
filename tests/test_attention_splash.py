"""Splash attention (`mot.splash`) in Pallas' interpreter on the CPU equals the dense path.

On a TPU `model.attention_impl="splash"` (or "auto") runs the same function compiled;
here the interpreter runs it (slowly: rows of 200 tokens, i.e. 2 x 2 tiles of 128).
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from mot import masks, splash
from tests import _procs
from tests.test_attention_blockwise import batch_ids, qkv, random_batch


def test_block_sizes_are_cut_to_the_row_and_the_row_padded_to_them():
  assert splash.block_sizes(200, 512, 512) == (256, 256, 256)
  assert splash.block_sizes(200, 128, 256) == (128, 256, 256)
  assert splash.block_sizes(300, 128, 128) == (128, 128, 384)


def test_splash_in_the_interpreter_equals_dense_forward_and_gradients():
  ids = batch_ids(random_batch(1, length=200))
  q, k, v, w = qkv(0, 2, 200, 200)

  @jax.jit
  def outputs_and_grads(q, k, v):
    mask = masks.attention_mask(ids, ids)
    dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask)
    tiled = lambda q, k, v: splash.attention(q, k, v, ids, ids, 128, 128, interpret=True)
    return [jax.grad(lambda *x, f=f: jnp.sum(f(*x) * w), argnums=(0, 1, 2))(q, k, v)
            + (f(q, k, v),) for f in (dense, tiled)]

  (*want_grads, want), (*got_grads, got) = outputs_and_grads(q, k, v)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)   # padding rows included
  for a, b in zip(want_grads, got_grads):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)


MESH_WORKER = """
import flax.linen as nn, jax, numpy as np
from mot import masks, splash
from tests.test_attention_blockwise import batch_ids, qkv, random_batch
ids = batch_ids(random_batch(1, length=100))
q, k, v, _ = qkv(0, 2, 100, 100)
mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
def run(q, k, v):
  with nn.logical_axis_rules((("activation_batch", "data"),)):
    return splash.attention(q, k, v, ids, ids, 128, 128, interpret=True)
with jax.set_mesh(mesh):
  fn = jax.jit(run)
  assert "manual_computation" in fn.lower(q, k, v).as_text()   # one shard_map
  got = fn(q, k, v)
want = jax.nn.dot_product_attention(q, k, v, mask=masks.attention_mask(ids, ids))
np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
"""


def test_splash_runs_per_device_rows_under_a_mesh(tmp_path):
  log = str(tmp_path / "worker.log")
  _procs.run_all([([sys.executable, "-c", MESH_WORKER], _procs.cpu_env(2), log)],
                 timeout=300, what="splash under a (2,) mesh")
