"""QSGP on the kernel basis at inducing points (``Phi = K(X, Z)``, ``S = K(Z, Z) + jitter I``:
Evans and Nair, 2020, App. I.2, and Proposition 4's augmented prediction, App. G), in both
backends: q(f), the KL (a dense S) and the ELBO against the dense weight-space reference, the
augmentation's variance, the loss unbiased for the exact negative ELBO, the kernel held out of
the gradient, training through ``fit``, bad input."""
import numpy as np
import pytest
import reference as ref
from test_qsgp_model import REPLICATES, _adagrad, _estimates, _tables, control_variate_estimates

M, K, D, JITTER, NOISE = 7, 2, 2, 0.05, 0.3
LENGTHSCALE, VARIANCE = [0.9, 1.4], 1.3


def _problem(backend, rng, num_dense=K, n=9, augment_noise=None, relevance=False):
    """A QSGP on ``M`` inducing points with random q tables (and precisions, ``relevance``), its
    GPModel, data, and the dense ``Phi`` ``(n, m)``, ``S`` ``(m, m)`` and ``C`` ``(m, m)``."""
    lib = backend.lib
    X, y, Z = rng.normal(size=(n, D)), rng.normal(size=n), rng.normal(size=(M, D))
    kernel = backend.kernel("matern32", LENGTHSCALE, VARIANCE)
    prior = lib.QSGP(kernel, inducing_points=backend.array(Z), num_dense=num_dense, jitter=JITTER,
                     augment_noise=augment_noise, relevance=relevance)
    q_mu, log_diag = rng.normal(size=M) * 0.5, rng.normal(size=M) * 0.3 - 0.5
    dense = rng.normal(size=(M, num_dense)) * 0.4
    backend.set(prior, q_mu=q_mu, q_log_diag=log_diag, q_dense=dense)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=NOISE))
    Phi = ref.kernel("matern32", X, Z, LENGTHSCALE, VARIANCE)
    S = ref.kernel("matern32", Z, Z, LENGTHSCALE, VARIANCE) + JITTER * np.eye(M)
    if relevance:
        log_precision = rng.normal(size=M)
        backend.set(prior, log_precision=log_precision)
        S = np.diag(np.exp(log_precision))
    C = ref.chevron_factor(log_diag, dense)
    return model, X, y, Z, Phi, S, C, q_mu


@pytest.mark.parametrize("num_dense,relevance", [(0, False), (K, False), (M, False), (K, True)])
def test_marginals_kl_and_elbo_against_the_dense_reference(backend, rng, num_dense, relevance, monkeypatch):
    """``q(f(X)) = N(K_xZ mu, K_xZ C C^T K_Zx)``, the KL is against ``N(0, S^-1)`` with the dense
    ``S`` (over blocks of its rows too) or the relevance vector machine's ``diag(s)``, and the
    GPModel's ELBO is Eq. 2 with that ``S``."""
    from sparsegp_common.priors import qsgp

    model, X, y, Z, Phi, S, C, q_mu = _problem(backend, rng, num_dense, relevance=relevance)
    mean, cov = (backend.numpy(a) for a in model.predict_f(backend.array(X), full_cov=True))
    np.testing.assert_allclose(mean, Phi @ q_mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov, Phi @ C @ C.T @ Phi.T, rtol=1e-10, atol=1e-12)
    expected_kl = ref.gaussian_kl(q_mu, C @ C.T, np.zeros(M), np.linalg.inv(S))
    for block in (qsgp.BLOCK, 3):
        monkeypatch.setattr(qsgp, "BLOCK", block)
        kl = backend.numpy(backend.bound(model.prior).posterior().kl())
        assert float(kl) == pytest.approx(expected_kl, rel=1e-10)
    expected = -ref.weight_space_negative_elbo(Phi, S, y, NOISE, q_mu, C)
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-10)


def test_augmented_prediction(backend, rng):
    """Proposition 4: the variance gains ``k_xx^2 / (|k_xZ|^2 / noise + k_xx)`` (never lowering
    it), which far from ``Z`` brings it back to the prior's ``k_xx`` where the plain one
    collapses to 0; the mean is unchanged; ``predict_y`` adds the noise to it."""
    model, X, y, Z, Phi, S, C, q_mu = _problem(backend, rng, augment_noise=NOISE)
    far = np.vstack([X, [[40.0, -40.0]]])
    Phi = ref.kernel("matern32", far, Z, LENGTHSCALE, VARIANCE)
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(far)))
    plain = np.sum((Phi @ C) ** 2, axis=1)
    added = VARIANCE**2 / (np.sum(Phi**2, axis=1) / NOISE + VARIANCE)
    np.testing.assert_allclose(mean, Phi @ q_mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, plain + added, rtol=1e-10)
    assert plain[-1] < 1e-12 and var[-1] == pytest.approx(VARIANCE, rel=1e-10)
    _, cov = model.predict_f(backend.array(far), full_cov=True)
    np.testing.assert_allclose(np.diag(backend.numpy(cov)), var, rtol=1e-10)
    var_y = backend.numpy(model.predict_y(backend.array(far)).variance)
    np.testing.assert_allclose(var_y, var + NOISE, rtol=1e-10)


@pytest.mark.parametrize("relevance", [False, True])
def test_loss_is_unbiased(backend, rng, relevance):
    """z-test over replicates: the quadruply stochastic loss with the dense ``S`` (its quadratic
    forms over pairs of the two basis sets, ``log|S|`` exact), or with the relevance vector
    machine's learnt diagonal one, has the exact negative ELBO as its mean."""
    model, X, y, *_ = _problem(backend, rng, relevance=relevance)
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3)
    values = _estimates(backend, model, X, y, loss, REPLICATES[backend.name])
    exact = -float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    z = (values.mean() - exact) / (values.std() / np.sqrt(len(values)))
    assert abs(z) < 4, (values.mean(), exact, z)
    assert values.std() > 1e-3 * abs(exact)


def test_nystrom_control_variate(backend, rng, monkeypatch):
    """App. F.2: with the dense ``S`` the support rows add ``Psi = L^-1 K(X_p, Z)``, whose pair
    cancels the noise of the prior quadratics: an inducing point at each of 40 inputs, 10 support
    rows, 8 basis indices per set, a large noise variance (so that the prior's terms dominate
    the noise): the loss stays unbiased (z-test) and its standard deviation is under a fifth of
    that with the data rows' pair alone (0.21 against 4.5 in Pyro), itself below that without
    control variates (5.0)."""
    from sparsegp_common.objectives import control_variates

    lib, n = backend.lib, 40
    X = np.sort(rng.uniform(0, 4, size=(n, 1)), axis=0)
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    prior = lib.QSGP(backend.kernel("rbf", [0.7], 1.0), inducing_points=backend.array(X), jitter=1e-4)
    backend.set(prior, q_mu=0.3 * rng.normal(size=n), q_log_diag=np.full(n, -1.5))
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=100.0))
    Xa, ya = backend.array(X), backend.array(y)
    exact = -float(backend.numpy(model.elbo(Xa, ya)))
    replicates = REPLICATES[backend.name] // 2

    def estimates(**options):
        return control_variate_estimates(backend, model, lib.QuadruplyStochasticELBO(num_basis=8, **options), Xa, ya,
                                         replicates)[0]

    nystrom = estimates(control_variates=Xa[::4])
    z = (nystrom.mean() - exact) / (nystrom.std() / np.sqrt(replicates))
    assert abs(z) < 4, (nystrom.mean(), exact, z)
    monkeypatch.setattr(control_variates, "support", lambda X, basis: control_variates.Support(X, basis))
    if backend.name == "numpyro":  # the first state's compiled program, kept from above, has the Nystrom rows
        from numpyro_sparsegp import compiled

        monkeypatch.setattr(compiled, "_programs", {})
    data_only = estimates(control_variates=Xa[::4])
    plain = _estimates(backend, model, Xa, ya, lib.QuadruplyStochasticELBO(num_basis=8), replicates)
    print(nystrom.std(), data_only.std(), plain.std())
    assert nystrom.std() < data_only.std() < plain.std()


@pytest.mark.parametrize("relevance", [False, True])
def test_what_is_held(rng, relevance):
    """Pyro: with the dense ``S`` neither the loss nor the exact ELBO differentiates the kernel's
    hyperparameters or ``Z`` (``log|S|`` is a constant), while the noise and the q tables get
    gradients; the relevance vector machine holds only ``Z`` and learns its precisions and the kernel."""
    import torch
    from backends import BACKENDS

    backend = BACKENDS["pyro"]()
    backend.reset()
    model, X, y, *_ = _problem(backend, rng, relevance=relevance)
    Xt, yt = backend.array(X), backend.array(y)
    named = dict(model.named_parameters())
    for value in (-model.elbo(Xt, yt), backend.lib.QuadruplyStochasticELBO(num_basis=3)(model.model, model.guide, Xt, yt)):
        grads = dict(zip(named, torch.autograd.grad(value, list(named.values()), allow_unused=True)))
        held = [name for name in named if name.startswith("prior.Z") or ("kernel" in name and not relevance)]
        assert len(held) == (1 if relevance else 3) and all(grads[name] is None for name in held), held
        assert all(grads[name] is not None for name in named if name not in held)


@pytest.mark.parametrize("relevance", [False, True])
def test_set_optimal_diagonal(backend, rng, relevance):
    """Proposition 1: the diagonal columns' ``C_rr^2 = 1 / (|phi_r(X)|^2 / noise + S_rr)``, over
    several blocks of functions and rows; the dense columns' entries are left; at that optimum
    the exact ELBO's gradient w.r.t. those ``log C_rr`` is zero."""
    from sparsegp_common.priors import qsgp

    model, X, y, Z, Phi, S, C, q_mu = _problem(backend, rng, relevance=relevance)
    before = backend.numpy(backend.bound(model.prior).q_log_diag).copy()
    X = rng.normal(size=(11, D))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qsgp, "BLOCK", 3)
        model.prior.set_optimal_diagonal(backend.array(X), NOISE)
    after = backend.numpy(backend.bound(model.prior).q_log_diag)
    Phi = ref.kernel("matern32", X, Z, LENGTHSCALE, VARIANCE)
    np.testing.assert_allclose(after[K:], -0.5 * np.log(np.sum(Phi**2, axis=0) / NOISE + np.diag(S))[K:], rtol=1e-12)
    np.testing.assert_array_equal(after[:K], before[:K])
    C[np.arange(K, M), np.arange(K, M)] = np.exp(after[K:])

    def negative_elbo(log_c):
        D_ = C.copy()
        D_[np.arange(K, M), np.arange(K, M)] = np.exp(log_c)
        return ref.weight_space_negative_elbo(Phi, S, np.zeros(len(X)), NOISE, q_mu, D_)

    step = 1e-5
    for r in range(M - K):
        shifted = [after[K:].copy() for _ in range(2)]
        shifted[0][r] += step
        shifted[1][r] -= step
        assert abs(negative_elbo(shifted[0]) - negative_elbo(shifted[1])) / (2 * step) < 1e-6


def _sine(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, 1))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def test_fit_with_inducing_points_at_every_training_input(backend):
    """``fit`` by rows (AdaGrad on the q tables, the data and Nystrom control variates on 50
    support rows) with an inducing point at every training input, ``m = n = 200``: the posterior
    mean approaches the sine (RMSE below 0.1 from 0.7 at the prior), the kernel stays where it
    was, and the augmented variance returns to the prior's away from the data."""
    lib = backend.lib
    X, y = _sine()
    Xt = np.linspace(0.5, 9.5, 50)[:, None]
    prior = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), inducing_points=backend.array(X), augment_noise=0.01)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.01), num_data=len(X))
    options = {} if backend.name == "pyro" else {"momentum": 0.0}
    groups = [{"params": f"gp.{name}", "optimizer": _adagrad(backend), "lr": lr, **options}
              for name, lr in (("q_mu", 0.05), ("q_log_diag", 0.5), ("q_dense", 0.05))]
    loss = lib.QuadruplyStochasticELBO(num_basis=100, control_variates=backend.array(X[::4]))
    result = lib.fit(model.model, model.guide, (backend.array(X), backend.array(y)), num_steps=600, batch_size=100,
                     lr=0.01, progress=False, loss=loss, param_groups=groups)
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(np.vstack([Xt, [[30.0]]]))))
    rmse = np.sqrt(np.mean((mean[:-1] - np.sin(Xt[:, 0])) ** 2))
    assert rmse < 0.1, rmse
    assert var[-1] == pytest.approx(1.0, rel=1e-6) and var[:-1].max() < 0.5, var
    assert float(backend.numpy(result.params["gp.kernel.lengthscale"])[0]) == pytest.approx(1.0, rel=1e-12)


def test_arviz_export(backend, rng):
    """``to_inference_data`` after a short ``fit`` by rows (the kernel basis; the export reads
    every basis through the same posterior): the pointwise log-likelihood of every row and draws
    of ``f`` (QSGP has no global site ``u``: ``w`` is integrated out)."""
    lib = backend.lib
    X, y = _sine(60)
    Xa, ya = backend.array(X), backend.array(y)
    kernel = backend.kernel("rbf", [1.0], 1.0)
    prior = lib.QSGP(kernel, inducing_points=Xa, jitter=1e-4)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.05), num_data=60)
    result = lib.fit(model.model, model.guide, (Xa, ya), num_steps=20, batch_size=30, lr=0.01, progress=False,
                     loss=lib.QuadruplyStochasticELBO(num_basis=10), param_groups=_tables(backend, lr=0.1))
    idata = lib.to_inference_data(model, data=(Xa, ya), num_samples=8, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 4, 60)
    assert set(idata.posterior.data_vars) == {"gp.f"} and idata.posterior["gp.f"].shape == (2, 4, 60)
    assert np.isfinite(idata.log_likelihood["y"].values).all()


def test_q_starts_at_the_prior_scale(backend, rng):
    """``C_ii = S_ii^(-1/2)`` at the start: ``S = K(Z, Z) + jitter I``'s diagonal with inducing
    points, 1 for the relevance vector machine's ``s = exp(0)`` and for random Fourier features."""
    lib = backend.lib
    Z = rng.normal(size=(M, D))
    kernel = backend.kernel("matern32", LENGTHSCALE, VARIANCE)
    S = ref.kernel("matern32", Z, Z, LENGTHSCALE, VARIANCE) + JITTER * np.eye(M)
    dense = lib.QSGP(kernel, inducing_points=backend.array(Z), jitter=JITTER, name="dense")
    np.testing.assert_allclose(backend.numpy(backend.bound(dense).q_log_diag), -0.5 * np.log(np.diag(S)), rtol=1e-12)
    for prior in (lib.QSGP(kernel, inducing_points=backend.array(Z), relevance=True, name="rvm"),
                  lib.QSGP(kernel, M, D, name="rff")):
        np.testing.assert_array_equal(backend.numpy(backend.bound(prior).q_log_diag), np.zeros(M))


class _FixedKernel:
    """Just what ``_factor`` reads: a kernel matrix given outright."""

    lengthscale, variance = np.ones(1), np.asarray(1.0)

    def __init__(self, K):
        self.K = K

    def K_at(self, Z, Z2, lengthscale, variance):
        return self.K


@pytest.mark.parametrize("smallest", [-5e-6, -5e-5])
def test_factor_raises_the_jitter_up_to_three_times(smallest):
    """``K(Z, Z) + jitter I`` with eigenvalues ``(1, 0.5, smallest)`` and ``jitter = 0``: the levels
    ``1e-7``, ``1e-6`` and ``1e-5`` (``1e-8 variance`` raised tenfold, three times) are tried in
    turn; -5e-6 factorises at the third with a warning, -5e-5 at none."""
    from sparsegp_common.linalg import CholeskyError
    from sparsegp_common.priors.qsgp import _factor

    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]
    K = Q @ np.diag([1.0, 0.5, smallest]) @ Q.T
    if smallest < -1e-5:
        with pytest.raises(CholeskyError):
            _factor(_FixedKernel(K), np.zeros((3, 1)), 0.0, np.asarray)
        return
    with pytest.warns(UserWarning, match="1e-05 I instead"):
        L, level, _ = _factor(_FixedKernel(K), np.zeros((3, 1)), 0.0, np.asarray)
    assert level == pytest.approx(1e-5)
    np.testing.assert_allclose(L @ L.T, K + 1e-5 * np.eye(3), rtol=1e-10, atol=1e-14)


def test_bad_arguments(backend, rng):
    lib = backend.lib
    kernel = backend.kernel("rbf", [1.0], 1.0)
    Z = backend.array(rng.normal(size=(5, 2)))
    with pytest.raises(TypeError, match="num_features and input_dim"):
        lib.QSGP(kernel, 5)
    with pytest.raises(ValueError, match="num_features=4 but inducing_points has 5 rows"):
        lib.QSGP(kernel, 4, inducing_points=Z)
    with pytest.raises(ValueError, match="inducing_points has 2 input dimensions"):
        lib.QSGP(kernel, input_dim=3, inducing_points=Z)
    with pytest.raises(ValueError, match="augment_noise is for inducing_points"):
        lib.QSGP(kernel, 5, 2, augment_noise=0.1)
    with pytest.raises(ValueError, match="augment_noise must be positive"):
        lib.QSGP(kernel, inducing_points=Z, augment_noise=0.0)
    for bad in ({}, {"inducing_points": Z, "augment_noise": 0.1}):
        with pytest.raises(ValueError, match="relevance=True takes inducing_points"):
            lib.QSGP(kernel, 5, 2, relevance=True, **bad) if not bad else lib.QSGP(kernel, relevance=True, **bad)
    with pytest.raises(ValueError, match="num_basis .* needs a diagonal prior precision"):
        lib.QSGP(kernel, inducing_points=Z, num_basis=3)
    with pytest.raises(ValueError, match="num_basis must be a positive integer"):
        lib.QSGP(kernel, inducing_points=Z, relevance=True, num_basis=0)
    with pytest.raises(TypeError, match="relevance must be True or False"):
        lib.QSGP(kernel, inducing_points=Z, relevance=1)
    with pytest.raises(ValueError, match="jitter"):
        lib.QSGP(kernel, inducing_points=Z, jitter=-1.0)
    with pytest.raises(ValueError, match="inducing_points contains NaN"):
        lib.QSGP(kernel, inducing_points=backend.array([[0.0, np.nan]]))
    with pytest.raises(TypeError, match="stationary kernel"):
        lib.QSGP(lib.Sum(kernel, backend.kernel("rbf", [2.0], 1.0)), inducing_points=Z)
    with pytest.warns(UserWarning, match="not numerically positive definite"):  # coincident inputs, no jitter
        coincident = lib.QSGP(kernel, inducing_points=backend.array(np.zeros((3, 2))), jitter=0.0)
    assert 0 < coincident.jitter <= 1e-5
    bernoulli = lib.GPModel(lib.QSGP(kernel, inducing_points=Z), lib.Bernoulli())
    X, labels = backend.array(rng.normal(size=(4, 2))), backend.array([0.0, 1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="diagonal prior precision"):
        if backend.name == "pyro":
            lib.QuadruplyStochasticELBO(num_basis=2)(bernoulli.model, bernoulli.guide, X, labels)
        else:
            import jax

            _, params = _params(backend, bernoulli, X, labels)
            lib.QuadruplyStochasticELBO(num_basis=2).loss(jax.random.PRNGKey(0), params, bernoulli.model,
                                                          bernoulli.guide, X, labels)


def _params(backend, model, X, y):
    from numpyro import handlers

    with handlers.trace() as trace, handlers.seed(rng_seed=0):
        model.model(X, y)
    return trace, {k: s["value"] for k, s in trace.items() if s["type"] == "param"}
