"""Polygon windows: area and membership (NumPy and the backends' arrays), and the Cox ELBO on an
L-shaped window, its default randomised rule unbiased (z-test) against the integral over the
polygon by Gauss-Legendre on its two rectangles."""
import math

import numpy as np
import pytest
import reference as ref
from test_cox import OFFSET, elbo

from sparsegp_common.objectives import windows

L_SHAPE = [(0.0, 0.0), (2.0, 0.0), (2.0, 1.0), (1.0, 1.0), (1.0, 2.0), (0.0, 2.0)]
PARTS = [((0.0, 2.0), (0.0, 1.0)), ((0.0, 1.0), (1.0, 2.0))]  # the L as two rectangles


def in_l_shape(X):
    return ((X[:, 1] <= 1) | (X[:, 0] <= 1)) & np.all((X >= 0) & (X <= 2), axis=1)


def test_polygon_area_and_membership(backend):
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 2.5, (2000, 2))
    for vertices in (L_SHAPE, L_SHAPE[::-1]):
        polygon = windows.Polygon(vertices)
        assert polygon.volume == pytest.approx(3.0) and polygon.bounds.tolist() == [[0, 2], [0, 2]]
        np.testing.assert_array_equal(polygon.contains(X), in_l_shape(X))
        np.testing.assert_array_equal(backend.numpy(polygon.indicator(backend.array(X))), in_l_shape(X).astype(float))
        assert polygon.contains(polygon.anchor[None])[0]
    with pytest.raises(ValueError, match="shape"):
        windows.Polygon([(0, 0), (1, 1)])
    with pytest.raises(ValueError, match="zero area"):
        windows.Polygon([(0, 0), (1, 1), (2, 2)])
    with pytest.raises(ValueError, match="NaN"):
        windows.Polygon([(0, 0), (1, np.nan), (2, 0)])
    with pytest.raises(TypeError, match="Rectangle"):
        backend.lib.CoxProcess(backend.svgp(np.zeros((2, 2)), ("rbf", [1.0, 1.0], 1.0)), windows.Polygon(L_SHAPE),
                               backend.lib.Binned(8))


def l_shape_process(backend):
    rng = np.random.default_rng(3)
    axis = np.linspace(0.1, 1.9, 4)
    Z = np.stack([g.ravel() for g in np.meshgrid(axis, axis)], axis=-1)
    q_mu, q_sqrt = rng.normal(size=len(Z)), np.diag(rng.uniform(0.2, 0.5, len(Z)))
    kern = ("rbf", [0.4, 0.6], 1.0)
    gp = backend.svgp(Z, kern, q_mu, q_sqrt)
    polygon = windows.Polygon(L_SHAPE)
    model = backend.lib.CoxProcess(gp, polygon, offset=OFFSET)
    events = rng.uniform(0, 2, (60, 2))
    events = events[in_l_shape(events)]
    return model, events, ref.SVGPRef(*kern, Z, q_mu, q_sqrt, jitter=1e-6)


def exact_elbo(svgp_ref, events, nodes=30):
    x, w = np.polynomial.legendre.leggauss(nodes)
    integral = 0.0
    for (x0, x1), (y0, y1) in PARTS:
        gx, gy = np.meshgrid(x0 + (x + 1) * (x1 - x0) / 2, y0 + (x + 1) * (y1 - y0) / 2)
        weights = np.outer(w, w).ravel() * (x1 - x0) * (y1 - y0) / 4
        integral += weights @ ref.cox_intensity_mean(svgp_ref, np.stack([gx.ravel(), gy.ravel()], -1), OFFSET)
    return (svgp_ref.predict(events)[0] + OFFSET).sum() - integral - svgp_ref.kl()


def test_default_rule_on_a_polygon_is_unbiased(backend):
    """Stratified nodes on the bounding box, those outside weighing nothing: over 200 seeds the ELBO
    averages to the exact one; the box's integral (no mask) is off by many standard errors."""
    model, events, svgp_ref = l_shape_process(backend)
    assert isinstance(model.rule, windows.StratifiedMC)
    exact = exact_elbo(svgp_ref, events)
    draws = np.array([elbo(backend, model, backend.array(events), seed=s) for s in range(200)])
    se = draws.std(ddof=1) / math.sqrt(len(draws))
    assert abs(draws.mean() - exact) / se < 4, ((draws.mean() - exact) / se, se)
    box = backend.lib.CoxProcess(model.prior, windows.Rectangle([[0, 2], [0, 2]]), offset=OFFSET)
    assert abs(elbo(backend, box, backend.array(events)) - exact) > 10 * se
    with pytest.raises(ValueError, match="outside the window"):
        model.elbo(backend.array([[1.5, 1.5]]))


def test_pixel_rule_and_map_on_a_polygon(backend):
    """A raster's pixel rule on the L (pixel edges on the L's edges) is exact for a constant
    intensity, and the map is drawn inside the L only."""
    import matplotlib

    from sparsegp_common.data.raster import Raster

    matplotlib.use("Agg")
    raster = Raster(np.arange(16.0).reshape(4, 4), ((0, 2), (0, 2)))
    gp = backend.svgp(np.array([[0.5, 0.5], [1.5, 0.5]]), ("rbf", [1.0, 1.0], 1e-8),
                      mean_function=backend.lib.Covariates(raster, backend.array([0.0]), bias=0.0))
    model = backend.lib.CoxProcess(gp, windows.Polygon(L_SHAPE), raster.rule())
    events = backend.array([[0.5, 0.5], [0.5, 1.5]])
    # f = 0 (q at the prior, prior variance 1e-8): the ELBO is -|W| up to the tiny variance
    assert elbo(backend, model, events) == pytest.approx(-3.0, abs=1e-6)
    ax = model.plot_intensity(part="mean", resolution=20)
    mesh = np.ma.filled(ax.collections[0].get_array().astype(float), np.nan).reshape(20, 20)  # NaN: masked
    x, y = np.meshgrid(np.linspace(0, 2, 20), np.linspace(0, 2, 20))
    inside = ((x < 1) | (y < 1)) & (x > 0) & (y > 0) & (x < 2) & (y < 2)  # strictly: the border may go either way
    outside = (x > 1) & (y > 1)
    assert np.isfinite(mesh[inside]).all() and np.isnan(mesh[outside]).all()
