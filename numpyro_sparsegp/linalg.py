"""Cholesky factorisation with jitter escalation, and triangular solves (see :mod:`sparsegp_common.linalg`);
under ``jax.jit`` a failed factorisation gives NaN, outside it ``CholeskyError``."""
from sparsegp_common.linalg import CholeskyError, cholesky, cholesky_and_solve, solve_lower

__all__ = ["CholeskyError", "cholesky", "cholesky_and_solve", "solve_lower"]
