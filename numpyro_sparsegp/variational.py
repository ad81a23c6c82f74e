"""The Gaussian variational family q(u) = N(q_mu, q_sqrt q_sqrt^T) and its KL to the prior.

Shapes: ``q_mu`` is ``batch_shape + (M,)``; ``q_sqrt`` is ``batch_shape + (M, M)`` (lower
triangular, positive diagonal; "full") or ``batch_shape + (M,)`` (positive; "diagonal"), where
``batch_shape`` is ``()`` or ``(L,)`` for L independent latent functions.
"""
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import LowerCholeskyTransform, biject_to

from .linalg import solve_lower


class _LowerCholesky(type(constraints.lower_cholesky)):
    """``lower_cholesky`` reached from an unconstrained square matrix (see the transform)."""


class _LowerCholeskyTransform(LowerCholeskyTransform):
    """Square matrix ``x`` -> ``tril(x, -1) + diag(exp(diag(x)))``, the transform torch uses for
    ``lower_cholesky``; the strictly upper triangle of ``x`` is ignored (its gradient is zero)."""

    # NumPyro's own transform packs the M (M + 1) / 2 free entries into a vector and unpacks them
    # by a scatter, which XLA runs serially on CPU (and constant-folds for seconds when compiling
    # at M >= 1024); it also builds the matrix on float64 zeros under jax_enable_x64, which breaks
    # float32 models that factorise Kuu in float64. Masking a square matrix avoids both.
    domain = constraints.real_matrix
    codomain = _LowerCholesky()

    def __call__(self, x):
        return jnp.tril(x, -1) + _diag_embed(jnp.exp(jnp.diagonal(x, axis1=-2, axis2=-1)))

    def _inverse(self, y):
        return jnp.tril(y, -1) + _diag_embed(jnp.log(jnp.diagonal(y, axis1=-2, axis2=-1)))

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        return jnp.diagonal(x, axis1=-2, axis2=-1).sum(-1)

    def forward_shape(self, shape):
        return shape

    def inverse_shape(self, shape):
        return shape


def _diag_embed(d):
    return d[..., None] * jnp.eye(d.shape[-1], dtype=d.dtype)


_lower_cholesky = _LowerCholeskyTransform.codomain
biject_to.register(_LowerCholesky, lambda constraint: _LowerCholeskyTransform())


def init_q(num_inducing, batch_shape, diagonal, like, Luu=None):
    """``(q_mu, q_sqrt, constraint)`` at the prior: ``q_sqrt = I`` (whitened) or ``Luu``."""
    q_mu = jnp.zeros(batch_shape + (num_inducing,), dtype=like.dtype)
    if diagonal:
        q_sqrt = jnp.ones_like(q_mu) if Luu is None else jnp.broadcast_to(jnp.diagonal(Luu, axis1=-2, axis2=-1), q_mu.shape)
        return q_mu, q_sqrt, constraints.positive
    eye = jnp.eye(num_inducing, dtype=like.dtype)
    q_sqrt = jnp.broadcast_to(eye if Luu is None else Luu, batch_shape + (num_inducing, num_inducing))
    return q_mu, q_sqrt, _lower_cholesky


def is_diagonal(q_mu, q_sqrt):
    return q_sqrt.shape == q_mu.shape


def kl(q_mu, q_sqrt, Luu=None):
    """``KL[N(q_mu, S) || N(0, K)]`` summed over the batch; ``Luu=None`` means ``K = I`` (whitened)."""
    diagonal = is_diagonal(q_mu, q_sqrt)
    diag = q_sqrt if diagonal else jnp.diagonal(q_sqrt, axis1=-2, axis2=-1)
    M = q_mu.shape[-1]
    num = q_mu.size // M
    log_det_S = 2 * jnp.log(jnp.abs(diag)).sum()
    if Luu is None:
        trace, mahalanobis, log_det_K = (q_sqrt**2).sum(), (q_mu**2).sum(), 0.0
    else:
        S_half = _diag_embed(q_sqrt) if diagonal else q_sqrt
        trace = (solve_lower(Luu, S_half) ** 2).sum()
        mahalanobis = (solve_lower(Luu, q_mu[..., None]) ** 2).sum()
        log_det_K = 2 * jnp.broadcast_to(jnp.log(jnp.diagonal(Luu, axis1=-2, axis2=-1)), q_mu.shape).sum()
    return 0.5 * (trace + mahalanobis - num * M + log_det_K - log_det_S)


def q_distribution(q_mu, q_sqrt):
    """``q(u)`` as a distribution with event shape ``batch_shape + (M,)``."""
    if is_diagonal(q_mu, q_sqrt):
        return dist.Normal(q_mu, q_sqrt).to_event(q_mu.ndim)
    return dist.MultivariateNormal(q_mu, scale_tril=q_sqrt).to_event(q_mu.ndim - 1)


def prior_distribution(q_mu, Luu=None):
    """``p(u)``: ``N(0, I)`` when whitened (``Luu=None``), else ``N(0, Luu Luu^T)``; same event shape as q."""
    zeros = jnp.zeros_like(q_mu)
    if Luu is None:
        return dist.Normal(zeros, 1.0).to_event(q_mu.ndim)
    return dist.MultivariateNormal(zeros, scale_tril=jnp.broadcast_to(Luu, q_mu.shape + q_mu.shape[-1:])).to_event(q_mu.ndim - 1)
