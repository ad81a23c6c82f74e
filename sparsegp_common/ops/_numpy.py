"""NumPy implementations of the operations the array API standard lacks (float64 references)."""
import numpy as np

from ..linalg import CholeskyError


def solve_lower(L, B, transpose=False):
    return np.linalg.solve(np.swapaxes(L, -1, -2) if transpose else L, B)


def cholesky(A, levels, message):
    eye = np.eye(A.shape[-1], dtype=A.dtype)
    for level in levels:
        try:
            return np.linalg.cholesky(A + level * eye)
        except np.linalg.LinAlgError:
            continue
    raise CholeskyError(message)


def check_dtype(dtype):
    return dtype


def precise_matmul(a, b):
    return a @ b


def is_concrete(x):
    return True


def normal(key, shape, like):
    """``key`` is a ``numpy.random.Generator``."""
    return key.standard_normal(shape).astype(like.dtype)


def stop_gradient(x):
    return x


def split(key, n):
    """``n`` keys from ``key``: a ``numpy.random.Generator`` (or None, NumPy's global RNG) is
    stateful, so the same one serves each draw in turn."""
    return (key,) * n


def uniform(key, shape, dtype=None, device=None):
    draws = np.random.random(shape) if key is None else key.random(shape)
    return draws.astype(np.float64 if dtype is None else dtype)


def recurrence(step, first, second, coefficients, count):
    terms = [first, second]
    for i in range(count - 2):
        terms.append(step(terms[-2], terms[-1], *(float(c[i]) for c in coefficients)))
    return np.stack(terms[:count], -1)
