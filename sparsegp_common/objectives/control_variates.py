"""Support-point control variates of the quadruply stochastic estimator (Evans and Nair, 2020,
Sec. 2.4, Eq. 3, Proposition 3 and App. F.1), with their state passed in and returned.

For vectors ``v`` (the mean and the dense columns of ``C``, the columns of an ``(m, p)`` array)
the data quadratic ``|Phi v|^2 / noise`` is estimated from rows and two basis sets ``I``, ``J``;
its basis-index noise is cancelled, to the extent that ``n / n_bar Phi_p^T Phi_p`` resembles the
minibatch's ``n / n~ Phi_l^T Phi_l``, by adding the zero-mean pair

    ``- n m^2 / (noise n_bar m~^2) (Phi_pJ v_J) . (Phi_pI v_I)  +  n / (noise n_bar) |a|^2``

over ``n_bar`` support rows ``p`` drawn once, ``a = Phi_p v`` (``(n_bar, p)``). ``Phi_p`` is the
basis at fixed hyperparameters (F.3: the pair stays zero-mean when the hyperparameters move; only
its correlation with the estimate fades, until a refresh moves them), so ``a`` is kept up to date in ``O(n_bar m~)`` per step from
the entries a step changed (:func:`advance`): an optimiser that moves only the drawn entries
(SGD, AdaGrad) keeps it exact; Adam's moments move every entry and would make it wrong.

For a dense prior precision ``S = K(Z, Z)`` (a kernel basis) the prior quadratic ``v^T S v`` is
estimated from the same two sets, and App. F.2's Nystrom control variate cancels its noise the
same way: the support rows gain ``Psi = L^-1 K(X_p, Z)`` (``L L^T = K(X_p, X_p)``, so that
``Psi^T Psi`` is the Nystrom approximation of ``S``) with coefficient 1, beside ``Phi_p`` with
coefficient ``n / (noise n_bar)`` (:meth:`Support.features`, :meth:`Support.coefficients`).

The gradient of ``|a|^2`` is dense; its entries at ``U``, the distinct indices of ``I`` and
``J``, are kept and scaled by ``m / |U|`` (F.1), which is unbiased for exchangeable draws. Repeated
indices count once: each occurrence is weighted by one over its multiplicity (from a sort), so no
``unique`` (with its data-dependent size) is needed.
"""
from typing import NamedTuple

from sparsegp_common.linalg import cholesky, solve_lower
from sparsegp_common.ops import backend, device, namespace

__all__ = ["State", "Support", "advance", "catch_up", "initial_state", "occurrences", "pair", "support"]


class Support(NamedTuple):
    """The support rows: their inputs ``X`` ``(n_bar, D)``, the basis as it was at
    initialisation, ``basis`` (``features(X, I)``), and for a dense prior precision the
    Cholesky factor ``nystrom`` of ``K(X, X)`` (None: a diagonal one)."""

    X: object
    basis: object
    nystrom: object = None

    def features(self, I):
        """The support rows' features of the basis functions ``I``: ``Phi_p[:, I]`` ``(n_bar, len(I))``,
        and below them ``Psi[:, I]`` with a dense prior precision (``(2 n_bar, len(I))``)."""
        Phi = self.basis.features(self.X, I)
        if self.nystrom is None:
            return Phi
        return namespace(Phi).concat([Phi, solve_lower(self.nystrom, self.basis.prior_cross(self.X, I))], axis=0)

    def coefficients(self, num_data, noise, like):
        """Each support row's coefficient ``(rows,)``: ``n / (noise n_bar)`` for the data rows, 1 for
        the Nystrom rows."""
        xp, n_bar = namespace(like), self.X.shape[0]
        data = xp.ones((n_bar,), dtype=like.dtype, device=device(like)) * (num_data / (noise * n_bar))
        if self.nystrom is None:
            return data
        return xp.concat([data, xp.ones((n_bar,), dtype=like.dtype, device=device(like))])


def support(X, basis):
    """The :class:`Support` on the rows ``X`` for ``basis`` (the Nystrom factor computed here
    when its prior precision is dense: ``O(n_bar^3)``, in float64, as ``S``'s own jitter was
    chosen for)."""
    if basis.diagonal_prior:
        return Support(X, basis)
    return Support(X, basis, cholesky(basis.gram(X), basis.jitter, dtype="float64"))


def initial_state(support, v):
    """``a = Phi_p v`` exactly, ``(rows, p)`` for ``v`` ``(m, p)``: ``O(n_bar m)``, at the start and
    at every refresh (which clears round-off drift)."""
    xp = namespace(v)
    return support.features(xp.arange(v.shape[0])) @ v


def occurrences(index, dtype):
    """``(weights, count)``: each entry of ``index`` weighted (in ``dtype``) by one over its
    multiplicity, so that a sum over them counts each distinct index once, and the number of
    distinct indices."""
    xp = namespace(index)
    ordered = xp.sort(index)  # O(n log n): the multiplicity is the width of the index's run
    runs = xp.searchsorted(ordered, index, side="right") - xp.searchsorted(ordered, index, side="left")
    weights = 1.0 / xp.astype(runs, dtype)
    return weights, xp.sum(weights)


def pair(support, a, v_I, v_J, I, J, num_weights, num_data, noise):
    """The control-variate pair of Eq. 3 for the columns of ``v`` (``(m, p)``), summed over them,
    with the F.1 gradient of its ``|a|^2`` part.

    Args:
        support: the :class:`Support`; ``a``: its state ``Phi_p v`` at the current ``v`` (``(n_bar, p)``).
        v_I, v_J: ``v`` at the estimate's basis sets ``I`` and ``J`` (``(m~, p)``, the live
            parameters). ``num_weights``: ``m``; ``num_data``: ``n``; ``noise``: the likelihood variance.

    Returns:
        A scalar of zero mean over ``I`` and ``J``, to add to the estimate of
        ``sum_columns |Phi v|^2 / noise``.
    """
    xp, ops = namespace(v_I), backend(v_I)
    m = num_weights
    scale = support.coefficients(num_data, noise, v_I)[:, None]
    Phi_I, Phi_J = support.features(I), support.features(J)
    sampled = (m / I.shape[0]) * (m / J.shape[0]) * xp.sum(scale * (Phi_J @ v_J) * (Phi_I @ v_I))
    weights, size = occurrences(xp.concat([I, J]), v_I.dtype)
    v_U = xp.concat([v_I, v_J])
    live = a + xp.concat([Phi_I, Phi_J], axis=1) @ (weights[:, None] * (v_U - ops.stop_gradient(v_U)))
    # scale |a|^2 with its gradient w.r.t. v scaled by m / |U| (F.1), the noise's left exact
    squares = live**2
    change = xp.sum(ops.stop_gradient(scale) * (squares - ops.stop_gradient(squares)))  # value 0, the gradient w.r.t. v at U
    return xp.sum(scale * ops.stop_gradient(squares)) + (m / size) * change - sampled


def advance(support, a, rows, change):
    """The state after a step that changed ``v`` only at ``rows``: ``a + Phi_p change``, ``change``
    being the step's change of ``v`` at ``rows``, ``(len(rows), p)`` (repeated rows hold the same
    change and count once)."""
    weights, _ = occurrences(rows, a.dtype)
    return a + support.features(rows) @ (weights[:, None] * change)


class State(NamedTuple):
    """The control variates' state between steps (arrays only: it rides in NumPyro's mutable state
    and in checkpoints).

    Attributes:
        X: the support rows ``(n_bar, D)``.
        a: ``Phi_p v`` ``(n_bar, p)`` at the values ``v`` had when ``rows`` were last read.
        rows: the rows a step may have changed since (the last step's basis sets).
        values: ``v`` at ``rows`` when they were read ``(len(rows), p)``.
        lengthscale, variance: the kernel's values ``Phi_p`` is computed at (those of the last
            refresh: fixed in between, F.3).
        step: steps since the start.
    """

    X: object
    a: object
    rows: object
    values: object
    lengthscale: object
    variance: object
    step: object


def catch_up(support, state, v_rows):
    """``a`` at the current ``v`` from the state of the step before, assuming (as AdaGrad and SGD
    do) that the step changed ``v`` only at the rows it read: ``O(n_bar len(rows) p)``.
    ``v_rows(index)``: the current ``v`` at ``index``."""
    change = backend(state.a).stop_gradient(v_rows(state.rows) - state.values)
    return advance(support, state.a, state.rows, change)
