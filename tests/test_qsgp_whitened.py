"""QSGP on the whitened kernel basis (``whiten=True``: ``phi(x) = L^-1 k(Z, x)``, ``S = I``), in
both backends: the features (rows of the factor at ``Z``, a solve elsewhere, inside ``jit`` too),
q(f), the KL and the ELBO against the dense weight-space reference, the same prior as the dense
``S``, the loss unbiased (with control variates too), ``fit`` by rows reaching the exact GP's mean
where the kernel functions themselves crawl, float32, bad input."""
import contextlib

import numpy as np
import pytest
import reference as ref
from test_qsgp_inducing import _sine
from test_qsgp_model import REPLICATES, _adagrad, _estimates, control_variate_estimates

M, K, D, JITTER, NOISE = 7, 2, 2, 0.05, 0.3
LENGTHSCALE, VARIANCE = [0.9, 1.4], 1.3


def _problem(backend, rng, num_dense=K, augment_noise=None):
    """A whitened QSGP on ``M`` inducing points with random q tables, its GPModel, inputs whose
    first rows are ``Z``'s (in another order, one repeated) and the rest new, targets, and the
    dense ``Phi`` ``(n, m)``, ``C`` ``(m, m)``, ``q_mu`` and ``Z``'s factor ``L``."""
    lib = backend.lib
    Z = rng.normal(size=(M, D))
    X = np.vstack([Z[[4, 0, 2, 2, 6]], rng.normal(size=(4, D))])
    y = rng.normal(size=len(X))
    prior = lib.QSGP(backend.kernel("matern32", LENGTHSCALE, VARIANCE), inducing_points=backend.array(Z),
                     num_dense=num_dense, jitter=JITTER, augment_noise=augment_noise, whiten=True)
    q_mu, log_diag = rng.normal(size=M) * 0.5, rng.normal(size=M) * 0.3 - 0.5
    dense = rng.normal(size=(M, num_dense)) * 0.4
    backend.set(prior, q_mu=q_mu, q_log_diag=log_diag, q_dense=dense)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=NOISE))
    L = np.linalg.cholesky(ref.kernel("matern32", Z, Z, LENGTHSCALE, VARIANCE) + JITTER * np.eye(M))
    return model, X, y, _features(L, Z, X), ref.chevron_factor(log_diag, dense), q_mu, L


def _features(L, Z, X):
    """``phi(X) = L^-1 (k(Z, X) + jitter [z = x])`` ``(n, m)``: the kernel with the nugget that
    ``K(Z, Z) + jitter I`` has, so that ``phi(z_l) = L[l]``."""
    same = np.all(Z[:, None, :] == X[None, :, :], axis=-1)
    return np.linalg.solve(L, ref.kernel("matern32", Z, X, LENGTHSCALE, VARIANCE) + JITTER * same).T


def test_features_are_rows_of_the_factor_at_Z_and_a_solve_elsewhere(backend, rng):
    """``phi(z_l) = L[l]`` (read from the factor, repeated inputs too; the kernel with ``K(Z, Z) +
    jitter I``'s nugget) and ``phi(x) = L^-1 k(Z, x)`` at new inputs, mixed in one call, with repeated and unsorted basis indices; the same under
    ``jax.jit``."""
    model, X, y, Phi, C, q_mu, L = _problem(backend, rng)
    np.testing.assert_allclose(Phi[:5], L[[4, 0, 2, 2, 6]], rtol=1e-12, atol=1e-14)  # the reference's own check
    basis = backend.bound(model.prior).basis
    I = backend.array(np.array([5, 0, 3, 3, 6]), dtype=np.int64)
    expected = Phi[:, [5, 0, 3, 3, 6]]
    np.testing.assert_allclose(backend.numpy(basis.features(backend.array(X), I)), expected, rtol=1e-10, atol=1e-12)
    if backend.name == "numpyro":
        import jax

        jitted = jax.jit(lambda X, I: basis.features(X, I))(backend.array(X), I)
        np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_dense", [0, K, M])
def test_marginals_kl_and_elbo_against_the_dense_reference(backend, rng, num_dense):
    """``q(f(X)) = N(Phi mu, Phi C C^T Phi^T)`` with the rotated features, the KL against
    ``N(0, I)``, the ELBO Eq. 2 with ``S = I`` (``log|S| = 0``), and Proposition 4's variance from
    ``|k(x, Z)|^2``, not ``|phi(x)|^2``."""
    model, X, y, Phi, C, q_mu, L = _problem(backend, rng, num_dense)
    mean, cov = (backend.numpy(a) for a in model.predict_f(backend.array(X), full_cov=True))
    np.testing.assert_allclose(mean, Phi @ q_mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov, Phi @ C @ C.T @ Phi.T, rtol=1e-10, atol=1e-12)
    kl = float(backend.numpy(backend.bound(model.prior).posterior().kl()))
    assert kl == pytest.approx(ref.gaussian_kl(q_mu, C @ C.T, np.zeros(M), np.eye(M)), rel=1e-10)
    expected = -ref.weight_space_negative_elbo(Phi, np.eye(M), y, NOISE, q_mu, C)
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-10)
    augmented, X, y, Phi, C, q_mu, L = _problem(backend, np.random.default_rng(0), num_dense, augment_noise=NOISE)
    cross = ref.kernel("matern32", X, backend.numpy(augmented.prior.Z), LENGTHSCALE, VARIANCE)
    added = VARIANCE**2 / (np.sum(cross**2, axis=1) / NOISE + VARIANCE)
    var = backend.numpy(augmented.predict_f(backend.array(X))[1])
    np.testing.assert_allclose(var, np.sum((Phi @ C) ** 2, axis=1) + added, rtol=1e-10)


def test_same_prior_and_optimum_as_the_dense_basis(backend, rng):
    """Rotating the basis changes neither the model nor its best ``q`` (away from ``Z``, where
    the whitened features carry the jitter's nugget): at each basis's exact optimum (the Bayesian linear regression posterior) the ELBOs are equal (both the log marginal
    likelihood of ``N(0, K_XZ S^-1 K_ZX + noise I)``) and so are the predictive means."""
    lib = backend.lib
    Z = rng.normal(size=(M, D))
    X, y, Xt = rng.normal(size=(M + 3, D)), rng.normal(size=M + 3), rng.normal(size=(5, D))
    kernel = backend.kernel("matern32", LENGTHSCALE, VARIANCE)
    S = ref.kernel("matern32", Z, Z, LENGTHSCALE, VARIANCE) + JITTER * np.eye(M)
    out = []
    for whiten in (False, True):
        prior = lib.QSGP(kernel, inducing_points=backend.array(Z), num_dense=M, jitter=JITTER, whiten=whiten)
        Phi = ref.kernel("matern32", X, Z, LENGTHSCALE, VARIANCE)
        if whiten:
            Phi = np.linalg.solve(np.linalg.cholesky(S), Phi.T).T
        Sigma = np.linalg.inv(Phi.T @ Phi / NOISE + (np.eye(M) if whiten else S))
        backend.set(prior, q_mu=Sigma @ Phi.T @ y / NOISE, **_chevron_tables(np.linalg.cholesky(Sigma)))
        model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=NOISE))
        out.append((float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))),
                    backend.numpy(model.predict_f(backend.array(Xt))[0])))
    prior_cov = ref.kernel("matern32", X, Z, LENGTHSCALE, VARIANCE) @ np.linalg.solve(
        S, ref.kernel("matern32", Z, X, LENGTHSCALE, VARIANCE)) + NOISE * np.eye(len(X))
    evidence = -0.5 * (y @ np.linalg.solve(prior_cov, y) + np.linalg.slogdet(2 * np.pi * prior_cov)[1])
    assert out[0][0] == pytest.approx(evidence, rel=1e-9) and out[1][0] == pytest.approx(evidence, rel=1e-9)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-8, atol=1e-10)


def _chevron_tables(C):
    """``q_log_diag`` and ``q_dense`` of a full (``num_dense = m``) chevron factor ``C``."""
    return {"q_log_diag": np.log(np.diag(C)), "q_dense": np.tril(C, -1)}


@pytest.mark.parametrize("control", [False, True])
def test_loss_is_unbiased(backend, rng, control):
    """z-test over replicates: the quadruply stochastic loss on rows of ``Z`` (the factor's rows),
    with its diagonal ``S`` read as single-index sums, and with the data control variates on
    support rows of ``Z``, has the exact negative ELBO as its mean."""
    model, X, y, *_ = _problem(backend, rng, num_dense=0 if control else K)
    X, y = X[:5], y[:5]
    exact = -float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    replicates = REPLICATES[backend.name]
    if control:
        loss = backend.lib.QuadruplyStochasticELBO(num_basis=3, control_variates=backend.array(X[1:4]))
        values = control_variate_estimates(backend, model, loss, backend.array(X), backend.array(y), replicates // 2)[0]
    else:
        values = _estimates(backend, model, X, y, backend.lib.QuadruplyStochasticELBO(num_basis=3), replicates)
    z = (values.mean() - exact) / (values.std() / np.sqrt(len(values)))
    assert abs(z) < 4, (values.mean(), exact, z)
    assert values.std() > 1e-3 * abs(exact)


def _fit_sine(backend, whiten, steps):
    """``fit`` by rows (AdaGrad 0.3 on the q tables) with an inducing point at each of 100 inputs of
    a sine, noise 0.001 (held): the RMSE of the posterior mean at the inputs from the exact GP's."""
    lib = backend.lib
    X, y = _sine(100)
    prior = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), inducing_points=backend.array(X), jitter=1e-6, whiten=whiten)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.001), num_data=len(X))
    prior.set_optimal_diagonal(backend.array(X), 0.001)
    options = {} if backend.name == "pyro" else {"momentum": 0.0}
    groups = [{"params": "gp.q_*", "optimizer": _adagrad(backend), "lr": 0.3, **options},
              {"params": "*", "lr_schedule": lambda t: 0.0}]
    # every row and basis index each step (without replacement): the exact gradient, no noise
    loss = lib.QuadruplyStochasticELBO(num_basis=len(X), replacement=False)
    lib.fit(model.model, model.guide, (backend.array(X), backend.array(y)), num_steps=steps, progress=False, loss=loss,
            param_groups=groups)
    K = ref.kernel("rbf", X, X, [1.0], 1.0)
    exact = K @ np.linalg.solve(K + 0.001 * np.eye(len(X)), y)
    return np.sqrt(np.mean((backend.numpy(model.predict_f(backend.array(X))[0]) - exact) ** 2))


def test_fit_reaches_the_exact_mean_where_the_kernel_functions_crawl(backend):
    """The point of the rotation: with a small noise the mean's curvature ``K (K + noise I) /
    noise`` on the kernel functions spans many more decades than ``K / noise + I`` on the whitened
    ones, so that the same AdaGrad steps on the exact gradient bring the whitened posterior mean near the exact GP's
    while the kernel functions' stays far from it."""
    whitened, dense = _fit_sine(backend, True, 200), _fit_sine(backend, False, 200)
    assert whitened < 0.015 and dense > 3 * whitened, (whitened, dense)  # 0.0099 and 0.050


def test_bad_arguments(backend):
    lib, kernel = backend.lib, backend.kernel("rbf", [1.0], 1.0)
    Z = backend.array(np.zeros((3, 1)) + np.arange(3)[:, None])
    with pytest.raises(TypeError, match="whiten must be True or False"):
        lib.QSGP(kernel, inducing_points=Z, whiten=1)
    with pytest.raises(ValueError, match="whiten=True takes inducing_points, without relevance"):
        lib.QSGP(kernel, 4, 1, whiten=True)
    with pytest.raises(ValueError, match="whiten=True takes inducing_points, without relevance"):
        lib.QSGP(kernel, inducing_points=Z, whiten=True, relevance=True)


def test_pyro_captured_step_runs_the_host_reads_traced():
    """Pyro's captured step (``fit(compiled=True)``) cannot record a read of the host's factor (the
    recording would keep one batch's features for every replay): it warns and runs traced, with
    the traced step's losses."""
    import pyro
    import torch

    import pyro_sparsegp as psg

    X, y = (torch.as_tensor(a) for a in _sine(60))
    losses = {}
    for compiled in (False, True):
        pyro.clear_param_store()
        torch.manual_seed(0)
        prior = psg.QSGP(psg.RBF(lengthscale=torch.tensor([1.0])), inducing_points=X, whiten=True)
        model = psg.GPModel(prior, psg.Gaussian(variance=torch.tensor(0.01)), num_data=len(X))
        with pytest.warns(RuntimeWarning, match="computation on the host cannot be recorded") if compiled else \
                contextlib.nullcontext():
            losses[compiled] = psg.fit(model.model, model.guide, (X, y), num_steps=5, batch_size=30, progress=False,
                                       compiled=compiled).losses
    np.testing.assert_array_equal(losses[True], losses[False])
