"""The quadruply stochastic ELBO estimator (Evans and Nair, 2020) against the dense Eq. 2 of
``reference.py``: unbiased by exact enumeration of every index draw (value and gradient), by a
z-test at realistic sizes with and without replacement; biased when one basis set serves both
sides of a quadratic form; the chevron family's reads; the same numbers in NumPy, torch and JAX."""
import itertools

import numpy as np
import pytest

import reference as ref
from sparsegp_common.objectives.quadruply_stochastic import Draw, draw, gaussian_loss, indices
from sparsegp_common.variational.chevron import Chevron


class TableBasis:
    """A basis given by its full ``Phi`` ``(n, m)`` and ``S`` ``(m, m)`` (small problems);
    ``features`` reads the rows of ``X``, which here are row indices into ``Phi``."""

    def __init__(self, Phi, S, diagonal_prior):
        self.Phi, self.S, self.diagonal_prior = Phi, S, diagonal_prior

    def features(self, X, I):
        xp = _xp(self.Phi)
        return xp.take(xp.take(self.Phi, X, axis=0), I, axis=1)

    def prior_diagonal(self, I):
        xp = _xp(self.S)
        return xp.take(xp.linalg.diagonal(self.S), I, axis=0)

    def prior_block(self, J, I):
        xp = _xp(self.S)
        return xp.take(xp.take(self.S, J, axis=0), I, axis=1)

    def prior_log_det(self):
        xp = _xp(self.S)
        return 2 * xp.sum(xp.log(xp.linalg.diagonal(xp.linalg.cholesky(self.S))))


def _xp(a):
    from sparsegp_common.ops import namespace

    return namespace(a)


def problem(n=4, m=5, k=2, diagonal_prior=True, seed=0):
    rng = np.random.default_rng(seed)
    Phi = rng.normal(size=(n, m))
    if diagonal_prior:
        S = np.diag(rng.uniform(0.5, 2.0, m))
    else:
        A = rng.normal(size=(m, m))
        S = A @ A.T / m + np.eye(m)
    y = rng.normal(size=n)
    mu, log_diag = rng.normal(size=m), rng.normal(scale=0.3, size=m)
    dense = rng.normal(scale=0.5, size=(m, k))
    return TableBasis(Phi, S, diagonal_prior), y, 0.7, Chevron(mu, log_diag, dense)


def exact(basis, y, noise, q):
    return ref.weight_space_negative_elbo(basis.Phi, basis.S, y, noise, q.q_mu, q.dense_factor())


def estimate(basis, y, noise, q, rows, I, J, R, D):
    ints = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return gaussian_loss(basis, q, ints(rows), y[ints(rows)], noise, len(y),
                         Draw(ints(I), ints(J), ints(R), ints(D)))


def draws(n, m, k, size=1):
    """Every draw with replacement: rows, I, J (``size`` each), one dense and one diagonal column."""
    tuples = lambda count: list(itertools.product(range(count), repeat=size))  # noqa: E731
    return itertools.product(tuples(n), tuples(m), tuples(m), [(r,) for r in range(k)] or [()],
                             [(d,) for d in range(k, m)] or [()])


def test_reference_eq2_is_the_elbo_and_reaches_the_marginal_likelihood():
    """Eq. 2 equals E_q log p(y|w) - KL; at the optimal q it is log N(y | 0, Phi S^-1 Phi^T + noise I)."""
    for diagonal_prior in (True, False):
        basis, y, noise, q = problem(n=7, m=5, k=5, diagonal_prior=diagonal_prior)
        Phi, S = basis.Phi, basis.S
        C = q.dense_factor()
        assert -exact(basis, y, noise, q) == pytest.approx(ref.weight_space_elbo(Phi, S, y, noise, q.q_mu, C), rel=1e-12)
        Sigma = np.linalg.inv(Phi.T @ Phi / noise + S)
        mu, C = Sigma @ Phi.T @ y / noise, np.linalg.cholesky(Sigma)
        lml = ref.exact_lml(Phi @ np.linalg.inv(S) @ Phi.T, y, noise)
        assert -ref.weight_space_negative_elbo(Phi, S, y, noise, mu, C) == pytest.approx(lml, rel=1e-10)


def test_chevron_reads_its_tables():
    _, _, _, q = problem(m=6, k=2)
    C = q.dense_factor()
    assert np.allclose(C, np.tril(C)) and np.allclose(np.diag(C), np.exp(q.log_diag))
    assert np.allclose(C[:, 2:], np.diag(np.exp(q.log_diag))[:, 2:])  # diagonal-only columns
    np.testing.assert_array_equal(q.column_block(np.array([4, 1, 0]), np.array([1, 0])), C[[4, 1, 0]][:, [1, 0]])
    np.testing.assert_allclose(q.covariance(), C @ C.T)
    with pytest.raises(ValueError, match="dense"):
        Chevron(q.q_mu, q.log_diag, np.zeros((6, 7)))


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("diagonal_prior", [True, False])
def test_estimate_is_unbiased_by_enumeration(k, diagonal_prior):
    """Mean over every (row, i, j, r, d) equals Eq. 2 (mean-field, chevron and full C; a
    diagonal S through its single-index sums, a dense S through S[J, I])."""
    basis, y, noise, q = problem(k=k, diagonal_prior=diagonal_prior)
    values = [estimate(basis, y, noise, q, *d) for d in draws(len(y), q.num_weights, k)]
    assert np.mean(values) == pytest.approx(exact(basis, y, noise, q), rel=1e-12)
    assert np.std(values) > 1e-3  # the draws differ: a real estimator, not the exact value


def test_estimate_is_unbiased_with_repeated_indices():
    """Two rows and two basis indices per set, with replacement (so with repeats): every tuple."""
    basis, y, noise, q = problem(n=3, m=4, k=1)
    values = [estimate(basis, y, noise, q, *d) for d in draws(3, 4, 1, size=2)]
    assert np.mean(values) == pytest.approx(exact(basis, y, noise, q), rel=1e-12)


def test_one_basis_set_for_both_sides_is_biased():
    """I = J (one set for both sides of the quadratic forms) is not the exact value on average."""
    basis, y, noise, q = problem(k=0)
    values = [estimate(basis, y, noise, q, rows, I, I, R, D) for rows, I, _, R, D in draws(len(y), q.num_weights, 0)]
    assert abs(np.mean(values) - exact(basis, y, noise, q)) > 1.0


def test_gradients_are_unbiased_by_enumeration():
    """torch float64: the mean of the autograd gradients over every draw equals the gradient of
    Eq. 2 with respect to the mean, both factor tables, the noise and the prior's diagonal."""
    torch = pytest.importorskip("torch")
    basis, y, noise, q = problem(k=2)

    def leaves():
        return [torch.tensor(a, requires_grad=True) for a in (q.q_mu, q.log_diag, q.dense, np.log(noise), np.log(np.diag(basis.S)))]

    def torch_problem(values):
        mu, log_diag, dense, log_noise, log_s = values
        return TableBasis(torch.tensor(basis.Phi), torch.diag(torch.exp(log_s)), True), Chevron(mu, log_diag, dense), torch.exp(log_noise)

    values = leaves()
    b, tq, tnoise = torch_problem(values)
    C = tq.dense_factor()
    mu, yt = tq.q_mu, torch.tensor(y)
    L_mu = (-2 * yt @ b.Phi @ mu + ((b.Phi @ mu) ** 2).sum()) / tnoise + mu @ b.S @ mu
    L_sigma = ((b.Phi @ C) ** 2).sum() / tnoise + torch.trace(b.S @ C @ C.T) - 2 * torch.log(torch.diagonal(C)).sum()
    L_const = -torch.logdet(b.S) - len(mu) + len(y) * torch.log(2 * np.pi * tnoise) + yt @ yt / tnoise
    expected = torch.autograd.grad(0.5 * (L_mu + L_sigma + L_const), values)
    total = [torch.zeros_like(g) for g in expected]
    count = 0
    for rows, I, J, R, D in draws(len(y), q.num_weights, 2):
        values = leaves()
        b, tq, tnoise = torch_problem(values)
        idx = [torch.tensor(a, dtype=torch.int64) for a in (rows, I, J, R, D)]
        loss = gaussian_loss(b, tq, idx[0], yt[idx[0]], tnoise, len(y), Draw(*idx[1:]))
        total = [t + g for t, g in zip(total, torch.autograd.grad(loss, values))]
        count += 1
    for name, t, g in zip(("q_mu", "log_diag", "dense", "log noise", "log S_ii"), total, expected):
        np.testing.assert_allclose((t / count).numpy(), g.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("replacement", [True, False])
def test_estimate_is_unbiased_at_realistic_sizes(replacement):
    """n = 40, m = 30, 8 rows and 6 basis functions per set, chevron k = 3 with 2 dense columns
    drawn by ``draw``: the mean of 4,000 estimates is within 4 standard errors of Eq. 2."""
    basis, y, noise, q = problem(n=40, m=30, k=3, seed=1)
    key = np.random.default_rng(2)
    values = []
    for _ in range(4000):
        rows, d = indices(key, y, 40, 8, replacement), draw(key, y, q, 6, num_columns=2, replacement=replacement)
        assert rows.max() < 40 and d.I.max() < 30 and d.J.max() < 30 and d.R.max() < 3 and d.D.min() >= 3
        values.append(gaussian_loss(basis, q, rows, y[rows], noise, 40, d))
    values = np.array(values)
    z = (values.mean() - exact(basis, y, noise, q)) / (values.std() / np.sqrt(len(values)))
    assert abs(z) < 4, z
    if not replacement:
        assert len(set(rows.tolist())) == 8
        with pytest.raises(ValueError, match="without replacement"):
            indices(key, y, 40, 41, replacement=False)


def test_backends_agree():
    """torch and JAX give NumPy's value at the same draw (float64)."""
    import jax
    import jax.numpy as jnp
    import torch

    basis, y, noise, q = problem(k=2, diagonal_prior=False)
    fixed = (np.array([0, 2]), np.array([1, 4]), np.array([3, 1]), np.array([1]), np.array([2, 4]))
    expected = estimate(basis, y, noise, q, *fixed)
    for to in (torch.tensor, jnp.asarray):
        with jax.enable_x64(True):
            b = TableBasis(to(basis.Phi), to(basis.S), False)
            tq = Chevron(*(to(a) for a in (q.q_mu, q.log_diag, q.dense)))
            idx = [to(a) for a in fixed]
            value = gaussian_loss(b, tq, idx[0], to(y)[idx[0]], to(np.asarray(noise)), len(y), Draw(*idx[1:]))
            assert float(value) == pytest.approx(float(expected), rel=1e-12)
            key = None if to is torch.tensor else jax.random.PRNGKey(0)
            d = draw(key, tq.q_mu, tq, 4)
            assert d.I.shape == d.J.shape == d.D.shape == (4,)
            assert int(d.I.max()) < 5 and int(d.D.min()) >= 2
            np.testing.assert_array_equal(np.asarray(d.R), [0, 1])


# -- Theorem 3 as printed (paper_literal) ---------------------------------------------------------


def _expected_log_sigmoid(y, mean, var, points=101):
    """``E log sigmoid((2y - 1) f)`` under ``f ~ N(mean, var)`` by Gauss-Hermite."""
    x, w = np.polynomial.hermite.hermgauss(points)
    f = mean[:, None] + np.sqrt(2 * var)[:, None] * x
    return np.sum(w * -np.logaddexp(0.0, -(2 * y[:, None] - 1) * f), axis=1) / np.sqrt(np.pi)


def test_literal_theorem_3_estimates_the_printed_quantity_from_below():
    """Enumerating every draw (one index each of I, J and R): Theorem 3's arguments are unbiased
    for ``phi mu`` and for the latent variance ``v`` (not its standard deviation: the spec's
    erratum), its KL estimate for the exact KL, and its mean loss is at least the printed Eq. 5
    quantity's ``KL - sum E_z log g(phi mu + z v)`` (Jensen, logistic sites), which differs from
    the true negative ELBO ``KL - sum E_z log g(phi mu + z sqrt(v))``."""
    from sparsegp_common.objectives.quadruply_stochastic import LiteralDraw, literal_arguments, literal_bound

    basis, _, _, q = problem(n=4, m=5, k=2)
    y = np.array([0.0, 1.0, 1.0, 0.0])
    rows = np.arange(4)
    C = q.dense_factor()
    mean, v = basis.Phi @ q.q_mu, np.sum((basis.Phi @ C) ** 2, axis=1)
    S = np.diag(basis.S)
    kl = 0.5 * (np.sum(S * (q.q_mu**2 + np.sum(C**2, axis=1))) - 5 - np.sum(np.log(S)) - 2 * np.sum(q.log_diag))
    a_sum, s_sum, loss_sum, count = 0.0, 0.0, 0.0, 0
    for I, J, R in itertools.product(range(5), repeat=3):
        drawn = LiteralDraw(np.array([I]), np.array([J]), np.array([R]))
        a, s = literal_arguments(basis, q, rows, drawn)
        a_sum, s_sum, count = a_sum + a, s_sum + s, count + 1
        loss_sum += literal_bound(basis, q, rows, y, _expected_log_sigmoid, 4, drawn)
    np.testing.assert_allclose(a_sum / count, mean, rtol=1e-12)
    np.testing.assert_allclose(s_sum / count, v, rtol=1e-12)
    kl_mean = np.mean([literal_bound(basis, q, rows, y, lambda y, a, var: np.zeros_like(a), 4,
                                     LiteralDraw(np.array([i]), np.array([0]), np.array([0]))) for i in range(5)])
    np.testing.assert_allclose(kl_mean, kl, rtol=1e-12)
    printed = kl - np.sum(_expected_log_sigmoid(y, mean, v**2))
    true = kl - np.sum(_expected_log_sigmoid(y, mean, v))
    assert loss_sum / count >= printed - 1e-12
    assert abs(printed - true) > 1e-3  # v != 1: the printed quantity is another one


def test_subsampled_f_draws_one_weight_per_distinct_index():
    """An index drawn twice is one weight: both copies take the same normal draw, so each row's
    ``f_hat`` is ``(m / m~) mult_i w_i`` here (``Phi = I``: row ``i`` reads weight ``i`` alone)
    with ``w_i = mu_i + C_ii eps`` and ``eps`` one of the drawn normals."""
    from sparsegp_common.objectives.quadruply_stochastic import BoundDraw, subsampled_f

    m = 5
    _, _, _, q = problem(m=m, k=0)
    I, eps = np.array([3, 1, 3]), np.array([0.3, -1.2, 0.8])
    f = subsampled_f(TableBasis(np.eye(m), np.eye(m), True), q, np.arange(m), BoundDraw(I, np.zeros(0), eps))
    np.testing.assert_array_equal(f[[0, 2, 4]], 0.0)
    for i, multiplicity in ((3, 2), (1, 1)):
        drawn = (f[i] / (multiplicity * m / len(I)) - q.q_mu[i]) / np.exp(q.log_diag[i])
        assert np.isclose(eps, drawn, rtol=1e-12, atol=0).any(), (i, drawn)
