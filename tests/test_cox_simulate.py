"""``CoxProcess.simulate``: the batched draw of ``f`` (a joint draw at anchor points, then the
candidates in batches from q's conditional) has q's marginals and, through the anchors, its
correlations (moments of many NumPy draws against the formulas); simulated patterns have the
count distribution of the posterior predictive, mean ``int E_q lambda`` and variance
``E Lambda + Var Lambda`` (z-tests, fixed seeds), with the batches forced small and in one joint
draw; the anchors stay inside a ``Polygon`` (covariates without values outside it); both backends
draw the same patterns."""
import math
import warnings

import numpy as np
import pytest
import reference as ref
from backends import NumPyroBackend, PyroBackend
from test_cox import HIGH, LOW, OFFSET, cox
from test_cox_polygon import L_SHAPE, in_l_shape

from sparsegp_common.objectives import windows
from sparsegp_common.inference.cox_simulation import AnchoredDraws


def moments(X):
    """Mean and covariance of a GP at 1-D points (RBF, lengthscale 1.5, variance 0.8)."""
    return np.sin(X[:, 0]), ref.kernel("rbf", X, X, [1.5], 0.8)


def empirical(draws):
    mean, cov = draws.mean(0), np.cov(draws.T)
    sd = np.sqrt(np.diag(cov))
    # standard error of a covariance entry: sqrt((s_i^2 s_j^2 + c_ij^2) / n)
    se = np.sqrt((np.outer(sd, sd) ** 2 + cov**2) / len(draws))
    return mean, cov, se


def test_anchored_draw_has_the_joint_or_the_anchored_covariance():
    X = np.linspace(0.0, 8.0, 40)[:, None]
    mean, cov = moments(X)

    # 40 rows in one batch: the joint draw
    draw = AnchoredDraws(moments, None, 64, np.asarray)
    draws = np.array([draw(X, seed) for seed in range(3000)])
    assert draw.unexplained == [0.0] * 3000
    m, c, se = empirical(draws)
    assert np.max(np.abs(m - mean) / np.sqrt(np.diag(cov) / len(draws))) < 4.5
    assert np.max(np.abs(c - cov) / se) < 4.5

    # batches of 8 given 4 anchors: marginals exact, covariance v_a^T v_b between rows
    anchors = np.linspace(0.0, 8.0, 4)[:, None]
    draw = AnchoredDraws(moments, anchors, 8, np.asarray)
    draws = np.array([draw(X, seed) for seed in range(3000)])
    _, K = moments(np.concatenate([anchors, X]))
    L = np.linalg.cholesky(K[:4, :4] + 1e-6 * 0.8 * np.eye(4))
    V = np.linalg.solve(L, K[:4, 4:])
    scheme = V.T @ V
    np.fill_diagonal(scheme, np.diag(cov))
    m, c, se = empirical(draws)
    assert np.max(np.abs(m - mean) / np.sqrt(np.diag(cov) / len(draws))) < 4.5
    assert np.max(np.abs(c - scheme) / se) < 4.5
    fraction = 1 - np.sum(V**2) / np.sum(np.diag(cov))
    np.testing.assert_allclose(draw.unexplained, fraction, rtol=1e-6)
    assert 0.1 < fraction < 0.2  # 4 anchors for lengthscale 1.5 on [0, 8]: a visible remainder ...
    assert np.max(np.abs(scheme - cov)) > 0.1
    # ... which 12 anchors leave below 1e-5 of the variance, the scheme then q's covariance
    anchors = np.linspace(0.0, 8.0, 12)[:, None]
    _, K = moments(np.concatenate([anchors, X]))
    V = np.linalg.solve(np.linalg.cholesky(K[:12, :12] + 1e-6 * 0.8 * np.eye(12)), K[:12, 12:])
    draw = AnchoredDraws(moments, anchors, 8, np.asarray)
    draw(X, 0)
    assert draw.unexplained[0] == pytest.approx(1 - np.sum(V**2) / np.sum(np.diag(cov))) and draw.unexplained[0] < 1e-5
    np.testing.assert_allclose(V.T @ V, cov, atol=2e-5)


def count_moments(svgp_ref, offset, nodes=100):
    """``E N = int E lambda`` and ``Var N = E N + int int E lambda(x) E lambda(y) (exp(c(x, y)) - 1)``
    of the pattern's count under q (Gauss-Legendre)."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    x, w = LOW + (x + 1) * (HIGH - LOW) / 2, w * (HIGH - LOW) / 2
    mean, cov = svgp_ref.predict(x[:, None])
    rate = np.exp(mean + offset + np.diag(cov) / 2)
    expected = w @ rate
    return expected, expected + (w * rate) @ np.expm1(cov) @ (w * rate)


@pytest.mark.parametrize("batch_size, num_anchors, shift", [(300, 12, 0.0), (512, 1, -1.5)])
def test_simulated_counts_have_the_posterior_predictive_mean_and_variance(backend, rng, batch_size, num_anchors, shift):
    """About 900 candidates per pattern in 3 batches given 12 anchors (lengthscale 2 on [0, 10]);
    with the intensity scaled by exp(-1.5), about 200 in one joint draw. The count's variance
    beyond its mean (7 and 2.3 times the mean here: f's correlated uncertainty) is what a draw of
    f independent per candidate would lose."""
    model, _, svgp_ref, _ = cox(backend, rng)
    model.offset = OFFSET + shift
    expected, variance = count_moments(svgp_ref, OFFSET + shift)
    assert variance > 2 * expected
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patterns = model.simulate(num_samples=150, seed=3, batch_size=batch_size, num_anchors=num_anchors)
    assert not [w for w in caught if "anchor points" in str(w.message)]  # 12 leave less than 1% of the variance
    counts = np.array([len(p) for p in patterns])
    assert all(((backend.numpy(p) >= LOW) & (backend.numpy(p) <= HIGH)).all() for p in patterns)
    assert abs(counts.mean() - expected) < 4 * math.sqrt(variance / len(counts)), (counts.mean(), expected)
    assert 0.55 < counts.var(ddof=1) / variance < 1.6, (counts.var(ddof=1), variance)


def test_too_few_anchors_warn(backend, rng):
    model, _, _, _ = cox(backend, rng)
    with pytest.warns(UserWarning, match="the 2 anchor points left up to .* of the variance"):
        model.simulate(num_samples=1, seed=0, batch_size=300, num_anchors=2)


def test_anchor_points():
    box = windows.Rectangle([[0.0, 10.0], [0.0, 5.0]])
    points = windows.anchor_points(box, 512)
    assert points.shape == (512, 2) and box.contains(points).all()
    assert len(np.unique(points[:, 0])) == 32 and len(np.unique(points[:, 1])) == 16
    assert windows.anchor_points(windows.Rectangle([[0, 1]] * 3), 512).shape == (512, 3)
    assert windows.anchor_points(windows.Interval(0.0, 1.0), 7).shape == (7, 1)
    polygon = windows.Polygon(L_SHAPE)
    points = windows.anchor_points(polygon, 400)
    assert 250 < len(points) <= 400 and in_l_shape(points).all()
    flat = windows.UserRule([[0.0, 1.0], [2.0, 1.0]], [1.0, 1.0])  # a box of zero height
    np.testing.assert_allclose(windows.anchor_points(flat, 10), [[0.1 + 0.2 * i, 1.0] for i in range(10)])
    with pytest.raises(ValueError, match="num_points"):
        windows.anchor_points(box, 0)


def test_simulate_on_a_polygon_reads_covariates_inside_only(backend):
    """Covariates without values outside the L (NaN, which the raster refuses): the bound and the
    anchors use points inside only; the events lie inside."""
    from sparsegp_common.data.raster import Raster

    images = np.zeros((8, 8))
    images[5:, 5:] = np.nan  # in the L's missing square, beyond the pixels an inside point interpolates
    raster = Raster(images, ((0, 2), (0, 2)))
    gp = backend.svgp(np.array([[0.5, 0.5], [1.5, 0.5], [0.5, 1.5]]), ("rbf", [0.8, 0.8], 0.02),
                      mean_function=backend.lib.Covariates(raster, backend.array([0.0]), bias=math.log(100.0)))
    model = backend.lib.CoxProcess(gp, windows.Polygon(L_SHAPE))
    patterns = [backend.numpy(p) for p in model.simulate(num_samples=2, seed=0, batch_size=256)]  # 3 batches each
    assert all(200 < len(p) < 400 and in_l_shape(p).all() for p in patterns), [len(p) for p in patterns]


def test_backends_draw_the_same_patterns():
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        model, *_ = cox(backend, np.random.default_rng(11))
        results.append([backend.numpy(p) for p in model.simulate(num_samples=3, seed=7, batch_size=128)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_thinning_doubles_a_bound_the_intensity_exceeds():
    """A constant intensity 8 on a 2 x 2 square thinned from a bound of 4: the bound is doubled
    until it dominates (accepting where ``lambda > bound`` would give rate 4), so the counts have
    mean 32 (z-test over 300 patterns, a fixed seed); a bound never reached is an error."""
    square, rng = windows.Rectangle([[0.0, 2.0], [0.0, 2.0]]), np.random.default_rng(0)
    intensity = lambda X, seed: np.full(len(X), math.log(8.0))  # noqa: E731
    counts = [len(windows.thin(square, math.log(4.0), intensity, rng)) for _ in range(300)]
    assert abs(np.mean(counts) - 32.0) <= 4 * math.sqrt(32.0 / 300), np.mean(counts)
    with pytest.raises(RuntimeError, match="kept exceeding its bound after 3 doublings"):
        windows.thin(square, 0.0, lambda X, seed: np.full(len(X), 50.0), rng, max_tries=3)
