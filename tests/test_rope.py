"""mot.rope against an independent numpy reference of Qwen2-VL / Qwen3-VL M-RoPE.

The first group checks the reference itself (complex-number RoPE, hand-written position
tables), so a bug in tests/reference_mrope.py cannot hide a bug in mot.rope.  The second group
checks ``mot.rope.apply_mrope(x, positions, sections, theta, interleaved=False)``.
"""

import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:  # tests/ on sys.path (pytest's default rootdir-less import mode)
    import reference_mrope as ref
except ImportError:  # tests/ imported as a package
    from tests import reference_mrope as ref

THETA = 10000.0
# (head_dim, sections): the default, the Qwen2-VL-like 128 split, a Qwen3-VL-like split, small.
CONFIGS = [(64, (8, 12, 12)), (128, (16, 24, 24)), (64, (12, 10, 10)), (32, (4, 6, 6))]
LAYOUT = [("text", 3), ("image", (4, 4)), ("text", 2)]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _text_positions(b, l, start=0):
    idx = np.arange(start, start + l)
    return np.broadcast_to(np.stack([idx, idx, idx], -1), (b, l, 3)).astype(np.int32)


# --------------------------------------------------------------------------- reference checks


def _complex_rope_1d(x, pos, theta):
    """RoPE as a complex rotation of the pairs (x[j], x[j + D/2]) — rotate-half layout."""
    d = x.shape[-1]
    w = 1.0 / theta ** (np.arange(0, d, 2) / d)
    z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    z = z * np.exp(1j * pos[:, :, None, None] * w)
    return np.concatenate([z.real, z.imag], -1)


@pytest.mark.parametrize("dim", [32, 64, 128])
def test_reference_rope_1d_is_complex_rotation(dim):
    x = _rng(1).normal(size=(2, 9, 3, dim))
    pos = np.arange(18).reshape(2, 9) * 3
    np.testing.assert_allclose(
        ref.reference_rope_1d(x, pos, THETA), _complex_rope_1d(x, pos, THETA), atol=1e-5
    )


@pytest.mark.parametrize("dim,sections", CONFIGS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_reference_mrope_on_text_is_rope_1d(dim, sections, interleaved):
    x = _rng(2).normal(size=(2, 11, 2, dim))
    pos = _text_positions(2, 11, start=4)
    np.testing.assert_allclose(
        ref.reference_mrope(x, pos, sections, THETA, interleaved),
        ref.reference_rope_1d(x, pos[..., 0], THETA),
        atol=1e-12,
    )


def _axis_table(half, sections, interleaved):
    """Hand-rolled: which axis (0 t, 1 h, 2 w) drives each of the D/2 frequencies."""
    if not interleaved:
        return [0] * sections[0] + [1] * sections[1] + [2] * sections[2]
    axes = []
    for j in range(half):
        if j % 3 == 1 and j < 3 * sections[1]:
            axes.append(1)
        elif j % 3 == 2 and j < 3 * sections[2]:
            axes.append(2)
        else:
            axes.append(0)
    return axes


def test_reference_axis_tables_by_hand():
    # Qwen3-VL's default (24, 20, 20) over 64 frequencies: THW repeated 20 times, then T x4.
    assert _axis_table(64, (24, 20, 20), True) == [0, 1, 2] * 20 + [0] * 4
    # mot's default (8, 12, 12) interleaved: the HF slice stops at 32, so h gets 11, w 10.
    axes = _axis_table(32, (8, 12, 12), True)
    assert (axes.count(0), axes.count(1), axes.count(2)) == (11, 11, 10)


@pytest.mark.parametrize("dim,sections", CONFIGS + [(128, (24, 20, 20))])
@pytest.mark.parametrize("interleaved", [False, True])
def test_reference_mrope_is_per_frequency_complex_rotation(dim, sections, interleaved):
    # Each frequency j rotates its pair by pos[axis(j)] * w_j.
    rng = _rng(3)
    x = rng.normal(size=(2, 7, 2, dim))
    pos = rng.integers(0, 40, size=(2, 7, 3))
    axes = np.array(_axis_table(dim // 2, sections, interleaved))
    w = 1.0 / THETA ** (np.arange(0, dim, 2) / dim)
    angle = pos[..., axes] * w  # [B, L, D/2]
    z = (x[..., : dim // 2] + 1j * x[..., dim // 2 :]) * np.exp(1j * angle[:, :, None, :])
    np.testing.assert_allclose(
        ref.reference_mrope(x, pos, sections, THETA, interleaved),
        np.concatenate([z.real, z.imag], -1),
        atol=2e-5,
    )


def test_reference_positions_by_hand():
    expected = np.array(
        [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
        + [[3, 3 + r, 3 + c] for r in range(4) for c in range(4)]
        + [[7, 7, 7], [8, 8, 8]]
    )
    np.testing.assert_array_equal(ref.reference_positions(LAYOUT), expected)
    # Non-square image: next index is s + max(hp, wp).
    pos = ref.reference_positions([("text", 1), ("image", (2, 3)), ("text", 1)])
    np.testing.assert_array_equal(pos[1:7], [[1, 1 + r, 1 + c] for r in range(2) for c in range(3)])
    np.testing.assert_array_equal(pos[-1], [4, 4, 4])
    # Video (T, hp, wp) and action chunk K.
    pos = ref.reference_positions([("video", (3, 2, 2)), ("action", 4), ("text", 1)])
    np.testing.assert_array_equal(pos[:4], [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(pos[8:12], [[2, 0, 0], [2, 0, 1], [2, 1, 0], [2, 1, 1]])
    np.testing.assert_array_equal(pos[12:16], [[3 + k, 3, 3] for k in range(4)])
    np.testing.assert_array_equal(pos[16], [7, 7, 7])
    assert pos.dtype == np.int32 and pos.shape == (17, 3)


# --------------------------------------------------------------------------- mot.rope


@pytest.fixture(scope="module")
def rope():
    path = pathlib.Path(__file__).resolve().parents[1] / "mot" / "rope.py"
    if not path.exists():
        pytest.skip("mot/rope.py not written yet")
    import mot.rope  # errors inside the module must fail, not skip

    return mot.rope


@functools.lru_cache(maxsize=None)
def _fn(rope, sections, interleaved, jit):
    fn = functools.partial(rope.apply_mrope, sections=sections, theta=THETA,
                           interleaved=interleaved)
    return jax.jit(fn) if jit else fn


def _apply(rope, x, pos, sections, interleaved, jit=True):
    # jit by default (cached per config): much cheaper on CPU than eager op-by-op dispatch.
    return _fn(rope, tuple(sections), interleaved, jit)(jnp.asarray(x), jnp.asarray(pos, jnp.int32))


@pytest.mark.parametrize("dim,sections", CONFIGS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_text_is_rope_1d(rope, dim, sections, interleaved):
    x = _rng(4).normal(size=(2, 40, 3, dim)).astype(np.float32)
    pos = _text_positions(2, 40)
    out = _apply(rope, x, pos, sections, interleaved)
    expected = ref.reference_rope_1d(x, pos[..., 0], THETA).astype(np.float32)
    chex.assert_shape(out, x.shape)
    chex.assert_trees_all_close(out, expected, atol=1e-5, rtol=1e-5)


def _batch_positions():
    """Two packed rows of equal length: the DESIGN layout and another one, padded with text."""
    p0 = ref.reference_positions(LAYOUT)  # 21 tokens
    p1 = ref.reference_positions([("text", 1), ("image", (2, 5)), ("text", 4), ("image", (3, 2))])
    l = max(len(p0), len(p1))

    def pad(p):
        nxt = int(p.max()) + 1
        return np.concatenate([p, _text_positions(1, l - len(p), start=nxt)[0]])

    return np.stack([pad(p0), pad(p1)])


@pytest.mark.parametrize("dim,sections", CONFIGS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_layout_matches_reference(rope, dim, sections, interleaved):
    pos = _batch_positions()
    x = _rng(5).normal(size=(2, pos.shape[1], 4, dim)).astype(np.float32)
    out = _apply(rope, x, pos, sections, interleaved)
    expected = ref.reference_mrope(x, pos, sections, THETA, interleaved).astype(np.float32)
    chex.assert_shape(out, x.shape)
    chex.assert_type(out, jnp.float32)
    chex.assert_trees_all_close(out, expected, atol=1e-5, rtol=1e-5)


def test_layouts_differ(rope):
    # On image tokens the two layouts (and plain 1-D RoPE) really are different rotations.
    pos = ref.reference_positions(LAYOUT)[None]
    x = _rng(6).normal(size=(1, pos.shape[1], 1, 64)).astype(np.float32)
    a = np.asarray(_apply(rope, x, pos, (8, 12, 12), False))
    b = np.asarray(_apply(rope, x, pos, (8, 12, 12), True))
    img = slice(3, 19)
    assert np.abs(a[:, img] - b[:, img]).max() > 1e-2
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)  # text: both are 1-D RoPE


@pytest.mark.parametrize("dim,sections", [(64, (8, 12, 12)), (128, (16, 24, 24))])
@pytest.mark.parametrize("interleaved", [False, True])
def test_relative_property(rope, dim, sections, interleaved):
    rng = _rng(7)
    b, l, h = 2, 16, 2
    q = rng.normal(size=(b, l, h, dim)).astype(np.float32)
    k = rng.normal(size=(b, l, h, dim)).astype(np.float32)
    p1 = rng.integers(10, 40, size=(b, l, 3))
    p2 = rng.integers(10, 40, size=(b, l, 3))
    shift = np.array([5, -3, 7])

    def dots(pq, pk):
        rq = np.asarray(_apply(rope, q, pq, sections, interleaved), np.float64)
        rk = np.asarray(_apply(rope, k, pk, sections, interleaved), np.float64)
        return np.sum(rq * rk, axis=-1)  # [B, L, H]

    base = dots(p1, p2)
    np.testing.assert_allclose(dots(p1 + shift, p2 + shift), base, atol=1e-3)
    # Sanity: the dot product does depend on the relative offset of every axis.
    for axis in range(3):
        moved = p1.copy()
        moved[..., axis] += 3
        assert np.abs(dots(moved, p2) - base).max() > 1e-2


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_shape_and_dtype_preserved(rope, dtype):
    pos = _batch_positions()
    x32 = _rng(8).normal(size=(2, pos.shape[1], 3, 64)).astype(np.float32)
    x = jnp.asarray(x32, dtype)
    for jit in (True, False):  # eager once too
        out = _apply(rope, x, pos, (8, 12, 12), False, jit=jit)
        chex.assert_shape(out, x.shape)
        chex.assert_type(out, dtype)
    expected = ref.reference_mrope(np.asarray(x, np.float32), pos, (8, 12, 12), THETA)
    tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
    chex.assert_trees_all_close(out.astype(jnp.float32), expected.astype(np.float32),
                                atol=tol, rtol=tol)


def test_bad_sections_rejected(rope):
    x = jnp.zeros((1, 4, 1, 64), jnp.float32)
    pos = jnp.asarray(_text_positions(1, 4))
    with pytest.raises((ValueError, AssertionError)):
        rope.apply_mrope(x, pos, (8, 12, 8), THETA)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tables_are_exactly_cos_and_sin_of_the_angles(rope, interleaved):
    """The tables pass through an identity matmul (a fusion fence, see rotary_tables): it
    must not change a bit, or every checkpoint's numbers would move with the fence."""
    pos = jnp.asarray(_batch_positions()) * 37   # large angles: rounding would show
    tables = jax.jit(rope.rotary_tables, static_argnums=(1, 2, 3, 4))(
        pos, 64, (8, 12, 12), THETA, interleaved)
    angles = rope.mrope_angles(pos, 64, (8, 12, 12), THETA, interleaved)
    expected = jax.jit(lambda a: (jnp.cos(a), jnp.sin(a)))(angles)
    for got, want in zip(tables, expected):
        chex.assert_shape(got, (*pos.shape[:2], 32))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
