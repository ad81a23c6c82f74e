"""Covariate images: bilinear interpolation against a dense reference (scipy), out-of-extent and
missing values refused, standardisation, the pixel rule's clipped areas, and a raster mean
function inside the Cox ELBO against the dense reference."""
import jax
import numpy as np
import pytest
import reference as ref
from scipy.interpolate import RegularGridInterpolator

from sparsegp_common.data.raster import PixelRule, Raster
from sparsegp_common.objectives import windows

EXTENT = ((0.0, 4.0), (-1.0, 2.0))  # 8 x 6 pixels of 0.5 x 0.5


def images(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, 6, 8))


def dense_bilinear(values, extent, X):
    """scipy's linear interpolation between pixel centres, the border pixels held beyond them."""
    (x0, x1), (y0, y1) = extent
    K, H, W = values.shape
    x = x0 + (np.arange(W) + 0.5) * (x1 - x0) / W
    y = y0 + (np.arange(H) + 0.5) * (y1 - y0) / H
    clamped = np.stack([np.clip(X[:, 0], x[0], x[-1]), np.clip(X[:, 1], y[0], y[-1])], axis=1)
    return np.stack([RegularGridInterpolator((y, x), v)(clamped[:, ::-1]) for v in values], axis=1)


def test_bilinear_values_match_the_dense_reference(backend):
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.uniform([0, -1], [4, 2], (200, 2)),
                        [[0.0, -1.0], [4.0, 2.0], [0.1, 1.9], [3.99, 0.5], [2.25, 0.25]]])  # corners, border strip, a centre
    raster = Raster(images(), EXTENT)
    got = backend.numpy(raster.evaluate(backend.array(X)))
    np.testing.assert_allclose(got, dense_bilinear(raster.values, EXTENT, X), rtol=1e-12, atol=1e-12)
    # at a pixel centre the pixel's own value
    np.testing.assert_allclose(got[-1], raster.values[:, 2, 4], rtol=1e-12)


def test_points_outside_or_without_values_are_refused(backend):
    raster = Raster(images(), EXTENT, names=("elev", "slope"))
    with pytest.raises(ValueError, match=r"1 point\(s\) lie outside the raster's extent"):
        raster.evaluate(backend.array([[1.0, 0.0], [4.5, 0.0]]))
    values = images()
    values[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"no value \(NaN\) at 1 point"):
        Raster(values, EXTENT).evaluate(backend.array([[0.1, -0.9], [3.0, 1.0]]))
    with pytest.raises(ValueError, match="extent"):
        Raster(images(), ((1.0, 0.0), (0.0, 1.0)))
    with pytest.raises(ValueError, match="names"):
        Raster(images(), EXTENT, names=("elev",))


def test_standardised_images():
    raw = images() * [[[3.0]], [[0.1]]] + [[[100.0]], [[-2.0]]]
    raster = Raster(raw, EXTENT, standardize=True)
    np.testing.assert_allclose(raster.values.mean(axis=(1, 2)), 0.0, atol=1e-12)
    np.testing.assert_allclose(raster.values.std(axis=(1, 2)), 1.0, rtol=1e-12)
    np.testing.assert_allclose(raster.values * raster.scale[:, None, None] + raster.mean[:, None, None], raw, rtol=1e-12)
    with pytest.raises(ValueError, match="constant"):
        Raster(np.ones((3, 3)), EXTENT, standardize=True)


def test_pixel_rule_clips_border_pixels_to_the_window():
    raster = Raster(images(), EXTENT)
    window = windows.Rectangle([[0.3, 3.6], [-0.8, 1.1]])
    layout = PixelRule(raster).layout(window)
    assert layout.weights.sum() == pytest.approx(window.volume, rel=1e-12)
    assert window.contains(layout.points).all()
    # clipped pixels: the midpoint rule on each part is exact for linear integrands
    (a, b), (c, d) = window.bounds
    exact = (b**2 - a**2) / 2 * (d - c) * 2 + (d**2 - c**2) / 2 * (b - a) * -1
    assert layout.weights @ (2 * layout.points[:, 0] - layout.points[:, 1]) == pytest.approx(exact, rel=1e-12)
    whole = PixelRule(raster).layout(windows.Rectangle(EXTENT))
    np.testing.assert_allclose(np.sort(whole.points, axis=0), np.sort(raster.centres(), axis=0))
    with pytest.raises(ValueError, match="extends beyond the raster's extent"):
        PixelRule(raster).layout(windows.Rectangle([[0.0, 4.5], [-1.0, 2.0]]))


def test_raster_mean_in_the_cox_elbo_matches_the_reference(backend):
    """A ``Covariates`` mean on two images, with the pixel rule as the integration rule: the
    ELBO against the dense reference (its integral by the same pixel rule of the exact
    bilinear-plus-GP intensity), and the Pyro/NumPyro parity."""
    rng = np.random.default_rng(3)
    raster = Raster(images(), EXTENT, standardize=True)
    Z = rng.uniform([0, -1], [4, 2], (6, 2))
    q_mu, q_sqrt = rng.normal(size=6) * 0.5, np.diag(rng.uniform(0.3, 0.8, 6))
    events = rng.uniform([0, -1], [4, 2], (30, 2))
    kern, w, b = ("rbf", [0.9, 1.1], 0.8), np.array([0.4, -0.3]), 0.5
    mf = backend.lib.Covariates(raster, backend.array(w), bias=b)
    gp = backend.svgp(Z, kern, q_mu, q_sqrt, mean_function=mf)
    model = backend.lib.CoxProcess(gp, windows.Rectangle(EXTENT), raster.rule(), offset=0.2)
    svgp_ref = ref.SVGPRef(*kern, Z, q_mu, q_sqrt, jitter=1e-6, mean=lambda X: b + dense_bilinear(raster.values, EXTENT, X) @ w)
    layout = raster.rule().layout(windows.Rectangle(EXTENT))
    expected = ((svgp_ref.predict(events)[0] + 0.2).sum() - layout.weights @ ref.cox_intensity_mean(svgp_ref, layout.points, 0.2)
                - svgp_ref.kl())
    ev = backend.array(events)
    value = model.elbo(ev, key=jax.random.PRNGKey(0)) if backend.name == "numpyro" else model.elbo(ev)
    assert float(backend.numpy(value)) == pytest.approx(expected, rel=1e-10)
    assert -backend.loss(model.model, model.guide, ev) == pytest.approx(expected, rel=1e-10)
    assert backend.lib.Covariates(raster).num_features == 3  # weights default to zeros, one per image


def test_intensity_map_of_a_covariate_process(backend, tmp_path):
    """The plot helper draws the posterior mean (or a part, or the band) over the window with the
    events; the covariate part it maps is exp(m + offset) of the fitted values."""
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(4)
    raster = Raster(images(), EXTENT)
    events = rng.uniform([0, -1], [4, 2], (40, 2))
    gp = backend.svgp(rng.uniform([0, -1], [4, 2], (5, 2)), ("rbf", [1.0, 1.0], 0.5),
                      mean_function=backend.lib.Covariates(raster, backend.array([0.3, -0.2]), bias=1.0))
    model = backend.lib.CoxProcess(gp, windows.Rectangle(EXTENT), offset=0.1)
    for part, stat in (("f", "mean"), ("mean", "mean"), ("gp", "width")):
        ax = model.plot_intensity(events=backend.array(events), part=part, stat=stat, resolution=40)
        mesh = ax.collections[0].get_array().reshape(30, 40)  # 40 along x (4 wide), 30 along y (3 high)
        assert np.isfinite(mesh).all() and len(ax.lines[0].get_xdata()) == 40
    gx, gy = np.meshgrid(np.linspace(0, 4, 40), np.linspace(-1, 2, 30))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=-1)
    ax = model.plot_intensity(part="mean", resolution=40)
    expected = np.exp(1.0 + dense_bilinear(raster.values, EXTENT, grid) @ [0.3, -0.2] + 0.1)
    np.testing.assert_allclose(ax.collections[0].get_array().ravel(), expected, rtol=1e-6)
    ax.figure.savefig(tmp_path / "map.png")
    with pytest.raises(ValueError, match="stat"):
        model.plot_intensity(stat="median")
