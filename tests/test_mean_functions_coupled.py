"""Coefficients with a Gaussian prior, coupled with the SVGP's inducing variables in one joint ``q``
(``CoupledMean``): the ELBO, predictions, KL and ``q(u)`` against the dense joint Gaussian of
``tests/reference.py``, the sampled SVI loss unbiased for the closed form, gradients, latent
batches and the export's draws."""
import numpy as np
import pytest
import reference as ref
from test_svgp import KERN, problem

# a prior of its own per coefficient: the KL's trace and log-determinant divide each row by its scale
PRIOR_LOC, PRIOR_SCALE = np.array([0.5, -1.0, 2.0]), np.array([10.0, 3.0, 1.5])


def coupled(backend, rng, whiten=True, num_latent=None, per_latent=False, diagonal=False):
    """An SVGP with a linear mean (prior N(PRIOR_LOC, diag(PRIOR_SCALE^2))) and a non-trivial joint q: ``(gp, X, F(X) function,
    (Z, q_mu, q_sqrt, loc, Lc, W))``."""
    X, Z, q_mu, q_sqrt = problem(rng, num_latent=num_latent, diagonal=diagonal)
    batch = () if num_latent is None else (num_latent,)
    coefficient_batch = batch if per_latent else ()
    loc = rng.normal(size=coefficient_batch + (3,))
    Lc = np.tril(0.2 * rng.normal(size=coefficient_batch + (3, 3)), -1) + np.diag([0.3, 0.1, 0.2])
    W = 0.4 * rng.normal(size=batch + (len(Z), 3))
    D = backend.ppl.distributions
    mf = backend.lib.Linear(loc[..., 1:], bias=loc[..., 0], prior=D.Normal(backend.array(PRIOR_LOC), backend.array(PRIOR_SCALE)))
    backend.set(mf, coefficients_loc=loc, coefficients_scale_tril=Lc)
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=whiten, num_latent=num_latent, diagonal=diagonal, mean_function=mf)
    backend.set(gp, q_sqrt_cross=W)
    return gp, X, (Z, q_mu, q_sqrt, loc, Lc, W)


def features(X):
    return np.hstack([np.ones((len(X), 1)), X])


def reference(params, whiten, latent=None):
    """The dense reference of one latent function (``latent``: its index), or of all with shared coefficients."""
    Z, q_mu, q_sqrt, loc, Lc, W = params
    if latent is not None:
        q_mu, q_sqrt, W = q_mu[latent], q_sqrt[latent], W[latent]
        loc, Lc = (loc[latent], Lc[latent]) if loc.ndim == 2 else (loc, Lc)
    if q_mu.ndim == 1:
        q_mu, q_sqrt, W = q_mu[None], q_sqrt[None], W[None]
    svgps = [ref.SVGPRef(*KERN, Z, m, s, whiten, jitter=1e-6) for m, s in zip(q_mu, q_sqrt)]
    return ref.CoupledRef(svgps, features, loc, Lc, W, PRIOR_LOC, PRIOR_SCALE)


@pytest.mark.parametrize("whiten, diagonal", [(True, False), (False, False), (True, True)])
def test_coupled_q_matches_the_dense_joint_gaussian(backend, whiten, diagonal):
    rng = np.random.default_rng(11)
    gp, X, params = coupled(backend, rng, whiten, diagonal=diagonal)
    expected = reference(params, whiten)
    Xa = backend.array(X)
    for part in ("f", "mean", "gp"):
        mean, cov = expected.predict(X, part=part)
        got_mean, got_var = (backend.numpy(a) for a in gp.predict_f(Xa, part=part))
        _, got_cov = (backend.numpy(a) for a in gp.predict_f(Xa, part=part, full_cov=True))
        np.testing.assert_allclose(got_mean, mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got_var, np.diag(cov), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got_cov, cov, rtol=1e-8, atol=1e-10)
    state = gp.inspect()
    assert float(backend.numpy(state.kl)) == pytest.approx(expected.kl(), rel=1e-10)
    _, joint = expected.joint()
    np.testing.assert_allclose(backend.numpy(state.q_u.covariance_matrix), joint[3:, 3:], rtol=1e-10, atol=1e-12)
    # the Gaussian ELBO in closed form
    y = rng.normal(size=len(X))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.2))
    mean, cov = expected.predict(X)
    elbo = ref.gaussian_ell(0.2)(y, mean, np.diag(cov)).sum() - expected.kl()
    assert float(backend.numpy(model.elbo(Xa, backend.array(y)))) == pytest.approx(elbo, rel=1e-10)


def test_sampled_loss_is_unbiased_for_the_coupled_elbo(backend):
    """The SVI pair samples the coefficients, draws ``u`` and ``f`` from ``q`` given them and scores
    the GP's KL given them: over 300 seeds its loss averages to the closed form (z-test)."""
    rng = np.random.default_rng(12)
    gp, X, params = coupled(backend, rng)
    W = 2.5 * params[-1]
    backend.set(gp, q_sqrt_cross=W)
    y = rng.normal(size=len(X))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=1.0))
    Xa, ya = backend.array(X), backend.array(y)
    exact = float(backend.numpy(model.elbo(Xa, ya)))
    losses = backend.losses(model.model, model.guide, Xa, ya, replicates=300)
    se = losses.std(ddof=1) / np.sqrt(len(losses))
    z = (-losses.mean() - exact) / se
    assert losses.std() > 0.1 and abs(z) < 4, z
    # the test resolves the coupling: without it (W = 0) the bound moves by more than 5 se
    backend.set(gp, q_sqrt_cross=np.zeros_like(W))
    assert abs(float(backend.numpy(model.elbo(Xa, ya))) - exact) > 5 * se


def test_cross_gradients_match_the_reference(backend):
    """d ELBO / d q_sqrt_cross against central differences of the dense reference."""
    rng = np.random.default_rng(13)
    gp, X, params = coupled(backend, rng, whiten=False)
    y = rng.normal(size=len(X))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.2))
    W = params[-1]

    def reference_elbo(W):
        expected = reference(params[:-1] + (W,), whiten=False)
        mean, cov = expected.predict(X)
        return ref.gaussian_ell(0.2)(y, mean, np.diag(cov)).sum() - expected.kl()

    def elbo(W):
        with backend.handlers.substitute(data={"gp.q_sqrt_cross": W}):
            return model.elbo(backend.array(X), backend.array(y))

    (grad,) = backend.grad(elbo, W)
    h, E = 1e-5, np.zeros_like(W)
    expected = np.zeros_like(W)
    for index in np.ndindex(*W.shape):
        E[index] = h
        expected[index] = (reference_elbo(W + E) - reference_elbo(W - E)) / (2 * h)
        E[index] = 0.0
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("whiten", [True, False])
def test_kl_given_sampled_coefficients(backend, whiten):
    """Given draws of the coefficients (``e = Lc^-1 (c - loc)``), the GP's KL is that of
    ``N(q_mu + W e, S)`` against its prior, one per draw."""
    rng = np.random.default_rng(16)
    gp, X, params = coupled(backend, rng, whiten)
    Z, q_mu, q_sqrt, loc, Lc, W = params
    c = loc + rng.normal(size=(4, 3)) @ Lc.T
    kl = backend.numpy(backend.bound(gp).posterior().given(backend.array(c)).kl())
    e = np.linalg.solve(Lc, (c - loc).T).T
    expected = [ref.SVGPRef(*KERN, Z, q_mu + W @ draw, q_sqrt, whiten, jitter=1e-6).kl() for draw in e]
    np.testing.assert_allclose(kl, expected, rtol=1e-10)


def test_components_share_the_coupled_coefficients(backend):
    """A component axis (``f = F c + g_1 + g_2``) with coefficients coupled to both components'
    ``v``: the moments of every part and the KL against the dense joint Gaussian."""
    from test_svgp import component_points

    rng, lib, T, M = np.random.default_rng(17), backend.lib, 2, 5
    X, Z = rng.normal(size=(12, 2)), rng.normal(size=(T, M, 2))
    kerns = [("matern52", [0.7, 1.4], 1.3), ("matern52", [2.0, 0.5], 0.6)]
    q_mu = rng.normal(size=(T, M))
    q_sqrt = np.tril(rng.normal(size=(T, M, M)) * 0.3, -1) + np.eye(M) * rng.uniform(0.3, 1.2, size=(T, M, 1))
    loc, W = rng.normal(size=3), 0.4 * rng.normal(size=(T, M, 3))
    Lc = np.tril(0.2 * rng.normal(size=(3, 3)), -1) + np.diag([0.3, 0.1, 0.2])
    D = backend.ppl.distributions
    mf = lib.Linear(loc[1:], bias=loc[0], prior=D.Normal(backend.array(PRIOR_LOC), backend.array(PRIOR_SCALE)))
    backend.set(mf, coefficients_loc=loc, coefficients_scale_tril=Lc)
    kernel = lib.Matern52(lengthscale=backend.array([k[1] for k in kerns]), variance=backend.array([k[2] for k in kerns]))
    gp = lib.SVGP(kernel, component_points(lib)(backend.array(Z)), mean_function=mf)
    backend.set(gp, q_mu=q_mu, q_sqrt=q_sqrt, q_sqrt_cross=W)
    svgps = [ref.SVGPRef(k[0], k[1], k[2], z, m, s, True, 1e-6) for k, z, m, s in zip(kerns, Z, q_mu, q_sqrt)]
    expected = ref.CoupledRef(svgps, features, loc, Lc, W, PRIOR_LOC, PRIOR_SCALE)
    for part in ("f", "mean", "gp"):
        mean, cov = expected.predict(X, l=(0, 1), part=part)
        got_mean, got_var = (backend.numpy(a) for a in gp.predict_f(backend.array(X), part=part))
        np.testing.assert_allclose(got_mean, mean, rtol=1e-9, atol=1e-12, err_msg=part)
        np.testing.assert_allclose(got_var, np.diag(cov), rtol=1e-9, atol=1e-12, err_msg=part)
    assert float(backend.numpy(gp.inspect().kl)) == pytest.approx(expected.kl(), rel=1e-10)


@pytest.mark.parametrize("per_latent", [False, True])
def test_latent_functions_couple_with_shared_or_own_coefficients(backend, per_latent):
    """Two latent functions: each one's moments as a single coupled SVGP's; the KL of the joint q
    over the shared coefficients and both ``v`` (or the sum of two independent ones)."""
    rng = np.random.default_rng(14)
    gp, X, params = coupled(backend, rng, num_latent=2, per_latent=per_latent)
    mean, var = (backend.numpy(a) for a in gp.predict_f(backend.array(X)))
    _, cov = (backend.numpy(a) for a in gp.predict_f(backend.array(X), full_cov=True))
    for latent in range(2):
        m, c = reference(params, True, latent).predict(X)
        np.testing.assert_allclose(mean[:, latent], m, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(var[:, latent], np.diag(c), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cov[latent], c, rtol=1e-8, atol=1e-10)
    kl = sum(reference(params, True, l).kl() for l in range(2)) if per_latent else reference(params, True).kl()
    assert float(backend.numpy(gp.inspect().kl)) == pytest.approx(kl, rel=1e-10)


def test_export_draws_follow_the_coupled_q(backend):
    """``gp.f`` draws (coefficients drawn, then ``f`` given them) have the integrated moments; draws
    that ignored the coupling would have about 0.74 of the variance."""
    rng = np.random.default_rng(15)
    gp, X, params = coupled(backend, rng)
    y = rng.normal(size=len(X))
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=0.2))
    num = 2000
    idata = backend.lib.to_inference_data(model, data=(backend.array(X), backend.array(y)), num_samples=num)
    f = idata.posterior["gp.f"].values.reshape(num, -1)
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(X)))
    assert np.mean(np.abs(f.mean(0) - mean) / np.sqrt(var / num) < 3.3) > 0.95
    # the variance of a draw's mean given c is part of var: an uncoupled draw would miss it
    np.testing.assert_allclose(f.var(0, ddof=1), var, rtol=4 * np.sqrt(2 / num))
