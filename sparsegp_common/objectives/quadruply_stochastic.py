"""The quadruply stochastic estimator of the Gaussian-likelihood ELBO of a weight-space model
(Evans and Nair, 2020, "Quadruply stochastic Gaussian processes", Theorems 1-2, Propositions 1-2).

The model is ``f(x) = phi(x)^T w`` with ``m`` basis functions, prior ``w ~ N(0, S^-1)`` and
``q(w) = N(mu, C C^T)`` (:class:`~sparsegp_common.variational.chevron.Chevron`). With
``y ~ N(Phi w, noise I)`` the negative ELBO is ``(L_mu + L_Sigma + L_const) / 2`` (their Eq. 2):

* ``L_mu = (-2 y^T Phi mu + |Phi mu|^2) / noise + mu^T S mu``;
* ``L_Sigma = sum_r [c_r^T (Phi^T Phi / noise + S) c_r - 2 log C_rr]`` over the columns ``c_r``;
* ``L_const = -log|S| - m + n log(2 pi noise) + y^T y / noise``.

Each sum over data rows or basis functions is estimated from a uniform draw of its indices
(:class:`Draw`): rows (``n~`` of ``n``), two independent basis sets ``I`` and ``J`` for the two
sides of every quadratic form, dense columns ``R`` of ``C`` and diagonal columns ``D``. Sums are
scaled by ``count / drawn``, so the estimate is unbiased with replacement or without (each index
then has inclusion probability ``drawn / count``). Where the structure allows, a quadratic form
is a single-index sum (a diagonal ``S``: ``sum_i S_ii v_i^2``; a diagonal column: Proposition
1's ``(|phi_r|^2 / noise + S_rr) C_rr^2``), which removes the variance of the pairs ``i != j``
that a diagonal never has. The cost is ``O(n~ m~ (1 + k) + m~^2)``, whatever ``n`` and ``m``.

A basis answers ``features(X, I)`` (``Phi[rows, I]``, ``(n~, len(I))``), ``diagonal_prior``,
``prior_diagonal(I)`` (``S_ii``), and, for a dense ``S``, ``prior_block(J, I)`` (``S[J, I]``)
and ``prior_log_det()`` (exact ``log|S|``).
"""
import math
from typing import NamedTuple

from sparsegp_common.ops import backend, device, namespace

__all__ = ["BoundDraw", "Draw", "LiteralDraw", "bound_draw", "draw", "gaussian_loss", "indices", "kl_estimate",
           "literal_arguments", "literal_bound", "literal_draw", "quadratic_form", "rows_read", "subsampled_bound",
           "subsampled_f"]


class Draw(NamedTuple):
    """One draw of the index sets (integer arrays; duplicates allowed).

    Attributes:
        I, J: ``(m~,)`` basis indices in ``[0, m)``, drawn independently of each other (one set
            for both sides of a quadratic form would bias it).
        R: dense columns of ``C`` in ``[0, k)`` (all ``k`` of them, or a uniform draw).
        D: diagonal columns in ``[k, m)``.
    """

    I: object
    J: object
    R: object
    D: object

    def rows(self):
        """The index arrays whose rows of ``q`` the estimate reads."""
        return self.I, self.J, self.D, self.R


def draw(key, like, q, num_basis, num_columns=None, replacement=True):
    """The basis indices of one estimate (the rows are the caller's minibatch): ``I``, ``J`` and
    ``D`` of ``num_basis`` indices each; ``R``: every dense column of ``q`` (``num_columns=None``)
    or ``num_columns`` of them. With ``replacement`` (the default) a draw costs ``O(num_basis)``;
    without, ``O(m)`` (a permutation). ``like``: an array on the device (and of the backend) to
    draw on; ``key``: the backend's key (torch, NumPy: a generator or None)."""
    ops, where, xp = backend(like), device(like), namespace(like)
    m, k = q.num_weights, q.num_dense
    keys = ops.split(key, 4)

    def pick(key, count, size, offset=0):
        drawn = indices(key, like, count, size, replacement)
        return drawn + offset if offset else drawn

    R = xp.arange(k, device=where) if num_columns is None else pick(keys[2], k, num_columns)
    # without replacement, at most the m - k diagonal columns there are
    D = pick(keys[3], m - k, num_basis if replacement else min(num_basis, m - k), offset=k) if m > k \
        else xp.arange(0, device=where)
    return Draw(pick(keys[0], m, num_basis), pick(keys[1], m, num_basis), R, D)


class BoundDraw(NamedTuple):
    """One draw of :func:`subsampled_bound`: basis indices ``I`` ``(m~,)`` and standard normal
    ``eps_dense`` ``(k,)`` and ``eps_I`` ``(m~,)``."""

    I: object
    eps_dense: object
    eps_I: object

    def rows(self):
        """The index arrays whose rows of ``q`` the estimate reads."""
        return (self.I,)


def bound_draw(key, like, q, num_basis, replacement=True):
    """The random numbers of one :func:`subsampled_bound` (arguments as for :func:`draw`)."""
    ops = backend(like)
    keys = ops.split(key, 3)
    I = indices(keys[0], like, q.num_weights, num_basis, replacement)
    return BoundDraw(I, ops.normal(keys[1], (q.num_dense,), like), ops.normal(keys[2], (num_basis,), like))


class LiteralDraw(NamedTuple):
    """One draw of :func:`literal_bound`: basis indices ``I``, ``J`` and columns ``R`` of ``C``
    (``(m~,)`` each, uniform over all ``m``)."""

    I: object
    J: object
    R: object

    def rows(self):
        """The index arrays whose rows of ``q`` the estimate reads (``C[I, R]`` is read at ``I``)."""
        return self.I, self.J


def literal_draw(key, like, q, num_basis, replacement=True):
    """The indices of one :func:`literal_bound` (arguments as for :func:`draw`)."""
    keys = backend(like).split(key, 3)
    return LiteralDraw(*(indices(k, like, q.num_weights, num_basis, replacement) for k in keys))


def rows_read(drawn, *more):
    """The sorted rows of ``q``'s tables that an estimate from ``drawn`` (a :class:`Draw`,
    :class:`BoundDraw` or :class:`LiteralDraw`) reads, with the index arrays ``more`` (repeats kept): what a
    :class:`~sparsegp_common.variational.chevron.GatheredChevron` must hold for it."""
    xp = namespace(drawn.I)
    parts = list(drawn.rows())
    return xp.sort(xp.concat([xp.astype(p, drawn.I.dtype) for p in parts + list(more)]))


def indices(key, like, count, size, replacement=True):
    """``size`` uniform indices in ``[0, count)`` on the device of ``like``: with replacement
    (``O(size)``) or without (a permutation, ``O(count)``)."""
    if not replacement and size > count:
        raise ValueError(f"cannot draw {size} of {count} indices without replacement")
    ops, where = backend(like), device(like)
    return ops.randint(key, (size,), count, where) if replacement else ops.permutation(key, count, where)[:size]


def gaussian_loss(basis, q, X, y, noise, num_data, draw, features=None):
    """An unbiased estimate of the negative ELBO ``(L_mu + L_Sigma + L_const) / 2``.

    Args:
        basis: the weight-space basis (see the module docstring).
        q: a :class:`~sparsegp_common.variational.chevron.Chevron` over the ``m`` weights.
        X: ``(n~, D)`` the drawn data rows; ``y``: ``(n~,)`` their targets.
        noise: the likelihood variance (a scalar array).
        num_data: ``n``, the number of training rows the draw came from.
        draw: a :class:`Draw`.
        features: ``(Phi[:, I], Phi[:, J])`` if the caller has them (None: read here).

    Returns:
        A scalar: its expectation over the rows and ``draw`` is the exact negative ELBO, its
        gradient's that of the exact one.
    """
    xp = namespace(y)
    m, k = q.num_weights, q.num_dense
    rows = num_data / y.shape[0]
    Phi_I, Phi_J = features or (basis.features(X, draw.I), basis.features(X, draw.J))

    def quadratic(v_I, v_J):
        return quadratic_form(basis, Phi_I, Phi_J, draw, (v_I, v_J), (v_I, v_J), noise, rows, m)

    mu_I, mu_J = q.mean(draw.I), q.mean(draw.J)
    L_mu = -2 * rows * (m / draw.I.shape[0]) * xp.sum(y * (Phi_I @ mu_I)) / noise + quadratic(
        mu_I[:, None], mu_J[:, None])[0]
    L_sigma = _diagonal_columns(basis, q, X, noise, rows, draw.D) if m > k else 0.0
    if k:
        columns = quadratic(q.column_block(draw.I, draw.R), q.column_block(draw.J, draw.R))
        L_sigma = L_sigma + (k / draw.R.shape[0]) * xp.sum(columns - 2 * q.log_diagonal(draw.R))
    if basis.diagonal_prior:
        log_det = (m / draw.I.shape[0]) * xp.sum(xp.log(basis.prior_diagonal(draw.I)))
    else:
        log_det = basis.prior_log_det()
    L_const = -log_det - m + num_data * xp.log(2 * math.pi * noise) + rows * xp.sum(y**2) / noise
    return 0.5 * (L_mu + L_sigma + L_const)


def quadratic_form(basis, Phi_I, Phi_J, draw, a, b, noise, rows, m):
    """An unbiased estimate of ``a^T (Phi^T Phi / noise + S) b`` for the columns of ``a`` and ``b``
    (``(a_I, a_J)``, ``(b_I, b_J)``: each at the basis sets ``I`` and ``J``, ``(m~, p)``), from the
    features ``Phi_I``, ``Phi_J`` of the drawn rows (``rows``: ``n / n~``; ``m`` functions):
    ``(p,)``. A diagonal ``S`` is a single-index sum over ``I``."""
    xp = namespace(Phi_I)
    pairs = (m / draw.I.shape[0]) * (m / draw.J.shape[0])
    data = rows * pairs * xp.sum((Phi_J @ a[1]) * (Phi_I @ b[0]), axis=0) / noise
    if basis.diagonal_prior:
        prior = (m / draw.I.shape[0]) * xp.sum(basis.prior_diagonal(draw.I)[:, None] * a[0] * b[0], axis=0)
    else:
        prior = pairs * xp.sum(a[1] * (basis.prior_block(draw.J, draw.I) @ b[0]), axis=0)
    return data + prior


def _diagonal_columns(basis, q, X, noise, rows, D):
    """``sum_{r >= k} (|phi_r|^2 / noise + S_rr) C_rr^2 - 2 log C_rr`` from the columns ``D``."""
    xp = namespace(X)
    Phi_D, log_c = basis.features(X, D), q.log_diagonal(D)
    per_column = (rows * xp.sum(Phi_D**2, axis=0) / noise + basis.prior_diagonal(D)) * xp.exp(2 * log_c) - 2 * log_c
    return ((q.num_weights - q.num_dense) / D.shape[0]) * xp.sum(per_column)


def subsampled_bound(basis, q, X, y, log_prob, num_data, drawn):
    """An estimate of the negative ELBO for any factorising likelihood whose expectation is at
    least the exact negative ELBO when ``log p(y | f)`` is concave in ``f`` (a lower bound on the
    ELBO): the reparameterised subsampled bound of the spec, which corrects Evans and Nair's
    Theorem 3 (their Eq. 5 scales ``z`` by the variance of ``f`` where its standard deviation
    belongs, so the printed estimator bounds the wrong quantity).

    With ``w = q_mu + C eps``, ``f_hat = (m / m~) Phi[:, I] w_I`` is unbiased for ``Phi w``
    given ``eps``, so by Jensen ``E log p(y | f_hat) <= E_q log p(y | f)``; the KL is estimated
    without bias from the same indices (single-index sums: a diagonal prior precision).

    Args:
        log_prob: ``log_prob(y, f)`` per row.
        drawn: a :class:`BoundDraw` (a repeated index takes the normal draw of its first
            occurrence, as one weight).
    """
    f_hat = subsampled_f(basis, q, X, drawn)
    expected = (num_data / y.shape[0]) * namespace(y).sum(log_prob(y, f_hat))
    return kl_estimate(basis, q, drawn.I) - expected


def subsampled_f(basis, q, X, drawn):
    """``f_hat = (m / m~) Phi[:, I] w_I`` at the rows ``X`` ``(n~,)``, with ``w = q_mu + C eps``
    from a :class:`BoundDraw` (a repeated index takes the normal draw of its first occurrence, as
    one weight): unbiased for ``Phi w`` given ``eps``."""
    xp = namespace(X)
    I, eps_dense, eps_I = drawn
    m, k = q.num_weights, q.num_dense
    if not basis.diagonal_prior:
        raise ValueError("the subsampled bound needs a basis with a diagonal prior precision")
    # one draw per distinct index: the draw at the position of its first copy in sorted order
    eps_I = xp.take(eps_I, xp.searchsorted(xp.sort(I), I, side="left"), axis=0)
    log_c = q.log_diagonal(I)
    w = q.mean(I) + xp.exp(log_c) * eps_I * xp.astype(I >= k, X.dtype)
    if k:
        w = w + q.column_block(I, xp.arange(k, device=device(I))) @ eps_dense
    return (m / I.shape[0]) * (basis.features(X, I) @ w)


def kl_estimate(basis, q, I):
    """``KL[q(w) || N(0, S^-1)]`` estimated without bias from the rows ``I`` (a diagonal ``S``)."""
    xp = namespace(q.q_mu)
    m, k, S, log_c = q.num_weights, q.num_dense, basis.prior_diagonal(I), q.log_diagonal(I)
    below = 0.0  # the rows' squared dense entries below the diagonal
    if k:
        columns = xp.arange(k, device=device(I))
        below = xp.sum(xp.where(I[:, None] > columns[None, :], q.column_block(I, columns), 0.0) ** 2, axis=1)
    return 0.5 * ((m / I.shape[0]) * xp.sum(S * (q.mean(I) ** 2 + below + xp.exp(2 * log_c)) - xp.log(S) - 2 * log_c)
                  - m)


def literal_bound(basis, q, X, y, expected_log_prob, num_data, drawn):
    """Evans and Nair's Theorem 3 exactly as printed, for reproducing their results only: each
    row's ``log g(a + z s)`` averaged over ``z ~ N(0, 1)``, with ``a = (m / m~) phi_I mu_I`` and
    ``s = (m / m~)^3 sum_r (phi_J C_{J r}) (phi_I C_{I r})``, an unbiased estimate of the latent
    *variance* ``v`` where its standard deviation belongs. Its mean is at most the printed Eq. 5
    quantity ``sum E_z log g(phi mu + z v)``, which is not the expected log-likelihood (it
    overstates it where ``v < 1``), so this is not a bound on the ELBO: use
    :func:`subsampled_bound`. The KL is estimated as there.

    Args:
        expected_log_prob: ``(y, mean, var) -> (N,)``, ``E log p(y | f)`` under ``f ~ N(mean, var)``
            (the ``z``-integral: ``E log g(a + z s) = E log g(a + z |s|)``, taken as ``var = s^2``).
        drawn: a :class:`LiteralDraw`.
    """
    xp = namespace(y)
    if not basis.diagonal_prior:
        raise ValueError("the literal Theorem 3 needs a basis with a diagonal prior precision")
    a, s = literal_arguments(basis, q, X, drawn)
    # s is often exactly 0 (no drawn column meets a drawn row): the smallest normal number keeps
    # the z-integral's sqrt(var) differentiable there
    expected = (num_data / y.shape[0]) * xp.sum(expected_log_prob(y, a, s**2 + xp.finfo(s.dtype).smallest_normal))
    return kl_estimate(basis, q, drawn.I) - expected


def literal_arguments(basis, q, X, drawn):
    """Theorem 3's ``(a, s)`` per row ``(n~,)``: unbiased for ``phi mu`` and for the latent
    variance ``phi C C^T phi^T`` over the draw of ``I``, ``J`` and ``R``."""
    xp = namespace(X)
    I, J, R = drawn
    scale = q.num_weights / I.shape[0]
    Phi_I, Phi_J = basis.features(X, I), basis.features(X, J)
    a = scale * (Phi_I @ q.mean(I))
    s = scale**3 * xp.sum((Phi_J @ q.entries(J, R)) * (Phi_I @ q.entries(I, R)), axis=-1)
    return a, s
