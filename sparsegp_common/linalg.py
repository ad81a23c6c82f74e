"""Cholesky factorisation with jitter escalation, and triangular solves, for any backend."""
from sparsegp_common.messages import cholesky_failed
from sparsegp_common.ops import backend, namespace


class CholeskyError(RuntimeError):
    """A covariance matrix could not be factorised even after jitter escalation."""


def cholesky(A, jitter=1e-6, max_tries=3, dtype=None):
    """Lower Cholesky factor of ``A + jitter * I``, shape ``(..., M, M)``.

    On failure the jitter is multiplied by 10 up to ``max_tries`` times before a
    :class:`CholeskyError` is raised (under JAX tracing a final failure gives NaN instead).
    ``dtype`` (e.g. float64) factorises in another precision and returns the factor in the dtype
    of ``A``; in JAX float64 needs ``jax_enable_x64``.
    """
    xp, ops = namespace(A), backend(A)
    work = A if dtype is None else xp.astype(A, ops.check_dtype(dtype))
    base = jitter if jitter > 0 else float(xp.finfo(work.dtype).eps)
    levels = [jitter] + [base * 10.0**i for i in range(1, max_tries + 1)]
    L = ops.cholesky(work, levels, cholesky_failed(A.shape, work.dtype, levels[-1]))
    return xp.astype(L, A.dtype)


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal.
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    return backend(L, B).solve_lower(L, B, transpose)
