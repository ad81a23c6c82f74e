"""The SVGP against the dense float64 reference: KL, q(f) moments, ELBO, Titsias optimum."""
import itertools

import numpy as np
import pytest

import reference as ref

KERN = ("matern52", [0.7, 1.4], 1.3)


def problem(rng, N=30, M=7, D=2, num_latent=None, diagonal=False):
    X, Z = rng.normal(size=(N, D)), rng.normal(size=(M, D))
    shape = () if num_latent is None else (num_latent,)
    q_mu = rng.normal(size=shape + (M,))
    if diagonal:
        q_sqrt = rng.uniform(0.3, 1.2, size=shape + (M,))
    else:
        q_sqrt = np.tril(rng.normal(size=shape + (M, M)) * 0.3, -1) + np.eye(M) * rng.uniform(0.3, 1.2, size=shape + (M,))[..., None]
    return X, Z, q_mu, q_sqrt


def references(Z, q_mu, q_sqrt, whiten, jitter=1e-6):
    """One reference SVGP per latent function."""
    if q_mu.ndim == 1:
        return [ref.SVGPRef(KERN[0], KERN[1], KERN[2], Z, q_mu, q_sqrt, whiten, jitter)]
    return [ref.SVGPRef(KERN[0], KERN[1], KERN[2], Z, m, s, whiten, jitter) for m, s in zip(q_mu, q_sqrt)]


OPTIONS = [dict(whiten=w, diagonal=d, num_latent=L) for w in (True, False) for d in (False, True) for L in (None, 3)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_kl_and_marginals_match_reference(backend, rng, options):
    X, Z, q_mu, q_sqrt = problem(rng, num_latent=options["num_latent"], diagonal=options["diagonal"])
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, **options)
    refs = references(Z, q_mu, q_sqrt, options["whiten"])
    post = backend.bound(gp).posterior()
    assert backend.numpy(post.kl()) == pytest.approx(sum(r.kl() for r in refs), rel=1e-9)

    mean, var = (backend.numpy(a) for a in gp.predict_f(backend.array(X)))
    _, cov = (backend.numpy(a) for a in gp.predict_f(backend.array(X), full_cov=True))
    expected = [r.predict(X) for r in refs]
    if options["num_latent"] is None:
        mean, var, cov = mean[:, None], var[:, None], cov[None]
    for i, (m, c) in enumerate(expected):
        np.testing.assert_allclose(mean[:, i], m, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(var[:, i], np.diag(c), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(cov[i], c, rtol=1e-8, atol=1e-10)


LIKELIHOODS = {
    "gaussian": (lambda lib: lib.Gaussian(variance=0.2), lambda y, m, v: ref.gaussian_ell(0.2)(y, m, v), 1e-10),
    "poisson_exp": (lambda lib: lib.Poisson(), ref.poisson_exp_ell, 1e-10),
    "bernoulli_probit": (
        lambda lib: lib.Bernoulli(link="probit"),
        lambda y, m, v: ref.expected_log_lik_quad(ref.log_lik("bernoulli_probit"), y, m, v),
        1e-7,
    ),
}


def observations(name, rng, n):
    if name == "gaussian":
        return rng.normal(size=n)
    if name == "poisson_exp":
        return rng.poisson(1.5, size=n).astype(float)
    return rng.integers(0, 2, size=n).astype(float)


@pytest.mark.parametrize("lik_name", sorted(LIKELIHOODS))
@pytest.mark.parametrize("whiten", [True, False])
def test_elbo_matches_reference(backend, rng, lik_name, whiten):
    make_lik, ell, rtol = LIKELIHOODS[lik_name]
    X, Z, q_mu, q_sqrt = problem(rng)
    y = observations(lik_name, rng, len(X))
    lik = make_lik(backend.lib)
    if lik_name == "gaussian":
        backend.set(lik, variance=0.2)
    model = backend.lib.GPModel(backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=whiten), lik)
    expected = references(Z, q_mu, q_sqrt, whiten)[0].elbo(ell, X, y)
    Xa, ya = backend.array(X), backend.array(y)
    assert float(backend.numpy(model.elbo(Xa, ya))) == pytest.approx(expected, rel=rtol)
    # Pyro's and NumPyro's own ELBOs on the model/guide pair give the same, deterministic value
    for mean_field in (False, True):
        for seed in (0, 1):
            loss = backend.loss(model.model, model.guide, Xa, ya, mean_field=mean_field, seed=seed)
            assert -loss == pytest.approx(expected, rel=rtol)


def test_titsias_optimum_equals_collapsed_bound(backend, rng):
    """At the optimal q(u) the uncollapsed ELBO equals Titsias' collapsed bound (below the exact LML)."""
    X, Z, _, _ = problem(rng, N=40, M=9)
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=len(X))
    noise, jitter = 0.05, 1e-6
    k = lambda A, B: ref.kernel(KERN[0], A, B, KERN[1], KERN[2])  # noqa: E731
    Kuu = k(Z, Z) + jitter * np.eye(len(Z))
    q_mu, q_sqrt = ref.titsias_optimum_whitened(k(X, Z), Kuu, y, noise)
    lik = backend.set(backend.lib.Gaussian(), variance=noise)
    model = backend.lib.GPModel(backend.svgp(Z, KERN, q_mu, q_sqrt, jitter=jitter), lik)
    elbo = float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    bound = ref.collapsed_bound(k(X, X), k(X, Z), Kuu, y, noise)
    assert elbo == pytest.approx(bound, rel=1e-9)
    assert elbo < ref.exact_lml(k(X, X), y, noise)


def test_hensman_term_lower_bounds_lml_and_predictive_term_does_not(backend, rng):
    """With Z = X and the optimal q the Hensman ELBO equals the log marginal likelihood; the
    predictive-likelihood data term (pyro.contrib.gp's Gaussian) exceeds it, so it is no bound."""
    X = rng.normal(size=(25, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=len(X))
    noise, jitter = 0.05, 1e-8
    k = lambda A, B: ref.kernel(KERN[0], A, B, KERN[1], KERN[2])  # noqa: E731
    Kuu = k(X, X) + jitter * np.eye(len(X))
    lml = ref.exact_lml(k(X, X), y, noise)
    q_mu, q_sqrt = ref.titsias_optimum_whitened(k(X, X), Kuu, y, noise)
    lik = backend.set(backend.lib.Gaussian(), variance=noise)
    model = backend.lib.GPModel(backend.svgp(X, KERN, q_mu, q_sqrt, jitter=jitter), lik)
    elbo = float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    assert elbo == pytest.approx(lml, abs=1e-4)
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(X)))
    kl = float(backend.numpy(backend.bound(model.prior).posterior().kl()))
    predictive = ref.stats.norm.logpdf(y, mean, np.sqrt(var + noise)).sum() - kl
    assert predictive > lml + 1.0
    # and for arbitrary q the Hensman ELBO stays below the LML
    for seed in range(5):
        backend.reset()
        _, _, q_mu, q_sqrt = problem(np.random.default_rng(seed), N=1, M=len(X))
        model = backend.lib.GPModel(backend.svgp(X, KERN, q_mu, q_sqrt, jitter=jitter), lik)
        assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) < lml


def test_new_features_plug_in_through_dispatch(backend, rng):
    """A feature class registered for (features, kernel) with Kuu = I (here: inducing points
    whitened by hand, Kuf = chol(Kzz)^-1 Kzf) reproduces the whitened SVGP."""
    lib = backend.lib
    X, Z, q_mu, q_sqrt = problem(rng)

    class WhitenedPoints(lib.InducingPoints):
        pass

    @lib.Kuu.register(WhitenedPoints, lib.kernels.Kernel)
    def _kuu(features, kernel):
        return None

    @lib.Kuf.register(WhitenedPoints, lib.kernels.Kernel)
    def _kuf(features, kernel, X):
        L = lib.cholesky(kernel.K(features.Z), jitter=1e-6)
        return backend.solve_lower(L, kernel.K(features.Z, X))  # traceable: NumPyro predicts under jit

    plain = backend.svgp(Z, KERN, q_mu, q_sqrt)
    custom = backend.lib.SVGP(backend.kernel(*KERN), WhitenedPoints(backend.array(Z)), whiten=False, name="custom")
    backend.set(custom, q_mu=q_mu, q_sqrt=q_sqrt)
    for a, b in zip(plain.predict_f(backend.array(X)), custom.predict_f(backend.array(X))):
        np.testing.assert_allclose(backend.numpy(a), backend.numpy(b), rtol=1e-9)
    kl = [float(backend.numpy(backend.bound(m).posterior().kl())) for m in (plain, custom)]
    assert kl[0] == pytest.approx(kl[1], rel=1e-12)


def component_points(lib, declared=True):
    """Inducing points ``(T, M, D)``, one set per component of ``f = sum_t f_t``, for a kernel of
    batch shape ``(T,)`` (an additive model: the component-axis route of the harmonic method)."""

    class ComponentPoints(lib.features.Features):
        component_shape = (2,) if declared else ()

        def __init__(self, Z):
            super().__init__()
            self._param("Z", Z)

        num_inducing = property(lambda self: self.Z.shape[-2])
        input_dim = property(lambda self: self.Z.shape[-1])

    lib.Kuu.register(ComponentPoints, lib.kernels.Kernel)(lambda features, kernel: kernel.K(features.Z))
    lib.Kuf.register(ComponentPoints, lib.kernels.Kernel)(lambda features, kernel, X: kernel.K(features.Z, X))
    return ComponentPoints


@pytest.mark.parametrize("whiten", [True, False])
def test_component_axis_sums_independent_components(backend, rng, whiten):
    """Features with a component axis: KL, q(f) and the ELBO are the sums over one reference SVGP
    per component; the same features without the declaration are an error, not a wrong ELBO."""
    lib, T, M, noise = backend.lib, 2, 6, 0.3
    X, y, Z = rng.normal(size=(25, 2)), rng.normal(size=25), rng.normal(size=(T, M, 2))
    kerns = [("matern52", [0.7, 1.4], 1.3), ("matern52", [2.0, 0.5], 0.6)]
    q_mu = rng.normal(size=(T, M))
    q_sqrt = np.tril(rng.normal(size=(T, M, M)) * 0.3, -1) + np.eye(M) * rng.uniform(0.3, 1.2, size=(T, M, 1))
    refs = [ref.SVGPRef(k[0], k[1], k[2], z, m, s, whiten, 1e-6) for k, z, m, s in zip(kerns, Z, q_mu, q_sqrt)]
    kernel = lib.Matern52(lengthscale=backend.array([k[1] for k in kerns]), variance=backend.array([k[2] for k in kerns]))
    gp = backend.set(lib.SVGP(kernel, component_points(lib)(backend.array(Z)), whiten=whiten), q_mu=q_mu, q_sqrt=q_sqrt)
    mean, var = (backend.numpy(a) for a in gp.predict_f(backend.array(X)))
    np.testing.assert_allclose(mean, sum(r.predict(X)[0] for r in refs), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(var, sum(np.diag(r.predict(X)[1]) for r in refs), rtol=1e-9)
    model = lib.GPModel(gp, backend.set(lib.Gaussian(), variance=noise))
    expected = ref.gaussian_ell(noise)(y, mean, var).sum() - sum(r.kl() for r in refs)
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-10)

    backend.reset()
    kernel = lib.Matern52(lengthscale=backend.array([k[1] for k in kerns]), variance=backend.array([k[2] for k in kerns]))
    with pytest.raises(ValueError, match="component"):
        undeclared = lib.SVGP(kernel, component_points(lib, declared=False)(backend.array(Z)), whiten=whiten, name="gp2")
        lib.GPModel(undeclared, lib.Gaussian()).elbo(backend.array(X), backend.array(y))


def split_points(lib, T):
    """Inducing points ``(T, M, D)`` of the components of ``f = sum_t f_t``, ``f_t ~ GP(0, k / T)``,
    over one *base* kernel ``k`` (no batch axis): the route of a decomposition of ``k`` (the
    harmonic method), where ``sum_t k_t(x, x) = k(x, x)`` must be added once, not T times."""

    class SplitPoints(lib.features.Features):
        component_shape = (T,)

        def __init__(self, Z):
            super().__init__()
            self._param("Z", Z)

        num_inducing = property(lambda self: self.Z.shape[-2])
        input_dim = property(lambda self: self.Z.shape[-1])

    lib.Kuu.register(SplitPoints, lib.kernels.Kernel)(lambda features, kernel: kernel.K(features.Z) / T)
    lib.Kuf.register(SplitPoints, lib.kernels.Kernel)(lambda features, kernel, X: kernel.K(features.Z, X) / T)
    return SplitPoints


@pytest.mark.parametrize("whiten", [True, False])
def test_components_of_a_base_kernel_add_the_prior_once(backend, rng, whiten):
    """A component axis over one base kernel: q(f), its covariance, the prior variance and the
    ELBO against a dense reference that builds the T components ``k / T`` explicitly."""
    lib, T, M, noise = backend.lib, 3, 5, 0.3
    X, y, Z = rng.normal(size=(20, 2)), rng.normal(size=20), rng.normal(size=(T, M, 2))
    q_mu = rng.normal(size=(T, M))
    q_sqrt = np.tril(rng.normal(size=(T, M, M)) * 0.3, -1) + np.eye(M) * rng.uniform(0.3, 1.2, size=(T, M, 1))
    lengthscale, variance = [0.7, 1.4], 1.3
    refs = [ref.SVGPRef("matern52", lengthscale, variance / T, z, m, s, whiten, 1e-6) for z, m, s in zip(Z, q_mu, q_sqrt)]
    kernel = lib.Matern52(lengthscale=backend.array(lengthscale), variance=variance)
    gp = backend.set(lib.SVGP(kernel, split_points(lib, T)(backend.array(Z)), whiten=whiten), q_mu=q_mu, q_sqrt=q_sqrt)
    mean, cov = (backend.numpy(a) for a in gp.predict_f(backend.array(X), full_cov=True))
    np.testing.assert_allclose(mean, sum(r.predict(X)[0] for r in refs), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cov, sum(r.predict(X)[1] for r in refs), rtol=1e-9, atol=1e-12)
    var = backend.numpy(gp.predict_f(backend.array(X))[1])
    np.testing.assert_allclose(var, np.diag(cov), rtol=1e-9)
    prior_var = backend.numpy(backend.bound(gp).prior_variance(backend.array(X)))
    np.testing.assert_allclose(prior_var, np.full(len(X), variance), rtol=1e-12)
    model = lib.GPModel(gp, backend.set(lib.Gaussian(), variance=noise))
    expected = ref.gaussian_ell(noise)(y, mean, var).sum() - sum(r.kl() for r in refs)
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("num_latent", [None, 2])
def test_unwhitened_diagonal_q_starts_at_the_least_kl(backend, rng, num_latent):
    """A diagonal ``q`` cannot be the prior ``N(0, Kuu)``: it starts where the KL is least over
    diagonal ``q``, which is the KL's minimum along each coordinate of ``q_sqrt``."""
    _, Z, _, _ = problem(rng, M=5)
    gp = backend.svgp(Z, KERN, whiten=False, diagonal=True, num_latent=num_latent)
    state = gp.inspect()
    q_sqrt = backend.numpy(state.params["gp.q_sqrt"])
    assert q_sqrt.shape == (() if num_latent is None else (num_latent,)) + (5,)
    Kuu = ref.kernel(KERN[0], Z, Z, *KERN[1:]) + 1e-6 * np.eye(5)
    kl = lambda s: ref.gaussian_kl(np.zeros(5), np.diag(s**2), np.zeros(5), Kuu)
    start = q_sqrt.reshape(-1, 5)[-1]
    for i, step in itertools.product(range(5), (-1e-3, 1e-3)):
        assert kl(start + step * np.eye(5)[i]) > kl(start)
    expected = (1 if num_latent is None else num_latent) * kl(start)
    assert float(backend.numpy(state.kl)) == pytest.approx(expected, rel=1e-9)
    assert expected < (1 if num_latent is None else num_latent) * kl(np.sqrt(np.diag(Kuu)))  # the marginals' KL


def test_undeclared_batch_axes_are_errors_where_kuu_is_the_identity(backend, rng):
    """Features with ``Kuu = I`` have no factor whose batch shape the constructor checks: a batch
    axis of ``Kuf`` or of the kernel that is neither a latent function nor a declared component is
    an error when ``q(f)`` or the prior variance meets it, not a sum broadcast over it."""
    lib, M = backend.lib, 4
    X, Z = rng.normal(size=(9, 2)), rng.normal(size=(2, M, 2))

    class StackedPoints(lib.features.Features):  # two sets of points, no component declared
        def __init__(self, Z):
            super().__init__()
            self._param("Z", Z)

        num_inducing = property(lambda self: self.Z.shape[-2])
        input_dim = property(lambda self: self.Z.shape[-1])

    lib.Kuu.register(StackedPoints, lib.kernels.Kernel)(lambda features, kernel: None)
    lib.Kuf.register(StackedPoints, lib.kernels.Kernel)(lambda features, kernel, X: kernel.K(features.Z, X))
    gp = lib.SVGP(backend.kernel(*KERN), StackedPoints(backend.array(Z)))
    with pytest.raises(ValueError, match=r"mean shape \(2, 9\).*component shape \(\)"):
        gp.predict_f(backend.array(X))

    backend.reset()
    kernel = lib.Matern52(lengthscale=backend.array([[0.7, 1.4], [2.0, 0.5]]), variance=backend.array([1.3, 0.6]))
    gp = lib.SVGP(kernel, StackedPoints(backend.array(Z)))
    with pytest.raises(ValueError, match=r"K_diag has shape \(2, 9\).*component shape \(\)"):
        backend.bound(gp).prior_variance(backend.array(X))


def test_q_u_with_a_shift_and_cross_directions(backend, rng):
    """``q_u(shift, cross)`` is ``N(q_mu + shift, S + cross cross^T)``: both kept when both are given."""
    X, Z, q_mu, q_sqrt = problem(rng)
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt)
    shift, cross = rng.normal(size=q_mu.shape), rng.normal(size=q_mu.shape + (2,))
    posterior = backend.bound(gp).posterior()
    for kwargs in ({"shift": shift}, {"cross": cross}, {"shift": shift, "cross": cross}):
        q = posterior.q_u(**{k: backend.array(v) for k, v in kwargs.items()})
        S = q_sqrt @ q_sqrt.T + (cross @ cross.T if "cross" in kwargs else 0)
        np.testing.assert_allclose(backend.numpy(q.mean), q_mu + kwargs.get("shift", 0), rtol=1e-12, err_msg=str(list(kwargs)))
        np.testing.assert_allclose(backend.numpy(q.covariance_matrix), S, rtol=1e-10, err_msg=str(list(kwargs)))


def test_pyro_contrib_gp_scores_the_predictive_term():
    """pyro.contrib.gp's VariationalSparseGP loss is KL - sum log N(y | mu, var + noise), the
    predictive term of the test above; ours is KL - sum E_q[log N(y | f, noise)]."""
    torch = pytest.importorskip("torch")
    import pyro.contrib.gp as cgp
    from pyro.infer import TraceMeanField_ELBO

    from backends import PyroBackend

    backend = PyroBackend()
    backend.reset()
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(20, 1)), rng.normal(size=20)
    Z, q_mu = X[:5], rng.normal(size=5)
    q_sqrt = np.tril(rng.normal(size=(5, 5)) * 0.2, -1) + np.diag(rng.uniform(0.3, 1.0, 5))
    kernel = cgp.kernels.Matern52(input_dim=1, variance=torch.tensor(1.3, dtype=torch.float64),
                                  lengthscale=torch.tensor(0.7, dtype=torch.float64))
    theirs = cgp.models.VariationalSparseGP(
        torch.tensor(X), torch.tensor(y), kernel, torch.tensor(Z),
        cgp.likelihoods.Gaussian(variance=torch.tensor(0.2, dtype=torch.float64)), whiten=True, jitter=1e-6)
    theirs.u_loc.data = torch.tensor(q_mu)
    theirs.u_scale_tril = torch.tensor(q_sqrt)
    their_loss = float(TraceMeanField_ELBO().loss(theirs.model, theirs.guide))

    r = ref.SVGPRef("matern52", [0.7], 1.3, Z, q_mu, q_sqrt, whiten=True, jitter=1e-6)
    mean, cov = r.predict(X)
    predictive = ref.stats.norm.logpdf(y, mean, np.sqrt(np.diag(cov) + 0.2)).sum()
    assert their_loss == pytest.approx(r.kl() - predictive, rel=1e-8)

    backend.reset()  # contrib.gp left its own "likelihood.variance" in the param store
    lik = backend.set(backend.lib.Gaussian(), variance=0.2)
    ours = backend.lib.GPModel(backend.svgp(Z, ("matern52", [0.7], 1.3), q_mu, q_sqrt, jitter=1e-6), lik)
    our_loss = backend.loss(ours.model, ours.guide, backend.array(X), backend.array(y), mean_field=True)
    assert our_loss == pytest.approx(-r.elbo(ref.gaussian_ell(0.2), X, y), rel=1e-10)
    assert our_loss > their_loss  # E_q[log p] <= log E_q[p] (Jensen): theirs is the looser, invalid "bound"
