"""Cholesky factorisation with jitter escalation, and triangular solves."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.linalg import solve_triangular

from sparsegp_common.messages import cholesky_failed

from .checks import concrete


class CholeskyError(RuntimeError):
    """A covariance matrix could not be factorised even after jitter escalation."""


def cholesky(A, jitter=1e-6, max_tries=3, dtype=None):
    """Lower Cholesky factor of ``A + jitter * I``, shape ``(..., M, M)``.

    On failure the jitter is multiplied by 10 up to ``max_tries`` times before a
    :class:`CholeskyError` is raised. Under ``jit``/``grad`` tracing the retries are nested
    ``lax.cond`` and a final failure returns NaN (so the loss becomes NaN) instead of raising: a
    host callback to raise would cost about as much as the rest of a small SVI step. ``dtype``
    (e.g. ``jnp.float64``, which needs ``jax_enable_x64``) factorises in another precision and
    returns the factor in the dtype of ``A``.
    """
    if dtype is not None and jnp.dtype(dtype) == jnp.float64 and not jax.config.jax_enable_x64:
        raise ValueError(f"cholesky_dtype={jnp.dtype(dtype).name} needs jax.config.update('jax_enable_x64', True)")
    work = A if dtype is None else A.astype(dtype)
    eye = jnp.eye(A.shape[-1], dtype=work.dtype)
    base = jitter if jitter > 0 else float(jnp.finfo(work.dtype).eps)
    levels = [jitter] + [base * 10.0**i for i in range(1, max_tries + 1)]

    message = cholesky_failed(A.shape, work.dtype, levels[-1])
    if concrete(work):  # eager: plain retries
        for level in levels:
            L = jnp.linalg.cholesky(work + level * eye)
            if bool(jnp.all(jnp.isfinite(L))):
                return L.astype(A.dtype)
        raise CholeskyError(message)

    def attempt(i):
        L = jnp.linalg.cholesky(work + levels[i] * eye)
        if i == max_tries:
            return L
        return lax.cond(jnp.all(jnp.isfinite(L)), lambda: L, lambda: attempt(i + 1))

    return attempt(0).astype(A.dtype)


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal.
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    batch = jnp.broadcast_shapes(L.shape[:-2], B.shape[:-2])
    L, B = jnp.broadcast_to(L, batch + L.shape[-2:]), jnp.broadcast_to(B, batch + B.shape[-2:])
    return solve_triangular(L, B, lower=True, trans=1 if transpose else 0)
