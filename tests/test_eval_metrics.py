"""Tests for mot.eval_metrics (numpy / scikit-learn judges; no JAX)."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from mot import eval_metrics as em

N_TRAIN = 1500


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    images = d.images.astype(np.float64)  # [1797, 8, 8], values 0..16
    labels = d.target
    return images[:N_TRAIN], labels[:N_TRAIN], images[N_TRAIN:], labels[N_TRAIN:]


def test_split_sizes(digits):
    x_tr, y_tr, x_te, y_te = digits
    assert x_tr.shape == (1500, 8, 8) and x_te.shape == (297, 8, 8)
    assert x_tr.max() == em.PIXEL_MAX


def test_classifier_heldout_accuracy(digits):
    x_tr, y_tr, x_te, y_te = digits
    clf = em.fit_digit_classifier(x_tr, y_tr)
    acc = em.classifier_accuracy(clf, x_te, y_te)
    assert acc >= 0.94, acc
    assert acc == pytest.approx(0.953, abs=0.01)
    # Flattened input is accepted too and gives the same answer.
    assert em.classifier_accuracy(clf, x_te.reshape(-1, 64), y_te) == acc
    # Training accuracy is (near) perfect.
    assert em.classifier_accuracy(clf, x_tr, y_tr) > 0.99


def test_classifier_rejects_bad_shapes(digits):
    x_tr, y_tr, _, _ = digits
    with pytest.raises(ValueError):
        em.fit_digit_classifier(x_tr[:, :4, :4], y_tr)
    with pytest.raises(ValueError):
        em.fit_digit_classifier(x_tr, y_tr[:10])


def test_classifier_warns_on_wrong_scale(digits):
    x_tr, y_tr, x_te, y_te = digits
    clf = em.fit_digit_classifier(x_tr, y_tr)
    with pytest.warns(UserWarning, match=r"\[0, 16\]"):
        em.classifier_accuracy(clf, x_te / 8.0 - 1.0, y_te)


def test_frechet_self_is_zero():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8))
    assert em.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)


def test_frechet_self_is_zero_on_singular_pixel_covariance(digits):
    # Digit pixels have always-blank border pixels: singular covariances.
    _, _, x_te, _ = digits
    flat = x_te.reshape(-1, 64)
    assert em.frechet_distance(flat, flat) == pytest.approx(0.0, abs=1e-6)


def _gaussian_samples(rng, mean, cov, n):
    """Samples whose empirical mean / (N-1) covariance equal mean / cov exactly."""
    d = len(mean)
    z = rng.normal(size=(n, d))
    z -= z.mean(0)
    # Whiten to identity sample covariance, then colour with chol(cov).
    c = np.cov(z, rowvar=False)
    z = z @ np.linalg.inv(np.linalg.cholesky(c)).T
    return z @ np.linalg.cholesky(cov).T + mean


def test_frechet_matches_closed_form_diagonal():
    rng = np.random.default_rng(1)
    d = 6
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    var1, var2 = rng.uniform(0.2, 3.0, size=d), rng.uniform(0.2, 3.0, size=d)
    a = _gaussian_samples(rng, mu1, np.diag(var1), 400)
    b = _gaussian_samples(rng, mu2, np.diag(var2), 250)
    np.testing.assert_allclose(np.cov(a, rowvar=False), np.diag(var1), atol=1e-10)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum(var1 + var2 - 2 * np.sqrt(var1 * var2))
    assert em.frechet_distance(a, b) == pytest.approx(expected, rel=1e-8)


def test_frechet_matches_closed_form_full_covariance():
    # Commuting-free general case: d² = |dmu|² + tr(S1 + S2 - 2 (S1^½ S2 S1^½)^½).
    rng = np.random.default_rng(2)
    d = 5
    m1, m2 = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    s1, s2 = m1 @ m1.T + 0.1 * np.eye(d), m2 @ m2.T + 0.1 * np.eye(d)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    a = _gaussian_samples(rng, mu1, s1, 300)
    b = _gaussian_samples(rng, mu2, s2, 300)
    w, v = np.linalg.eigh(s1)
    r = (v * np.sqrt(w)) @ v.T
    e = np.linalg.eigvalsh(r @ s2 @ r)
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.sum(np.sqrt(e))
    assert em.frechet_distance(a, b) == pytest.approx(expected, rel=1e-7)


def test_frechet_shift_only():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(200, 4))
    shift = np.array([1.0, -2.0, 0.5, 3.0])
    assert em.frechet_distance(a, a + shift) == pytest.approx(np.sum(shift**2), rel=1e-8)


def test_frechet_symmetric():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(120, 10))
    b = 1.5 * rng.normal(size=(90, 10)) + 0.3
    assert em.frechet_distance(a, b) == pytest.approx(em.frechet_distance(b, a), rel=1e-9)


def test_frechet_validates_shapes():
    a = np.zeros((10, 3))
    with pytest.raises(ValueError, match="2-D"):
        em.frechet_distance(np.zeros(10), a)
    with pytest.raises(ValueError, match="2-D"):
        em.frechet_distance(a, np.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match="feature sizes"):
        em.frechet_distance(a, np.zeros((10, 4)))
    with pytest.raises(ValueError, match="at least 2"):
        em.frechet_distance(a, np.zeros((1, 3)))
    with pytest.raises(ValueError, match="NaN"):
        em.frechet_distance(a, np.full((10, 3), np.nan))


def test_frechet_floor(digits):
    x_tr, _, x_te, _ = digits
    floor = em.frechet_floor(x_tr, x_te, n=297, seed=0)
    assert np.isfinite(floor) and floor > 0
    # Deterministic in the seed, and a subset of real digits is far closer than noise.
    assert em.frechet_floor(x_tr, x_te, n=297, seed=0) == floor
    noise = np.random.default_rng(0).uniform(0, 16, size=(297, 64))
    assert em.frechet_distance(noise, x_te.reshape(-1, 64)) > 5 * floor
    with pytest.raises(ValueError):
        em.frechet_floor(x_tr, x_te, n=1, seed=0)
    with pytest.raises(ValueError):
        em.frechet_floor(x_tr, x_te, n=len(x_tr) + 1, seed=0)
