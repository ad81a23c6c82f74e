"""A snapshot control variate for the mean's part of the quadruply stochastic estimator: the
variance reduction of stochastic variance-reduced gradients (SVRG; Johnson and Zhang, 2013,
"Accelerating stochastic gradient descent using predictive variance reduction"), for a loss
whose draws are of rows and of basis functions alike.

``L_mu(mu) = (-2 y^T Phi mu + |Phi mu|^2) / noise + mu^T S mu`` is quadratic, and its estimate
``L^(mu)`` from one draw of rows and basis sets ``I``, ``J`` too. Every few steps a full pass over
the ``n`` training rows takes a snapshot ``s`` of ``mu`` with ``h = (Phi^T Phi / noise + S) s -
Phi^T y / noise`` (half the exact gradient there) and ``c = s^T (Phi^T Phi / noise + S) s``, and
each step adds the pair

    ``- L^(s) - grad L^(s) . (mu - s) + L_mu(s) + grad L_mu(s) . (mu - s)``
    ``= 2 y^ . mu + Q^(s, s) - Q^(s, mu) - Q^(mu, s) + 2 h . mu - c``

(``Q^(a, b)``: the draw's estimate of ``a^T (Phi^T Phi / noise + S) b``, :func:`quadratic_form`;
``y^ . mu``: its estimate of ``y^T Phi mu / noise``), of mean zero over the draw. The loss's
gradient in ``mu`` is then ``grad L^(mu) - grad L^(s) + grad L_mu(s)``: its noise is that of
``Q^`` at ``mu - s``, and vanishes as ``mu`` settles, where the support-point variates (Evans and
Nair, 2020, Proposition 3) leave the rows' noise and that of the basis functions outside the
support rows. ``2 h . mu`` is estimated from ``I`` and ``J`` (``(m / m~) (h_I . mu_I + h_J .
mu_J)``), so a step still changes only the rows it drew.

The pair is computed with the basis at the snapshot's hyperparameters and noise, so it stays
zero-mean when they move (App. F.3's argument): it then cancels less, until the next snapshot.
A snapshot costs one pass of ``O(n m)`` feature entries (``O(n m D)`` kernel evaluations, or
reads of a factor held in host memory), so it suits the sizes where ``n m`` fits a pass every
few steps: a whitened inducing basis at every training input (Table 3's protocol).
"""
from typing import NamedTuple

from sparsegp_common.objectives.quadruply_stochastic import quadratic_form
from sparsegp_common.ops import backend, device, namespace

__all__ = ["Snapshot", "exact", "pair"]


class Snapshot(NamedTuple):
    """The snapshot control variate's state between steps (arrays only: it rides in NumPyro's
    mutable state and in checkpoints).

    Attributes:
        X, y: the training rows ``(n, D)`` and their targets ``(n,)`` (the full pass reads them).
        s: ``mu`` at the last snapshot ``(m,)``.
        h: ``(Phi^T Phi / noise + S) s - Phi^T y / noise`` there ``(m,)``.
        c: ``s^T (Phi^T Phi / noise + S) s`` (a scalar).
        lengthscale, variance, noise: the hyperparameters the snapshot was taken at.
        step: steps since the start (a snapshot is taken when it is a multiple of the period).
    """

    X: object
    y: object
    s: object
    h: object
    c: object
    lengthscale: object
    variance: object
    noise: object
    step: object


def exact(basis, X, y, s, noise, block):
    """``(h, c)`` at the snapshot ``s`` ``(m,)`` over all the rows ``X`` ``(n, D)``, ``y`` ``(n,)``,
    one pass over blocks of ``block`` rows (working memory ``O(block m)``): ``O(n m)``."""
    xp, ops = namespace(s), backend(s)
    m, where = s.shape[0], device(s)
    every = xp.arange(m, device=where)

    def rows(R, weights):
        Phi = basis.features(xp.take(X, R, axis=0), every)
        f = Phi @ s
        residual, square = f - xp.take(y, R, axis=0), f**2
        if weights is not None:
            residual, square = residual * weights, square * weights
        return xp.concat([residual @ Phi, xp.sum(square)[None]])

    data = ops.blockwise_sum(rows, X.shape[0], min(block, X.shape[0]), s) / noise
    prior = _prior_product(basis, s, block)
    return data[:m] + prior, data[m] + xp.sum(s * prior)


def _prior_product(basis, s, block):
    """``S s`` ``(m,)``: over blocks of ``S``'s columns for a dense ``S``."""
    xp, ops = namespace(s), backend(s)
    every = xp.arange(s.shape[0], device=device(s))
    if basis.diagonal_prior:
        return basis.prior_diagonal(every) * s

    def columns(I, weights):
        s_I = xp.take(s, I, axis=0)
        return basis.prior_block(every, I) @ (s_I if weights is None else s_I * weights)

    return ops.blockwise_sum(columns, s.shape[0], min(block, s.shape[0]), s)


def pair(basis, state, features, X, y, draw, mu_I, mu_J, num_data):
    """The pair above for the draw (rows ``X`` ``(n~, D)`` with targets ``y``, basis sets
    ``draw.I`` and ``draw.J``), to add to the estimate of ``L_mu``: a scalar of mean zero.

    Args:
        basis: the basis at the snapshot's hyperparameters; ``features``: its ``(Phi[:, I],
            Phi[:, J])`` at ``X``. ``state``: the :class:`Snapshot`.
        mu_I, mu_J: the live mean at ``I`` and ``J`` ``(m~,)``.
        num_data: ``n``.
    """
    xp = namespace(mu_I)
    I, J = draw.I, draw.J
    m, rows, noise = state.s.shape[0], num_data / y.shape[0], state.noise
    s_I, s_J = xp.take(state.s, I, axis=0)[:, None], xp.take(state.s, J, axis=0)[:, None]
    Phi_I, Phi_J = features

    def Q(a, b):
        return quadratic_form(basis, Phi_I, Phi_J, draw, a, b, noise, rows, m)[0]

    mu = (mu_I[:, None], mu_J[:, None])
    linear = 2 * rows * (m / I.shape[0]) * xp.sum(y * (Phi_I @ mu_I)) / noise
    h_mu = ((m / I.shape[0]) * xp.sum(xp.take(state.h, I, axis=0) * mu_I)
            + (m / J.shape[0]) * xp.sum(xp.take(state.h, J, axis=0) * mu_J))
    return linear + Q((s_I, s_J), (s_I, s_J)) - Q((s_I, s_J), mu) - Q(mu, (s_I, s_J)) + h_mu - state.c
