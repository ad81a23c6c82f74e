"""Variational orthogonal features against dense float64 references (spec vof.md, section 15)."""
import math

import jax
import numpy as np
import pytest
import reference as ref
import torch
from backends import NumPyroBackend, PyroBackend

import numpyro_sparsegp.vof as nvof
import pyro_sparsegp.vof as pvof
from pyro_sparsegp.params import active

VOF = {"pyro": pvof, "numpyro": nvof}
Z_STAR = 4.5  # Bonferroni over a few dozen comparisons per test (false failure ~1e-4)


def numpy(x):
    if isinstance(x, (tuple, list)):
        return tuple(numpy(a) for a in x)
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def evaluate(backend, obj, fn):
    """``fn(obj)`` with ``obj``'s parameters readable (Pyro: active; NumPyro: bound), as NumPy."""
    if backend.name == "pyro":
        with torch.no_grad(), active(obj):
            return numpy(fn(obj))
    return numpy(fn(obj.bind()))


def draws(backend, obj, fn, replicates, seed=0):
    """``replicates`` independent values of ``fn(bound obj, key)`` stacked: ``(R, ...)``; Pyro
    draws from torch's RNG (``key`` is None), NumPyro from one key per replicate (vmapped)."""
    if backend.name == "pyro":
        torch.manual_seed(seed)
        with torch.no_grad(), active(obj):
            return np.stack([np.stack(numpy(fn(obj, None))) for _ in range(replicates)])
    bound = obj.bind()
    keys = jax.random.split(jax.random.PRNGKey(seed), replicates)
    return np.asarray(jax.jit(jax.vmap(lambda k: jax.numpy.stack(fn(bound, k))))(keys))


def key_kwargs(backend, key):
    return {} if backend.name == "pyro" else {"key": key}


def frequencies(backend, features, key):
    if backend.name == "pyro":
        return features.draw_frequencies(dtype=torch.float64)
    return features.draw_frequencies(key)


def assert_unbiased(samples, truth, z=Z_STAR, atol=1e-10):
    """``|mean - truth| <= z sd / sqrt(R) + atol`` elementwise over the replicates ``(R, ...)``."""
    R = samples.shape[0]
    err = np.abs(samples.mean(0) - truth)
    bound = z * samples.std(0, ddof=1) / math.sqrt(R) + atol
    assert np.all(err <= bound), f"max z = {np.max((err - atol) / np.maximum(bound - atol, 1e-300) * z):.2f}"


def hermite_gp(backend, M, sigma_x=0.9, lengthscale=(0.6,), variance=1.7, diagonal=False, name="gp"):
    kernel = backend.kernel("rbf", list(lengthscale), variance)
    features = VOF[backend.name].HermiteFeatures(M, backend.array(np.full(len(lengthscale), sigma_x)), kernel=kernel)
    return backend.lib.SVGP(kernel, features, diagonal=diagonal, name=name)


def spectral_gp(backend, M, basis="fourier", kern=("matern32", [0.5], 1.0), a=6.0, diagonal=False, name="gp", **options):
    cls = {"fourier": "FourierFeatures", "legendre": "LegendreFeatures"}[basis]
    features = getattr(VOF[backend.name], cls)(M, backend.array(np.atleast_1d(a)), **options)
    return backend.lib.SVGP(backend.kernel(*kern), features, diagonal=diagonal, name=name)


def kuf(backend, gp, X):
    return evaluate(backend, gp, lambda g: backend.lib.Kuf(g.features, g.kernel, backend.array(X)))


def lower(rng, M, scale=0.3):
    return np.tril(rng.normal(size=(M, M)) * scale, -1) + np.diag(rng.uniform(0.4, 1.0, M))


# ---------------------------------------------------------------- 1. orthonormal bases


@pytest.mark.parametrize("basis", ["fourier", "legendre"])
@pytest.mark.parametrize("dim", [1, 2])
def test_basis_orthonormal(backend, basis, dim):
    M = 15 if dim == 1 else 12
    gp = spectral_gp(backend, M, basis, kern=("matern32", [0.5] * dim, 1.0), a=[2.5, 4.0][:dim], num_quadrature=80)

    def gram(g):
        nodes, weights = g.features.quadrature()
        P = g.features.basis_functions(nodes)
        return P.T @ (weights[:, None] * P)

    np.testing.assert_allclose(evaluate(backend, gp, gram), np.eye(M), atol=1e-12)


def test_hermite_reference_functions_orthonormal():
    w = np.linspace(-12, 12, 20001)
    psi = np.stack([ref.hermite_function(m, 0.8, w) for m in range(12)])
    np.testing.assert_allclose(psi @ psi.T * (w[1] - w[0]), np.eye(12), atol=1e-10)


# ---------------------------------------------------------------- 2.-3. Hermite closed form


def test_hermite_closed_form_equals_quadrature_up_to_sign(backend):
    v, ls, sx = 1.7, 0.6, 0.9
    X = np.array([[-1.1], [0.0], [0.7], [2.2]])
    K = kuf(backend, hermite_gp(backend, 8, sx, (ls,), v), X)
    r = ref.hermite_r(ls, sx)
    sqrt_s = lambda w: math.sqrt(v * ls) * math.exp(-(ls**2) * w**2 / 4)
    for m in range(8):
        quad = np.array([ref.vof_kuf_quad(sqrt_s, lambda w, m=m: ref.hermite_function(m, r, w), x) for x in X[:, 0]])
        np.testing.assert_allclose(K[m], [1, 1, -1, -1][m % 4] * quad, rtol=1e-8, atol=1e-12)
        paper = ref.hermite_kuf_paper(m, X[:, 0], v, ls, r)  # the main-text form (same sign as ours)
        np.testing.assert_allclose(K[m], paper, rtol=1e-10, atol=1e-13)


def test_hermite_equals_eigenfunction_features(backend):
    v, ls, sx = 1.3, 0.45, 1.6
    X = np.linspace(-4, 4, 9)[:, None]
    K = kuf(backend, hermite_gp(backend, 30, sx, (ls,), v), X)
    expected = np.stack([ref.se_eigenfeature(m, X[:, 0], v, ls, sx) for m in range(30)])
    np.testing.assert_allclose(K, expected, rtol=1e-9, atol=1e-13)


def test_hermite_tensor_product_and_truncation(backend):
    ls = [0.5, 2.0]
    gp = hermite_gp(backend, 10, 1.0, tuple(ls), 1.4)
    idx = gp.features.indices
    assert idx[0].tolist() == [0, 0] and len({tuple(i) for i in idx}) == 10
    # the second dimension has the longer lengthscale, hence the faster-decaying eigenvalues
    assert idx[:, 0].sum() > idx[:, 1].sum()
    X = np.array([[0.3, -0.8], [1.5, 0.2]])
    K = kuf(backend, gp, X)
    for (m1, m2), row in zip(idx, K):
        expected = [ref.se_eigenfeature(m1, x1, 1.4, ls[0], 1.0) * ref.se_eigenfeature(m2, x2, 1.0, ls[1], 1.0)
                    for x1, x2 in X]
        np.testing.assert_allclose(row, expected, rtol=1e-10)


# ---------------------------------------------------------------- 4. Bessel / Mercer


def test_bessel_monotone_and_mercer_limit(backend):
    X = np.array([[-2.0], [0.0], [0.7], [1.9]])
    K = kuf(backend, hermite_gp(backend, 60, 0.9, (0.6,), 1.7), X)
    partial = np.cumsum(K**2, axis=0)
    assert np.all(np.diff(partial, axis=0) >= 0)
    assert np.all(partial <= 1.7 + 1e-12)
    np.testing.assert_allclose(partial[-1], 1.7, rtol=1e-8)
    assert np.all(partial[0] < 1.6)  # the limit is not reached at once


def test_fig1_band_limited_matern32(backend):
    """Spec Fig. 1: Matern-3/2, l = 0.2, a = 10, M = 31: diag(Q_ff) in [0.858, 0.861] <= k_a(0)."""
    X = np.array([[-2.5], [-0.3], [0.0], [1.2], [2.9]])
    gp = spectral_gp(backend, 31, kern=("matern32", [0.2], 1.0), a=10.0)
    qff = (kuf(backend, gp, X) ** 2).sum(0)
    lam = math.sqrt(3) / 0.2
    k_a = ref.band_limited_variance(lambda w: math.sqrt(2 * math.pi) * 2 / math.pi * lam**3 / (lam**2 + w**2) ** 2, 10.0)
    assert k_a == pytest.approx(0.8607, abs=1e-4)
    assert np.all((qff > 0.858) & (qff < 0.861)) and np.all(qff <= k_a + 1e-12)
    wider = (kuf(backend, spectral_gp(backend, 41, kern=("matern32", [0.2], 1.0), a=10.0, name="g41"), X) ** 2).sum(0)
    assert np.all(wider >= qff - 1e-12)


def band_altered_matern32(backend, a, factor):
    """A Matern-3/2 kernel (l = 0.5) whose spectral density is ``factor`` times larger outside the
    box ``[-a, a]``, with the ``k(0)`` that this density implies: ``(kernel, k(0) increase)``."""
    from scipy import integrate

    s = lambda w: ref.spectral_density("matern32", np.array([[w]]), np.array([0.5]), 1.0).item()
    extra = (factor - 1) * 2 * integrate.quad(s, a, np.inf)[0] / math.sqrt(2 * math.pi)

    class BandAltered(backend.lib.Matern32):
        def spectral_density(self, omega):
            outside = (abs(omega) > a).any(-1)
            return super().spectral_density(omega) * (1 + (factor - 1) * outside)

        def K_diag(self, X):
            return super().K_diag(X) + extra

    return BandAltered(lengthscale=backend.array([0.5]), variance=1.0), extra


def test_band_limit_invariance(backend, rng):
    """Spec 15.7: a change of s outside [-a, a] leaves Kuf, the predictive mean and the Monte Carlo
    mean estimate unchanged; the ELBO and the variances move only through k(0)."""
    a, noise, N = 6.0, 0.1, 7
    X, y = rng.uniform(-2, 2, size=(N, 1)), rng.normal(size=N)
    q_mu, q_sqrt = rng.normal(size=11), lower(rng, 11, 0.2)
    results = {}
    for factor in (1.0, 3.0):
        kernel, extra = band_altered_matern32(backend, a, factor)
        gp = backend.set(backend.lib.SVGP(kernel, VOF[backend.name].FourierFeatures(11, backend.array([a]), num_quadrature=256),
                                          name=f"gp{factor:g}"), q_mu=q_mu, q_sqrt=q_sqrt)
        lik = backend.set(backend.lib.Gaussian(name=f"lik{factor:g}"), variance=noise)
        Xb, yb = backend.array(X), backend.array(y)
        elbo = float(backend.numpy(backend.lib.GPModel(gp, lik).elbo(Xb, yb)))
        moments = draws(backend, gp, lambda g, key: VOF[backend.name].estimated_moments(g, Xb, **key_kwargs(backend, key)), 3)
        results[factor] = (kuf(backend, gp, X), np.stack([backend.numpy(t) for t in gp.predict_f(Xb)]), elbo, moments, extra)
    (K1, pred1, elbo1, mc1, _), (K3, pred3, elbo3, mc3, extra) = results[1.0], results[3.0]
    assert extra > 0.05  # the change is not negligible
    np.testing.assert_allclose(K3, K1, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(pred3[0], pred1[0], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(pred3[1] - pred1[1], extra, rtol=1e-10)
    np.testing.assert_allclose(mc3[:, 0], mc1[:, 0], rtol=1e-13, atol=1e-15)  # same frequencies (same seed)
    np.testing.assert_allclose(mc3[:, 1] - mc1[:, 1], extra, rtol=1e-10)
    assert elbo3 - elbo1 == pytest.approx(-N * extra / (2 * noise), rel=1e-10)


def test_quadrature_kuf_matches_reference_integral(backend):
    gp = spectral_gp(backend, 7, "legendre", kern=("matern52", [0.4], 1.2), a=5.0)
    X = np.array([[-1.0], [0.4], [2.0]])
    K = kuf(backend, gp, X)
    lam = math.sqrt(5) / 0.4
    sqrt_s = lambda w: math.sqrt(math.sqrt(2 * math.pi) * 1.2 * 8 / (3 * math.pi) * lam**5 / (lam**2 + w**2) ** 3)
    from scipy import special

    for m in range(7):
        psi = lambda w, m=m: math.sqrt((2 * m + 1) / 10) * special.eval_legendre(m, w / 5)
        np.testing.assert_allclose(K[m], [ref.vof_kuf_quad(sqrt_s, psi, x, -5, 5) for x in X[:, 0]], rtol=1e-8, atol=1e-12)


# ---------------------------------------------------------------- 5. Titsias consistency and KL


def titsias_problem(rng, n=30):
    X = rng.normal(size=(n, 1))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.normal(size=n)
    return X, y


def test_titsias_consistency(backend, rng):
    v, ls, sx, noise = 1.3, 0.6, 1.0, 0.05
    X, y = titsias_problem(rng)
    lml = ref.exact_lml(ref.kernel("rbf", X, X, ls, v), y, noise)
    bounds = []
    for M in (2, 4, 8, 16, 40):
        K_ref = np.stack([ref.se_eigenfeature(m, X[:, 0], v, ls, sx) for m in range(M)])
        q_mu, S, bound = ref.vof_titsias(K_ref, y, noise, np.full(len(X), v))
        gp = hermite_gp(backend, M, sx, (ls,), v, name=f"gp{M}")
        backend.set(gp, q_mu=q_mu, q_sqrt=np.linalg.cholesky(S))
        lik = backend.set(backend.lib.Gaussian(name=f"lik{M}"), variance=noise)
        model = VOF[backend.name].VOFModel(gp, lik)
        elbo = float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
        assert elbo == pytest.approx(bound, rel=1e-9)
        assert elbo == pytest.approx(ref.vof_gaussian_elbo(K_ref, q_mu, S, y, noise, np.full(len(X), v)), rel=1e-9)
        bounds.append(bound)
    assert np.all(np.diff(bounds) >= -1e-9) and bounds[-1] <= lml
    assert bounds[-1] == pytest.approx(lml, abs=1e-4)


@pytest.mark.parametrize("diagonal", [False, True])
def test_kl_closed_form(backend, rng, diagonal):
    gp = hermite_gp(backend, 6, diagonal=diagonal)
    assert float(evaluate(backend, gp, lambda g: g.posterior().kl())) == 0.0
    q_mu = rng.normal(size=6)
    q_sqrt = rng.uniform(0.3, 1.5, 6) if diagonal else lower(rng, 6)
    backend.set(gp, q_mu=q_mu, q_sqrt=q_sqrt)
    S = ref.covariance(q_sqrt)
    kl = float(evaluate(backend, gp, lambda g: g.posterior().kl()))
    assert kl == pytest.approx(ref.gaussian_kl(q_mu, S, np.zeros(6), np.eye(6)), rel=1e-12)


def test_diagonal_optimum_below_dense(backend, rng):
    """Spec 15.10: the optimal diagonal S (S_mm = 1 / P_mm for the optimal precision P, same mean)
    gives an ELBO below the dense optimum; it is the diagonal optimum (perturbations lower it)."""
    v, ls, sx, noise = 1.3, 0.6, 1.0, 0.05
    X, y = titsias_problem(rng, 40)
    K = np.stack([ref.se_eigenfeature(m, X[:, 0], v, ls, sx) for m in range(6)])
    q_mu, S, bound = ref.vof_titsias(K, y, noise, np.full(len(X), v))
    diag_sqrt = np.sqrt(1 / np.diag(np.linalg.inv(S)))

    def elbo(diagonal, q_sqrt, name):
        gp = backend.set(hermite_gp(backend, 6, sx, (ls,), v, diagonal=diagonal, name=name), q_mu=q_mu, q_sqrt=q_sqrt)
        model = gaussian_vof(backend, gp, noise=noise, name="lik" + name)
        return float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))

    dense = elbo(False, np.linalg.cholesky(S), "dense")
    best = elbo(True, diag_sqrt, "diag")
    assert dense == pytest.approx(bound, rel=1e-10)
    assert best == pytest.approx(ref.vof_gaussian_elbo(K, q_mu, np.diag(diag_sqrt**2), y, noise, np.full(len(X), v)), rel=1e-10)
    assert best < dense - 1e-3
    for i, scale in enumerate((0.98, 1.02)):
        assert elbo(True, diag_sqrt * scale, f"d{i}") < best
        assert elbo(True, diag_sqrt * np.exp(0.05 * rng.normal(size=6)), f"r{i}") < best


def off_diagonal(S):
    """Largest correlation between different coordinates of ``S``."""
    d = np.sqrt(np.diag(S))
    return np.max(np.abs(S / np.outer(d, d) - np.eye(len(d))))


def test_prop3_optimal_covariance_tends_to_diagonal(backend):
    """Spec 15.10 / Prop. 3 (corrected limit): for Hermite features and inputs from their own
    N(0, sigma_x^2), N S* tends to the diagonal noise / lambda_m; for uniform inputs it does not."""
    v = ls = 0.5
    sx, noise, M = 3.0, 1e-4, 8
    gp = hermite_gp(backend, M, sx, (ls,), v)
    a, b = 1 / (4 * sx**2), 1 / (2 * ls**2)
    A = a + b + math.sqrt(a**2 + 2 * a * b)
    lam = v * math.sqrt(2 * a / A) * (b / A) ** np.arange(M)
    rng = np.random.default_rng(0)

    def scaled_optimum(X):
        K = kuf(backend, gp, X)
        return len(X) * np.linalg.inv(np.eye(M) + K @ K.T / noise)

    gaussian = [scaled_optimum(rng.normal(0, sx, size=(N, 1))) for N in (100, 1000, 10000, 100000)]
    corr = [off_diagonal(S) for S in gaussian]
    assert corr[0] > 0.1 and corr[-1] < 0.03 and corr[-1] < corr[0] / 5
    np.testing.assert_allclose(np.diag(gaussian[-1]) * lam / noise, 1.0, rtol=0.05)
    half_width = math.sqrt(108)
    assert off_diagonal(scaled_optimum(rng.uniform(-half_width, half_width, size=(100000, 1)))) > 0.1


# ---------------------------------------------------------------- 6. Monte Carlo estimators


MC_X = np.array([[-2.0], [-0.6], [0.0], [0.9], [1.8]])


def mc_gp(backend, rng, diagonal=False, design="grid", name="gp", **options):
    gp = spectral_gp(backend, 21, a=6.0, diagonal=diagonal, design=design, name=name, **options)
    q_sqrt = rng.uniform(0.3, 1.2, 21) if diagonal else lower(rng, 21, 0.2)
    return backend.set(gp, q_mu=rng.normal(size=21) * 0.7, q_sqrt=q_sqrt)


def truth(backend, gp, X):
    """Quadrature ``Kuf`` (512 nodes: exact here to round-off) and the exact ``mu``, ``sigma^2``."""
    K = kuf(backend, gp, X)
    q_mu, q_sqrt = evaluate(backend, gp, lambda g: (g.q_mu, g.q_sqrt))
    S = ref.covariance(q_sqrt)
    mu = K.T @ q_mu
    var = 1.0 + np.einsum("mn,mk,kn->n", K, S - np.eye(len(q_mu)), K)
    return K, mu, var


@pytest.mark.parametrize("diagonal", [False, True])
def test_mc_estimators_unbiased(backend, rng, diagonal):
    gp = mc_gp(backend, rng, diagonal, num_quadrature=512)
    K, mu, var = truth(backend, gp, MC_X)
    V, X = VOF[backend.name], backend.array(MC_X)

    def kuf_hat(g, key):
        A, Phi = V.spectral_terms(g.features, g.kernel, *frequencies(backend, g.features, key), X)
        return ((A @ Phi).T,)

    assert_unbiased(draws(backend, gp, kuf_hat, 500)[:, 0], K)
    moments = draws(backend, gp, lambda g, key: V.estimated_moments(g, X, **key_kwargs(backend, key)), 1000)
    mean, pseudo_var = moments[:, 0], moments[:, 1]
    assert_unbiased(mean, mu)
    assert_unbiased(pseudo_var + mean**2, var + mu**2)  # mu^2 + sigma^2, what the ELBO needs


def test_mc_mu_squared_and_sigma_squared_separately(backend, rng):
    V, X = VOF[backend.name], backend.array(MC_X)
    # q_sqrt = I makes sigma^2 = k exactly, so var + mean^2 - k estimates mu^2 alone
    gp = mc_gp(backend, rng, name="a", num_quadrature=512)
    backend.set(gp, q_sqrt=np.eye(21))
    _, mu, _ = truth(backend, gp, MC_X)
    m = draws(backend, gp, lambda g, key: V.estimated_moments(g, X, **key_kwargs(backend, key)), 1000)
    assert_unbiased(m[:, 1] + m[:, 0] ** 2 - 1.0, mu**2)
    # q_mu = 0 leaves sigma^2 alone
    gp = backend.set(mc_gp(backend, rng, name="b", num_quadrature=512), q_mu=np.zeros(21))
    _, _, var = truth(backend, gp, MC_X)
    m = draws(backend, gp, lambda g, key: V.estimated_moments(g, X, **key_kwargs(backend, key)), 1000)
    assert np.all(m[:, 0] == 0)
    assert_unbiased(m[:, 1], var)


def test_reusing_one_set_is_biased(backend, rng):
    """Negative test: ``mu_hat(W)^2`` from one set overshoots ``mu^2`` by ``Var[mu_hat]``."""
    gp = mc_gp(backend, rng, design="iid", num_quadrature=512)
    _, mu, _ = truth(backend, gp, MC_X)
    V, X = VOF[backend.name], backend.array(MC_X)

    def one_set(g, key):
        A, Phi = V.spectral_terms(g.features, g.kernel, *frequencies(backend, g.features, key), X)
        return (A @ (Phi @ g.q_mu),)

    mu_hat = draws(backend, gp, one_set, 1000)[:, 0]
    assert_unbiased(mu_hat, mu)  # the mean itself is fine
    squared = mu_hat**2
    z = (squared.mean(0) - mu**2) / (squared.std(0, ddof=1) / math.sqrt(len(squared)))
    assert np.all(z > 5)


def test_grid_design_reduces_variance(backend, rng):
    V, X = VOF[backend.name], backend.array(MC_X)
    sds = {}
    for design in ("grid", "iid"):
        gp = mc_gp(backend, np.random.default_rng(1), design=design, name=design)
        m = draws(backend, gp, lambda g, key: V.estimated_moments(g, X, **key_kwargs(backend, key)), 400)
        sds[design] = m.std(0, ddof=1)
    assert np.all(sds["grid"][0] * 10 < sds["iid"][0])
    assert np.all(sds["grid"][1] * 10 < sds["iid"][1])


def test_mc_two_dimensional_unbiased(backend, rng):
    X = rng.uniform(-1.5, 1.5, size=(4, 2))
    gp = spectral_gp(backend, 12, kern=("rbf", [0.8, 1.1], 1.0), a=[3.5, 3.0], num_samples=40, num_quadrature=48)
    backend.set(gp, q_mu=rng.normal(size=12))
    K = kuf(backend, gp, X)
    V, Xb = VOF[backend.name], backend.array(X)

    def kuf_hat(g, key):
        A, Phi = V.spectral_terms(g.features, g.kernel, *frequencies(backend, g.features, key), Xb)
        return ((A @ Phi).T,)

    assert_unbiased(draws(backend, gp, kuf_hat, 800)[:, 0], K)


def test_sign_flip_invariance(backend, rng):
    """Spec 15.16: negating feature j (its Kuf row, m_j, row and column j of S) leaves the
    collapsed ELBO unchanged (dense and diagonal S)."""
    V = VOF[backend.name]
    y = np.sin(MC_X[:, 0])
    flip = np.ones(21)
    flip[[2, 5, 11]] = -1
    for diagonal in (False, True):
        gp = mc_gp(backend, rng, diagonal, name=f"gp{diagonal}")
        lik = backend.set(backend.lib.Gaussian(name=f"lik{diagonal}"), variance=0.1)
        q_mu, q_sqrt = evaluate(backend, gp, lambda g: (g.q_mu, g.q_sqrt))
        sets = [[backend.numpy(t) for t in evaluate(backend, gp, lambda g, k=k: V.spectral_terms(
            g.features, g.kernel, *frequencies(backend, g.features, jax.random.PRNGKey(k)), backend.array(MC_X)))]
            for k in (0, 1)]

        def elbo(signs, kuf_signs):
            flipped = [(backend.array(A), backend.array(P * kuf_signs)) for A, P in sets]
            backend.set(gp, q_mu=signs * q_mu, q_sqrt=q_sqrt if diagonal else signs[:, None] * q_sqrt * signs)
            mean, var, kl = evaluate(backend, gp, lambda g: (
                *V.collapsed_moments(*flipped, g.family(g.q_mu, g.q_sqrt), g.kernel.K_diag(backend.array(MC_X))), g.posterior().kl()))
            return backend.expected_log_prob(lik, y, mean, var).sum() - float(kl)

        original = elbo(np.ones(21), np.ones(21))
        assert elbo(flip, flip) == pytest.approx(original, rel=1e-13)
        assert abs(elbo(np.ones(21), flip) - original) > 1e-2  # flipping Kuf alone changes it


# ---------------------------------------------------------------- 7. the ELBO, its gradient, the two objectives


def gaussian_vof(backend, gp, noise=0.1, num_data=None, name="lik"):
    lik = backend.set(backend.lib.Gaussian(name=name), variance=noise)
    return VOF[backend.name].VOFModel(gp, lik, num_data=num_data)


def elbo_and_grads(backend, model, X, y, replicates=None):
    """The ELBO and its gradient with respect to every parameter (Pyro: unconstrained; NumPyro:
    constrained), flattened: the quadrature ``GPModel`` bound when ``replicates`` is None, else
    ``replicates`` independent collapsed estimates ``(R,)`` and ``(R, P)``."""
    exact = replicates is None
    target = backend.lib.GPModel(model.prior, model.likelihood, num_data=model.num_data) if exact else model
    if backend.name == "pyro":
        import pyro

        def one():
            with pyro.poutine.trace(param_only=True) as tr, active(model.prior, model.likelihood):
                value = target.elbo(X, y)
            names = sorted(tr.trace.nodes)
            grads = torch.autograd.grad(value, [tr.trace.nodes[n]["value"].unconstrained() for n in names])
            return float(value.detach()), np.concatenate([numpy(g).ravel() for g in grads])

        if exact:
            return one()
        torch.manual_seed(0)
        out = [one() for _ in range(replicates)]
        return np.array([v for v, _ in out]), np.stack([g for _, g in out])
    from numpyro import handlers

    kwargs = (lambda key: {}) if exact else (lambda key: {"key": key})
    trace = handlers.trace(handlers.seed(lambda: target.elbo(X, y, **kwargs(None)), 0)).get_trace()
    params = {n: s["value"] for n, s in trace.items() if s["type"] == "param"}

    def fn(p, key):
        with handlers.substitute(data=p):
            return target.elbo(X, y, **kwargs(key))

    def flat(value, grads):
        return value, jax.numpy.concatenate([jax.numpy.ravel(grads[n]) for n in sorted(grads)])

    if exact:
        return tuple(np.asarray(a) for a in flat(*jax.value_and_grad(fn)(params, None)))
    keys = jax.random.split(jax.random.PRNGKey(0), replicates)
    values, grads = jax.jit(jax.vmap(lambda k: flat(*jax.value_and_grad(fn)(params, k))))(keys)
    return np.asarray(values), np.asarray(grads)


@pytest.mark.parametrize("diagonal, design, num_samples", [(False, "grid", 50), (True, "grid", 50), (False, "iid", 3)])
def test_elbo_and_gradient_unbiased(backend, rng, diagonal, design, num_samples):
    """The collapsed estimate and its gradient against the quadrature bound (z-tests over 500
    replicates); with 3 independent frequencies a set the two sets' means differ enough that
    ``mu_1^2`` in place of ``mu_1 mu_2`` (a bias of the mean's variance) fails the test."""
    gp = mc_gp(backend, rng, diagonal, design=design, num_quadrature=512, num_samples=num_samples)
    y = np.sin(MC_X[:, 0]) + 0.1
    model = gaussian_vof(backend, gp, num_data=40)
    X, yb = backend.array(MC_X), backend.array(y)
    value, grad = elbo_and_grads(backend, model, X, yb)
    values, grads = elbo_and_grads(backend, model, X, yb, replicates=500)
    assert len(grad) >= 21 + (21 if diagonal else 21 * 21) + 4  # q_mu, q_sqrt, a, lengthscale, variance, noise
    assert_unbiased(values, value)
    assert_unbiased(grads, grad, atol=1e-8)


def test_sampled_u_objective_matches_collapsed_in_expectation(backend, rng):
    gp = mc_gp(backend, rng, num_quadrature=512)
    y = np.cos(MC_X[:, 0])
    model = gaussian_vof(backend, gp)
    X, yb = backend.array(MC_X), backend.array(y)
    exact, _ = elbo_and_grads(backend, model, X, yb)
    for mean_field in (False, True):
        losses = backend.losses(model.model, model.guide, X, yb, replicates=600, mean_field=mean_field)
        assert_unbiased(-losses, exact)


def test_sampled_u_minibatch_plate_scaling(backend, rng):
    """Subsampled Option-A objective, scaled by N / B, is unbiased for the full-batch bound (Hermite: exact Kuf)."""
    X, y = titsias_problem(rng, 12)
    gp = hermite_gp(backend, 5, 1.0, (0.7,), 1.0)
    backend.set(gp, q_mu=rng.normal(size=5), q_sqrt=lower(rng, 5))
    model = gaussian_vof(backend, gp, noise=0.2)
    exact = float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    g = backend.lib.GPModel(gp, model.likelihood)
    assert exact == pytest.approx(float(backend.numpy(g.elbo(backend.array(X), backend.array(y)))), rel=1e-12)
    losses = backend.losses(model.model, model.guide, backend.array(X), backend.array(y), replicates=1000,
                            subsample_size=4)
    assert_unbiased(-losses, exact)


# ---------------------------------------------------------------- 8. training, prediction, ArviZ


def loss_objects(backend):
    import numpyro
    import pyro

    if backend.name == "pyro":
        return {"collapsed": VOF["pyro"].CollapsedELBO(), "sampled": pyro.infer.TraceMeanField_ELBO()}
    return {"collapsed": VOF["numpyro"].CollapsedELBO(), "sampled": numpyro.infer.TraceMeanField_ELBO()}


@pytest.mark.parametrize("objective", ["collapsed", "sampled"])
def test_fourier_fit_predict_and_arviz(backend, rng, objective):
    X = rng.uniform(-2, 2, size=(40, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    model = gaussian_vof(backend, spectral_gp(backend, 11, kern=("matern52", [0.7], 1.0), a=4.0, diagonal=True,
                                              num_quadrature=64), noise=0.05, num_data=40)
    Xa, ya = backend.array(X), backend.array(y)
    result = backend.lib.fit(model.model, model.guide, (Xa, ya), num_steps=150, batch_size=20, lr=0.05,
                             loss=loss_objects(backend)[objective], progress=False)
    assert result.losses[-20:].mean() < result.losses[:20].mean()
    assert {"gp.q_mu", "gp.q_sqrt", "gp.features.a", "gp.kernel.lengthscale", "lik.variance"} <= set(result.params)
    mean, var = (backend.numpy(t) for t in model.predict_f(Xa, params=result.params))
    assert np.sqrt(np.mean((mean - np.sin(2 * X[:, 0])) ** 2)) < 0.4 and np.all(var > 0)
    idata = backend.lib.to_inference_data(model, data=(Xa, ya), num_samples=8, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 4, 40)


def test_hermite_any_likelihood_fit_predict_and_arviz(backend, rng):
    X = rng.normal(size=(60, 1))
    y = (rng.random(60) < 1 / (1 + np.exp(-3 * X[:, 0]))).astype(float)
    kernel = backend.kernel("rbf", [1.0], 1.0)
    gp = backend.lib.SVGP(kernel, VOF[backend.name].HermiteFeatures(10, backend.array([1.0]), kernel=kernel))
    model = VOF[backend.name].VOFModel(gp, backend.lib.Bernoulli())
    Xa, ya = backend.array(X), backend.array(y)
    result = backend.lib.fit(model.model, model.guide, (Xa, ya), num_steps=150, lr=0.05,
                             loss=loss_objects(backend)["sampled"], progress=False)
    assert result.losses[-20:].mean() < result.losses[:20].mean()
    pred = model.predict_y(Xa, params=result.params)
    p = backend.numpy(pred.mean)
    assert np.mean((p > 0.5) == (y > 0.5)) > 0.75
    idata = backend.lib.to_inference_data(model, data=(Xa, ya), num_samples=8, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 4, 60)


# ---------------------------------------------------------------- 9. errors


def test_errors(backend):
    V, lib = VOF[backend.name], backend.lib
    with pytest.raises(ValueError, match="odd"):
        V.FourierFeatures(20, 3.0)
    with pytest.raises(ValueError, match="design"):
        V.FourierFeatures(21, 3.0, design="sobol")
    with pytest.raises(ValueError, match="sigma_x"):
        V.HermiteFeatures(5, -1.0)
    with pytest.raises(ValueError, match="a has 2 entries"):
        V.LegendreFeatures(5, [1.0, 2.0], input_dim=3)
    gp = spectral_gp(backend, 11)
    with pytest.raises(TypeError, match="Gaussian likelihood"):
        V.VOFModel(gp, lib.Bernoulli())
    with pytest.raises(TypeError, match="SVGP on HermiteFeatures"):
        V.VOFModel(backend.svgp(np.zeros((3, 1))), lib.Gaussian())
    bad = lib.SVGP(backend.kernel("matern32", [1.0], 1.0), V.HermiteFeatures(4), name="bad")
    with pytest.raises(TypeError, match="SquaredExponential"):
        kuf(backend, bad, np.zeros((2, 1)))
    with pytest.raises(ValueError, match="needs y"):
        gaussian_vof(backend, spectral_gp(backend, 11, name="g2"), name="l2").model(backend.array(np.zeros((2, 1))))


# ---------------------------------------------------------------- 10. Pyro / NumPyro parity


def test_pyro_numpyro_parity():
    rng = np.random.default_rng(3)
    X, y = rng.uniform(-2, 2, size=(6, 2)), rng.normal(size=6)
    omega, weights = rng.uniform(-3, 3, size=(2, 40, 2)), rng.uniform(0.1, 0.3, size=(2, 40))
    q_mu, q_sqrt, u = rng.normal(size=15), lower(rng, 15), rng.normal(size=15)
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        V, Xb = VOF[backend.name], backend.array(X)
        out = {}
        for label, gp in (("hermite", hermite_gp(backend, 15, 1.1, (0.7, 1.3), 1.2, name="h")),
                          ("fourier", spectral_gp(backend, 15, kern=("matern32", [0.8, 1.1], 1.0), a=[3.0, 4.0],
                                                  num_quadrature=24, name="f")),
                          ("legendre", spectral_gp(backend, 15, "legendre", kern=("matern52", [0.8, 1.1], 1.0),
                                                   a=[3.0, 2.0], diagonal=True, num_quadrature=24, name="l"))):
            backend.set(gp, q_mu=q_mu, q_sqrt=np.diag(q_sqrt).copy() if label == "legendre" else q_sqrt)
            out[label + " Kuf"] = kuf(backend, gp, X)
            out[label + " predict"] = np.stack([backend.numpy(a) for a in gp.predict_f(Xb)])
            if label == "hermite":
                model = V.VOFModel(gp, backend.set(backend.lib.Gaussian(name="lh"), variance=0.3))
                out["hermite elbo"] = float(backend.numpy(model.elbo(Xb, backend.array(y))))
                continue

            def moments(g, V=V, backend=backend, Xb=Xb):
                sets = [V.spectral_terms(g.features, g.kernel, backend.array(o), backend.array(w), Xb)
                        for o, w in zip(omega, weights)]
                Kff = g.kernel.K_diag(Xb)
                return (*V.collapsed_moments(*sets, g.family(g.q_mu, g.q_sqrt), Kff), *V.sampled_moments(*sets, backend.array(u), Kff))

            out[label + " moments"] = np.stack(evaluate(backend, gp, moments))
        results.append(out)
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        np.testing.assert_allclose(results[0][key], results[1][key], rtol=1e-8, atol=1e-12, err_msg=key)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_pyro_features_follow_the_device_of_their_inputs(device, monkeypatch):
    """Issue 20: HermiteFeatures are built from tensors on any device (no ``Tensor.numpy()``), and
    Kuf, the frequencies and the moments stay on that device."""
    import pyro

    pyro.clear_param_store()

    def no_numpy(self, *args, **kwargs):
        raise AssertionError("Tensor.numpy() called while building or evaluating VOF features")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    X = torch.linspace(-1, 1, 6, dtype=torch.float64, device=device).reshape(3, 2)
    from pyro_sparsegp import SVGP, Matern32, SquaredExponential

    k = SquaredExponential(torch.tensor([0.7, 1.3], dtype=torch.float64, device=device))
    hermite = SVGP(k, pvof.HermiteFeatures(5, torch.tensor([1.0, 0.8], dtype=torch.float64, device=device), kernel=k),
                   name="h")
    fourier = SVGP(Matern32(torch.tensor([0.9, 1.1], dtype=torch.float64, device=device)),
                   pvof.FourierFeatures(5, torch.tensor([3.0, 2.0], dtype=torch.float64, device=device),
                                        num_samples=7, num_quadrature=6), name="f")
    for gp in (hermite, fourier):
        with torch.no_grad(), active(gp):
            assert pvof.Kuf(gp.features, gp.kernel, X).device == X.device
            assert all(m.device == X.device for m in pvof.estimated_moments(gp, X))
