"""Cholesky factorisation with jitter escalation, and triangular solves."""
import torch

from sparsegp_common.messages import cholesky_failed


class CholeskyError(torch.linalg.LinAlgError):
    """A covariance matrix could not be factorised even after jitter escalation."""


def cholesky(A, jitter=1e-6, max_tries=3, dtype=None):
    """Lower Cholesky factor of ``A + jitter * I``, shape ``(..., M, M)``.

    On failure the jitter is multiplied by 10 up to ``max_tries`` times before a
    :class:`CholeskyError` is raised. ``dtype`` (e.g. ``torch.float64``) factorises in another
    precision and returns the factor in the dtype of ``A``.
    """
    work = A if dtype is None else A.to(dtype)
    eye = torch.eye(A.shape[-1], dtype=work.dtype, device=work.device)
    base = jitter if jitter > 0 else torch.finfo(work.dtype).eps
    for attempt in range(max_tries + 1):
        level = jitter if attempt == 0 else base * 10.0**attempt
        L, info = torch.linalg.cholesky_ex(work + level * eye)
        if not bool(info.any()):
            return L.to(A.dtype)
    raise CholeskyError(cholesky_failed(A.shape, work.dtype, level))


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal.
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    if transpose:
        return torch.linalg.solve_triangular(L.transpose(-1, -2), B, upper=True)
    return torch.linalg.solve_triangular(L, B, upper=False)
