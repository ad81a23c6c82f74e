"""Support-point control variates of the quadruply stochastic estimator (Evans and Nair, 2020,
Sec. 2.4, Eq. 3, Proposition 3 and App. F.1), with their state passed in and returned.

For vectors ``v`` (the mean and the dense columns of ``C``, the columns of an ``(m, p)`` array)
the data quadratic ``|Phi v|^2 / noise`` is estimated from rows and two basis sets ``I``, ``J``;
its basis-index noise is cancelled, to the extent that ``n / n_bar Phi_p^T Phi_p`` resembles the
minibatch's ``n / n~ Phi_l^T Phi_l``, by adding the zero-mean pair

    ``- n m^2 / (noise n_bar m~^2) (Phi_pJ v_J) . (Phi_pI v_I)  +  n / (noise n_bar) |a|^2``

over ``n_bar`` support rows ``p`` drawn once, ``a = Phi_p v`` (``(n_bar, p)``). ``Phi_p`` is the
basis at initialisation (F.3: the pair stays zero-mean when the hyperparameters move; only its
correlation with the estimate fades), so ``a`` is kept up to date in ``O(n_bar m~)`` per step from
the entries a step changed (:func:`advance`): an optimiser that moves only the drawn entries
(SGD, AdaGrad) keeps it exact; Adam's moments move every entry and would make it wrong.

The gradient of ``|a|^2`` is dense; its entries at ``U``, the distinct indices of ``I`` and
``J``, are kept and scaled by ``m / |U|`` (F.1), which is unbiased for exchangeable draws. Repeated
indices count once: each occurrence is weighted by one over its multiplicity, so no ``unique``
(with its data-dependent size) is needed.
"""
from typing import NamedTuple

from sparsegp_common.ops import backend, namespace

__all__ = ["Support", "advance", "initial_state", "occurrences", "pair"]


class Support(NamedTuple):
    """The support rows: their inputs ``X`` ``(n_bar, D)`` and the basis as it was at
    initialisation, ``basis`` (``features(X, I)``)."""

    X: object
    basis: object


def initial_state(support, v):
    """``a = Phi_p v`` exactly, ``(n_bar, p)`` for ``v`` ``(m, p)``: ``O(n_bar m)``, at the start and
    at every refresh (which clears round-off drift)."""
    xp = namespace(v)
    return support.basis.features(support.X, xp.arange(v.shape[0])) @ v


def occurrences(I, J, dtype):
    """``(indices, weights, |U|)``: ``I`` and ``J`` joined, each occurrence weighted (in ``dtype``)
    by one over its multiplicity, so that a sum over them counts each distinct index once."""
    xp = namespace(I)
    idx = xp.concat([I, J])
    weights = 1.0 / xp.astype(xp.sum(xp.astype(idx[:, None] == idx[None, :], xp.int32), axis=1), dtype)
    return idx, weights, xp.sum(weights)


def pair(support, a, v, I, J, num_data, noise):
    """The control-variate pair of Eq. 3 for the columns of ``v`` (``(m, p)``), summed over them,
    with the F.1 gradient of its ``|a|^2`` part.

    Args:
        support: the :class:`Support`; ``a``: its state ``Phi_p v`` at the current ``v`` (``(n_bar, p)``).
        v: ``(m, p)``, the live parameters (only the rows ``I``, ``J`` are read).
        I, J: the estimate's basis sets. ``num_data``: ``n``; ``noise``: the likelihood variance.

    Returns:
        A scalar of zero mean over ``I`` and ``J``, to add to the estimate of
        ``sum_columns |Phi v|^2 / noise``.
    """
    xp, ops = namespace(v), backend(v)
    m, n_bar = v.shape[0], support.X.shape[0]
    scale = num_data / (noise * n_bar)
    v_I, v_J = xp.take(v, I, axis=0), xp.take(v, J, axis=0)
    Phi_I, Phi_J = support.basis.features(support.X, I), support.basis.features(support.X, J)
    sampled = scale * (m / I.shape[0]) * (m / J.shape[0]) * xp.sum((Phi_J @ v_J) * (Phi_I @ v_I))
    idx, weights, size = occurrences(I, J, v.dtype)
    v_U = xp.take(v, idx, axis=0)
    Phi_U = xp.concat([Phi_I, Phi_J], axis=1)  # the features at idx = concat(I, J)
    live = a + Phi_U @ (weights[:, None] * (v_U - ops.stop_gradient(v_U)))
    exact = scale * xp.sum(live**2)
    factor = m / size
    return factor * exact + ops.stop_gradient((1 - factor) * exact) - sampled


def advance(support, a, I, J, change):
    """The state after a step that changed ``v`` only at ``I`` and ``J``: ``a + Phi_p change``,
    ``change`` being the step's change of ``v`` at the rows ``concat(I, J)``, ``(2 m~, p)`` (what a
    sparse update gathered anyway; repeated rows hold the same change and count once)."""
    idx, weights, _ = occurrences(I, J, a.dtype)
    return a + support.basis.features(support.X, idx) @ (weights[:, None] * change)
