"""JAX implementations of the operations the array API standard lacks."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..linalg import CholeskyError, phi_inner
from . import plain_moments
from ._jax_trig import cos, sin  # noqa: F401 (this backend's cos and sin)


@functools.cache
def _batched_lapack_deadlocks():
    # jaxlib 0.10.0 to 0.11.0 split a batched LAPACK call over XLA's CPU thread pool and block a
    # pool thread until its parts finish: as many such calls at once as the pool has threads
    # (two independent solves on a 2-core machine) wait for each other for ever. Fixed upstream
    # after 0.11.0 (jax commit 859992407d, "Don't try to parallelize LAPACK kernels").
    import jaxlib

    version = tuple(int(part) for part in jaxlib.__version__.split(".")[:3] if part.isdigit())
    return (0, 10, 0) <= version < (0, 11, 1) and jax.default_backend() == "cpu"


_UNROLLED = 16  # batches up to this size: one call per matrix written out, not a loop


def _per_matrix(fn, *stacks):
    """``fn`` of equally batched stacks of matrices; one LAPACK call per matrix where batched calls
    can deadlock: written out for small batches (a loop's output, updated in place matrix by
    matrix, was copied whole each time: a tenth of an HVGP step of 8 blocks), else ``lax.map``."""
    batch = stacks[0].shape[:-2]
    size = math.prod(batch)
    if size <= 1 or not _batched_lapack_deadlocks():
        return fn(*stacks)
    flat = [s.reshape((size,) + s.shape[-2:]) for s in stacks]
    if size <= _UNROLLED:
        # split rather than indexed: its transpose is one concatenation, not a sum of padded copies
        parts = zip(*(lax.split(s, (1,) * size) for s in flat))
        out = jnp.stack([fn(*(p[0] for p in part)) for part in parts])
    else:
        out = lax.map(lambda args: fn(*args), flat)
    return out.reshape(batch + out.shape[-2:])


def solve_lower(L, B, transpose=False):
    batch = jnp.broadcast_shapes(L.shape[:-2], B.shape[:-2])
    L, B = jnp.broadcast_to(L, batch + L.shape[-2:]), jnp.broadcast_to(B, batch + B.shape[-2:])
    return _per_matrix(functools.partial(_solve_lower, transpose=transpose), L, B)


def _solve_lower(L, B, transpose):
    # solved on the right, as B^T L^-T: LAPACK's column-major B^T is B's row-major layout, so XLA
    # copies nothing in or out (as the torch backend)
    return lax.linalg.triangular_solve(L, B.mT, left_side=False, lower=True, transpose_a=not transpose).mT


def cholesky(A, levels, message, dtype):
    """Lower factor of ``A + level I`` for the first of ``levels`` that succeeds, computed in
    ``dtype`` and returned in ``A``'s.

    Under ``jit``/``grad`` tracing the retries are a ``lax.while_loop`` and a final failure returns
    NaN (so the loss becomes NaN) instead of raising: a host callback to raise would cost about as
    much as the rest of a small SVI step.
    """
    levels, dtype = tuple(levels), jnp.dtype(dtype)
    if dtype == A.dtype:
        return _escalating_cholesky(A, levels, message)
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        return _cholesky_in_x64(A, levels, message)
    return _escalating_cholesky(A.astype(dtype), levels, message).astype(A.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _escalating_cholesky(A, levels, message):
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    if is_concrete(A):
        for level in levels:
            L = _per_matrix(jnp.linalg.cholesky, A + level * eye)
            if bool(jnp.all(jnp.isfinite(L))):
                return L
        raise CholeskyError(message)

    def attempt(level):
        return _per_matrix(jnp.linalg.cholesky, A + level * eye)

    if len(levels) == 1:
        return attempt(levels[0])
    # the retries as a loop: two factorisations in the compiled program, not one per level
    retries = jnp.asarray(levels[1:], dtype=A.dtype)

    def failed(state):
        i, L = state
        return (i < retries.shape[0]) & ~jnp.all(jnp.isfinite(L))

    def retry(state):
        i, _ = state
        return i + 1, attempt(retries[i])

    return lax.while_loop(failed, retry, (0, attempt(levels[0])))[1]


@_escalating_cholesky.defjvp
def _escalating_cholesky_jvp(levels, message, primals, tangents):
    # Differentiating through the retries would carry a failed attempt's NaN factor into the
    # gradient (reverse mode multiplies its zero cotangent by the NaN), so the derivative is taken
    # of the factor that was kept, the jitter being a constant.
    (A,), (dA,) = primals, tangents
    L = _escalating_cholesky(A, levels, message)
    return L, _cholesky_tangent(L, dA)


def _cholesky_tangent(L, dA):
    """``dL = L Phi(L^-1 dA L^-T)`` (Phi: the lower triangle, half the diagonal)."""
    return L @ phi_inner(L, dA)


def cholesky_and_solve(K, B, levels, message):
    """See :func:`sparsegp_common.linalg.cholesky_and_solve`."""
    return _cholesky_and_solve(K, B, tuple(levels), message)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _cholesky_and_solve(K, B, levels, message):
    L = cholesky(K, levels, message, K.dtype)
    return L, solve_lower(L, B)


@_cholesky_and_solve.defjvp
def _cholesky_and_solve_jvp(levels, message, primals, tangents):
    # dL = L P and dA = L^-1 dB - P A with P = Phi(L^-1 dK L^-T): transposed by JAX, the cotangent
    # of K is that of sparsegp_common.linalg.cholesky_and_solve_cotangents (the term L^T L_bar
    # only where L is used), and forward mode (jax.jvp, jax.hessian) still works
    (K, B), (dK, dB) = primals, tangents
    L, A = _cholesky_and_solve(K, B, levels, message)
    P = phi_inner(L, dK)
    return (L, A), (L @ P, solve_lower(L, dB) - P @ A)


def whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    """See :func:`sparsegp_common.variational.whitened_moments.whitened_moments`."""
    return _whitened_moments(K, Kuf, q_mu, q_sqrt, tuple(levels), message)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    from ..variational.whitened_moments import factor_and_moments

    return factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message)[:3]


@_whitened_moments.defjvp
def _whitened_moments_jvp(levels, message, primals, tangents):
    # forward mode as written there, which JAX transposes into the reverse mode's two M x M x N products
    from ..variational.whitened_moments import factor_and_moments, tangents as moment_tangents

    K, Kuf, q_mu, q_sqrt = primals
    L, mean, change, saved = factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message)
    return (L, mean, change), moment_tangents(L, saved, q_mu, q_sqrt, *tangents)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _cholesky_in_x64(A, levels, message):
    # A float64 factor inside a program without jax_enable_x64: float64 exists only within such
    # a block, and JAX transposes a JVP outside any block (where float64 products are truncated
    # to float32), so the derivative is a VJP computed in a block of its own, in float64 as with
    # jax_enable_x64. The price: no forward mode (jax.jvp, jax.hessian) through this factor.
    return _cholesky_in_x64_fwd(A, levels, message)[0]


def _cholesky_in_x64_fwd(A, levels, message):
    with jax.enable_x64(True):
        L = _escalating_cholesky(A.astype(jnp.float64), levels, message)
        return L.astype(A.dtype), L


def _cholesky_in_x64_bwd(levels, message, L, cotangent):
    with jax.enable_x64(True):
        transpose = jax.linear_transpose(functools.partial(_cholesky_tangent, L), L)
        return (transpose(cotangent.astype(L.dtype))[0].astype(cotangent.dtype),)


_cholesky_in_x64.defvjp(_cholesky_in_x64_fwd, _cholesky_in_x64_bwd)


def precise_matmul(a, b):
    # XLA's default on recent GPUs multiplies float32 in TF32 (10-bit mantissa): kernel matrices
    # computed that way are indefinite at the jitter levels float32 needs
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def is_concrete(x):
    return not isinstance(x, jax.core.Tracer)


def output_shape(fn):
    """The shape of ``fn()``'s array (None for None), traced without running it: no compilation."""
    out = jax.eval_shape(fn)
    return None if out is None else tuple(out.shape)


def normal(key, shape, like):
    return jax.random.normal(key, shape, dtype=like.dtype)


def with_partials(fn, *inputs):
    """See the torch version: ``fn(*inputs)[0]`` with the partial derivatives ``fn(*inputs)[1]``."""
    return _with_partials(fn, *inputs)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _with_partials(fn, *inputs):
    return fn(*inputs)[0]


@_with_partials.defjvp
def _with_partials_jvp(fn, primals, tangents):
    value, partials = fn(*primals)  # differentiable again: higher derivatives stay exact
    return value, sum(p * t for p, t in zip(partials, tangents))


def stop_gradient(x):
    return lax.stop_gradient(x)


def split(key, n):
    """``n`` independent keys from a PRNG key."""
    return jax.random.split(key, n)


def uniform(key, shape, dtype=None, device=None):
    """Uniform draws on ``[0, 1)`` from ``key`` (``dtype=None``: JAX's default float)."""
    if dtype is None:
        return jax.random.uniform(key, shape)
    return jax.random.uniform(key, shape, dtype=dtype)


def permutation(key, n, device=None):
    """A random permutation of ``range(n)`` from ``key``."""
    return jax.random.permutation(key, n)


def randint(key, shape, high, device=None):
    """Uniform integers in ``[0, high)`` from ``key``."""
    return jax.random.randint(key, shape, 0, high)


def blockwise_sum(block, size, chunk, like):
    """As the torch version, by ``lax.scan`` over ``jax.checkpoint``-ed blocks (one traced block,
    its rows made inside it: working memory of one block, whatever ``size``); the last block is
    padded with repeated indices that ``block(rows, weights)`` weighs by zero."""

    def one(b):
        rows = b * chunk + jnp.arange(chunk)
        return block(jnp.minimum(rows, size - 1), (rows < size).astype(like.dtype))

    one = jax.checkpoint(one)
    first = jax.eval_shape(one, 0)
    total, _ = lax.scan(lambda acc, b: (acc + one(b), None), jnp.zeros(first.shape, first.dtype),
                        jnp.arange(-(-size // chunk)))
    return total


def categorical(key, logits, shape):
    return jax.random.categorical(key, logits, shape=tuple(shape) + tuple(logits.shape[:-1]))


def bincount(index, length, dtype):
    return jnp.bincount(index, length=length).astype(dtype)


def recurrence(step, first, second, coefficients, count):
    """As the torch version, by ``lax.scan`` (one traced step whatever ``count``)."""
    if count <= 2:
        return jnp.stack([first, second][:count], -1)
    xs = tuple(jnp.asarray(c, dtype=first.dtype) for c in coefficients)

    def body(carry, c):
        prev, cur = carry
        nxt = step(prev, cur, *c)
        return (cur, nxt), nxt

    rest = lax.scan(body, (first, second), xs)[1]
    return jnp.moveaxis(jnp.concatenate([first[None], second[None], rest]), 0, -1)


# ---------------------------------------------------------------- deep basis kernels (sparsegp_common.dbk)


def _wide_dtype():
    """float64 when JAX has it enabled (``jax_enable_x64``), else float32."""
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def wide(x, like):
    """``x`` in the widest float dtype (float64 with ``jax_enable_x64``), where the deep basis kernels
    accumulate and ``Kuu``'s distances are expanded."""
    return jnp.asarray(x, dtype=_wide_dtype())


def cast_like(x, like):
    """``x`` in the dtype of ``like``."""
    return x.astype(like.dtype)


def from_host(x, like):
    """The NumPy array ``x`` in the dtype and on the device of the concrete ``like``, converted on
    the host (an eager operation on the device would compile a program of its own)."""
    x = np.asarray(x, dtype=like.dtype)
    return jax.device_put(x, like.sharding) if is_concrete(like) else jnp.asarray(x)


def dbk_moments(Phi, y, s=None):
    """See :func:`sparsegp_common.ops.plain_moments` (accumulated in float64 with ``jax_enable_x64``)."""
    return plain_moments(Phi, y, s, _wide_dtype())


# special functions for the likelihoods

def softplus(x):
    return jax.nn.softplus(x)


def lgamma(x):
    return jax.scipy.special.gammaln(x)


def ndtr(x):
    return jax.scipy.special.ndtr(x)


def ndtri(p):
    return jax.scipy.special.ndtri(p)


def log_ndtr(x):
    return jax.scipy.special.log_ndtr(x)


def logsumexp(x, axis=-1):
    return jax.nn.logsumexp(x, axis)


def softmax(x, axis=-1):
    return jax.nn.softmax(x, axis)


def quantile(x, q, axis=0, method="linear"):
    return jnp.quantile(x, q, axis=axis, method=method)


def as_index(x):
    """Integer labels as the library's index dtype (int32)."""
    return jnp.asarray(x, jnp.int32)


def when_any(flags, if_any, otherwise):
    """As the torch version, by ``lax.cond`` (one branch runs; both under ``vmap``)."""
    return lax.cond(jnp.any(flags), if_any, otherwise)


def host_callback(fn, *arrays):
    """As the torch version; under ``jit`` when the compiled program runs (``jax.debug.callback``)."""
    jax.debug.callback(lambda *values: fn(*map(np.asarray, values)), *arrays)


def on_host(fn, shape, like, *arrays):
    """As the torch version; under ``jit`` when the compiled program runs (``jax.pure_callback``, no
    derivative: ``fn``'s values are constants to the gradient)."""
    out = jax.ShapeDtypeStruct(tuple(shape), like.dtype)
    return jax.pure_callback(lambda *values: np.asarray(fn(*map(np.asarray, values)), dtype=like.dtype), out,
                             *arrays, vmap_method="sequential")


def index_add(x, index, values):
    """``x`` with ``values`` added at the rows ``index`` (repeats accumulate); in place where
    ``x``'s buffer is donated to the compiled program."""
    return x.at[index].add(values)
