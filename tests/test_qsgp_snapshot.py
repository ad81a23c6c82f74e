"""The snapshot control variate of the quadruply stochastic loss (``QuadruplyStochasticELBO(snapshot=
(X, y))``): the full pass against the dense reference (diagonal and dense ``S``), the pair of mean
zero by enumerating every draw, the mean's gradient without noise at a fresh snapshot of the
optimum, the same numbers in NumPy, torch and JAX; in both backends the first step takes the
snapshot of the model's values, ``fit`` reaches the exact GP's mean where the plain estimate does
not, Pyro's state round trip, bad input."""
import itertools

import numpy as np
import pytest

import reference as ref
from sparsegp_common.objectives import snapshot
from sparsegp_common.objectives.quadruply_stochastic import Draw, gaussian_loss
from sparsegp_common.variational.chevron import Chevron
from test_qsgp import problem
from test_qsgp_inducing import _sine
from test_qsgp_whitened import NOISE, _problem


def _exact(basis, y, noise, s):
    """``(h, c)`` from the dense ``Phi`` and ``S``."""
    H = basis.Phi.T @ basis.Phi / noise + basis.S
    return H @ s - basis.Phi.T @ y / noise, s @ H @ s


def _state(basis, y, noise, s, to=np.asarray):
    h, c = _exact(basis, y, noise, s)
    return snapshot.Snapshot(to(np.arange(len(y))), to(y), to(s), to(h), to(np.asarray(c)), None, None,
                             to(np.asarray(noise)), 1)


def _loss(basis, y, noise, q, state, rows, I, J):
    """The estimate with the pair (``state``: None, without), at one draw (one diagonal column,
    the first: a term without ``q_mu``)."""
    ints = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    rows, draw = ints(rows), Draw(ints(I), ints(J), ints([]), ints([0]))
    features = (basis.features(rows, draw.I), basis.features(rows, draw.J))
    value = gaussian_loss(basis, q, rows, y[rows], noise, len(y), draw, features)
    if state is None:
        return value
    return value + 0.5 * snapshot.pair(basis, state, features, rows, y[rows], draw, q.mean(draw.I), q.mean(draw.J),
                                       len(y))


@pytest.mark.parametrize("diagonal_prior", [True, False])
def test_full_pass_against_the_dense_reference(diagonal_prior):
    """``h = (Phi^T Phi / noise + S) s - Phi^T y / noise`` and ``c = s^T (...) s`` over blocks
    smaller than ``n`` and ``m``."""
    basis, y, noise, q = problem(n=7, m=5, k=0, diagonal_prior=diagonal_prior)
    s = np.random.default_rng(1).normal(size=5)
    h, c = snapshot.exact(basis, np.arange(7), y, s, noise, block=3)
    expected_h, expected_c = _exact(basis, y, noise, s)
    np.testing.assert_allclose(h, expected_h, rtol=1e-12)
    assert c == pytest.approx(expected_c, rel=1e-12)


@pytest.mark.parametrize("diagonal_prior", [True, False])
def test_pair_has_mean_zero_over_every_draw(diagonal_prior):
    """Enumerating every draw of one row and one index in each of ``I`` and ``J``: the pair's mean is
    zero, so the loss keeps the exact negative ELBO's mean, with a snapshot away from ``q_mu``."""
    basis, y, noise, q = problem(n=4, m=5, k=0, diagonal_prior=diagonal_prior)
    state = _state(basis, y, noise, np.random.default_rng(2).normal(size=5))
    draws = list(itertools.product(range(4), range(5), range(5)))
    pairs = [_loss(basis, y, noise, q, state, [r], [i], [j]) - _loss(basis, y, noise, q, None, [r], [i], [j])
             for r, i, j in draws]
    assert abs(np.mean(pairs)) < 1e-10 * np.max(np.abs(pairs)), (np.mean(pairs), np.max(np.abs(pairs)))


def _mean_gradient(basis, y, noise, q, state, draw):
    """The estimate's gradient in ``q_mu`` by central differences (exact for a quadratic)."""
    eps, out = 1e-4, np.empty(q.q_mu.shape[0])
    for i in range(len(out)):
        step = np.eye(len(out))[i] * eps
        up, down = (Chevron(q.q_mu + sign * step, q.log_diag, q.dense) for sign in (1, -1))
        out[i] = (_loss(basis, y, noise, up, state, *draw) - _loss(basis, y, noise, down, state, *draw)) / (2 * eps)
    return out


@pytest.mark.parametrize("diagonal_prior", [True, False])
def test_a_fresh_snapshot_of_the_optimum_leaves_no_noise_in_the_mean_gradient(diagonal_prior):
    """At ``q_mu = s = (Phi^T Phi + noise S)^-1 Phi^T y`` (where ``h = 0``) every draw's gradient in
    ``q_mu`` is zero with the pair (the estimate's change since the snapshot is none), and far
    from zero without it."""
    basis, y, noise, q = problem(n=4, m=5, k=0, diagonal_prior=diagonal_prior)
    optimum = np.linalg.solve(basis.Phi.T @ basis.Phi + noise * basis.S, basis.Phi.T @ y)
    q = Chevron(optimum, q.log_diag, q.dense)
    state = _state(basis, y, noise, optimum)
    np.testing.assert_allclose(state.h, 0.0, atol=1e-12)
    with_pair, without = [], []
    for draw in [([0, 2], [1, 4], [3, 3]), ([3, 1], [0, 2], [4, 1])]:
        with_pair.append(_mean_gradient(basis, y, noise, q, state, draw))
        without.append(_mean_gradient(basis, y, noise, q, None, draw))
    assert np.max(np.abs(with_pair)) < 1e-6 and np.max(np.abs(without)) > 0.1, (with_pair, without)


def test_backends_agree():
    """torch and JAX give NumPy's full pass and pair at the same draw (float64)."""
    import jax
    import jax.numpy as jnp
    import torch

    from test_qsgp import TableBasis

    basis, y, noise, q = problem(n=6, m=5, k=0, diagonal_prior=False)
    s = np.random.default_rng(3).normal(size=5)
    draw = ([0, 2, 5], [1, 4], [3, 3])
    expected = _loss(basis, y, noise, q, _state(basis, y, noise, s), *draw)
    expected_pass = snapshot.exact(basis, np.arange(6), y, s, noise, block=4)
    for to in (torch.tensor, jnp.asarray):
        with jax.enable_x64(True):
            b = TableBasis(to(basis.Phi), to(basis.S), False)
            h, c = snapshot.exact(b, to(np.arange(6)), to(y), to(s), to(np.asarray(noise)), block=4)
            np.testing.assert_allclose(np.asarray(h), expected_pass[0], rtol=1e-12)
            assert float(c) == pytest.approx(float(expected_pass[1]), rel=1e-12)
            tq = Chevron(*(to(a) for a in (q.q_mu, q.log_diag, q.dense)))
            state = _state(basis, y, noise, s, to)
            rows, I, J = (to(np.asarray(a, dtype=np.int64)) for a in draw)
            d = Draw(I, J, to(np.zeros(0, dtype=np.int64)), to(np.zeros(1, dtype=np.int64)))
            features = (b.features(rows, I), b.features(rows, J))
            value = gaussian_loss(b, tq, rows, to(y)[rows], to(np.asarray(noise)), 6, d, features)
            value = value + 0.5 * snapshot.pair(b, state, features, rows, to(y)[rows], d, tq.mean(I), tq.mean(J), 6)
            assert float(value) == pytest.approx(float(expected), rel=1e-12)


# -- in the models ------------------------------------------------------------------------------


def _one_step_state(backend, model, loss, X, y):
    """The loss's state after one estimate from its initial state."""
    if backend.name == "pyro":
        loss.loss(model.model, model.guide, X, y)
        return loss.state
    from numpyro import handlers

    with handlers.trace() as trace, handlers.seed(rng_seed=0):
        model.model(X, y)
    params = {k: site["value"] for k, site in trace.items() if site["type"] == "param"}
    with handlers.substitute(data=params):
        state = loss.initial_state(model.model, X, y)
    import jax

    out = loss.loss_with_mutable_state(jax.random.PRNGKey(0), {**params, loss.STATE: state}, model.model, model.guide,
                                       X, y)
    return out["mutable_state"][loss.STATE]


def test_first_step_takes_the_snapshot_of_the_model(backend, rng):
    """On the whitened basis (rows of ``Z`` and new inputs among the data): after the first step
    the state holds ``s = q_mu`` and the exact ``h`` and ``c`` of the dense reference."""
    model, X, y, Phi, C, q_mu, L = _problem(backend, rng, num_dense=0)
    X, y = backend.array(X), backend.array(y)
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3, snapshot=(X, y), snapshot_every=4)
    state = _one_step_state(backend, model, loss, X, y)
    H = Phi.T @ Phi / NOISE + np.eye(len(q_mu))
    np.testing.assert_allclose(backend.numpy(state.s), q_mu, rtol=1e-12)
    np.testing.assert_allclose(backend.numpy(state.h), H @ q_mu - Phi.T @ backend.numpy(y) / NOISE, rtol=1e-10)
    assert float(backend.numpy(state.c)) == pytest.approx(q_mu @ H @ q_mu, rel=1e-10)
    assert int(backend.numpy(state.step)) == 1


def _fit_sine(backend, with_snapshot):
    """``fit`` with minibatches of 20 rows and 20 basis indices per set (AdaGrad 0.3 on the q
    tables) on the whitened basis at 100 inputs of a sine, noise 0.001 (held): the RMSE of the
    posterior mean at the inputs from the exact GP's."""
    from test_qsgp_model import _adagrad

    lib = backend.lib
    X, y = _sine(100)
    Xa, ya = backend.array(X), backend.array(y)
    prior = lib.QSGP(backend.kernel("rbf", [1.0], 1.0), inducing_points=Xa, jitter=1e-6, whiten=True)
    model = lib.GPModel(prior, backend.set(lib.Gaussian(), variance=0.001), num_data=len(X))
    prior.set_optimal_diagonal(Xa, 0.001)
    options = {} if backend.name == "pyro" else {"momentum": 0.0}
    groups = [{"params": "gp.q_*", "optimizer": _adagrad(backend), "lr": 0.3, **options},
              {"params": "*", "lr_schedule": lambda t: 0.0}]
    loss = lib.QuadruplyStochasticELBO(num_basis=20, snapshot=(Xa, ya) if with_snapshot else None, snapshot_every=5)
    lib.fit(model.model, model.guide, (Xa, ya), num_steps=300, batch_size=20, progress=False, loss=loss,
            param_groups=groups)
    K = ref.kernel("rbf", X, X, [1.0], 1.0)
    exact = K @ np.linalg.solve(K + 0.001 * np.eye(len(X)), y)
    return np.sqrt(np.mean((backend.numpy(model.predict_f(Xa)[0]) - exact) ** 2))


def test_fit_with_a_snapshot_reaches_the_exact_mean(backend):
    """The point of the snapshot: the same drawn steps come near the exact GP's mean with it and
    stay far without (0.014-0.017 against 0.26-0.28 when written)."""
    with_snapshot, plain = _fit_sine(backend, True), _fit_sine(backend, False)
    assert with_snapshot < 0.04 and plain > 5 * with_snapshot, (with_snapshot, plain)


def test_pyro_state_round_trip(rng):
    """Pyro's loss saves the snapshot in ``state_dict`` and loads it back as a snapshot."""
    from backends import BACKENDS

    backend = BACKENDS["pyro"]()
    backend.reset()
    model, X, y, *_ = _problem(backend, rng, num_dense=0)
    X, y = backend.array(X), backend.array(y)
    loss = backend.lib.QuadruplyStochasticELBO(num_basis=3, snapshot=(X, y))
    loss.loss(model.model, model.guide, X, y)
    saved = loss.state_dict()
    other = backend.lib.QuadruplyStochasticELBO(num_basis=3, snapshot=(X, y))
    other.load_state_dict(saved)
    assert isinstance(other.state, snapshot.Snapshot)
    np.testing.assert_array_equal(backend.numpy(other.state.h), backend.numpy(loss.state.h))


def test_bad_arguments(backend, rng):
    lib = backend.lib
    model, X, y, *_ = _problem(backend, rng, num_dense=0)
    X, y = backend.array(X), backend.array(y)
    with pytest.raises(ValueError, match="snapshot replaces the support-point control_variates"):
        lib.QuadruplyStochasticELBO(snapshot=(X, y), control_variates=X)
    with pytest.raises(TypeError, match="snapshot must be None or the training data"):
        lib.QuadruplyStochasticELBO(snapshot=X)
    with pytest.raises(ValueError, match="snapshot_every"):
        lib.QuadruplyStochasticELBO(snapshot=(X, y), snapshot_every=0)
    sized = lib.GPModel(model.prior, model.likelihood, num_data=50)
    with pytest.raises(ValueError, match="snapshot takes all num_data=50 training rows, got 9"):
        _one_step_state(backend, sized, lib.QuadruplyStochasticELBO(num_basis=3, snapshot=(X, y)), X, y)
    bernoulli = lib.GPModel(model.prior, lib.Bernoulli())
    with pytest.raises(ValueError, match="snapshot is for the Gaussian likelihood"):
        _one_step_state(backend, bernoulli, lib.QuadruplyStochasticELBO(num_basis=3, snapshot=(X, y * 0)), X, y * 0)
