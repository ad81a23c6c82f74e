"""Optimiser steps that change only given rows of a table: AdaGrad (Duchi, Hazan and Singer,
2011) and plain SGD, the rules that move no entry without a gradient. With the rows a step read
and the gradient there, a step costs ``O(rows)``, not ``O(table)``: the quadruply stochastic
GP's q tables (Evans and Nair, 2020) are updated so whatever ``m``.

``rows`` may repeat a row; the gradient of all but one copy must then be zero (a
:class:`~sparsegp_common.variational.chevron.GatheredChevron` reads every row from its first
copy), so that a repeat adds nothing. The result equals the dense rule applied to the dense
gradient, zero off ``rows`` (NumPyro's ``Adagrad(momentum=0.0)`` and ``SGD``, to round-off).
"""
from sparsegp_common.ops import backend, namespace

__all__ = ["adagrad_rows", "sgd_rows"]


def adagrad_rows(table, accumulator, rows, grad, lr):
    """AdaGrad at ``rows``: ``G += g^2``, ``w -= lr g / sqrt(G)`` (no step where ``G = 0``).

    Args:
        table, accumulator: ``(m, ...)`` the values and the sums of squared gradients.
        rows: ``(r,)`` integer rows; grad: ``(r, ...)`` the gradient at them.
        lr: the step size.

    Returns:
        ``(table, accumulator)`` after the step.
    """
    xp, ops = namespace(table), backend(table)
    lr = xp.asarray(lr, dtype=table.dtype)  # a float64 schedule (JAX's x64) must not promote the step
    accumulator = ops.index_add(accumulator, rows, grad**2)
    seen = xp.take(accumulator, rows, axis=0)
    safe = xp.where(seen > 0, seen, xp.ones_like(seen))
    step = xp.where(seen > 0, grad / xp.sqrt(safe), xp.zeros_like(grad))
    return ops.index_add(table, rows, -lr * step), accumulator


def sgd_rows(table, rows, grad, lr):
    """Plain SGD at ``rows``: ``w -= lr g``."""
    return backend(table).index_add(table, rows, -namespace(table).asarray(lr, dtype=table.dtype) * grad)
