"""Decoupled mean/covariance bases against dense float64 references (spec decoupled.md, section 8)."""
import numpy as np
import pytest

import reference as ref
from backends import NumPyroBackend, PyroBackend

KERN = ("rbf", [0.8, 1.3], 1.2)
NOISE = 0.1


def k(A, B, kern=KERN):
    return ref.kernel(kern[0], A, B, kern[1], kern[2])


def lower(rng, M, scale=0.5):
    """A random square factor with a positive diagonal."""
    return np.tril(rng.normal(size=(M, M)) * scale, -1) + np.diag(rng.uniform(0.3, 1.0, M))


def make(backend, Za, Zb, kernel=KERN, parametrization="direct", **values):
    """A DecoupledGP with the given (constrained) parameter values; options pass through."""
    options = {key: values.pop(key) for key in list(values) if key not in ("a", "L", "q_mu", "q_sqrt")}
    kern = backend.kernel(*kernel) if isinstance(kernel, tuple) else kernel
    gp = backend.lib.DecoupledGP(kern, backend.array(Za), backend.array(Zb), parametrization=parametrization, **options)
    return backend.set(gp, **values)


def kl(backend, gp, **kwargs):
    return float(backend.numpy(backend.bound(gp).posterior().kl(**kwargs)))


def moments(backend, gp, X, full_cov=False):
    return [backend.numpy(t) for t in gp.predict_f(backend.array(X), full_cov=full_cov)]


def gaussian_model(backend, gp, num_data=None, noise=NOISE):
    return backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=noise), num_data=num_data)


def elbo(backend, model, X, y):
    return float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))


def feature_kernel(backend, W, b):
    """``k(x, z) = phi(x)^T phi(z)`` with explicit features ``phi(x) = (x W + b)^2`` (elementwise)."""
    W, b = backend.array(W), backend.array(b)

    class Quadratic(backend.lib.kernels.Kernel):
        def features(self, X):
            return (X @ W + b) ** 2

        def K(self, X, Z=None):
            F = self.features(X)
            return F @ (F if Z is None else self.features(Z)).T

        def K_diag(self, X):
            return (self.features(X) ** 2).sum(-1)

    return Quadratic()


# ---------------------------------------------------------------- 1. finite-feature ground truth


@pytest.mark.parametrize("parametrization", ["direct", "jacobi", "hybrid"])
def test_finite_feature_ground_truth(backend, rng, parametrization):
    D, d = 2, 6
    W, b = rng.normal(size=(D, d)) * 0.6, rng.normal(size=d) * 0.5
    phi = lambda A: (A @ W + b) ** 2  # noqa: E731
    X, Za, Zb = rng.normal(size=(15, D)), rng.normal(size=(9, D)), rng.normal(size=(4, D))
    a = rng.normal(size=9) * 0.3
    kern = feature_kernel(backend, W, b)
    if parametrization == "hybrid":
        q_mu, q_sqrt = rng.normal(size=4), lower(rng, 4)
        gp = make(backend, Za, Zb, kern, "hybrid", jitter=0.0, a=a, q_mu=q_mu, q_sqrt=q_sqrt)
        mu, Sigma = ref.hybrid_dense_weights(phi(Zb), q_mu, q_sqrt @ q_sqrt.T, phi(Za), a)
    else:
        L = lower(rng, 4)
        stored = (a, L)
        if parametrization == "jacobi":  # the parameters hold a0 = diag(K_a) a, L0 = diag(K_b) L
            stored = ((phi(Za) ** 2).sum(-1) * a, (phi(Zb) ** 2).sum(-1)[:, None] * L)
        gp = make(backend, Za, Zb, kern, parametrization, a=stored[0], L=stored[1])
        mu, Sigma = ref.decoupled_dense_weights(phi(Za), a, phi(Zb), L @ L.T)
    assert kl(backend, gp) == pytest.approx(ref.gaussian_kl(mu, Sigma, np.zeros(d), np.eye(d)), rel=1e-10)
    F = phi(X)
    mean, var = moments(backend, gp, X)
    np.testing.assert_allclose(mean, F @ mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, np.einsum("nd,de,ne->n", F, Sigma, F), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(moments(backend, gp, X, full_cov=True)[1], F @ Sigma @ F.T, rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------- 2.-3. the KL


@pytest.mark.parametrize("num_latent", [None, 3])
def test_three_kl_forms_agree(backend, rng, num_latent):
    Za, Zb = rng.normal(size=(11, 2)), rng.normal(size=(5, 2))
    shape = () if num_latent is None else (num_latent,)
    a = rng.normal(size=shape + (11,))
    L = np.stack([lower(rng, 5) for _ in range(num_latent or 1)]).reshape(shape + (5, 5))
    gp = make(backend, Za, Zb, num_latent=num_latent, a=a, L=L)
    Ka, Kb = k(Za, Za), k(Zb, Zb)
    pairs = list(zip(a.reshape(-1, 11), L.reshape(-1, 5, 5)))
    eq9 = sum(ref.decoupled_kl_eq9(ai, Ka, Li @ Li.T, Kb) for ai, Li in pairs)
    via_R = sum(ref.decoupled_kl_R(ai, Ka, Li @ Li.T, Kb) for ai, Li in pairs)
    assert eq9 == pytest.approx(via_R, rel=1e-10)
    assert kl(backend, gp) == pytest.approx(eq9, rel=1e-10)


def test_kl_nonnegative_and_zero_at_prior(backend, rng):
    Za, Zb = rng.normal(size=(8, 2)), rng.normal(size=(4, 2))
    assert kl(backend, make(backend, Za, Zb, a=np.zeros(8), L=np.zeros((4, 4)))) == 0.0
    for seed in range(5):
        r = np.random.default_rng(seed)
        L = r.normal(size=(4, 4)) * r.uniform(0.01, 3)  # not triangular: any square factor works
        value = kl(backend, make(backend, Za, Zb, a=r.normal(size=8), L=L))
        assert value > 0
        H = np.eye(4) + L.T @ k(Zb, Zb) @ L  # covariance part = KL[N(0, H^-1) || N(0, I)]
        cov_part = kl(backend, make(backend, Za, Zb, a=np.zeros(8), L=L))
        assert cov_part == pytest.approx(ref.gaussian_kl(np.zeros(4), np.linalg.inv(H), np.zeros(4), np.eye(4)), rel=1e-10)


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_kl_and_its_gradient_equal_the_dense_one(backend, rng, chunk):
    Za, Zb = rng.normal(size=(13, 2)), rng.normal(size=(3, 2))
    values = dict(a=rng.normal(size=(2, 13)), L=np.stack([lower(rng, 3), lower(rng, 3)]))
    whole = make(backend, Za, Zb, num_latent=2, name="whole", **values)
    chunked = make(backend, Za, Zb, num_latent=2, kl_chunk_size=chunk, name="chunked", **values)
    assert kl(backend, chunked) == pytest.approx(kl(backend, whole), rel=1e-12)
    g_whole, g_chunked = kl_gradient(backend, whole), kl_gradient(backend, chunked)
    assert len(g_whole) >= 4
    for a, b in zip(g_whole, g_chunked):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def kl_gradient(backend, gp):
    """Gradients of the exact KL with respect to every (unconstrained) parameter, in name order."""
    if backend.name == "pyro":
        import torch

        names, params = zip(*sorted(gp.named_parameters()))
        return [backend.numpy(g) for g in torch.autograd.grad(gp.posterior().kl(), params)]
    import jax
    from numpyro import handlers

    trace = handlers.trace(gp.bind).get_trace()
    values = {n: s["value"] for n, s in trace.items() if s["type"] == "param"}

    def fn(v):
        return handlers.substitute(gp.bind, data=v)().posterior().kl()

    grads = jax.grad(fn)(values)
    return [np.asarray(grads[n]) for n in sorted(grads)]


# ---------------------------------------------------------------- 4.-7. known special cases


def test_reduces_to_svgp_when_bases_coincide(backend, rng):
    """alpha = beta = Z: the SVGP with q_mu = K a, S = (K^-1 + B)^-1 (and back: B = S^-1 - K^-1)."""
    X, Z, y = rng.normal(size=(20, 2)), rng.normal(size=(6, 2)), rng.normal(size=20)
    a, L = rng.normal(size=6), lower(rng, 6)
    K, B = k(Z, Z), L @ L.T
    S = np.linalg.inv(np.linalg.inv(K) + B)
    np.testing.assert_allclose(np.linalg.inv(S) - np.linalg.inv(K), B, rtol=1e-8, atol=1e-8)
    decoupled = make(backend, Z, Z, a=a, L=L)
    svgp = backend.svgp(Z, KERN, K @ a, np.linalg.cholesky(S), whiten=False, jitter=0.0, name="svgp")
    assert kl(backend, decoupled) == pytest.approx(kl(backend, svgp), rel=1e-10)
    for full_cov in (False, True):
        for ours, theirs in zip(moments(backend, decoupled, X, full_cov), moments(backend, svgp, X, full_cov)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    expected = elbo(backend, gaussian_model(backend, svgp), X, y)
    assert elbo(backend, gaussian_model(backend, decoupled), X, y) == pytest.approx(expected, rel=1e-10)


def test_exact_gp_recovery(backend, rng):
    """alpha = beta = X, a = (K + s2 I)^-1 y, L = I / s: ELBO = log marginal likelihood, q(f) = GPR."""
    X, Xs = rng.normal(size=(12, 2)), rng.normal(size=(5, 2))
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=12)
    Ky = k(X, X) + NOISE * np.eye(12)
    gp = make(backend, X, X, a=np.linalg.solve(Ky, y), L=np.eye(12) / np.sqrt(NOISE))
    assert elbo(backend, gaussian_model(backend, gp), X, y) == pytest.approx(ref.exact_lml(k(X, X), y, NOISE), rel=1e-10)
    mean, cov = moments(backend, gp, Xs, full_cov=True)
    np.testing.assert_allclose(mean, k(Xs, X) @ np.linalg.solve(Ky, y), rtol=1e-9)
    np.testing.assert_allclose(cov, k(Xs, Xs) - k(Xs, X) @ np.linalg.solve(Ky, k(X, Xs)), rtol=1e-8, atol=1e-12)


def test_titsias_optimum_and_mean_basis_monotonicity(backend, rng):
    """alpha = beta = Z at the closed-form (a*, B*): the collapsed bound, with zero gradient in a;
    adding mean-only points (alpha = Z + extra) at their optimum cannot lower the ELBO."""
    X, Z, extra = rng.normal(size=(30, 2)), rng.normal(size=(6, 2)), rng.normal(size=(10, 2))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=30)
    a, B = ref.decoupled_optimum(k(X, Z), k(Z, Z), k(X, Z), k(Z, Z), y, NOISE)
    L = np.linalg.cholesky(B)
    model = gaussian_model(backend, make(backend, Z, Z, a=a, L=L))
    value = elbo(backend, model, X, y)
    assert value == pytest.approx(ref.collapsed_bound(k(X, X), k(X, Z), k(Z, Z), y, NOISE), rel=1e-10)
    assert value == pytest.approx(ref.decoupled_elbo(k(X, Z), a, k(X, Z), B, k(Z, Z), k(Z, Z), np.diag(k(X, X)), y, NOISE), rel=1e-10)
    h = 1e-5
    for i in range(3):  # central differences: the ELBO is stationary in a at a*
        step = np.eye(6)[i] * h
        up = elbo(backend, gaussian_model(backend, backend.set(model.prior, a=a + step)), X, y)
        down = elbo(backend, gaussian_model(backend, backend.set(model.prior, a=a - step)), X, y)
        assert abs(up - down) / (2 * h) < 1e-5
    backend.reset()
    Za = np.vstack([Z, extra])
    a_big, _ = ref.decoupled_optimum(k(X, Za), k(Za, Za), k(X, Z), k(Z, Z), y, NOISE)
    bigger = elbo(backend, gaussian_model(backend, make(backend, Za, Z, a=a_big, L=L)), X, y)
    assert bigger > value + 1e-3


# ---------------------------------------------------------------- 8. predictive bounds


def test_predictive_variance_bounds_and_mean_independent_of_covariance_basis(backend, rng):
    Za, Zb = rng.normal(size=(9, 2)), rng.normal(size=(5, 2))
    X, a = np.vstack([Zb, rng.normal(size=(40, 2)) * 2]), rng.normal(size=9)
    prior_var = k(X[:1], X[:1])[0, 0]
    big = make(backend, Za, Zb, a=a, L=lower(rng, 5, scale=30.0) * 30)
    mean, var = moments(backend, big, X)
    assert np.all(var >= 0) and np.all(var <= prior_var + 1e-12) and var.min() < 0.05 * prior_var
    backend.reset()
    zero = make(backend, Za, rng.normal(size=(5, 2)), a=a, L=np.zeros((5, 5)))
    mean0, var0 = moments(backend, zero, X)
    np.testing.assert_allclose(var0, prior_var, rtol=1e-14)
    np.testing.assert_allclose(mean0, mean, rtol=1e-12)
    np.testing.assert_allclose(mean, k(X, Za) @ a, rtol=1e-10)


# ---------------------------------------------------------------- 11. unbiasedness


@pytest.mark.parametrize("num_alpha, subsample", [(20, 4), (5, 2)])
def test_subsampled_kl_is_unbiased(backend, rng, num_alpha, subsample):
    """z-test over 4,000 draws; with 2 columns of 5 a scale of ``(M - 1) / n`` for ``M / n``
    (20 % low) fails it."""
    Za, Zb = rng.normal(size=(num_alpha, 2)), rng.normal(size=(3, 2))
    values = dict(a=rng.normal(size=num_alpha), L=lower(rng, 3))
    gp = make(backend, Za, Zb, kl_subsample_size=subsample, **values)
    exact = kl(backend, gp, subsample=False)
    assert exact == pytest.approx(kl(backend, make(backend, Za, Zb, name="exact", **values)), rel=1e-12)
    draws = subsampled_kls(backend, gp, 4000)
    assert draws.std() > 0.1 * abs(exact)  # really random
    z = (draws.mean() - exact) / (draws.std() / np.sqrt(len(draws)))
    assert abs(z) < 4.0, z


def test_subsampled_kl_is_exact_outside_inference(backend, rng):
    """Evaluated directly (no Pyro trace, no NumPyro seed handler) the KL is the exact one in both
    backends; columns are drawn during inference only."""
    Za, Zb = rng.normal(size=(20, 2)), rng.normal(size=(3, 2))
    values = dict(a=rng.normal(size=20), L=lower(rng, 3))
    gp = make(backend, Za, Zb, kl_subsample_size=4, **values)
    assert kl(backend, gp) == kl(backend, gp) == kl(backend, gp, subsample=False)


def subsampled_kls(backend, gp, n):
    if backend.name == "pyro":
        from pyro import poutine

        backend.reset(1)
        post = gp.posterior()
        with poutine.trace():  # columns are drawn during inference only
            return np.array([float(post.kl()) for _ in range(n)])
    import jax
    from numpyro import handlers

    def one(key):
        return handlers.seed(lambda: gp.bind().posterior().kl(), key)()

    return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(1), n)))


def test_minibatch_elbo_is_unbiased(backend, rng):
    X, Za, Zb = rng.normal(size=(30, 2)), rng.normal(size=(10, 2)), rng.normal(size=(4, 2))
    y = rng.normal(size=30)
    model = gaussian_model(backend, make(backend, Za, Zb, a=rng.normal(size=10), L=lower(rng, 4)))
    full = elbo(backend, model, X, y)
    estimates = -backend.losses(model.model, model.guide, backend.array(X), backend.array(y), replicates=2000, subsample_size=6)
    assert estimates.std() > 1.0
    z = (estimates.mean() - full) / (estimates.std() / np.sqrt(len(estimates)))
    assert abs(z) < 4.0, z


# ---------------------------------------------------------------- 12. invariances


def test_duplicating_a_mean_point_and_permuting_the_bases_change_nothing(backend, rng):
    X, Za, Zb = rng.normal(size=(10, 2)), rng.normal(size=(6, 2)), rng.normal(size=(4, 2))
    a, L = rng.normal(size=6), lower(rng, 4)
    base = make(backend, Za, Zb, a=a, L=L, name="base")
    dup = make(backend, np.vstack([Za, Za[:1]]), Zb, a=np.concatenate([[0.3 * a[0]], a[1:], [0.7 * a[0]]]), L=L, name="dup")
    pa, pb = rng.permutation(6), rng.permutation(4)
    perm = make(backend, Za[pa], Zb[pb], a=a[pa], L=L[pb], name="perm")
    for other in (dup, perm):
        assert kl(backend, other) == pytest.approx(kl(backend, base), rel=1e-10)
        for x, y in zip(moments(backend, other, X), moments(backend, base, X)):
            np.testing.assert_allclose(x, y, rtol=1e-10)


# ---------------------------------------------------------------- 13.-14. hybrid and Jacobi


def test_hybrid_kl_uses_the_corrected_log_determinant(backend, rng):
    """Spec A.3: the KL equals the dense one with -1/2 log|K^-1 S|, not the paper's printed -1."""
    Zr, Zu = rng.normal(size=(7, 2)), rng.normal(size=(4, 2))
    q_mu, q_sqrt, a_r = rng.normal(size=4), lower(rng, 4), rng.normal(size=7)
    gp = make(backend, Zr, Zu, parametrization="hybrid", jitter=0.0, a=a_r, q_mu=q_mu, q_sqrt=q_sqrt)
    args = (q_mu, q_sqrt @ q_sqrt.T, k(Zu, Zu), k(Zu, Zr), k(Zr, Zr), a_r)
    value = kl(backend, gp)
    assert value == pytest.approx(ref.hybrid_kl(*args), rel=1e-10)
    printed = ref.hybrid_kl(*args, logdet_coefficient=1.0)
    assert abs(value - printed) > 0.1  # the erratum is a real difference, caught by this test


def test_hybrid_generalises_svgp_and_matches_direct(backend, rng):
    X, Zr, Z = rng.normal(size=(15, 2)), rng.normal(size=(7, 2)), rng.normal(size=(5, 2))
    q_mu, q_sqrt = rng.normal(size=5), lower(rng, 5)
    hybrid = make(backend, Zr, Z, parametrization="hybrid", jitter=0.0, a=np.zeros(7), q_mu=q_mu, q_sqrt=q_sqrt, name="h")
    svgp = backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=False, jitter=0.0, name="svgp")
    assert kl(backend, hybrid) == pytest.approx(kl(backend, svgp), rel=1e-10)
    for x, y in zip(moments(backend, hybrid, X, True), moments(backend, svgp, X, True)):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    # direct decoupled with alpha = beta = Z and B = S^-1 - K^-1 (S < K), residual points unused
    a, L = rng.normal(size=5), lower(rng, 5)
    K = k(Z, Z)
    S = np.linalg.inv(np.linalg.inv(K) + L @ L.T)
    hybrid = make(backend, Zr, Z, parametrization="hybrid", jitter=0.0, a=np.zeros(7), q_mu=K @ a,
                  q_sqrt=np.linalg.cholesky(S), name="h2")
    direct = make(backend, Z, Z, a=a, L=L, name="direct")
    assert kl(backend, hybrid) == pytest.approx(kl(backend, direct), rel=1e-9)
    for x, y in zip(moments(backend, hybrid, X), moments(backend, direct, X)):
        np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-12)


def test_jacobi_parametrization_gives_the_same_elbo_for_mapped_parameters(backend, rng):
    X, Za, Zb, y = rng.normal(size=(20, 2)), rng.normal(size=(8, 2)), rng.normal(size=(4, 2)), rng.normal(size=20)
    a, L = rng.normal(size=8), lower(rng, 4)
    kern = ("matern52", [0.9, 1.1], 2.5)  # variance != 1 so that the scaling matters
    direct = make(backend, Za, Zb, kern, a=a, L=L, name="direct")
    jacobi = make(backend, Za, Zb, kern, "jacobi", a=2.5 * a, L=2.5 * L, name="jacobi")
    assert elbo(backend, gaussian_model(backend, jacobi), X, y) == pytest.approx(
        elbo(backend, gaussian_model(backend, direct), X, y), rel=1e-11)


# ---------------------------------------------------------------- 15. framework plumbing


def test_svi_loss_equals_hand_computed_elbo(backend, rng):
    """External minibatch with num_data: -loss = N / B sum_b E_q log p(y_b | f_b) - KL (dense)."""
    X, Za, Zb, y = rng.normal(size=(30, 2)), rng.normal(size=(10, 2)), rng.normal(size=(4, 2)), rng.normal(size=30)
    a, L = rng.normal(size=10), lower(rng, 4)
    model = gaussian_model(backend, make(backend, Za, Zb, a=a, L=L), num_data=30)
    idx = np.arange(4, 12)
    mean, cov = ref.decoupled_predict(k(X[idx], Za), a, k(X[idx], Zb), L @ L.T, k(Zb, Zb), k(X[idx], X[idx]))
    expected = 30 / 8 * ref.gaussian_ell(NOISE)(y[idx], mean, np.diag(cov)).sum() - ref.decoupled_kl_R(
        a, k(Za, Za), L @ L.T, k(Zb, Zb))
    for mean_field in (False, True):
        loss = backend.loss(model.model, model.guide, backend.array(X[idx]), backend.array(y[idx]), mean_field=mean_field)
        assert -loss == pytest.approx(expected, rel=1e-10)


def test_embedded_in_a_user_model_the_f_sites_are_masked_and_the_kl_enters_once(backend, rng):
    X, Za, Zb = rng.normal(size=(30, 2)), rng.normal(size=(10, 2)), rng.normal(size=(4, 2))
    y = rng.normal(size=30)
    gp = make(backend, Za, Zb, a=rng.normal(size=10), L=lower(rng, 4))
    full = elbo(backend, gaussian_model(backend, gp), X, y)
    model, guide = backend.user_model(gp, NOISE, subsample_size=10)
    nodes = backend.trace(guide, backend.array(X), backend.array(y))
    assert "gp.u" not in nodes and "gp.kl" not in nodes and "gp.f" in nodes
    estimates = -backend.losses(model, guide, backend.array(X), backend.array(y), replicates=2000)
    z = (estimates.mean() - full) / (estimates.std() / np.sqrt(len(estimates)))
    assert abs(z) < 4.0, z


# ---------------------------------------------------------------- multi-output, growth, the rest of the library


def test_independent_outputs_match_one_model_per_output(backend, rng):
    X, Za, Zb = rng.normal(size=(12, 2)), rng.normal(size=(7, 2)), rng.normal(size=(3, 2))
    ls, var = rng.uniform(0.5, 1.5, size=(3, 2)), rng.uniform(0.5, 2.0, size=3)
    a, L = rng.normal(size=(3, 7)), np.stack([lower(rng, 3) for _ in range(3)])
    kern = backend.lib.RBF(lengthscale=backend.array(ls), variance=backend.array(var))
    gp = make(backend, Za, Zb, kern, num_latent=3, a=a, L=L)
    mean, variance = moments(backend, gp, X)
    assert mean.shape == variance.shape == (12, 3)
    total = 0.0
    for i in range(3):
        kern_i = ("rbf", ls[i], var[i])
        m, c = ref.decoupled_predict(k(X, Za, kern_i), a[i], k(X, Zb, kern_i), L[i] @ L[i].T, k(Zb, Zb, kern_i), k(X, X, kern_i))
        np.testing.assert_allclose(mean[:, i], m, rtol=1e-10)
        np.testing.assert_allclose(variance[:, i], np.diag(c), rtol=1e-10)
        total += ref.decoupled_kl_R(a[i], k(Za, Za, kern_i), L[i] @ L[i].T, k(Zb, Zb, kern_i))
    assert kl(backend, gp) == pytest.approx(total, rel=1e-10)


def test_growing_bases_with_masks(backend, rng):
    X, Za, Zb = rng.normal(size=(10, 2)), rng.normal(size=(8, 2)), rng.normal(size=(4, 2))
    # L is any square matrix (not triangular): the inactive columns of the active rows count too
    a, L = rng.normal(size=8), lower(rng, 4) + np.triu(rng.normal(size=(4, 4)) * 0.5, 1)
    grown = make(backend, Za, Zb, active_alpha=3, active_beta=2, a=a, L=L, name="grown")
    small = make(backend, Za[:3], Zb[:2], a=a[:3], L=L[:2, :2], name="small")
    assert kl(backend, grown) == pytest.approx(kl(backend, small), rel=1e-12)
    for x, y in zip(moments(backend, grown, X), moments(backend, small, X)):
        np.testing.assert_allclose(x, y, rtol=1e-12)
    new = grown.add_basis(backend.array(X), 3)  # Pyro: also written into the module
    masks = [backend.numpy(new[f"grown.{key}_mask"]) for key in ("alpha", "beta")]
    np.testing.assert_array_equal(masks[0], [1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(masks[1], [1, 1, 1, 1])  # the fifth point does not fit: dropped
    np.testing.assert_allclose(backend.numpy(new["grown.Z_alpha"])[3:6], X[:3])
    np.testing.assert_allclose(backend.numpy(new["grown.Z_beta"])[2:], X[:2])
    np.testing.assert_allclose(backend.numpy(new["grown.Z_alpha"])[:3], Za[:3])
    if backend.name == "numpyro":  # pure and jittable; the result substitutes the parameters
        import jax
        from numpyro import handlers

        jitted = jax.jit(grown.add_basis, static_argnums=1)(backend.array(X), 3)
        for name in new:
            np.testing.assert_array_equal(np.asarray(jitted[name]), np.asarray(new[name]))
        bound = handlers.substitute(grown.bind, data=new)()
    else:
        bound = grown  # the module was updated in place
    post = bound.posterior()
    expected = make(backend, np.vstack([Za[:3], X[:3]]), np.vstack([Zb[:2], X[:2]]), a=a[:6], L=L, name="expected")
    assert float(backend.numpy(post.kl())) == pytest.approx(kl(backend, expected), rel=1e-12)
    # inactive coefficients get no gradient
    g = {name: grad for name, grad in zip(("Z_alpha", "Z_beta", "a", "L", "alpha_mask", "beta_mask"), masked_gradients(backend, grown))}
    assert np.all(g["a"][6:] == 0) and np.any(g["a"][:6] != 0) and np.all(g["alpha_mask"] == 0)


def masked_gradients(backend, gp):
    """Gradients of the KL with respect to Z_alpha, Z_beta, a, L and the masks."""
    names = ("Z_alpha", "Z_beta", "a", "L", "alpha_mask", "beta_mask")
    if backend.name == "pyro":
        import torch

        from pyro_sparsegp.params import active

        with active(gp):
            tensors = [getattr(gp, n).unconstrained() for n in names]  # what the KL reads
            value = gp.posterior().kl()
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
        return [np.zeros(t.shape) if g is None else backend.numpy(g) for g, t in zip(grads, tensors)]
    import jax
    from numpyro import handlers

    values = {f"{gp.name}.{n}": getattr(gp, n) for n in names}
    values = {**values, **gp.add_basis(jax.numpy.zeros((3, 2)), 3)}

    def fn(v):
        return handlers.substitute(gp.bind, data=v)().posterior().kl()

    grads = jax.grad(fn)(values)
    return [np.asarray(grads[f"{gp.name}.{n}"]) for n in names]


def test_fit_predict_sample_and_arviz_work_unchanged(backend, rng):
    X = rng.uniform(-3, 3, size=(60, 1))
    y = np.sinc(X[:, 0]) + 0.1 * rng.normal(size=60)
    gp = make(backend, X[:20], X[:5], kernel=("rbf", [0.8], 1.2))  # one lengthscale: 1-D inputs
    model = gaussian_model(backend, gp, noise=0.05)
    Xa, ya = backend.array(X), backend.array(y)
    result = backend.lib.fit(model.model, model.guide, (Xa, ya), num_steps=60, batch_size=20, lr=0.05, progress=False)
    assert result.losses[-10:].mean() < result.losses[:10].mean()
    assert {"gp.a", "gp.L", "gp.Z_alpha", "gp.Z_beta"} <= set(result.params)
    pred = model.predict_y(Xa[:7], quantiles=(0.1, 0.9), params=result.params)
    mean, var = (backend.numpy(t) for t in model.predict_f(Xa[:7], params=result.params))
    noise = backend.numpy(result.params["likelihood.variance"])
    np.testing.assert_allclose(backend.numpy(pred.variance), var + noise, rtol=1e-10)
    assert np.all(backend.numpy(pred.quantiles)[0] < mean) and np.all(mean < backend.numpy(pred.quantiles)[1])
    draws = backend.numpy(model.sample_f(Xa[:7], num_samples=4000, params=result.params))
    assert np.abs(draws.mean(0) - mean).max() < 5 * np.sqrt(var.max() / 4000) + 1e-6
    idata = backend.lib.to_inference_data(model, data=(Xa, ya), num_samples=8, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 4, 60)
    assert "gp.f" in idata.posterior and "gp.u" not in idata.posterior


def test_bad_arguments_are_named(backend, rng):
    Za, Zb = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    with pytest.raises(ValueError, match="parametrization"):
        make(backend, Za, Zb, parametrization="canonical")
    with pytest.raises(ValueError, match="kl_subsample_size"):
        make(backend, Za, Zb, kl_subsample_size=7)
    with pytest.raises(ValueError, match="kl_chunk_size"):
        make(backend, Za, Zb, kl_chunk_size=0)
    with pytest.raises(ValueError, match="Z_beta"):
        make(backend, Za, rng.normal(size=(3, 3)))
    with pytest.raises(ValueError, match="active_alpha"):
        make(backend, Za, Zb, active_alpha=7)
    with pytest.raises(ValueError, match="active_alpha"):
        make(backend, Za, Zb, parametrization="hybrid", active_alpha=2)
    with pytest.raises(ValueError, match="add_basis"):
        make(backend, Za, Zb).add_basis(backend.array(Za), 2)
    with pytest.raises(ValueError, match="num_new"):
        make(backend, Za, Zb, active_beta=1, name="g2").add_basis(backend.array(Za[:2]), 3)


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("parametrization", ["direct", "jacobi", "hybrid"])
@pytest.mark.parametrize("num_latent", [None, 2])
def test_pyro_and_numpyro_agree(parametrization, num_latent):
    rng = np.random.default_rng(5)
    X, Za, Zb, y = rng.normal(size=(25, 2)), rng.normal(size=(11, 2)), rng.normal(size=(4, 2)), rng.normal(size=25)
    shape = () if num_latent is None else (num_latent,)
    values = {"a": rng.normal(size=shape + (11,))}
    factors = np.stack([lower(rng, 4) for _ in range(num_latent or 1)]).reshape(shape + (4, 4))
    if parametrization == "hybrid":
        values.update(q_mu=rng.normal(size=shape + (4,)), q_sqrt=factors)
    else:
        values["L"] = factors
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        gp = make(backend, Za, Zb, ("matern52", [0.7, 1.4], 1.3), parametrization, num_latent=num_latent,
                  kl_chunk_size=3, **values)
        Xa = backend.array(X)
        out = [kl(backend, gp)] + moments(backend, gp, X) + [moments(backend, gp, X, True)[1]]
        if num_latent is None:
            model = gaussian_model(backend, gp)
            out += [elbo(backend, model, X, y), -backend.loss(model.model, model.guide, Xa, backend.array(y))]
        results.append(out)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)
