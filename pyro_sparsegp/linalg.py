"""Cholesky factorisation with jitter escalation, and triangular solves (see :mod:`sparsegp_common.linalg`);
``CholeskyError`` is also a ``torch.linalg.LinAlgError``."""
from sparsegp_common.linalg import cholesky, cholesky_and_solve, solve_lower
from sparsegp_common.ops._torch import CholeskyError

__all__ = ["CholeskyError", "cholesky", "cholesky_and_solve", "solve_lower"]
