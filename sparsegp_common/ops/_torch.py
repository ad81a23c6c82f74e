"""torch implementations of the operations the array API standard lacks."""
import math

import torch
from torch.fx.experimental import proxy_tensor as _proxy_tensor

from ..linalg import CholeskyError as _CoreCholeskyError


class CholeskyError(_CoreCholeskyError, torch.linalg.LinAlgError):
    """A covariance matrix could not be factorised even after jitter escalation."""


def solve_lower(L, B, transpose=False):
    # Solved as B^T L^{-T} (or B^T L^{-1}) on B's transposed view: LAPACK reads a row-major B in
    # place and the result comes back row-major, where the left-side solve copies B to column-major
    # and returns A column-major, which every later elementwise operation with a row-major array
    # then walks across (2-3x slower at M = 256, N = 1024 on CPU; benchmarks/RESULTS.md, "steps").
    if transpose:
        return torch.linalg.solve_triangular(L, B.mT, upper=False, left=False).mT
    return torch.linalg.solve_triangular(L.mT, B.mT, upper=True, left=False).mT


def cholesky(A, levels, message, dtype):
    """Lower factor of ``A + level I`` for the first of ``levels`` that succeeds, computed in
    ``dtype`` and returned in ``A``'s."""
    work = A.to(dtype)
    eye = torch.eye(A.shape[-1], dtype=dtype, device=A.device)
    if not is_concrete(A):  # recorded for a replay: no escalation; a failure is NaN (fit runs that step traced)
        L, info = torch.linalg.cholesky_ex(work + levels[0] * eye)
        return torch.where(info[..., None, None] == 0, L, math.nan).to(A.dtype)
    for level in levels:
        L, info = torch.linalg.cholesky_ex(work + level * eye)
        if not bool(info.any()):
            return L.to(A.dtype)
    raise CholeskyError(message)


def cholesky_and_solve(K, B, levels, message):
    """See :func:`sparsegp_common.linalg.cholesky_and_solve`: one autograd node when differentiated."""
    if torch.is_grad_enabled() and (K.requires_grad or B.requires_grad):
        return _CholeskyAndSolve.apply(K, B, levels, message)
    L = cholesky(K, levels, message, K.dtype)
    return L, solve_lower(L, B)


class _CholeskyAndSolve(torch.autograd.Function):
    """``(L, L^{-1} B)`` for ``L = chol(K + jitter I)``, backward by
    :func:`sparsegp_common.linalg.cholesky_and_solve_cotangents`."""

    @staticmethod
    def forward(ctx, K, B, levels, message):
        L = cholesky(K, levels, message, K.dtype)
        A = solve_lower(L, B)
        ctx.save_for_backward(L, A)
        ctx.shapes = (K.shape, B.shape)
        ctx.set_materialize_grads(False)  # an unused L gets None, not an M x M buffer of zeros
        return L, A

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, L_bar, A_bar):
        from ..linalg import cholesky_and_solve_cotangents

        L, A = ctx.saved_tensors
        K_bar, B_bar = cholesky_and_solve_cotangents(L, A, L_bar, A_bar)
        # inputs broadcast over the other's batch get the sum over it
        return (*(None if g is None else g.sum_to_size(shape) for g, shape in zip((K_bar, B_bar), ctx.shapes)),
                None, None)


def whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    """See :func:`sparsegp_common.variational.whitened_moments.whitened_moments`: one autograd node."""
    if torch.is_grad_enabled() and any(a.requires_grad for a in (K, Kuf, q_mu, q_sqrt)):
        return _WhitenedMoments.apply(K, Kuf, q_mu, q_sqrt, levels, message)
    from ..variational.whitened_moments import factor_and_moments

    return factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message)[:3]


class _WhitenedMoments(torch.autograd.Function):
    """``(L, mean, change)``, backward by :func:`sparsegp_common.variational.whitened_moments.cotangents`."""

    @staticmethod
    def forward(ctx, K, Kuf, q_mu, q_sqrt, levels, message):
        from ..variational.whitened_moments import factor_and_moments

        L, mean, change, saved = factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message)
        ctx.save_for_backward(L, q_mu, q_sqrt, *saved)
        ctx.shapes = (K.shape, Kuf.shape, q_mu.shape, q_sqrt.shape)
        ctx.set_materialize_grads(False)
        return L, mean, change

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, L_bar, mean_bar, change_bar):
        from ..variational.whitened_moments import cotangents

        L, q_mu, q_sqrt, *saved = ctx.saved_tensors
        grads = cotangents(L, saved, q_mu, q_sqrt, L_bar, mean_bar, change_bar)
        return (*(None if g is None else g.sum_to_size(shape) for g, shape in zip(grads, ctx.shapes)), None, None)


def precise_matmul(a, b):
    # torch's default keeps float32 products in full precision (allow_tf32 is off for matmul)
    return a @ b


def is_concrete(x):
    """False while a graph is captured (``make_fx``): values are not read back then."""
    return _proxy_tensor.get_proxy_mode() is None


def output_shape(fn):
    """The shape of ``fn()``'s array (None for None); torch runs it (eager operations compile nothing)."""
    out = fn()
    return None if out is None else tuple(out.shape)


def normal(key, shape, like):
    """Standard normal draws; ``key`` is a ``torch.Generator`` or None (the global RNG)."""
    return torch.randn(shape, dtype=like.dtype, device=like.device, generator=key)


def se_matvec(X, Z, lengthscale, variance, v):
    """``K(X, Z) @ v`` of the squared exponential as one fused autograd node."""
    return _SEMatvec.apply(X, Z, lengthscale, variance, v)


class _SEMatvec(torch.autograd.Function):
    """``K(X, Z) @ v`` for the squared exponential with ``K`` as the only (N, M) buffer.

    Forward: one product of augmented inputs gives ``log K = log var + Xs.Zs - |Xs|^2 / 2 -
    |Zs|^2 / 2`` for the scaled inputs ``Xs = (X - shift) / l`` (the shift cancels), then an
    in-place clamp and exp. Backward, with ``E = K * (g v^T)``: ``dv = K^T g``,
    ``dXs = E Zs - rowsum(E) Xs``, ``dZs = E^T Xs - colsum(E) Zs``, ``dvar = sum(E) / var``,
    the row and column sums coming out of the same two products.
    """

    @staticmethod
    def forward(ctx, X, Z, lengthscale, variance, v):
        from ..kernels import expanded_product

        ls = lengthscale.unsqueeze(-2)
        shift = X.mean(-2, keepdim=True)
        Xs, Zs = (X - shift) / ls, (Z - shift) / ls
        log_var = variance.log()
        z_term = log_var[..., None] - 0.5 * (Zs**2).sum(-1)
        K = expanded_product(Xs, Zs, -0.5 * (Xs**2).sum(-1), z_term)
        K = K.clamp_(max=log_var[..., None, None]).exp_()  # r2 >= 0: log K <= log var
        ctx.save_for_backward(Xs, Zs, lengthscale, variance, v, K)
        ctx.shapes, ctx.consumed = (X.shape, Z.shape), False
        return K @ v

    @staticmethod
    def backward(ctx, g):
        if ctx.consumed:
            raise RuntimeError("K_matvec's backward pass reuses its buffer and runs once (no retain_graph)")
        ctx.consumed = True
        Xs, Zs, lengthscale, variance, v, K = ctx.saved_tensors
        dv = K.transpose(-1, -2) @ g
        # E = K * (g v^T) overwrites K: allocating a second (N, M) buffer costs more than the products
        batch = torch.broadcast_shapes(K.shape[:-2], g.shape[:-2], v.shape[:-2])
        E = K if K.shape[:-2] == batch else K.expand(batch + K.shape[-2:]).clone()
        E = E.mul_(g).mul_(v.transpose(-1, -2)) if v.shape[-1] == 1 else E.mul_(g @ v.transpose(-1, -2))
        EZ = E @ torch.cat([Zs, torch.ones_like(Zs[..., :1])], -1)
        EX = (torch.cat([Xs, torch.ones_like(Xs[..., :1])], -1).transpose(-1, -2) @ E).transpose(-1, -2)
        rowsum, colsum = EZ[..., -1:], EX[..., -1:]
        dXs, dZs = EZ[..., :-1] - rowsum * Xs, EX[..., :-1] - colsum * Zs
        ls = lengthscale.unsqueeze(-2)
        dvar = rowsum.sum((-1, -2)) / variance
        dls = -((dXs * Xs).sum(-2) + (dZs * Zs).sum(-2)) / lengthscale
        X_shape, Z_shape = ctx.shapes
        grads = (dXs / ls, dZs / ls, dls, dvar, dv)
        shapes = (X_shape, Z_shape, lengthscale.shape, variance.shape, v.shape)
        # inputs broadcast over the kernel's batch get the sum over it
        return tuple(d.sum_to_size(shape) for d, shape in zip(grads, shapes))


def with_partials(fn, *inputs):
    """``fn(*inputs) = (value, partials)``, elementwise: ``value`` as one autograd node whose
    derivative is ``sum_i partials[i] * d inputs[i]`` (each input broadcast to the value's shape;
    only the partials are kept for the backward pass)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _WithPartials.apply(fn, *inputs)
    return fn(*inputs)[0]


class _WithPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *inputs):
        value, partials = fn(*inputs)
        ctx.save_for_backward(*partials)
        ctx.shapes = [x.shape for x in inputs]
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        # inputs broadcast to the value's shape get the sum over the broadcast axes
        return None, *((g * p).sum_to_size(shape) for p, shape in zip(ctx.saved_tensors, ctx.shapes))


def stop_gradient(x):
    return x.detach()


def split(key, n):
    """``n`` keys from ``key``: a ``torch.Generator`` (or None, the global RNG) is stateful, so
    the same one serves each draw in turn."""
    return (key,) * n


def uniform(key, shape, dtype=None, device=None):
    """Uniform draws on ``[0, 1)`` (``dtype=None``: torch's default dtype)."""
    return torch.rand(shape, dtype=dtype, device=device, generator=key)


def permutation(key, n, device=None):
    """A random permutation of ``range(n)`` (``key``: a ``torch.Generator`` or None, the global RNG)."""
    return torch.randperm(n, generator=key, device=device)


def randint(key, shape, high, device=None):
    """Uniform integers in ``[0, high)`` (``key``: a ``torch.Generator`` or None, the global RNG)."""
    return torch.randint(high, shape, generator=key, device=device)


def blockwise_sum(block, size, chunk, like):
    """``sum_b block(rows_b, None)`` over consecutive blocks of ``chunk`` indices covering
    ``range(size)``, each block recomputed in the backward pass (memory of one block)."""
    from torch.utils.checkpoint import checkpoint

    if size <= chunk:  # one block: nothing to save by recomputing it
        return block(torch.arange(size, device=like.device), None)
    blocks = (torch.arange(s, min(s + chunk, size), device=like.device) for s in range(0, size, chunk))
    return sum(checkpoint(block, rows, None, use_reentrant=False) for rows in blocks)


def categorical(key, logits, shape):
    """Indices ``shape + logits.shape[:-1]`` drawn with probabilities ``softmax(logits)`` along
    the last axis (``key``: a ``torch.Generator`` or None, the global RNG), as
    ``Categorical(logits=logits).sample(shape)`` draws them."""
    probs = torch.distributions.Categorical(logits=logits).probs
    batch = tuple(probs.shape[:-1])
    draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), math.prod(shape), replacement=True, generator=key)
    return draws.reshape(batch + tuple(shape)).permute(*range(len(batch), len(batch) + len(shape)), *range(len(batch)))


def bincount(index, length, dtype):
    """How often each of ``range(length)`` occurs in the integer ``index``, as ``dtype`` ``(length,)``."""
    return torch.bincount(index, minlength=length).to(dtype)


def recurrence(step, first, second, coefficients, count):
    """``count`` terms ``t_0 = first``, ``t_1 = second``, ``t_{i+2} = step(t_i, t_{i+1}, *c[i])``
    (``c[i]`` the i-th entries of the NumPy vectors ``coefficients``), stacked on a new last axis."""
    terms = [first, second]
    for i in range(count - 2):
        terms.append(step(terms[-2], terms[-1], *(float(c[i]) for c in coefficients)))
    return torch.stack(terms[:count], -1)


# ---------------------------------------------------------------- deep basis kernels (sparsegp_common.dbk)


def wide(x, like):
    """``x`` in the widest float dtype (float64), on ``like``'s device: where the deep basis kernels
    accumulate and ``Kuu``'s distances are expanded."""
    return torch.as_tensor(x, dtype=torch.float64, device=like.device)


def cast_like(x, like):
    """``x`` in the dtype and on the device of ``like``."""
    return x.to(like)


def from_host(x, like):
    """The NumPy array ``x`` as a new tensor in the dtype and on the device of ``like``."""
    return torch.tensor(x, dtype=like.dtype, device=like.device)


def dbk_moments(Phi, y, s=None):
    """``Phi^T S^-1 Phi``, ``Phi^T S^-1 y``, ``y^T S^-1 y`` (float64) and ``|phi_n|^2`` (dtype of
    ``Phi``) for ``S = diag(s)`` (``s`` float64 ``(N,)``; None: ``S = I``), by the blocked
    :class:`_Moments` (rows scaled by ``s^-1/2`` first)."""
    if s is None:
        gram, b, sq = _Moments.apply(Phi, y)
        return gram, b, (y.to(torch.float64) ** 2).sum(), sq
    w = s.rsqrt()
    gram, b, sq = _Moments.apply(Phi * w.to(Phi.dtype).unsqueeze(-1), y * w.to(y.dtype))
    return gram, b, ((y.to(torch.float64) * w) ** 2).sum(), sq * s.to(sq.dtype)


MOMENT_CHUNK = 4096  # rows per block of :class:`_Moments`: its float64 temporaries stay in cache


class _Moments(torch.autograd.Function):
    """``Phi^T Phi``, ``Phi^T y`` (float64) and ``|phi_n|^2`` (dtype of ``Phi``) in one pass over
    blocks of rows, and the gradient in one more: no (N, r) temporary besides the gradient itself
    (at large N, separate elementwise passes over GB-sized arrays dominated the step)."""

    @staticmethod
    def forward(ctx, Phi, y):
        r = Phi.shape[-1]
        gram = Phi.new_zeros((r, r), dtype=torch.float64)
        b = Phi.new_zeros((r,), dtype=torch.float64)
        sq = Phi.new_empty(Phi.shape[:1])
        for rows in _blocks(Phi.shape[0]):
            P = Phi[rows].to(torch.float64)
            gram.addmm_(P.transpose(-1, -2), P)
            b.addmv_(P.transpose(-1, -2), y[rows].to(torch.float64))
            sq[rows] = (P * P).sum(-1)
        ctx.save_for_backward(Phi, y)
        return gram, b, sq

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_gram, grad_b, grad_sq):
        Phi, y = ctx.saved_tensors
        r = Phi.shape[-1]
        sym = Phi.new_zeros((r, r), dtype=torch.float64) if grad_gram is None else grad_gram + grad_gram.transpose(-1, -2)
        grad_b = Phi.new_zeros((r,), dtype=torch.float64) if grad_b is None else grad_b
        grad_Phi = torch.empty_like(Phi) if ctx.needs_input_grad[0] else None
        grad_y = torch.empty_like(y) if ctx.needs_input_grad[1] else None
        for rows in _blocks(Phi.shape[0]):
            P = Phi[rows].to(torch.float64)
            if grad_Phi is not None:
                g = P @ sym + y[rows].to(torch.float64).unsqueeze(-1) * grad_b
                if grad_sq is not None:
                    g += 2 * grad_sq[rows].to(torch.float64).unsqueeze(-1) * P
                grad_Phi[rows] = g
            if grad_y is not None:
                grad_y[rows] = P @ grad_b
        return grad_Phi, grad_y


def _blocks(n):
    return (slice(s, min(s + MOMENT_CHUNK, n)) for s in range(0, n, MOMENT_CHUNK))


def cos(x):
    return torch.cos(x)


def sin(x):
    return torch.sin(x)


# special functions for the likelihoods

def softplus(x):
    return torch.nn.functional.softplus(x)


def lgamma(x):
    return torch.lgamma(x)


def ndtr(x):
    return torch.special.ndtr(x)


def ndtri(p):
    """The standard normal quantile function, the inverse of :func:`ndtr`."""
    return torch.special.ndtri(p)


def log_ndtr(x):
    return torch.special.log_ndtr(x)


def logsumexp(x, axis=-1):
    return torch.logsumexp(x, axis)


def softmax(x, axis=-1):
    return torch.softmax(x, axis)


def quantile(x, q, axis=0, method="linear"):
    return torch.quantile(x, q, dim=axis, interpolation=method)


def as_index(x):
    """Integer labels as the library's index dtype (int64)."""
    return x.long()


def when_any(flags, if_any, otherwise):
    """``if_any()`` if any of ``flags`` is set, else ``otherwise()`` (the flag is read back)."""
    return if_any() if bool(flags.any()) else otherwise()


def host_callback(fn, *arrays):
    """``fn`` of the arrays' NumPy values, run on the host (here at once)."""
    fn(*(a.detach().cpu().numpy() for a in arrays))


def on_host(fn, shape, like, *arrays):
    """``fn`` of the arrays' NumPy values, run on the host: its NumPy result ``shape`` as a tensor in
    the dtype and on the device of ``like`` (a constant to the gradient). Refused while a graph is
    recorded: the recording would keep this call's result for every replay."""
    if not is_concrete(like):
        raise NotImplementedError("a computation on the host cannot be recorded in a graph")
    out = fn(*(a.detach().cpu().numpy() for a in arrays))
    return torch.as_tensor(out, dtype=like.dtype).reshape(tuple(shape)).to(like.device)


def index_add(x, index, values):
    """``x`` with ``values`` added at the rows ``index`` (repeats accumulate), as a new tensor."""
    return x.index_add(0, index, values)
