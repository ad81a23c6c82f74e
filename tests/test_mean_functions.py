"""Mean functions: each inside the SVGP ELBO and the Cox ELBO against the dense float64 reference,
the parts of ``predict_f``, every prior component, latent batches, learning, and bad input."""
import math

import jax
import numpy as np
import pytest
import reference as ref
from test_svgp import KERN, problem

from sparsegp_common.objectives import windows

COVARIATES = np.array([[0.7, -0.3], [0.2, 0.5]])  # c(X) = X @ COVARIATES.T + sin(X[:, 0])


def covariates_np(X):
    return X @ COVARIATES.T + np.sin(X[:, :1])


def covariates(backend):
    """The same covariate function on the backend's arrays."""
    C = backend.array(COVARIATES)
    sin = (lambda a: a.sin()) if backend.name == "pyro" else jax.numpy.sin
    return lambda X: X @ C.T + sin(X[:, :1])


def mean_function(backend, kind):
    """``(backend mean function, reference m(X))`` for each kind, with non-trivial coefficients."""
    lib = backend.lib
    if kind == "zero":
        return lib.Zero(), lambda X: np.zeros(len(X))
    if kind == "constant":
        return lib.Constant(0.8), lambda X: np.full(len(X), 0.8)
    if kind == "linear":
        w, b = np.array([0.4, -1.1]), 0.3
        return lib.Linear(backend.array(w), bias=b), lambda X: b + X @ w
    w, b = np.array([1.5, -0.6]), -0.2
    return lib.Covariates(covariates(backend), backend.array(w), bias=b), lambda X: b + covariates_np(X) @ w


KINDS = ["zero", "constant", "linear", "covariates"]
ELLS = {"gaussian": ref.gaussian_ell(0.2), "poisson_exp": ref.poisson_exp_ell}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lik_name", sorted(ELLS))
@pytest.mark.parametrize("whiten", [True, False])
def test_svgp_elbo_with_mean_matches_reference(backend, kind, lik_name, whiten):
    rng = np.random.default_rng(1)
    X, Z, q_mu, q_sqrt = problem(rng)
    y = rng.normal(size=len(X)) if lik_name == "gaussian" else rng.poisson(1.5, size=len(X)).astype(float)
    mf, m = mean_function(backend, kind)
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=whiten, mean_function=mf)
    lik = backend.set(backend.lib.Gaussian(), variance=0.2) if lik_name == "gaussian" else backend.lib.Poisson()
    model = backend.lib.GPModel(gp, lik)
    svgp_ref = ref.SVGPRef(*KERN, Z, q_mu, q_sqrt, whiten, jitter=1e-6, mean=m)
    expected = svgp_ref.elbo(ELLS[lik_name], X, y)
    Xa, ya = backend.array(X), backend.array(y)
    assert float(backend.numpy(model.elbo(Xa, ya))) == pytest.approx(expected, rel=1e-9)
    assert -backend.loss(model.model, model.guide, Xa, ya) == pytest.approx(expected, rel=1e-9)
    mean, var = (backend.numpy(a) for a in model.predict_f(Xa))
    m_ref, cov_ref = svgp_ref.predict(X)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(var, np.diag(cov_ref), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS[1:])
def test_cox_elbo_with_mean_matches_reference(backend, kind):
    """The mean function enters the events' terms and the integrand, beside the offset."""
    rng = np.random.default_rng(2)
    Z, events = np.linspace(0, 10, 7)[:, None], np.sort(rng.uniform(0, 10, (25, 1)), axis=0)
    q_mu, q_sqrt = rng.normal(size=7) * 0.5, np.diag(rng.uniform(0.3, 0.8, 7))
    kern = ("rbf", [2.0], 1.2)
    if kind == "linear":
        mf, m = backend.lib.Linear(backend.array([0.05]), bias=0.2), lambda X: 0.2 + 0.05 * X[:, 0]
    elif kind == "constant":
        mf, m = backend.lib.Constant(0.4), lambda X: np.full(len(X), 0.4)
    else:
        mf = backend.lib.Covariates(lambda X: X**2 / 100, backend.array([0.5]), bias=0.1)
        m = lambda X: 0.1 + 0.5 * X[:, 0] ** 2 / 100  # noqa: E731
    gp = backend.svgp(Z, kern, q_mu, q_sqrt, mean_function=mf)
    model = backend.lib.CoxProcess(gp, windows.Interval(0.0, 10.0), backend.lib.GaussLegendre(64), offset=0.7)
    svgp_ref = ref.SVGPRef(*kern, Z, q_mu, q_sqrt, jitter=1e-6, mean=m)
    expected = ref.cox_elbo(svgp_ref, events, [(0.0, 10.0)], 0.7)
    ev = backend.array(events)
    value = model.elbo(ev, key=jax.random.PRNGKey(0)) if backend.name == "numpyro" else model.elbo(ev)
    assert float(backend.numpy(value)) == pytest.approx(expected, rel=1e-9)
    assert -backend.loss(model.model, model.guide, ev) == pytest.approx(expected, rel=1e-9)
    # the intensity's mean part is exp(m + offset), its GP part log-normal around exp(g)
    grid = np.linspace(0, 10, 9)[:, None]
    part = model.intensity(backend.array(grid), part="mean", quantiles=None)
    np.testing.assert_allclose(backend.numpy(part.mean), np.exp(m(grid) + 0.7), rtol=1e-9)
    full = model.intensity(backend.array(grid), quantiles=None)
    np.testing.assert_allclose(backend.numpy(full.mean), ref.cox_intensity_mean(svgp_ref, grid, 0.7), rtol=1e-9)


def test_predict_f_parts(backend):
    """``f = m + g``: the means add, ``g`` carries the variance, ``m`` none; full covariances too."""
    rng = np.random.default_rng(3)
    X, Z, q_mu, q_sqrt = problem(rng)
    mf, m = mean_function(backend, "linear")
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=mf)
    Xa = backend.array(X)
    (mf_, vf), (mm, vm), (mg, vg) = ([backend.numpy(a) for a in gp.predict_f(Xa, part=p)] for p in ("f", "mean", "gp"))
    np.testing.assert_allclose(mm, m(X), rtol=1e-12)
    np.testing.assert_allclose(mf_, mm + mg, rtol=1e-12)
    np.testing.assert_array_equal(vm, 0.0)
    np.testing.assert_allclose(vf, vg, rtol=1e-12)
    plain = backend.svgp(Z, KERN, q_mu, q_sqrt)
    np.testing.assert_allclose(backend.numpy(plain.predict_f(Xa)[0]), mg, rtol=1e-12)
    np.testing.assert_array_equal(backend.numpy(plain.predict_f(Xa, part="mean")[0]), 0.0)
    mean, cov = (backend.numpy(a) for a in gp.predict_f(Xa, full_cov=True))
    np.testing.assert_allclose(mean, mf_, rtol=1e-10)
    np.testing.assert_allclose(np.diag(cov), vf, rtol=1e-10)
    with pytest.raises(ValueError, match="part"):
        gp.predict_f(Xa, part="trend")


def test_latent_functions_take_shared_or_own_coefficients(backend):
    rng = np.random.default_rng(4)
    X, Z, q_mu, q_sqrt = problem(rng, num_latent=3)
    Xa = backend.array(X)
    own = backend.lib.Constant(backend.array([0.5, -1.0, 2.0]))
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, num_latent=3, mean_function=own)
    np.testing.assert_allclose(backend.numpy(gp.predict_f(Xa, part="mean")[0]), np.tile([0.5, -1.0, 2.0], (len(X), 1)))
    shared = backend.lib.Linear(backend.array([1.0, 0.0]))
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, num_latent=3, mean_function=shared)
    mean, var = (backend.numpy(a) for a in gp.predict_f(Xa, part="mean"))
    assert mean.shape == var.shape == (len(X), 3)
    np.testing.assert_allclose(mean, np.repeat(X[:, :1], 3, axis=1))
    with pytest.raises(ValueError, match="num_latent"):
        backend.svgp(Z, KERN, q_mu[0], q_sqrt[0], mean_function=backend.lib.Constant(backend.array([0.5, 1.0])))


def test_every_prior_shifts_by_its_mean(backend):
    """The decoupled and the deep-basis priors, and the VOF data term, carry the mean as the SVGP does."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(12, 2))
    Xa, lib = backend.array(X), backend.lib
    kernel = backend.kernel("rbf", [0.8, 0.8], 1.3)
    priors = [
        lib.DecoupledGP(kernel, backend.array(X[:6]), backend.array(X[:4]), mean_function=mean_function(backend, "linear")[0]),
        lib.SVDBK(lib.dbk.MLP(2, rank=4, dtype=backend.array(0.0).dtype), mean_function=mean_function(backend, "linear")[0]),
    ]
    for prior in priors:
        f, gp_part, mean_part = (backend.numpy(prior.predict_f(Xa, part=p)[0]) for p in ("f", "gp", "mean"))
        np.testing.assert_allclose(mean_part, 0.3 + X @ [0.4, -1.1], rtol=1e-10)
        np.testing.assert_allclose(f, gp_part + mean_part, rtol=1e-10, atol=1e-12)


def test_coefficient_gradients_match_the_reference(backend):
    """d ELBO / d coefficients against central differences of the dense reference ELBO."""
    rng = np.random.default_rng(6)
    X, Z, q_mu, q_sqrt = problem(rng)
    y = rng.normal(size=len(X))
    coefficients = np.array([0.3, 0.4, -1.1])

    def reference_elbo(c):
        svgp_ref = ref.SVGPRef(*KERN, Z, q_mu, q_sqrt, jitter=1e-6, mean=lambda A: c[0] + A @ c[1:])
        return svgp_ref.elbo(ref.gaussian_ell(0.2), X, y)

    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=backend.lib.Linear([0.0, 0.0]))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.2))

    def elbo(c):
        with backend.handlers.substitute(data={"gp.mean_function.coefficients": c}):
            return model.elbo(backend.array(X), backend.array(y))

    (grad,) = backend.grad(elbo, coefficients)
    h = 1e-5
    expected = [(reference_elbo(coefficients + h * e) - reference_elbo(coefficients - h * e)) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_coefficients_are_learned(backend):
    """A linear trend: ``fit`` moves the coefficients (sites ``gp.mean_function.coefficients``) off
    zero towards it, and the fitted ``f`` follows the data."""
    rng = np.random.default_rng(6)
    X = np.sort(rng.uniform(-3, 3, (100, 1)), axis=0)
    y = 2.0 + 1.5 * X[:, 0] + 0.1 * rng.normal(size=100)
    gp = backend.svgp(np.linspace(-3, 3, 5)[:, None], ("rbf", [1.0], 0.1), mean_function=backend.lib.Linear([0.0]))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.01))
    data = (backend.array(X), backend.array(y))
    result = backend.lib.fit(model.model, model.guide, data, num_steps=150, lr=0.05, progress=False)
    b, w = backend.numpy(result.params["gp.mean_function.coefficients"])
    assert b > 1.0 and w > 1.0, (b, w)
    mean = backend.numpy(model.predict_f(data[0], params=result.params)[0])
    assert np.sqrt(np.mean((mean - 2.0 - 1.5 * X[:, 0]) ** 2)) < 0.15


def test_bad_mean_functions(backend):
    lib = backend.lib
    Z = np.zeros((3, 2))
    with pytest.raises(TypeError, match="mean_function"):
        backend.svgp(Z, KERN, mean_function=lambda X: X[:, 0])
    with pytest.raises(ValueError, match="coefficients contains NaN"):
        lib.Constant(math.nan)
    with pytest.raises(TypeError, match="covariates"):
        lib.Covariates(3.0, backend.array([1.0]))
    with pytest.raises(ValueError, match="weights is required"):
        lib.Covariates(lambda X: X, None)
    X = backend.array(np.zeros((4, 2)))
    gp = backend.svgp(Z, KERN, mean_function=lib.Linear(backend.array([1.0, 2.0, 3.0])))
    with pytest.raises(ValueError, match="3 weights"):
        gp.predict_f(X)
    gp = backend.svgp(Z, KERN, mean_function=lib.Covariates(lambda X: X, backend.array([1.0])))
    with pytest.raises(ValueError, match=r"covariates\(X\) has shape"):
        gp.predict_f(X)
    # a coefficient prior whose event shape is not the coefficients' (3: the bias and two weights)
    D = backend.ppl.distributions
    prior = D.Normal(backend.array(np.zeros(2)), backend.array(np.ones(2))).to_event(1)
    model = lib.GPModel(backend.svgp(Z, KERN, mean_function=lib.Linear(backend.array([1.0, 2.0]), prior=prior)),
                        lib.Gaussian())
    with pytest.raises(ValueError, match=r"event shape \(2,\) does not match the coefficients' \(3,\)"):
        backend.loss(model.model, model.guide, X, backend.array(np.zeros(4)))


def with_prior(backend, loc, scale):
    """A linear mean whose coefficients have the prior N(0, 10^2), with ``q`` set to ``N(loc, diag(scale^2))``."""
    D = backend.ppl.distributions
    mf = backend.lib.Linear(loc[1:], bias=loc[0], prior=D.Normal(backend.array(0.0), backend.array(10.0)))
    return backend.set(mf, coefficients_loc=loc, coefficients_scale_tril=np.diag(scale))


def test_coefficients_with_a_prior_are_sample_sites(backend):
    rng = np.random.default_rng(7)
    X, Z, q_mu, q_sqrt = problem(rng)
    loc, scale = np.array([0.3, 0.4, -1.1]), np.array([0.2, 0.05, 0.1])
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=with_prior(backend, loc, scale))
    assert "gp.mean_function.coefficients" in gp.site_names
    for fn in (gp.model, gp.guide):
        site = backend.trace(fn, backend.array(X))["gp.mean_function.coefficients"]
        assert site["type"] == "sample" and not site["is_observed"]
        assert tuple(site["fn"].event_shape) == (3,)
    # the model scores them by the prior, the guide by q
    model_site = backend.trace(gp.model, backend.array(X))["gp.mean_function.coefficients"]
    value = backend.numpy(model_site["value"])
    assert float(backend.numpy(model_site["fn"].log_prob(model_site["value"]))) == pytest.approx(
        np.sum(-0.5 * (value / 10) ** 2 - np.log(10 * np.sqrt(2 * np.pi))), rel=1e-10)
    # predictions integrate over q: the mean part has variance F^2 scale^2
    F = np.hstack([np.ones((len(X), 1)), X])
    mean, var = (backend.numpy(a) for a in gp.predict_f(backend.array(X), part="mean"))
    np.testing.assert_allclose(mean, F @ loc, rtol=1e-12)
    np.testing.assert_allclose(var, F**2 @ scale**2, rtol=1e-12)
    _, cov = (backend.numpy(a) for a in gp.predict_f(backend.array(X), part="mean", full_cov=True))
    np.testing.assert_allclose(cov, (F * scale**2) @ F.T, rtol=1e-12, atol=1e-15)


def prior_model(backend, seed, loc, scale):
    """A Gaussian ``GPModel`` on the SVGP problem whose linear mean has a prior (``with_prior``)."""
    rng = np.random.default_rng(seed)
    X, Z, q_mu, q_sqrt = problem(rng)
    y = rng.normal(size=len(X))
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=with_prior(backend, loc, scale))
    return backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.2)), X, y, (Z, q_mu, q_sqrt)


def test_elbo_with_a_coefficient_prior_matches_the_reference(backend):
    """Closed form: ``f ~ N(F loc + mu, s2 + F^2 scale^2)`` in the Gaussian expectation, minus both
    KLs; the SVI loss, which samples the coefficients, averages to it (z-test over seeds)."""
    loc, scale = np.array([0.3, 0.4, -1.1]), np.array([0.2, 0.05, 0.1])
    model, X, y, (Z, q_mu, q_sqrt) = prior_model(backend, 8, loc, scale)
    svgp_ref = ref.SVGPRef(*KERN, Z, q_mu, q_sqrt, jitter=1e-6)
    F = np.hstack([np.ones((len(X), 1)), X])
    mu, cov = svgp_ref.predict(X)
    kl_c = np.sum(np.log(10 / scale) + (scale**2 + loc**2) / 200 - 0.5)
    expected = ref.gaussian_ell(0.2)(y, F @ loc + mu, np.diag(cov) + F**2 @ scale**2).sum() - svgp_ref.kl() - kl_c
    Xa, ya = backend.array(X), backend.array(y)
    assert float(backend.numpy(model.elbo(Xa, ya))) == pytest.approx(expected, rel=1e-10)
    losses = np.array([backend.loss(model.model, model.guide, Xa, ya, seed=s) for s in range(200)])
    z = (-losses.mean() - expected) / (losses.std(ddof=1) / np.sqrt(len(losses)))
    assert losses.std() > 0.01 and abs(z) < 4, z


def test_export_holds_the_mean_and_the_coefficient_draws(backend):
    """``gp.f`` draws include the mean function; coefficients with a prior are exported as draws of q."""
    loc, scale = np.array([2.0, 0.4, -1.1]), np.array([0.2, 0.05, 0.1])
    model, X, y, _ = prior_model(backend, 9, loc, scale)
    idata = backend.lib.to_inference_data(model, data=(backend.array(X), backend.array(y)), num_samples=400)
    draws = idata.posterior["gp.mean_function.coefficients"].values.reshape(400, 3)
    assert np.all(np.abs(draws.mean(0) - loc) < 4 * scale / np.sqrt(400))
    assert np.all(np.abs(draws.std(0) / scale - 1) < 0.2)
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(X)))
    f = idata.posterior["gp.f"].values.reshape(400, -1)
    assert np.mean(np.abs(f.mean(0) - mean) / np.sqrt(var / 400) < 3.3) > 0.95


def test_backends_agree_with_mean_functions():
    """Pyro and NumPyro to 1e-10 on the same inputs and parameters: a GP model with a linear mean,
    a Cox process with a raster mean (the pixel rule) and coefficients with a prior, coupled with ``u``."""
    from backends import NumPyroBackend, PyroBackend

    from sparsegp_common.data.raster import Raster

    rng = np.random.default_rng(10)
    X, Z, q_mu, q_sqrt = problem(rng)
    y = rng.normal(size=len(X))
    raster = Raster(rng.normal(size=(2, 5, 6)), ((-3.0, 3.0), (-3.0, 3.0)), standardize=True)
    events = rng.uniform(-2.5, 2.5, (15, 2))
    cross = 0.3 * rng.normal(size=(len(Z), 3))  # the coefficients coupled with u
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        lib, Xa = backend.lib, backend.array(X)
        linear = backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=lib.Linear([0.4, -1.1], bias=0.3))
        model = lib.GPModel(linear, backend.set(lib.Gaussian(), variance=0.2))
        covariates = lib.Covariates(raster, [0.5, -0.2], bias=1.0,
                                    prior=backend.ppl.distributions.Normal(backend.array(0.0), backend.array(5.0)))
        cox_gp = backend.set(backend.svgp(Z, KERN, q_mu, q_sqrt, mean_function=covariates), q_sqrt_cross=cross)
        cox = lib.CoxProcess(cox_gp, [[-3.0, 3.0], [-3.0, 3.0]], raster.rule())
        ev = backend.array(events)
        cox_elbo = cox.elbo(ev, key=jax.random.PRNGKey(0)) if backend.name == "numpyro" else cox.elbo(ev)
        values = [model.elbo(Xa, backend.array(y)), *model.predict_f(Xa, part="gp"), *linear.predict_f(Xa, part="mean"),
                  cox_elbo, *cox.intensity(ev, part="mean")[:2], *cox.intensity(ev)[:2]]
        results.append([backend.numpy(v) for v in values])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_vof_data_term_carries_the_mean(backend):
    """The VOF data term forms ``f`` itself (Hermite features: ``u`` sampled in the SVI loss,
    integrated in ``elbo``): both carry the mean, as ``GPModel`` does."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(40, 1))
    y = 0.5 + 1.5 * X[:, 0] + np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    lib, Xa, ya = backend.lib, backend.array(X), backend.array(y)
    kernel = backend.kernel("rbf", [0.8], 1.0)
    mean = lib.Linear([1.5], bias=0.5)
    prior = lib.SVGP(kernel, lib.HermiteFeatures(8, backend.array([1.0]), kernel=kernel), mean_function=mean)
    lik = backend.set(lib.Gaussian(), variance=0.1)
    vof = lib.VOFModel(prior, lik)
    exact = float(backend.numpy(lib.GPModel(prior, lik).elbo(Xa, ya)))
    assert float(backend.numpy(vof.elbo(Xa, ya))) == pytest.approx(exact, rel=1e-10)
    losses = backend.losses(vof.model, vof.guide, Xa, ya, replicates=100)
    assert abs(-losses.mean() - exact) < 4 * losses.std(ddof=1) / np.sqrt(len(losses))
