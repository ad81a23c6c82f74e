"""Deep basis kernels against dense float64 references (spec deep-basis-kernel.md, section 6)."""
import contextlib
import importlib
import itertools
import logging

import numpy as np
import pytest
from scipy import stats

import reference as ref
from backends import NumPyroBackend, PyroBackend

NOISE = 0.05


def dbk(backend):
    return importlib.import_module(f"{backend.lib.__name__}.dbk")


# ---------------------------------------------------------------- networks with known weights


def layer_shapes(arch, D, r, hidden, depth):
    inner = [(hidden, hidden)] * (depth - 1 if arch == "mlp" else depth)
    return [(hidden, D)] + inner + [(r, hidden)]


def random_weights(rng, arch, D, r, hidden=6, depth=2, scale=0.8):
    return [(rng.normal(size=(o, i)) * scale / np.sqrt(i), rng.normal(size=o) * 0.3)
            for o, i in layer_shapes(arch, D, r, hidden, depth)]


def np_features(arch, weights, X):
    """The networks' formulas in NumPy."""
    (W0, b0), *inner, (Wo, bo) = weights
    h = X @ W0.T + b0
    if arch == "mlp":
        h = np.tanh(h)
        for W, b in inner:
            h = np.tanh(h @ W.T + b)
    else:
        for W, b in inner:
            h = h + np.tanh(h @ W.T + b)
    return h @ Wo.T + bo


def make_net(backend, arch, weights):
    """An MLP or ResNet of the backend holding ``weights``, float64."""
    D, r, hidden, depth = weights[0][0].shape[1], weights[-1][0].shape[0], weights[0][0].shape[0], len(weights) - 2
    cls = {"mlp": dbk(backend).MLP, "resnet": dbk(backend).ResNet}[arch]
    if backend.name == "pyro":
        import torch

        net = cls(D, rank=r, hidden=hidden, depth=depth + (arch == "mlp"), dtype=torch.float64)
        with torch.no_grad():
            for layer, (W, b) in zip(layers(arch, net), weights):
                layer.weight.copy_(torch.as_tensor(W))
                layer.bias.copy_(torch.as_tensor(b))
        return net
    import equinox as eqx
    import jax.numpy as jnp

    net = cls(D, rank=r, hidden=hidden, depth=depth + (arch == "mlp"), dtype=jnp.float64)
    where = lambda n: [layer.weight for layer in layers(arch, n)] + [layer.bias for layer in layers(arch, n)]  # noqa: E731
    return eqx.tree_at(where, net, [jnp.asarray(W) for W, _ in weights] + [jnp.asarray(b) for _, b in weights])


def layers(arch, net):
    if arch == "mlp":
        return list(net.hidden) + [net.head]
    return [net.input] + list(net.blocks) + [net.head]


def f64(backend):
    if backend.name == "pyro":
        import torch

        return torch.float64
    import jax.numpy as jnp

    return jnp.float64


def feats(backend, net, X):
    return backend.numpy(net(backend.array(X)))


def lower(rng, r, scale=0.4):
    return np.tril(rng.normal(size=(r, r)) * scale, -1) + np.diag(rng.uniform(0.3, 1.0, r))


def svdbk(backend, weights, arch="mlp", q_mu=None, q_sqrt=None, name="gp", **options):
    prior = dbk(backend).SVDBK(make_net(backend, arch, weights), name=name, **options)
    values = {k: v for k, v in (("q_mu", q_mu), ("q_sqrt", q_sqrt)) if v is not None}
    return backend.set(prior, **values)


def gaussian_model(backend, prior, noise=NOISE, num_data=None):
    return backend.lib.GPModel(prior, backend.set(backend.lib.Gaussian(), variance=noise), num_data=num_data)


def exact(backend, weights, arch="mlp", noise=NOISE, **options):
    return backend.set(dbk(backend).ExactDBK(make_net(backend, arch, weights), **options), noise=noise)


def scalar(backend, value):
    return float(backend.numpy(value))


def corrected(Phi, Phi_star=None, M=None):
    """The correction ``c`` at the training rows and (optionally) the test rows, NumPy."""
    d = (Phi**2).sum(-1)
    M = d.max() if M is None else M
    c = np.maximum(M, d) - d
    if Phi_star is None:
        return c
    d_star = (Phi_star**2).sum(-1)
    return c, np.maximum(M, d_star) - d_star


# ---------------------------------------------------------------- networks


@pytest.mark.parametrize("arch", ["mlp", "resnet"])
def test_networks_compute_their_formulas(backend, rng, arch):
    weights = random_weights(rng, arch, D=3, r=4)
    X = rng.normal(size=(7, 3))
    np.testing.assert_allclose(feats(backend, make_net(backend, arch, weights), X), np_features(arch, weights, X), rtol=1e-12)
    net = getattr(dbk(backend), {"mlp": "MLP", "resnet": "ResNet"}[arch])(3, dtype=f64(backend))  # the paper's sizes
    assert (net.input_dim, net.rank) == (3, 128)
    assert feats(backend, net, X).shape == (7, 128)
    assert feats(backend, dbk(backend).MLP(3, rank=1, dtype=f64(backend)), X).shape == (7, 1)



def test_kernel_variance_scales_the_features_and_is_learned(backend, rng):
    """``variance`` v: phi = sqrt(v) net, in every formula of both models, and a parameter of its own."""
    weights = random_weights(rng, "resnet", D=2, r=3)
    X, y = rng.normal(size=(10, 2)), rng.normal(size=10)
    Phi = np.sqrt(0.3) * np_features("resnet", weights, X)
    model = exact(backend, weights, "resnet", variance=0.3)
    expected = ref.exact_lml(Phi @ Phi.T, y, NOISE) - corrected(Phi).sum() / (2 * NOISE)
    assert scalar(backend, model.objective(backend.array(X), backend.array(y))) == pytest.approx(expected, rel=1e-10)
    prior = svdbk(backend, weights, "resnet", variance=0.3)
    M = scalar(backend, prior.calibrate(backend.array(X)).max_sq_norm)
    assert M == pytest.approx((Phi**2).sum(-1).max(), rel=1e-12)
    np.testing.assert_allclose(backend.numpy(prior.prior_variance(backend.array(X))), np.full(10, M), rtol=1e-12)
    # d objective / d variance against central differences of the dense reference
    def reference(v):
        P = np.sqrt(v) * np_features("resnet", weights, X)
        return ref.exact_lml(P @ P.T, y, NOISE) - corrected(P).sum() / (2 * NOISE)

    expected = (reference(0.3 * (1 + 1e-6)) - reference(0.3 * (1 - 1e-6))) / (0.6e-6)
    assert objective_gradient(backend, model, X, y, "dbk.variance", 0.3) == pytest.approx(expected, rel=1e-6)
    result = backend.lib.fit(model.model, model.guide, (backend.array(X), backend.array(y)), num_steps=3, lr=0.01,
                             progress=False)
    assert scalar(backend, result.params["dbk.variance"]) != pytest.approx(0.3, rel=1e-4)
    backend.reset()
    for bad, error in ((0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), ("big", TypeError)):
        with pytest.raises(error, match="variance"):
            dbk(backend).SVDBK(dbk(backend).MLP(2, rank=3), variance=bad, name="bad")


def objective_gradient(backend, model, X, y, name, value):
    """d model.objective(X, y) / d ``name`` at ``value``, for a positive parameter ``name``."""
    if backend.name == "pyro":
        import pyro
        import torch

        setattr(model, name.split(".", 1)[1], torch.tensor(value, dtype=torch.float64))
        with pyro.poutine.trace(param_only=True) as tr:
            objective = model.objective(backend.array(X), backend.array(y))
        log_value = tr.trace.nodes[name]["value"].unconstrained()  # value = exp(log_value)
        return float(torch.autograd.grad(objective, log_value)[0]) / value
    import jax
    from numpyro import handlers

    def objective(v):
        with handlers.substitute(data={name: v}):
            return model.objective(backend.array(X), backend.array(y))

    return float(jax.grad(objective)(backend.array(value)))


# ---------------------------------------------------------------- 1.-3. exact low-rank algebra


@pytest.mark.parametrize("n, r", [(12, 3), (12, 1), (5, 8)])
@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_lowrank_lml_equals_dense_and_lowrank_mvn(backend, rng, n, r, heteroscedastic):
    Phi, y = rng.normal(size=(n, r)), rng.normal(size=n)
    noise = rng.uniform(0.01, 0.5, n) if heteroscedastic else 0.03
    dense = stats.multivariate_normal.logpdf(y, np.zeros(n), Phi @ Phi.T + np.diag(np.broadcast_to(noise, n)))
    value = scalar(backend, dbk(backend).lowrank_lml(backend.array(Phi), backend.array(y), backend.array(noise)))
    assert value == pytest.approx(dense, rel=1e-10)
    if backend.name == "pyro":
        import pyro.distributions as dist
    else:
        import numpyro.distributions as dist
    cov_diag = backend.array(np.broadcast_to(noise, n))
    library = dist.LowRankMultivariateNormal(backend.array(np.zeros(n)), backend.array(Phi), cov_diag).log_prob(backend.array(y))
    assert scalar(backend, library) == pytest.approx(dense, rel=1e-10)
    # the weight posterior: Woodbury and the determinant lemma in its terms
    mean, R = (backend.numpy(a) for a in dbk(backend).weight_posterior(backend.array(Phi), backend.array(y), backend.array(noise)))
    S_inv = np.diag(1 / np.broadcast_to(noise, n))
    np.testing.assert_allclose(R @ R.T, Phi.T @ S_inv @ Phi + np.eye(r), rtol=1e-12)
    np.testing.assert_allclose(mean, np.linalg.solve(Phi.T @ S_inv @ Phi + np.eye(r), Phi.T @ S_inv @ y), rtol=1e-10)


def test_lml_at_the_noise_bound_with_a_well_fit_target(backend, rng):
    """sigma^2 = 1e-6 and y almost in the span of Phi: y^T S^-1 y - |R^-1 b|^2 cancels about 7
    digits; the result still matches the residual form of spec 5.2, computed densely."""
    n, r, noise = 40, 5, 1e-6
    Phi = rng.normal(size=(n, r))
    y = Phi @ rng.normal(size=r) + 1e-3 * rng.normal(size=n)
    A = Phi.T @ Phi / noise + np.eye(r)
    m = np.linalg.solve(A, Phi.T @ y / noise)
    quad = ((y - Phi @ m) ** 2).sum() / noise + (m**2).sum()
    stable = -0.5 * (n * np.log(2 * np.pi) + n * np.log(noise) + np.linalg.slogdet(A)[1] + quad)
    assert (y**2).sum() / noise > 1e6 * quad  # the cancellation is real
    value = scalar(backend, dbk(backend).lowrank_lml(backend.array(Phi), backend.array(y), backend.array(noise)))
    assert value == pytest.approx(stable, rel=1e-9)


@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_pyro_blocked_moments_value_and_gradient(rng, monkeypatch, heteroscedastic):
    """The Pyro LML accumulates Phi^T Phi, Phi^T y and |phi_n|^2 over blocks of rows with its own
    backward pass: blocks of 4 rows (the last one short) against the dense LML, torch's gradcheck
    of the blocked function, and the corrected objective's gradient (with a kernel variance that
    scales the moments, not Phi) against autograd of the direct formula."""
    import torch

    from pyro_sparsegp import dbk as lib
    from sparsegp_common.ops import _torch as ops
    from sparsegp_common.priors import dbk as core

    monkeypatch.setattr(ops, "MOMENT_CHUNK", 4)
    n, r = 11, 3
    Phi, y = rng.normal(size=(n, r)), rng.normal(size=n)
    noise = rng.uniform(0.05, 0.5, n) if heteroscedastic else 0.07
    dense = stats.multivariate_normal.logpdf(y, np.zeros(n), Phi @ Phi.T + np.diag(np.broadcast_to(noise, n)))
    P, t, s = (torch.tensor(v, requires_grad=True) for v in (Phi, y, np.asarray(noise, dtype=float)))
    assert float(lib.lowrank_lml(P, t, s).detach()) == pytest.approx(dense, rel=1e-12)
    assert torch.autograd.gradcheck(lambda P, t: ops._Moments.apply(P, t), (P, t))
    assert torch.autograd.gradcheck(lambda P, t, s: lib.lowrank_lml(P, t, s), (P, t, s))
    # the trace penalty takes |phi_n|^2 from the same pass: compare with the direct formula
    v = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    *moments, sq = core._stats(P, t, s, v)
    value = core._lml(*moments, n) - lib.trace_penalty(sq, 0.07)
    direct = lib.lowrank_lml(P * v.sqrt(), t, s) - lib.trace_penalty(((P * v.sqrt()) ** 2).sum(-1), 0.07)
    assert float(value) == pytest.approx(float(direct), rel=1e-12)
    grads = torch.autograd.grad(value, (P, t, s, v))
    for got, want in zip(grads, torch.autograd.grad(direct, (P, t, s, v))):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_gradient_matches_the_closed_form(backend, rng):
    """Spec A.1: d log p / d Phi = -Sigma^-1 Phi + Sigma^-1 y y^T Sigma^-1 Phi."""
    Phi, y, noise = rng.normal(size=(9, 3)), rng.normal(size=9), 0.2
    if backend.name == "pyro":
        import torch

        P = torch.as_tensor(Phi).requires_grad_()
        grad = torch.autograd.grad(dbk(backend).lowrank_lml(P, torch.as_tensor(y), noise), P)[0].numpy()
    else:
        import jax

        grad = np.asarray(jax.grad(lambda P: dbk(backend).lowrank_lml(P, backend.array(y), noise))(backend.array(Phi)))
    Sigma_inv = np.linalg.inv(Phi @ Phi.T + noise * np.eye(9))
    np.testing.assert_allclose(grad, -Sigma_inv @ Phi + Sigma_inv @ np.outer(y, y) @ Sigma_inv @ Phi, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- exact DBK: objective, trace bound, predictive


@pytest.mark.parametrize("arch, variance", [("mlp", 1.0), ("resnet", 1.0), ("resnet", 0.3)])
def test_exact_dbk_objective_and_model_loss(backend, rng, arch, variance):
    weights = random_weights(rng, arch, D=2, r=4)
    X, y = rng.normal(size=(15, 2)), rng.normal(size=15)
    Phi = np.sqrt(variance) * np_features(arch, weights, X)
    lml = ref.exact_lml(Phi @ Phi.T, y, NOISE)
    trace = corrected(Phi).sum() / (2 * NOISE)
    for correction in (True, False):
        backend.reset()
        model = exact(backend, weights, arch, variance=variance, variance_correction=correction)
        Xa, ya = backend.array(X), backend.array(y)
        assert scalar(backend, model.log_marginal_likelihood(Xa, ya)) == pytest.approx(lml, rel=1e-10)
        expected = lml - trace if correction else lml
        assert scalar(backend, model.objective(Xa, ya)) == pytest.approx(expected, rel=1e-10)
        assert -backend.loss(model.model, model.guide, Xa, ya) == pytest.approx(expected, rel=1e-10)
    assert trace > 0


def test_trace_bound_and_trace_term(backend, rng):
    """Eq. 11 for the paper's diagonal C and a random PSD C; the term is >= 0, zero iff the norms
    are equal (features [cos g, sin g]), and the minibatch form with b = n is the full one."""
    Phi, y, noise = rng.normal(size=(10, 3)), rng.normal(size=10), 0.1
    lml = ref.exact_lml(Phi @ Phi.T, y, noise)
    c = corrected(Phi)
    lib = dbk(backend)
    corrected_lml = scalar(backend, lib.lowrank_lml(backend.array(Phi), backend.array(y), backend.array(noise + c)))
    assert corrected_lml == pytest.approx(ref.exact_lml(Phi @ Phi.T + np.diag(c), y, noise), rel=1e-10)
    penalty = scalar(backend, lib.trace_penalty(backend.array((Phi**2).sum(-1)), noise))
    assert penalty == pytest.approx(c.sum() / (2 * noise), rel=1e-12)
    assert corrected_lml >= lml - penalty
    for seed in range(5):
        B = np.random.default_rng(seed).normal(size=(10, 4))
        C = B @ B.T * 0.1
        assert ref.exact_lml(Phi @ Phi.T + C, y, noise) >= lml - np.trace(C) / (2 * noise)
    g = rng.normal(size=10)
    unit = backend.array(np.stack([np.cos(g), np.sin(g)], -1))
    assert scalar(backend, lib.trace_penalty((unit**2).sum(-1), noise)) == pytest.approx(0.0, abs=1e-12)
    sq = backend.array((Phi**2).sum(-1))
    np.testing.assert_allclose(backend.numpy(lib.correction(sq)), c, rtol=1e-14)
    assert np.all(backend.numpy(lib.correction(sq)) >= 0)


@pytest.mark.parametrize("arch, variance", [("mlp", 1.0), ("resnet", 1.0), ("resnet", 2.5)])
def test_exact_predictive_equals_dense_computation(backend, rng, arch, variance):
    """Eq. 6 without, eq. 12 (D-weighted mean, prior variance max(M, d*)) with correction."""
    weights = random_weights(rng, arch, D=2, r=3)
    X, y, Xs = rng.normal(size=(14, 2)), rng.normal(size=14), rng.normal(size=(6, 2)) * 2
    Phi, Phis = (np.sqrt(variance) * np_features(arch, weights, A) for A in (X, Xs))
    c, c_star = corrected(Phi, Phis)
    results = {}
    for correction in (False, True):
        backend.reset()
        model = exact(backend, weights, arch, variance=variance, variance_correction=correction)
        posterior = model.calibrate(backend.array(X), backend.array(y))
        pred = posterior.predict_y(backend.array(Xs), quantiles=(0.1, 0.9), batch_size=4)
        mean_f, var_f = (backend.numpy(a) for a in posterior.predict_f(backend.array(Xs), batch_size=4))
        K, kss = Phi @ Phi.T, (Phis**2).sum(-1)
        if correction:  # the dense GP with K + diag(c) and test prior variance |phi*|^2 + c* = max(M, d*)
            K, kss = K + np.diag(c), kss + c_star
        mean, var = ref.dense_gp_predict(K, Phis @ Phi.T, kss, y, NOISE)
        np.testing.assert_allclose(mean_f, mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(var_f, var, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(backend.numpy(pred.variance), var + NOISE, rtol=1e-9)
        np.testing.assert_allclose(backend.numpy(pred.quantiles)[1], mean + 1.2815515655446004 * np.sqrt(var + NOISE), rtol=1e-8)
        results[correction] = var_f
    assert np.all(results[True] >= results[False] - 1e-12) and np.any(results[True] > results[False] + 1e-6)
    assert np.all(np.maximum((Phis**2).sum(-1), (Phi**2).sum(-1).max()) >= results[True])  # below the prior


# ---------------------------------------------------------------- SVDBK: ELBO, optimum, predictive


@pytest.mark.parametrize("variance", [1.0, 0.3])
def test_elbo_is_eq8_and_the_corrected_elbo_subtracts_the_trace_term(backend, rng, variance):
    weights = random_weights(rng, "mlp", D=2, r=4)
    X, y = rng.normal(size=(12, 2)), rng.normal(size=12)
    m, L = rng.normal(size=4), lower(rng, 4)
    Phi = np.sqrt(variance) * np_features("mlp", weights, X)
    eq8 = ref.dbk_elbo(Phi, y, m, L @ L.T, NOISE)
    plain = gaussian_model(backend, svdbk(backend, weights, q_mu=m, q_sqrt=L, variance=variance, variance_correction=False,
                                          name="plain"))
    assert scalar(backend, plain.elbo(backend.array(X), backend.array(y))) == pytest.approx(eq8, rel=1e-10)
    backend.reset()
    model = gaussian_model(backend, svdbk(backend, weights, q_mu=m, q_sqrt=L, variance=variance))
    value = scalar(backend, model.elbo(backend.array(X), backend.array(y)))
    assert value == pytest.approx(eq8 - corrected(Phi).sum() / (2 * NOISE), rel=1e-10)
    assert -backend.loss(model.model, model.guide, backend.array(X), backend.array(y)) == pytest.approx(value, rel=1e-10)
    # the corrected SVI objective is at most the corrected exact log marginal likelihood
    assert value <= ref.exact_lml(Phi @ Phi.T + np.diag(corrected(Phi)), y, NOISE)


def test_elbo_below_lml_with_equality_at_the_weight_posterior(backend, rng):
    """log p(y) - ELBO = KL[q || p(w | y)]; at q = p(w | y) the marginals are eq. 6."""
    weights = random_weights(rng, "mlp", D=2, r=3)
    X, y, Xs = rng.normal(size=(10, 2)), rng.normal(size=10), rng.normal(size=(5, 2))
    Phi = np_features("mlp", weights, X)
    lml = ref.exact_lml(Phi @ Phi.T, y, NOISE)
    Lam = Phi.T @ Phi + NOISE * np.eye(3)
    m_star, S_star = np.linalg.solve(Lam, Phi.T @ y), NOISE * np.linalg.inv(Lam)
    for i, (m, S) in enumerate([(m_star, S_star)] + [(rng.normal(size=3), (lambda L: L @ L.T)(lower(rng, 3))) for _ in range(3)]):
        backend.reset()
        model = gaussian_model(backend, svdbk(backend, weights, q_mu=m, q_sqrt=np.linalg.cholesky(S),
                                              variance_correction=False, name=f"gp{i}"))
        value = scalar(backend, model.elbo(backend.array(X), backend.array(y)))
        assert lml - value == pytest.approx(ref.gaussian_kl(m, S, m_star, S_star), rel=1e-8, abs=1e-9)
        if i == 0:
            mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(Xs)))
            Phis = np_features("mlp", weights, Xs)
            exp_mean, exp_var = ref.dense_gp_predict(Phi @ Phi.T, Phis @ Phi.T, (Phis**2).sum(-1), y, NOISE)
            np.testing.assert_allclose(mean, exp_mean, rtol=1e-9)
            np.testing.assert_allclose(var, exp_var, rtol=1e-8)
        else:
            assert value < lml - 1e-6


def test_corrected_svi_predictive_uses_the_training_max(backend, rng, caplog):
    """``calibrate`` returns a new object that predicts with M over the training inputs; the prior
    is unchanged, and NumPyro compiles the predictions once for every calibration (M is traced)."""
    weights = random_weights(rng, "resnet", D=2, r=3)
    X, Xs = rng.normal(size=(20, 2)), rng.normal(size=(7, 2)) * 3
    m, L = rng.normal(size=3), lower(rng, 3)
    prior = svdbk(backend, weights, "resnet", q_mu=m, q_sqrt=L)
    model = gaussian_model(backend, prior)
    before = backend.numpy(model.predict_y(backend.array(Xs)).variance)  # uncalibrated: M over the rows given
    Phi, Phis = np_features("resnet", weights, X), np_features("resnet", weights, Xs)
    d_star = (Phis**2).sum(-1)
    np.testing.assert_allclose(before, ((Phis @ L) ** 2).sum(-1) + NOISE + d_star.max() - d_star, rtol=1e-10)
    compiles = []  # NumPyro's compile log of the second calibration's predictions
    for second, rows in enumerate((X, X[:5])):  # two calibrations: two values of M
        if second and backend.name == "numpyro":
            import jax

            log = contextlib.ExitStack()
            log.enter_context(jax.log_compiles())
            log.enter_context(caplog.at_level(logging.WARNING))
        calibrated = prior.calibrate(backend.array(rows), batch_size=6)
        M = (np_features("resnet", weights, rows) ** 2).sum(-1).max()
        assert scalar(backend, calibrated.max_sq_norm) == pytest.approx(M, rel=1e-12)
        pred = backend.lib.predict_y(calibrated, model.likelihood, backend.array(Xs), batch_size=3)
        c_star = np.maximum(M, d_star) - d_star
        np.testing.assert_allclose(backend.numpy(pred.mean), Phis @ m, rtol=1e-10)
        np.testing.assert_allclose(backend.numpy(pred.variance), ((Phis @ L) ** 2).sum(-1) + NOISE + c_star, rtol=1e-10)
        cov = backend.numpy(backend.lib.predict_f(calibrated, backend.array(Xs), full_cov=True)[1])
        np.testing.assert_allclose(cov, Phis @ L @ L.T @ Phis.T + np.diag(c_star), rtol=1e-10, atol=1e-12)
        if second and backend.name == "numpyro":
            log.close()
            compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(_compiled_")]
    assert compiles == []  # the second calibration reused the programs of the first
    np.testing.assert_allclose(backend.numpy(model.predict_y(backend.array(Xs)).variance), before)


def test_poisson_likelihood_uses_the_corrected_marginals(backend, rng):
    weights = random_weights(rng, "mlp", D=1, r=3)
    X, y = rng.uniform(-1, 1, size=(9, 1)), rng.poisson(2.0, size=9).astype(float)
    m, L = rng.normal(size=3) * 0.3, lower(rng, 3, 0.2) * 0.5
    model = backend.lib.GPModel(svdbk(backend, weights, q_mu=m, q_sqrt=L), backend.lib.Poisson())
    Phi = np_features("mlp", weights, X)
    var = ((Phi @ L) ** 2).sum(-1) + corrected(Phi)
    expected = ref.poisson_exp_ell(y, Phi @ m, var).sum() - ref.gaussian_kl(m, L @ L.T, np.zeros(3), np.eye(3))
    assert scalar(backend, model.elbo(backend.array(X), backend.array(y))) == pytest.approx(expected, rel=1e-10)


# ---------------------------------------------------------------- 8. and 17. minibatches and plates


def test_minibatch_elbo_is_unbiased_and_the_kl_unscaled(backend, rng):
    """Averaged over all subsets of size b, (n / b) sum_B (data terms) - KL is the full ELBO."""
    weights = random_weights(rng, "mlp", D=2, r=3)
    X, y = rng.normal(size=(7, 2)), rng.normal(size=7)
    model = gaussian_model(backend, svdbk(backend, weights, q_mu=rng.normal(size=3), q_sqrt=lower(rng, 3),
                                          variance_correction=False), num_data=7)
    full = scalar(backend, model.elbo(backend.array(X), backend.array(y)))
    subsets = list(itertools.combinations(range(7), 3))
    values = [scalar(backend, model.elbo(backend.array(X[list(s)]), backend.array(y[list(s)]))) for s in subsets]
    assert np.mean(values) == pytest.approx(full, rel=1e-11)
    assert np.std(values) > 1.0


def test_plate_scales_the_data_sites_but_not_w(backend, rng):
    weights = random_weights(rng, "mlp", D=2, r=3)
    X, y = rng.normal(size=(10, 2)), rng.normal(size=10)
    prior = svdbk(backend, weights)
    model, guide = weight_space_pair(backend, prior, NOISE, subsample_size=4)
    nodes = backend.trace(model, backend.array(X), backend.array(y))
    scale = lambda site: 1.0 if nodes[site]["scale"] is None else float(nodes[site]["scale"])  # noqa: E731
    assert scale("gp.w") == 1.0
    assert scale("y") == scale("gp.eps") == pytest.approx(10 / 4)
    backend.reset()
    gp_model = gaussian_model(backend, svdbk(backend, weights, name="gp2"))
    nodes = backend.trace(gp_model.model, backend.array(X), backend.array(y), subsample_size=4)
    assert float(nodes["y"]["scale"]) == pytest.approx(10 / 4)
    assert nodes["gp2.kl"]["scale"] in (None, 1.0)


def weight_space_pair(backend, prior, noise, subsample_size=None):
    """A user's model around :meth:`SVDBK.weight_model`: ``y ~ N(f, noise)`` in the data plate."""
    if backend.name == "pyro":
        import pyro as ppl
    else:
        import numpyro as ppl

    def plate(X):
        return ppl.plate("data", len(X), subsample_size=subsample_size)

    def model(X, y):
        data = plate(X)
        f = prior.weight_model(X, data)
        with data as idx:
            ppl.sample("y", ppl.distributions.Normal(f, noise**0.5), obs=y[idx])

    def guide(X, y):
        prior.weight_guide(X, plate(X))

    return model, guide


def test_weight_model_adds_the_mean_function_and_the_scaled_correction(backend, rng):
    """With ``w`` and ``eps`` given, ``f = Phi w + m(X) + sqrt(c) eps`` at every row."""
    weights = random_weights(rng, "mlp", D=2, r=3)
    X, w, eps = rng.normal(size=(6, 2)), rng.normal(size=3), rng.normal(size=6)
    mean = backend.lib.Linear(backend.array([0.4, -1.1]), bias=0.3)
    prior = svdbk(backend, weights, mean_function=mean)
    f = backend.handlers.condition(prior.weight_model, data={"gp.w": backend.array(w), "gp.eps": backend.array(eps)})
    Phi = np_features("mlp", weights, X)
    sq = np.sum(Phi**2, axis=1)
    expected = Phi @ w + 0.3 + X @ [0.4, -1.1] + np.sqrt(sq.max() - sq) * eps
    np.testing.assert_allclose(backend.numpy(f(backend.array(X))), expected, rtol=1e-10)


def test_trace_elbo_with_sampled_w_estimates_the_closed_form_bound(backend, rng):
    weights = random_weights(rng, "mlp", D=2, r=3)
    X, y = rng.normal(size=(12, 2)), rng.normal(size=12) * 0.3
    prior = svdbk(backend, weights, q_mu=rng.normal(size=3) * 0.3, q_sqrt=lower(rng, 3) * 0.5)
    closed = scalar(backend, gaussian_model(backend, prior, noise=0.3).elbo(backend.array(X), backend.array(y)))
    model, guide = weight_space_pair(backend, prior, 0.3)
    estimates = -backend.losses(model, guide, backend.array(X), backend.array(y), replicates=500)
    assert estimates.std() > 0.1
    z = (estimates.mean() - closed) / (estimates.std() / np.sqrt(len(estimates)))
    assert abs(z) < 4.0, z


# ---------------------------------------------------------------- 14. rotation invariance


def test_rotating_the_basis_changes_nothing(backend, rng):
    weights = random_weights(rng, "mlp", D=2, r=3)
    Q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    (Wo, bo) = weights[-1]
    rotated = weights[:-1] + [(Q.T @ Wo, Q.T @ bo)]  # phi -> Q^T phi, i.e. Phi -> Phi Q
    X, y, Xs = rng.normal(size=(11, 2)), rng.normal(size=11), rng.normal(size=(4, 2))
    np.testing.assert_allclose(np_features("mlp", rotated, X), np_features("mlp", weights, X) @ Q, rtol=1e-10, atol=1e-13)
    m, L = rng.normal(size=3), lower(rng, 3)
    out = []
    for i, (w, mean, factor) in enumerate([(weights, m, L), (rotated, Q.T @ m, np.linalg.cholesky(Q.T @ L @ L.T @ Q))]):
        backend.reset()
        model = exact(backend, w)
        posterior = model.calibrate(backend.array(X), backend.array(y))
        svi = gaussian_model(backend, svdbk(backend, w, q_mu=mean, q_sqrt=factor, name=f"gp{i}"))
        out.append([scalar(backend, model.objective(backend.array(X), backend.array(y))),
                    scalar(backend, svi.elbo(backend.array(X), backend.array(y))),
                    *[backend.numpy(a) for a in posterior.predict_f(backend.array(Xs))]])
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-9)


# ---------------------------------------------------------------- 13. Theorem 1


def test_theorem_1_rank_one_kernel_is_optimal(backend):
    """With sigma^2 known, Sigma* = f f^T + sigma^2 I maximises the expected log marginal likelihood
    and minimises the expected error of the posterior mean; the closed forms match Monte Carlo
    averages of the library's low-rank formulas over y ~ N(f, sigma^2 I)."""
    rng = np.random.default_rng(3)
    n, noise = 6, 0.1
    f = rng.normal(size=n)
    lml_fn, posterior_fn = dbk(backend).lowrank_lml, dbk(backend).weight_posterior
    if backend.name == "numpyro":  # hundreds of eager calls: compile once
        import jax

        lml_fn, posterior_fn = jax.jit(lml_fn), jax.jit(posterior_fn)
    ys = f + np.sqrt(noise) * rng.normal(size=(200, n))
    for Phi in (f[:, None], rng.normal(size=(n, 2))):
        lml = [scalar(backend, lml_fn(backend.array(Phi), backend.array(y), noise)) for y in ys[:200]]
        Sigma = Phi @ Phi.T + noise * np.eye(n)
        assert np.mean(lml) == pytest.approx(ref.expected_lml(Sigma, f, noise), abs=4 * np.std(lml) / np.sqrt(200))
        errors = []
        for y in ys[:200]:
            mean, _ = posterior_fn(backend.array(Phi), backend.array(y), noise)
            errors.append(np.sum((f - Phi @ backend.numpy(mean)) ** 2))
        expected_error = ref.expected_squared_error(Sigma, f, noise)
        assert np.mean(errors) == pytest.approx(expected_error, abs=4 * np.std(errors) / np.sqrt(200))
    best = np.outer(f, f) + noise * np.eye(n)
    for seed in range(30):
        r = np.random.default_rng(100 + seed)
        B = r.normal(size=(n, r.integers(1, 4))) * r.uniform(0.05, 1.0)
        others = [np.outer(f, f) + B @ B.T + noise * np.eye(n), B @ B.T + noise * np.eye(n)]
        for Sigma in others:
            assert ref.expected_lml(Sigma, f, noise) < ref.expected_lml(best, f, noise)
            assert ref.expected_squared_error(Sigma, f, noise) > ref.expected_squared_error(best, f, noise)


# ---------------------------------------------------------------- 15. log-Gaussian Cox process (A.5)


class DenseQ:
    """``q(f)`` of an uncorrected SVDBK from NumPy features, for ``reference.cox_elbo``."""

    def __init__(self, weights, m, L):
        self.weights, self.m, self.S = weights, m, L @ L.T

    def predict(self, X):
        Phi = np_features("mlp", self.weights, X)
        return Phi @ self.m, Phi @ self.S @ Phi.T

    def kl(self):
        return ref.gaussian_kl(self.m, self.S, np.zeros(len(self.m)), np.eye(len(self.m)))


def test_cox_process_with_the_svdbk_prior(backend, rng):
    weights = random_weights(rng, "mlp", D=1, r=3, scale=0.5)
    m, L = rng.normal(size=3) * 0.3, lower(rng, 3, 0.2) * 0.4
    events = np.sort(rng.uniform(0, 2, size=(25, 1)), axis=0)
    prior = svdbk(backend, weights, q_mu=m, q_sqrt=L, variance_correction=False)
    cox = backend.lib.CoxProcess(prior, [[0.0, 2.0]], backend.lib.GaussLegendre(64), offset=2.0)
    expected = ref.cox_elbo(DenseQ(weights, m, L), events, [(0.0, 2.0)], offset=2.0)
    assert scalar(backend, cox.elbo(backend.array(events))) == pytest.approx(expected, rel=1e-9)
    # the log-normal mean E_q exp(w^T phi) = exp(m^T phi + |L^T phi|^2 / 2), against Monte Carlo
    Xs = np.linspace(0, 2, 5)[:, None]
    mean, var = (backend.numpy(a) for a in prior.predict_f(backend.array(Xs)))
    w = m + rng.normal(size=(200000, 3)) @ L.T
    mc = np.exp(w @ np.asarray(np_features("mlp", weights, Xs)).T).mean(0)
    np.testing.assert_allclose(np.exp(mean + var / 2), mc, rtol=2e-3)
    # phi = 0 and a constant mu: n mu - |W| e^mu - KL, maximised at mu = log(n / |W|)
    zero = [(W, b) for W, b in weights[:-1]] + [(0 * weights[-1][0], 0 * weights[-1][1])]
    values = {}
    for mu in (np.log(25 / 2.0) - 0.1, np.log(25 / 2.0), np.log(25 / 2.0) + 0.1):
        backend.reset()
        flat = svdbk(backend, zero, q_mu=m, q_sqrt=L, variance_correction=False)
        cox = backend.lib.CoxProcess(flat, [[0.0, 2.0]], backend.lib.GaussLegendre(16), offset=float(mu))
        values[mu] = scalar(backend, cox.elbo(backend.array(events)))
        kl = ref.gaussian_kl(m, L @ L.T, np.zeros(3), np.eye(3))
        assert values[mu] == pytest.approx(25 * mu - 2.0 * np.exp(mu) - kl, rel=1e-12)
    assert max(values, key=values.get) == pytest.approx(np.log(12.5))


def test_cox_process_trains(backend, rng):
    events = np.sort(rng.uniform(0, 1, size=(40, 1)) ** 2, axis=0)  # more events near 0
    prior = dbk(backend).SVDBK(make_net(backend, "mlp", random_weights(rng, "mlp", D=1, r=4)), variance_correction=False)
    cox = backend.lib.CoxProcess(prior, [[0.0, 1.0]], backend.lib.GaussLegendre(32), offset=float(np.log(40)))
    result = backend.lib.fit(cox.model, cox.guide, (), num_steps=50, lr=0.05, progress=False, events=backend.array(events))
    assert result.losses[-10:].mean() < result.losses[:10].mean() - 1.0
    rate = backend.numpy(cox.intensity(backend.array([[0.05], [0.9]]), params=result.params).mean)
    assert rate[0] > rate[1]


# ---------------------------------------------------------------- training, prediction and ArviZ


def test_fit_calibrate_predict_and_arviz(backend, rng):
    X = rng.uniform(-1, 1, size=(64, 1))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=64)
    Xa, ya = backend.array(X), backend.array(y)
    prior = dbk(backend).SVDBK(make_net(backend, "mlp", random_weights(rng, "mlp", D=1, r=8, hidden=16)))
    model = gaussian_model(backend, prior, noise=0.1, num_data=64)
    result = backend.lib.fit(model.model, model.guide, (Xa, ya), num_epochs=20, batch_size=16, lr=0.03, progress=False)
    assert result.losses[-4:].mean() < result.losses[:4].mean()
    assert {"gp.q_mu", "gp.q_sqrt", "likelihood.variance"} <= set(result.params)
    assert any(k.startswith("gp.net") for k in result.params)
    calibrated = prior.calibrate(Xa, params=result.params)
    pred = backend.lib.predict_y(calibrated, model.likelihood, Xa, quantiles=(0.05, 0.95), params=result.params)
    assert np.sqrt(np.mean((backend.numpy(pred.mean) - y) ** 2)) < 0.5
    mean, var = (backend.numpy(a) for a in backend.lib.predict_f(calibrated, Xa, params=result.params))
    assert np.all(var > 0) and scalar(backend, calibrated.max_sq_norm) > 0
    idata = backend.lib.to_inference_data(model, data=(Xa, ya), num_samples=6, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 3, 64)
    backend.reset()
    exact_model = dbk(backend).ExactDBK(make_net(backend, "resnet", random_weights(rng, "resnet", D=1, r=8, hidden=16)))
    result = backend.lib.fit(exact_model.model, exact_model.guide, (Xa, ya), num_steps=30, lr=0.03, progress=False)
    assert result.losses[-5:].mean() < result.losses[:5].mean()
    pred = exact_model.calibrate(Xa, ya, params=result.params).predict_y(Xa)
    assert np.sqrt(np.mean((backend.numpy(pred.mean) - y) ** 2)) < 0.5


def test_calibrate_returns_a_posterior_that_training_does_not_change(backend, rng):
    """The posterior holds the parameter values it was computed at (by default the trained ones):
    training the model further changes neither it nor the model's lack of a posterior."""
    X = rng.uniform(-1, 1, size=(32, 1))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=32)
    Xa, ya = backend.array(X), backend.array(y)
    model = exact(backend, random_weights(rng, "mlp", D=1, r=4, hidden=5))
    fit = lambda: backend.lib.fit(model.model, model.guide, (Xa, ya), num_steps=5, lr=0.05, progress=False)  # noqa: E731
    fit()
    posterior = model.calibrate(Xa, ya)
    first = [backend.numpy(a) for a in posterior.predict_f(Xa)]
    result = fit()
    np.testing.assert_allclose([backend.numpy(a) for a in posterior.predict_f(Xa)], first, rtol=1e-12)
    again = model.calibrate(Xa, ya, params=result.params)
    assert np.max(np.abs(backend.numpy(again.predict_f(Xa)[0]) - first[0])) > 1e-6
    np.testing.assert_allclose(backend.numpy(model.calibrate(Xa, ya).predict_f(Xa)[0]),
                               backend.numpy(again.predict_f(Xa)[0]), rtol=1e-10)
    with pytest.raises(ValueError, match="calibrate"):
        model.predict_y(Xa)


def test_bad_arguments_are_named(backend, rng):
    lib = dbk(backend)
    with pytest.raises(ValueError, match="rank"):
        lib.MLP(2, rank=0)
    with pytest.raises(ValueError, match="depth"):
        lib.ResNet(2, depth=-1)
    with pytest.raises(TypeError, match="net"):
        lib.SVDBK(object())
    with pytest.raises(TypeError, match="variance_correction"):
        lib.SVDBK(lib.MLP(2, rank=3), variance_correction="yes")
    with pytest.raises(ValueError, match="noise"):
        lib.ExactDBK(lib.MLP(2, rank=3), noise=1e-9, name="d1")
    with pytest.raises(ValueError, match="noise"):  # the bound itself is outside the constraint
        lib.ExactDBK(lib.MLP(2, rank=3), noise=1e-6, name="d1")
    model = lib.ExactDBK(lib.MLP(2, rank=3), name="d2")
    with pytest.raises(ValueError, match="calibrate"):
        model.predict_f(backend.array(rng.normal(size=(3, 2))))
    with pytest.raises(ValueError, match="X"):
        model.objective(backend.array(rng.normal(size=(3, 4))), backend.array(np.zeros(3)))
    with pytest.raises(ValueError, match="y"):
        model.objective(backend.array(rng.normal(size=(3, 2))), backend.array(np.zeros(4)))


# ---------------------------------------------------------------- 16. parity


@pytest.mark.parametrize("arch", ["mlp", "resnet"])
def test_pyro_and_numpyro_agree(arch):
    rng = np.random.default_rng(11)
    weights = random_weights(rng, arch, D=2, r=5, hidden=7)
    X, y, Xs = rng.normal(size=(30, 2)), rng.normal(size=30), rng.normal(size=(9, 2)) * 2
    m, L = rng.normal(size=5), lower(rng, 5)
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        out = []
        for correction in (True, False):
            backend.reset()
            Xa, ya, Xsa = backend.array(X), backend.array(y), backend.array(Xs)
            model = exact(backend, weights, arch, variance=0.7, variance_correction=correction)
            posterior = model.calibrate(Xa, ya)
            out += [scalar(backend, model.objective(Xa, ya)), *[backend.numpy(a) for a in posterior.predict_f(Xsa)]]
            prior = svdbk(backend, weights, arch, q_mu=m, q_sqrt=L, variance=0.7, variance_correction=correction,
                          name="svi")
            svi = gaussian_model(backend, prior)
            out += [scalar(backend, svi.elbo(Xa, ya)), -backend.loss(svi.model, svi.guide, Xa, ya)]
            calibrated = prior.calibrate(Xa)
            out += [backend.numpy(a) for a in backend.lib.predict_y(calibrated, svi.likelihood, Xsa)[:2]]
        results.append(out)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("arch", ["mlp", "resnet"])
def test_network_parameters_have_the_same_names_and_shapes_in_both_backends(arch):
    """Each weight is a parameter ``<name>.net.<path>`` of the same shape in both backends, so the
    trained values of one load into the other; NumPyro predictions after ``fit`` use the trained
    network (``fit`` writes it back), as Pyro's do."""
    rng = np.random.default_rng(3)
    weights = random_weights(rng, arch, D=1, r=4, hidden=5)
    X = rng.uniform(-1, 1, size=(32, 1))
    y = np.sin(3 * X[:, 0])
    out = {}
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        model = gaussian_model(backend, svdbk(backend, weights, arch), num_data=32)
        Xa, ya = backend.array(X), backend.array(y)
        result = backend.lib.fit(model.model, model.guide, (Xa, ya), num_steps=25, lr=0.05, progress=False)
        trained = backend.numpy(model.predict_f(Xa)[0])
        np.testing.assert_allclose(trained, backend.numpy(model.predict_f(Xa, params=result.params)[0]), rtol=1e-10)
        out[backend.name] = {k: backend.numpy(v).shape for k, v in result.params.items()}, result.params
    shapes = {name: value[0] for name, value in out.items()}
    assert shapes["pyro"] == shapes["numpyro"]
    assert f"gp.net.{'hidden.0' if arch == 'mlp' else 'input'}.weight" in shapes["numpyro"]
    # the Pyro-trained values, handed to the NumPyro model, give the Pyro predictions
    backend = NumPyroBackend()
    model = gaussian_model(backend, svdbk(backend, weights, arch), num_data=32)
    params = {k: backend.array(PyroBackend().numpy(v)) for k, v in out["pyro"][1].items()}
    pyro_backend = PyroBackend()
    pyro_backend.reset()
    pyro_model = gaussian_model(pyro_backend, svdbk(pyro_backend, weights, arch), num_data=32)
    expected = pyro_backend.numpy(pyro_model.predict_f(pyro_backend.array(X), params=out["pyro"][1])[0])
    np.testing.assert_allclose(backend.numpy(model.predict_f(backend.array(X), params=params)[0]), expected, rtol=1e-8)
