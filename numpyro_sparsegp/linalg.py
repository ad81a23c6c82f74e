"""Cholesky factorisation with jitter escalation, and triangular solves.

Both go through the explicit inverse of the triangular factor, with derivative rules (JVPs, so
forward and reverse mode both work) made of matrix products: on CPU, XLA's triangular solves run
several times slower than products of the same size, and JAX's own derivatives of ``cholesky``
and ``solve_triangular`` take two triangular solves each. Under ``jit`` the inverse of a factor is
computed once and shared (as a common subexpression) by every solve and derivative that needs it.
For a well-conditioned factor (a Cholesky factor of ``Kuu`` with jitter) the inverse is as
accurate as the solves.
"""
import functools

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
    base = jitter if jitter > 0 else float(jnp.finfo(work.dtype).eps)
    levels = (float(jitter),) + tuple(base * 10.0**i for i in range(1, max_tries + 1))

    if concrete(work):  # eager: plain retries
        eye = jnp.eye(A.shape[-1], dtype=work.dtype)
        for level in levels:
            L = jnp.linalg.cholesky(work + level * eye)
            if bool(jnp.all(jnp.isfinite(L))):
                return L.astype(A.dtype)
        raise CholeskyError(cholesky_failed(A.shape, work.dtype, levels[-1]))
    return _cholesky_retrying(work, levels).astype(A.dtype)


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal (its upper triangle is ignored).
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    batch = jnp.broadcast_shapes(L.shape[:-2], B.shape[:-2])
    return _solve_lower(jnp.broadcast_to(L, batch + L.shape[-2:]), jnp.broadcast_to(B, batch + B.shape[-2:]), transpose)


def _mT(A):
    return jnp.swapaxes(A, -1, -2)


def _inverse_lower(L):
    return solve_triangular(L, jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape), lower=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _cholesky_retrying(A, levels):
    """Factor of ``A + level * I`` for the first of the jitter ``levels`` that succeeds (NaN when
    none does), by nested ``lax.cond``."""
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)

    def attempt(i):
        L = jnp.linalg.cholesky(A + levels[i] * eye)
        if i == len(levels) - 1:
            return L
        return lax.cond(jnp.all(jnp.isfinite(L)), lambda: L, lambda: attempt(i + 1))

    return attempt(0)


@_cholesky_retrying.defjvp
def _cholesky_retrying_jvp(levels, primals, tangents):
    # dL = L Phi(L^{-1} dA L^{-T}), Phi: lower triangle with the diagonal halved; the jitter is a
    # constant, so this holds whichever level succeeded. dA is symmetrised, as cholesky reads
    # only the symmetric part of its input.
    (A,), (dA,) = primals, tangents
    L = _cholesky_retrying(A, levels)
    L_inv = _inverse_lower(L)
    inner = L_inv @ (0.5 * (dA + _mT(dA))) @ _mT(L_inv)
    inner = jnp.tril(inner) - 0.5 * jnp.diagonal(inner, axis1=-2, axis2=-1)[..., None] * jnp.eye(A.shape[-1], dtype=A.dtype)
    return L, L @ inner


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _solve_lower(L, B, transpose):
    L_inv = _inverse_lower(L)
    return (_mT(L_inv) if transpose else L_inv) @ B


@_solve_lower.defjvp
def _solve_lower_jvp(transpose, primals, tangents):
    # L X = B:  dX = L^{-1} (dB - dL X);  L^T X = B:  dX = L^{-T} (dB - dL^T X)
    (L, B), (dL, dB) = primals, tangents
    L_inv = _inverse_lower(L)
    if transpose:
        L_inv, dL = _mT(L_inv), _mT(jnp.tril(dL))
    else:
        dL = jnp.tril(dL)
    X = L_inv @ B
    return X, L_inv @ (dB - dL @ X)
