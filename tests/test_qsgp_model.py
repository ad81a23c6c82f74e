"""The QSGP prior component (a chevron q over random Fourier weights) and its quadruply stochastic
loss, in both backends: q(f), the KL and the ELBO against the dense weight-space reference, the
loss's expectation and gradient against the exact ELBO's, training through ``fit``, bad input."""
import numpy as np
import pytest
import reference as ref
from resume import crash_and_resume

M, K, D = 7, 2, 2
#: Replicates of the statistical tests per backend: NumPyro's run as one vectorised compiled call,
#: Pyro's as an eager loop, so fewer (the formulas are the same core's; test_qsgp.py checks the two
#: backends' estimates on the same draws)
REPLICATES = {"pyro": 500, "numpyro": 4000}


def _problem(backend, rng, num_dense=K, n=9):
    """A QSGP with random q tables, its GPModel, data, and the dense Phi ``(n, m)`` and C ``(m, m)``."""
    lib = backend.lib
    X, y = rng.normal(size=(n, D)), rng.normal(size=n)
    kernel = backend.kernel("matern32", [0.9, 1.4], 1.3)
    q_mu, log_diag = rng.normal(size=M) * 0.5, rng.normal(size=M) * 0.3 - 0.5
    dense = rng.normal(size=(M, num_dense)) * 0.4
    prior = backend.set(lib.QSGP(kernel, M, D, num_dense=num_dense, seed=3), q_mu=q_mu, q_log_diag=log_diag,
                        q_dense=dense)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.3))
    bound = backend.bound(prior)
    Phi = backend.numpy(bound.basis.features(backend.array(X), backend.array(np.arange(M), dtype=np.int64)))
    C = ref.chevron_factor(log_diag, dense)
    return model, X, y, Phi, C, q_mu


@pytest.mark.parametrize("num_dense", [0, K, M])
def test_marginals_kl_and_elbo_against_the_dense_reference(backend, rng, num_dense):
    """``q(f(X))`` is ``N(Phi mu, Phi C C^T Phi^T)``, the KL is against ``N(0, I)``, and the
    GPModel's ELBO is Evans and Nair's Eq. 2 (mean-field, chevron and full C)."""
    model, X, y, Phi, C, q_mu = _problem(backend, rng, num_dense)
    mean, cov = (backend.numpy(a) for a in model.predict_f(backend.array(X), full_cov=True))
    np.testing.assert_allclose(mean, Phi @ q_mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov, Phi @ C @ C.T @ Phi.T, rtol=1e-10, atol=1e-12)
    _, var = model.predict_f(backend.array(X))
    np.testing.assert_allclose(backend.numpy(var), np.diag(Phi @ C @ C.T @ Phi.T), rtol=1e-10)
    kl = backend.numpy(backend.bound(model.prior).posterior().kl())
    assert float(kl) == pytest.approx(ref.gaussian_kl(q_mu, C @ C.T, np.zeros(M), np.eye(M)), rel=1e-10)
    expected = -ref.weight_space_negative_elbo(Phi, np.eye(M), y, 0.3, q_mu, C)
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-10)


def test_marginals_in_blocks_of_the_basis(backend, rng, monkeypatch):
    """Over several blocks of basis functions (m larger than the block) the moments are the same."""
    from sparsegp_common.priors import qsgp

    model, X, *_ = _problem(backend, rng)
    whole = [backend.numpy(a) for a in model.predict_f(backend.array(X))]
    monkeypatch.setattr(qsgp, "BLOCK", 3)
    for a, b in zip(whole, model.predict_f(backend.array(X))):
        np.testing.assert_allclose(backend.numpy(b), a, rtol=1e-12)


def _estimates(backend, model, X, y, loss, replicates):
    """``replicates`` independent estimates of the loss (one compiled call in NumPyro)."""
    if backend.name == "pyro":
        import torch

        torch.manual_seed(0)
        return np.array([loss.loss(model.model, model.guide, backend.array(X), backend.array(y))
                         for _ in range(replicates)])
    import jax
    from numpyro import handlers

    with handlers.trace() as trace, handlers.seed(rng_seed=0):
        model.model(backend.array(X), backend.array(y))
    params = {k: s["value"] for k, s in trace.items() if s["type"] == "param"}
    one = jax.jit(jax.vmap(lambda key: loss.loss(key, params, model.model, model.guide, backend.array(X), backend.array(y))))
    return np.asarray(one(jax.random.split(jax.random.PRNGKey(0), replicates)))


@pytest.mark.parametrize("num_columns,num_data", [(None, None), (1, None), (None, 20)])
def test_loss_is_unbiased_for_the_negative_elbo(backend, rng, num_columns, num_data):
    """z-test over replicates: the quadruply stochastic loss (3 of 7 basis indices per set, all
    or 1 of the 2 dense columns) has the GPModel's exact negative ELBO as its mean, its data
    terms scaled to ``num_data`` rows when the 9 given are a minibatch."""
    model, X, y, *_ = _problem(backend, rng)
    model = backend.lib.GPModel(model.prior, model.likelihood, num_data=num_data)
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3, num_columns=num_columns)
    values = _estimates(backend, model, X, y, loss, REPLICATES[backend.name])
    exact = -float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    z = (values.mean() - exact) / (values.std() / np.sqrt(len(values)))
    assert abs(z) < 4, (values.mean(), exact, z)
    assert values.std() > 1e-3 * abs(exact)  # an estimate, not the exact value


def test_loss_with_a_mean_function_is_the_loss_of_the_residuals(backend, rng):
    """``f = m + g``: on the same draws the loss with a linear mean ``m`` is the loss without it
    on ``y - m(X)``, and its mean function enters (the two differ on ``y``)."""
    lib = backend.lib
    model, X, y, *_ = _problem(backend, rng)
    tables = {name: backend.numpy(getattr(backend.bound(model.prior), name)) for name in ("q_mu", "q_log_diag", "q_dense")}
    mean = lib.Linear(backend.array([0.4, -1.1]), bias=0.3)
    shifted = backend.set(lib.QSGP(backend.kernel("matern32", [0.9, 1.4], 1.3), M, D, num_dense=K, seed=3,
                                   mean_function=mean, name="gpm"), **tables)
    shifted = lib.GPModel(shifted, backend.set(lib.Gaussian(), variance=0.3))
    loss = lib.QuadruplyStochasticELBO(num_basis=3)
    residuals = y - (0.3 + X @ [0.4, -1.1])
    with_mean = _estimates(backend, shifted, X, y, loss, 5)
    np.testing.assert_allclose(with_mean, _estimates(backend, model, X, residuals, loss, 5), rtol=1e-10)
    assert np.all(np.abs(with_mean - _estimates(backend, model, X, y, loss, 5)) > 1e-3)


def test_loss_gradient_is_unbiased(rng):
    """Pyro: the mean gradient of the loss w.r.t. every parameter (tables and hyperparameters)
    over replicates is the exact ELBO's, entry by entry within 4 standard errors."""
    import torch
    from backends import BACKENDS

    backend = BACKENDS["pyro"]()
    backend.reset()
    model, X, y, *_ = _problem(backend, rng)
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3)
    Xt, yt = backend.array(X), backend.array(y)
    named = dict(model.named_parameters())
    exact = torch.autograd.grad(-model.elbo(Xt, yt), list(named.values()))
    torch.manual_seed(1)
    grads = [torch.autograd.grad(loss(model.model, model.guide, Xt, yt), list(named.values())) for _ in range(600)]
    for i, (name, g) in enumerate(zip(named, exact)):
        samples = torch.stack([gr[i] for gr in grads]).numpy()
        z = (samples.mean(0) - g.numpy()) / (samples.std(0) / np.sqrt(len(samples)) + 1e-12)
        assert np.abs(z).max() < 4.5, (name, z)


@pytest.mark.parametrize("likelihood", ["bernoulli", "poisson"])
def test_other_likelihoods_get_a_bound(backend, rng, likelihood):
    """The reparameterised subsampled bound: with the whole basis drawn (without replacement) its
    mean is the exact negative ELBO (z-test); with 3 of 7 functions per draw it is above it
    (Jensen's gap for a log-concave likelihood, by more than 4 standard errors: in NumPyro, whose
    replicates are cheap enough to resolve it; the arithmetic is the core's)."""
    model, X, _, _, _, q_mu = _problem(backend, rng)
    y = (rng.uniform(size=len(X)) < 0.5) * 1.0 if likelihood == "bernoulli" else rng.poisson(1.5, size=len(X)) * 1.0
    if likelihood == "poisson":  # a tighter q: exp(f_hat) is heavy-tailed
        backend.set(model.prior, q_mu=0.3 * q_mu, q_log_diag=np.full(M, -2.0))
    model = backend.lib.GPModel(model.prior, backend.lib.Bernoulli() if likelihood == "bernoulli" else backend.lib.Poisson())
    exact = -float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    replicates = REPLICATES[backend.name]
    whole = _estimates(backend, model, X, y, backend.lib.QuadruplyStochasticELBO(num_basis=M, replacement=False),
                       replicates)
    z = (whole.mean() - exact) / (whole.std() / np.sqrt(len(whole)))
    assert abs(z) < 4, (whole.mean(), exact, z)
    if backend.name == "pyro":
        return
    few = _estimates(backend, model, X, y, backend.lib.QuadruplyStochasticELBO(num_basis=3), replicates)
    z = (few.mean() - exact) / (few.std() / np.sqrt(len(few)))
    assert z > 4, (few.mean(), exact, z)


def _bernoulli_user_model(backend, gp):
    """A user's model with ``gp``'s pair and Bernoulli labels (full batch)."""
    ppl = backend.ppl

    def model(X, y):
        data = ppl.plate("data", len(X))
        f = gp.model(X, data)
        with data:
            ppl.sample("y", ppl.distributions.Bernoulli(logits=f), obs=y)

    def guide(X, y):
        gp.guide(X, ppl.plate("data", len(X)))

    return model, guide


def test_subsampled_pair_in_a_users_model(backend, rng):
    """``QSGP(num_basis=3)`` in a user's model: ``Trace_ELBO`` of the pair has the mean of the
    library's subsampled bound on the same prior (``QuadruplyStochasticELBO`` on a ``GPModel``
    with the Bernoulli likelihood): a z-test on the difference of the two means; above the exact
    pair's (``f`` from q(f)'s exact marginals) by more than 4 standard errors (Jensen's gap)."""
    lib = backend.lib
    X = rng.normal(size=(9, D))
    y = (rng.uniform(size=9) < 0.5) * 1.0
    Xa, ya = backend.array(X), backend.array(y)
    kernel = backend.kernel("matern32", [0.9, 1.4], 1.3)
    values = dict(q_mu=rng.normal(size=M) * 0.5, q_log_diag=rng.normal(size=M) * 0.3 - 0.5,
                  q_dense=rng.normal(size=(M, K)) * 0.4)
    gp = backend.set(lib.QSGP(kernel, M, D, num_dense=K, seed=3, num_basis=3), **values)
    assert set(gp.site_names) >= {"gp.basis_draw", "gp.eps", "gp.kl", "gp.f"}
    replicates = REPLICATES[backend.name] // 2
    pair = backend.losses(*_bernoulli_user_model(backend, gp), Xa, ya, replicates=replicates)
    library = _estimates(backend, lib.GPModel(gp, lib.Bernoulli()), X, y, lib.QuadruplyStochasticELBO(num_basis=3),
                         replicates)
    z = (pair.mean() - library.mean()) / np.sqrt(pair.var() / replicates + library.var() / replicates)
    assert abs(z) < 4, (pair.mean(), library.mean(), z)
    backend.reset()
    exact_gp = backend.set(lib.QSGP(kernel, M, D, num_dense=K, seed=3), **values)
    exact = backend.losses(*_bernoulli_user_model(backend, exact_gp), Xa, ya, replicates=replicates)
    z = (pair.mean() - exact.mean()) / np.sqrt(pair.var() / replicates + exact.var() / replicates)
    assert z > 4, (pair.mean(), exact.mean(), z)


@pytest.mark.parametrize("basis", ["fourier", "whitened"])
def test_subsampled_draw_takes_every_index_from_its_cell(backend, rng, basis):
    """The pair's uniforms ``u`` become the indices ``floor(u m)``: with ``num_basis = m`` and one
    ``u`` inside each index's cell (in reverse order), the guide's ``f`` is ``Phi (q_mu + C e)``
    exactly, ``e`` the dense columns' normals, then the diagonal ones' (``m / m~ = 1``, every
    weight once); random Fourier features, or the whitened kernel functions (``S = I``) at inputs
    of which three are rows of ``Z``."""
    lib = backend.lib
    X = rng.normal(size=(5, D))
    kernel = backend.kernel("matern32", [0.9, 1.4], 1.3)
    q_mu, log_diag, dense = rng.normal(size=M) * 0.5, rng.normal(size=M) * 0.3 - 0.5, rng.normal(size=(M, K)) * 0.4
    if basis == "fourier":
        prior = lib.QSGP(kernel, M, D, num_dense=K, seed=3, num_basis=M)
    else:
        Z = np.vstack([X[:3], rng.normal(size=(M - 3, D))])
        prior = lib.QSGP(kernel, inducing_points=backend.array(Z), num_dense=K, num_basis=M, whiten=True)
    gp = backend.set(prior, q_mu=q_mu, q_log_diag=log_diag, q_dense=dense)
    u, eps = (np.arange(M)[::-1] + 0.5) / M, rng.normal(size=K + M)
    guide = backend.handlers.condition(gp.guide, data={"gp.basis_draw": backend.array(u), "gp.eps": backend.array(eps)})
    f = backend.numpy(backend.trace(guide, backend.array(X))["gp.f"]["value"])
    C = ref.chevron_factor(log_diag, dense)
    e = np.concatenate([eps[:K], eps[2 * K:]])  # weight i takes the i-th normal of the indices' sorted order
    Phi = backend.numpy(backend.bound(gp).basis.features(backend.array(X), backend.array(np.arange(M), dtype=np.int64)))
    np.testing.assert_allclose(f, Phi @ (q_mu + C @ e), rtol=1e-10)


def test_subsampled_pair_trains_in_a_users_model(backend):
    """``fit`` on a user's model with ``QSGP(num_basis=60)``: held-out classification of the
    sine's sign above 0.9."""
    lib = backend.lib
    X, f = _sine()
    labels = (f > 0) * 1.0
    Xt = np.linspace(0.5, 9.5, 60)[:, None]
    gp = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), 300, 1, num_basis=60)
    model, guide = _bernoulli_user_model(backend, gp)
    lib.fit(model, guide, (backend.array(X), backend.array(labels)), num_steps=300, lr=0.01, progress=False,
            param_groups=_tables(backend))
    mean, _ = gp.predict_f(backend.array(Xt))
    assert np.mean((backend.numpy(mean) > 0) == (np.sin(Xt[:, 0]) > 0)) > 0.9


def _sine(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, 1))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def test_fit_with_adagrad_tables_learns_a_sine(backend):
    """``fit`` with the quadruply stochastic loss, AdaGrad for the q tables and Adam for the
    hyperparameters: the test RMSE falls from the prior's (about 0.7) to below 0.15 and the
    predictive variance adds the noise."""
    lib = backend.lib
    X, y = _sine()
    Xt = np.linspace(0.5, 9.5, 50)[:, None]
    prior = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), 300, 1, num_dense=2)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.05), num_data=len(X))
    if backend.name == "pyro":
        from torch.optim import Adagrad as adagrad
    else:
        from numpyro.optim import Adagrad as adagrad
    result = lib.fit(model.model, model.guide, (backend.array(X), backend.array(y)), num_steps=400, batch_size=100, lr=0.01, progress=False,
                     loss=lib.QuadruplyStochasticELBO(num_basis=60),
                     param_groups=[{"params": "gp.q_*", "optimizer": adagrad, "lr": 0.1}])
    mean, var = (backend.numpy(a) for a in model.predict_f(backend.array(Xt)))
    rmse = np.sqrt(np.mean((mean - np.sin(Xt[:, 0])) ** 2))
    assert rmse < 0.15, rmse
    var_y = backend.numpy(model.predict_y(backend.array(Xt)).variance)
    noise = float(backend.numpy(result.params["likelihood.variance"]))
    np.testing.assert_allclose(var_y, var + noise, rtol=1e-5)


def test_fit_classifies_with_the_bound(backend):
    """``fit`` with the subsampled bound on Bernoulli labels of the sine's sign: the trained
    predictive probabilities classify held-out points (accuracy above 0.9)."""
    lib = backend.lib
    X, f = _sine()
    labels = (f > 0) * 1.0
    Xt = np.linspace(0.5, 9.5, 60)[:, None]
    model = lib.GPModel(lib.QSGP(backend.kernel("rbf", [1.0], 1.0), 300, 1), lib.Bernoulli(), num_data=len(X))
    lib.fit(model.model, model.guide, (backend.array(X), backend.array(labels)), num_steps=300, batch_size=100,
            lr=0.01, progress=False, loss=lib.QuadruplyStochasticELBO(num_basis=100), param_groups=_tables(backend))
    probs = backend.numpy(model.predict_y(backend.array(Xt)).mean)
    assert np.mean((probs > 0.5) == (np.sin(Xt[:, 0]) > 0)) > 0.9


def test_bad_arguments(backend, rng):
    lib = backend.lib
    kernel = backend.kernel("rbf", [1.0], 1.0)
    with pytest.raises(ValueError, match="num_dense"):
        lib.QSGP(kernel, 5, 1, num_dense=6)
    X, y = rng.normal(size=(4, 1)), rng.normal(size=4)
    with_prior = lib.Linear(backend.array([0.0]), prior=backend.ppl.distributions.Normal(0.0, 10.0))
    with pytest.raises(ValueError, match="num_basis takes mean functions without a coefficient prior"):
        lib.QSGP(kernel, 5, 1, num_basis=2, mean_function=with_prior, name="pair").model(backend.array(X))
    model = lib.GPModel(lib.QSGP(kernel, 5, 1, mean_function=with_prior, name="sampled"), lib.Gaussian())
    with pytest.raises(ValueError, match="loss takes mean functions without a coefficient prior"):
        _estimates(backend, model, X, y, lib.QuadruplyStochasticELBO(num_basis=2), 1)
    with pytest.raises(ValueError, match="num_features"):
        lib.QSGP(kernel, 0, 1)
    with pytest.raises(TypeError, match="random Fourier"):
        lib.QSGP(lib.Sum(kernel, backend.kernel("rbf", [2.0], 1.0)), 5, 1)
    with pytest.raises(ValueError, match="num_basis"):
        lib.QuadruplyStochasticELBO(num_basis=0)
    with pytest.raises(TypeError, match="replacement"):
        lib.QuadruplyStochasticELBO(replacement="yes")
    with pytest.raises(TypeError, match="paper_literal"):
        lib.QuadruplyStochasticELBO(paper_literal=1)
    with pytest.raises(ValueError, match="paper_literal"):
        lib.QuadruplyStochasticELBO(paper_literal=True, num_columns=2)
    X, y = backend.array(rng.normal(size=(4, 1))), backend.array([0.0, 1.0, 2.0, 0.0])
    svgp = lib.GPModel(lib.SVGP(kernel, X[:2]), lib.Gaussian())
    with pytest.raises(TypeError, match="QSGP prior"):
        if backend.name == "pyro":
            lib.QuadruplyStochasticELBO()(svgp.model, svgp.guide, X, y)
        else:
            import jax

            lib.QuadruplyStochasticELBO().loss(jax.random.PRNGKey(0), {}, svgp.model, svgp.guide, X, y)
    poisson = lib.GPModel(lib.QSGP(kernel, 5, 1), lib.Poisson())
    with pytest.raises(ValueError, match="Gaussian"):
        lib.QuadruplyStochasticELBO(num_basis=2, control_variates=X).initial_state(poisson.model, X, y)
    with pytest.raises(ValueError, match="X has 3 input dimensions"):
        lib.GPModel(lib.QSGP(kernel, 5, 1), lib.Gaussian()).predict_f(backend.array(rng.normal(size=(4, 3))))


# -- control variates: the state fit carries -------------------------------------------------------


def _cv_problem(backend, refresh_every=1000, seed=0):
    """A GPModel(QSGP) on a sine with 40 support rows, the loss with control variates, the data."""
    lib = backend.lib
    X, y = _sine(200, seed)
    prior = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), 60, 1, num_dense=2, seed=seed)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.05), num_data=len(X))
    loss = lib.QuadruplyStochasticELBO(num_basis=8, control_variates=backend.array(X[:40]), refresh_every=refresh_every)
    return model, loss, backend.array(X), backend.array(y)


def _adagrad(backend):
    if backend.name == "pyro":
        from torch.optim import Adagrad
    else:
        from numpyro.optim import Adagrad
    return Adagrad


def _tables(backend, **options):
    """The q tables' group: AdaGrad without momentum (NumPyro's default is 0.9)."""
    momentum = {} if backend.name == "pyro" else {"momentum": 0.0}
    return [{"params": "gp.q_*", "optimizer": _adagrad(backend), "lr": 0.05, **momentum, **options}]


def _fit_cv(backend, model, loss, X, y, steps, **options):
    return backend.lib.fit(model.model, model.guide, (X, y), num_steps=steps, batch_size=50, lr=0.01, progress=False,
                           loss=loss, param_groups=_tables(backend), **options)


def _state(backend, loss, result):
    return loss.state if backend.name == "pyro" else result.state.mutable_state["control_variates"]


def _exact_support_product(backend, model, state, caught_up=False):
    """``Phi_p v`` at the model's current values, recomputed from scratch; or (``caught_up``) as
    the next step finds it from ``state`` (which holds ``a`` before the last step's update)."""
    from sparsegp_common.objectives.control_variates import catch_up, support
    from sparsegp_common.priors import qsgp

    prior = backend.bound(model.prior)
    support, q = support(state.X, prior.basis.fixed(state.lengthscale, state.variance)), prior.chevron()
    if caught_up:
        return backend.numpy(catch_up(support, state, lambda rows: qsgp._columns(q, rows)))
    return backend.numpy(qsgp._support_product(support, q))


def test_dense_optimisers_are_refused_with_control_variates(backend):
    """Adam (the default) or weight decay on any of the q tables would move entries the state does
    not follow: ``fit`` refuses them, naming the table."""
    model, loss, X, y = _cv_problem(backend)
    with pytest.raises(ValueError, match="gp.q_"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, batch_size=50, loss=loss, progress=False)
    with pytest.raises(ValueError, match="weight_decay"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, batch_size=50, loss=loss, progress=False,
                        param_groups=_tables(backend, weight_decay=1e-3))
    with pytest.raises(ValueError, match="gp.q_(log_diag|dense)"):  # AdaGrad for q_mu alone: Adam for the others
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, batch_size=50, loss=loss, progress=False,
                        param_groups=[{**_tables(backend)[0], "params": "gp.q_mu"}])
    if backend.name == "numpyro":
        with pytest.raises(ValueError, match="momentum"):
            backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, batch_size=50, loss=loss, progress=False,
                            param_groups=[{"params": "gp.q_*", "optimizer": _adagrad(backend), "lr": 0.05}])
    with pytest.raises(ValueError, match="num_columns"):
        backend.lib.QuadruplyStochasticELBO(num_columns=1, control_variates=X[:5])


def control_variate_estimates(backend, model, loss, X, y, replicates, knocked=None):
    """``replicates`` estimates of ``loss`` (with control variates) from a state at the model's
    current values (never a refresh step); and with ``knocked``, a function of that state, the
    state after one step from ``knocked(state)``."""
    if backend.name == "pyro":
        import torch

        torch.manual_seed(0)
        state = loss.initial_state(model.model, X, y)
        values = []
        for _ in range(replicates):
            loss.state = state._replace(step=state.step * 0 + 1)
            values.append(loss.loss(model.model, model.guide, X, y))
        if knocked is None:
            return np.array(values), None
        loss.state = knocked(state)
        loss.loss(model.model, model.guide, X, y)
        return np.array(values), loss.state
    import jax
    from numpyro import handlers

    with handlers.trace() as trace, handlers.seed(rng_seed=0):
        model.model(X, y)
    params = {k: s["value"] for k, s in trace.items() if s["type"] == "param"}
    with handlers.substitute(data=params):
        state = loss.initial_state(model.model, X, y)

    def one(key, s):
        out = loss.loss_with_mutable_state(key, {**params, "control_variates": s}, model.model, model.guide, X, y)
        return out["loss"], out["mutable_state"]["control_variates"]

    keys = jax.random.split(jax.random.PRNGKey(0), replicates)
    values = np.asarray(jax.jit(jax.vmap(lambda k: one(k, state._replace(step=state.step * 0 + 1))[0]))(keys))
    return values, None if knocked is None else one(keys[0], knocked(state))[1]


def test_control_variates_keep_the_loss_unbiased_and_refresh(backend, rng):
    """With a state at the current values, the loss with control variates has the exact negative
    ELBO as its mean (z-test); a state knocked off ``Phi_p v`` is exact again after a refresh step."""
    model, X, y, *_ = _problem(backend, rng)
    Xs = backend.array(rng.normal(size=(6, D)))
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3, control_variates=Xs, refresh_every=4)
    exact = -float(backend.numpy(model.elbo(backend.array(X), backend.array(y))))
    values, refreshed = control_variate_estimates(
        backend, model, loss, backend.array(X), backend.array(y), REPLICATES[backend.name],
        knocked=lambda state: state._replace(a=state.a + 1.0, step=state.step * 0 + 4))
    z = (values.mean() - exact) / (values.std() / np.sqrt(len(values)))
    assert abs(z) < 4, (values.mean(), exact, z)
    np.testing.assert_allclose(backend.numpy(refreshed.a), _exact_support_product(backend, model, refreshed),
                               rtol=1e-10, atol=1e-12)


def test_fit_carries_and_resumes_the_control_variates_state(backend, tmp_path):
    """After 12 AdaGrad steps (the hyperparameters moving under Adam too, ``Phi_p`` refreshed at
    their values at step 7) the state that ``fit`` carried gives ``Phi_p v`` of the trained tables,
    to round-off; stopped after step 7 (checkpoint at 5) and resumed with new objects, the same
    losses, values and state as the uninterrupted run."""
    def run(**extra):
        backend.reset(seed=99)
        model, loss, X, y = _cv_problem(backend, refresh_every=7)
        result = _fit_cv(backend, model, loss, X, y, 12, seed=3, **extra)
        return result, _state(backend, loss, result), model

    full, full_state, model = run()
    assert abs(float(backend.numpy(full_state.lengthscale)[0]) - 1.0) > 1e-3  # the refresh took the moved lengthscale
    np.testing.assert_allclose(_exact_support_product(backend, model, full_state, caught_up=True),
                               _exact_support_product(backend, model, full_state), rtol=1e-9, atol=1e-11)
    assert int(backend.numpy(full_state.step)) >= 12
    resumed, resumed_state, _ = crash_and_resume(run, tmp_path, stop_at=7, every=5)
    np.testing.assert_allclose(resumed.losses, full.losses, rtol=1e-12)
    np.testing.assert_allclose(backend.numpy(resumed_state.a), backend.numpy(full_state.a), rtol=1e-12, atol=1e-14)
    for k, v in full.params.items():
        np.testing.assert_allclose(backend.numpy(resumed.params[k]), backend.numpy(v), rtol=1e-12, atol=1e-14)


def _float32_problem(lib, array, dtype, basis="fourier"):
    """A QSGP on 300 points of a sine over [0, 30] with m = 500 features, 2 dense columns; or on
    the kernel functions at every third point, the first repeated (coincident inputs), with the
    dense ``S`` or the relevance vector machine's, or the whitened ones (``snapshot``: at every
    point, the 300 points being all the data, for the snapshot control variate)."""
    X, y = _sine(300)
    X = 3 * X
    kernel = lib.RBF(lengthscale=array([2.0], dtype), variance=array(1.0, dtype))
    if basis == "fourier":
        prior = lib.QSGP(kernel, 500, 1, num_dense=2, seed=1)
    else:
        Z = np.concatenate([X[:1], X[::1 if basis == "snapshot" else 3]])
        prior = lib.QSGP(kernel, inducing_points=array(Z, dtype), num_dense=2, relevance=basis == "relevance",
                         whiten=basis in ("whitened", "snapshot"))
    num_data = len(X) if basis == "snapshot" else 3000
    return lib.GPModel(prior, lib.Gaussian(variance=array(0.1, dtype)), num_data=num_data), array(X, dtype), \
        array(y, dtype)


def _float32_loss(lib, basis, X, y):
    """The loss with control variates on 40 rows, or with the snapshot of all the rows (taken at
    the first step, so its full pass runs in the dtype too)."""
    if basis == "snapshot":
        return lib.QuadruplyStochasticELBO(num_basis=50, snapshot=(X, y))
    return lib.QuadruplyStochasticELBO(num_basis=50, control_variates=X[:40])


@pytest.mark.parametrize("basis", ["fourier", "inducing", "whitened", "snapshot"])
@pytest.mark.parametrize("run", ["pyro", "numpyro-jit"])
def test_float32_loss_and_gradients(run, basis):
    """The loss (with control variates, the Nystrom rows with a dense ``S``) on the same draws in
    float32 and float64: within 1e-4 of each other, each gradient within 2 % of its float64 norm
    (eager torch, compiled JAX); random Fourier features, and kernel functions at inputs with a
    coincident pair (the relevance vector machine's diagonal S reads as the features' does), and the
    whitened ones (rows of the factor at the inputs that are Z's, a solve at the others), with the
    snapshot control variate too."""
    from backends import BACKENDS, xla_optimisations

    backend = BACKENDS[run.split("-")[0]]()
    lib = backend.lib
    out = {}
    for name in ("float32", "float64"):
        backend.reset()
        if run == "pyro":
            import torch

            dtype = getattr(torch, name)
            array = lambda a, d: torch.as_tensor(np.asarray(a), dtype=d)  # noqa: E731
            model, X, y = _float32_problem(lib, array, dtype, basis)
            loss = _float32_loss(lib, basis, X, y)
            named = dict(model.named_parameters())
            torch.manual_seed(0)
            value = loss(model.model, model.guide, X, y)
            grads = torch.autograd.grad(value, list(named.values()), allow_unused=True)
            out[name] = float(value.detach()), {k: (torch.zeros_like(p) if g is None else g).double().numpy()
                                                for (k, p), g in zip(named.items(), grads)}
        else:
            import jax
            import jax.numpy as jnp
            from numpyro import handlers

            dtype = getattr(jnp, name)
            array = lambda a, d: jnp.asarray(np.asarray(a), dtype=d)  # noqa: E731
            with xla_optimisations(False):  # the set-up's eager operations: not what is compared
                model, X, y = _float32_problem(lib, array, dtype, basis)
                loss = _float32_loss(lib, basis, X, y)
                with handlers.trace() as trace, handlers.seed(rng_seed=0):
                    model.model(X, y)
                params = {k: s["value"] for k, s in trace.items() if s["type"] == "param"}
                with handlers.substitute(data=params):
                    state = loss.initial_state(model.model, X, y)

            def value(p):
                return loss.loss_with_mutable_state(jax.random.PRNGKey(0), {**p, loss.STATE: state},
                                                    model.model, model.guide, X, y)["loss"]

            with xla_optimisations(name == "float32"):  # the float64 reference compiles faster
                v, g = jax.jit(jax.value_and_grad(value))(params)
            out[name] = float(v), {k: np.asarray(x, np.float64) for k, x in g.items()}
    (l32, g32), (l64, g64) = out["float32"], out["float64"]
    assert l32 == pytest.approx(l64, rel=1e-4)
    for key in g64:
        error = np.linalg.norm(g32[key] - g64[key])
        assert np.isfinite(g32[key]).all() and error <= 0.02 * np.linalg.norm(g64[key]) + 1e-6, (key, error)
