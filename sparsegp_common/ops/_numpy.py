"""NumPy implementations of the operations the array API standard lacks (float64 references, and
the one-off factorisations done on the host)."""
import contextlib

import numpy as np
from threadpoolctl import threadpool_limits

from ..linalg import CholeskyError
from . import plain_moments

# From this order on a factorisation runs on one BLAS thread: the threaded dpotrf of OpenBLAS
# 0.3.31 (NumPy's and SciPy's wheels) crashed the process (segfault) at n = 16,000 and 20,000 on
# a 2-core machine, where n = 12,000 ran, and on one thread n = 20,000 took 65 s.
ONE_THREAD_FROM = 4096


def solve_lower(L, B, transpose=False):
    return np.linalg.solve(np.swapaxes(L, -1, -2) if transpose else L, B)


def cholesky(A, levels, message, dtype):
    work = A.astype(dtype)  # a copy, whose diagonal takes the jitter: no more n x n arrays than that
    diagonal = np.arange(A.shape[-1])
    base = work[..., diagonal, diagonal]
    with threadpool_limits(1, user_api="blas") if A.shape[-1] >= ONE_THREAD_FROM else contextlib.nullcontext():
        for level in levels:
            work[..., diagonal, diagonal] = base + level
            try:
                return np.linalg.cholesky(work).astype(A.dtype, copy=False)
            except np.linalg.LinAlgError:
                continue
    raise CholeskyError(message)


def cholesky_and_solve(K, B, levels, message):
    L = cholesky(K, levels, message, K.dtype)
    return L, solve_lower(L, B)


def whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    from ..variational.whitened_moments import factor_and_moments

    return factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message)[:3]


def precise_matmul(a, b):
    return a @ b


def is_concrete(x):
    return True


def output_shape(fn):
    """The shape of ``fn()``'s array (None for None)."""
    out = fn()
    return None if out is None else tuple(out.shape)


def normal(key, shape, like):
    """``key`` is a ``numpy.random.Generator``."""
    return key.standard_normal(shape).astype(like.dtype)


def with_partials(fn, *inputs):
    return fn(*inputs)[0]


def stop_gradient(x):
    return x


def split(key, n):
    """``n`` keys from ``key``: a ``numpy.random.Generator`` (or None, NumPy's global RNG) is
    stateful, so the same one serves each draw in turn."""
    return (key,) * n


def uniform(key, shape, dtype=None, device=None):
    draws = np.random.random(shape) if key is None else key.random(shape)
    return draws.astype(np.float64 if dtype is None else dtype)


def permutation(key, n, device=None):
    return np.random.permutation(n) if key is None else key.permutation(n)


def randint(key, shape, high, device=None):
    return np.random.randint(0, high, shape) if key is None else key.integers(0, high, shape)


def blockwise_sum(block, size, chunk, like):
    return sum(block(np.arange(s, min(s + chunk, size)), None) for s in range(0, size, chunk))


def categorical(key, logits, shape):
    rng = np.random if key is None else key
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    if p.ndim == 1:
        return rng.choice(len(p), size=shape, p=p / p.sum())
    cdf = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
    return (rng.random(tuple(shape) + cdf.shape[:-1])[..., None] > cdf).sum(axis=-1)


def bincount(index, length, dtype):
    return np.bincount(index, minlength=length).astype(dtype)


def recurrence(step, first, second, coefficients, count):
    terms = [first, second]
    for i in range(count - 2):
        terms.append(step(terms[-2], terms[-1], *(float(c[i]) for c in coefficients)))
    return np.stack(terms[:count], -1)


# ---------------------------------------------------------------- deep basis kernels (sparsegp_common.dbk)


def wide(x, like):
    """``x`` in the widest float dtype (float64), where the deep basis kernels accumulate and
    ``Kuu``'s distances are expanded."""
    return np.asarray(x, dtype=np.float64)


def cast_like(x, like):
    """``x`` in the dtype of ``like``."""
    return x.astype(like.dtype, copy=False)


def from_host(x, like):
    """A copy of ``x`` in the dtype of ``like``."""
    return np.array(x, dtype=like.dtype)


def dbk_moments(Phi, y, s=None):
    """See :func:`sparsegp_common.ops.plain_moments` (accumulated in float64)."""
    return plain_moments(Phi, y, s, np.float64)


def cos(x):
    return np.cos(x)


def sin(x):
    return np.sin(x)


# special functions for the likelihoods (SciPy, imported when used)

def softplus(x):
    return np.logaddexp(0.0, x)


def lgamma(x):
    from scipy import special

    return special.gammaln(x)


def ndtr(x):
    from scipy import special

    return special.ndtr(x)


def ndtri(p):
    from scipy import special

    return special.ndtri(p)


def log_ndtr(x):
    from scipy import special

    return special.log_ndtr(x)


def logsumexp(x, axis=-1):
    from scipy import special

    return special.logsumexp(x, axis=axis)


def softmax(x, axis=-1):
    from scipy import special

    return special.softmax(x, axis=axis)


def quantile(x, q, axis=0, method="linear"):
    return np.quantile(x, q, axis=axis, method=method)


def as_index(x):
    return np.asarray(x).astype(np.int64)


def when_any(flags, if_any, otherwise):
    return if_any() if np.any(flags) else otherwise()


def host_callback(fn, *arrays):
    fn(*arrays)


def on_host(fn, shape, like, *arrays):
    return np.asarray(fn(*arrays), dtype=like.dtype).reshape(tuple(shape))


def index_add(x, index, values):
    """``x`` with ``values`` added at the rows ``index`` (repeats accumulate), as a new array."""
    out = np.array(x, copy=True)
    np.add.at(out, index, values)
    return out
