"""The Gaussian variational family q(u) = N(q_mu, q_sqrt q_sqrt^T) and its KL to the prior.

Shapes: ``q_mu`` is ``batch_shape + (M,)``; ``q_sqrt`` is ``batch_shape + (M, M)`` (lower
triangular, positive diagonal; "full") or ``batch_shape + (M,)`` (positive; "diagonal"), where
``batch_shape`` is ``()`` or ``(L,)`` for L independent latent functions.
"""
import pyro.distributions as dist
import torch
from torch.distributions import constraints

from .linalg import solve_lower


def init_q(num_inducing, batch_shape, diagonal, like, Luu=None):
    """``(q_mu, q_sqrt, constraint)`` at the prior: ``q_sqrt = I`` (whitened) or ``Luu``."""
    q_mu = torch.zeros(batch_shape + (num_inducing,), dtype=like.dtype, device=like.device)
    if diagonal:
        q_sqrt = torch.ones_like(q_mu) if Luu is None else Luu.diagonal(dim1=-2, dim2=-1).expand_as(q_mu).clone()
        return q_mu, q_sqrt, constraints.positive
    eye = torch.eye(num_inducing, dtype=like.dtype, device=like.device)
    q_sqrt = (eye if Luu is None else Luu).expand(batch_shape + (num_inducing, num_inducing)).clone()
    return q_mu, q_sqrt, constraints.lower_cholesky


def is_diagonal(q_mu, q_sqrt):
    return q_sqrt.shape == q_mu.shape


def kl(q_mu, q_sqrt, Luu=None):
    """``KL[N(q_mu, S) || N(0, K)]`` summed over the batch; ``Luu=None`` means ``K = I`` (whitened)."""
    diagonal = is_diagonal(q_mu, q_sqrt)
    diag = q_sqrt if diagonal else q_sqrt.diagonal(dim1=-2, dim2=-1)
    M = q_mu.shape[-1]
    num = q_mu.numel() // M
    log_det_S = 2 * torch.log(diag.abs()).sum()
    if Luu is None:
        trace, mahalanobis, log_det_K = (q_sqrt**2).sum(), (q_mu**2).sum(), 0.0
    else:
        S_half = torch.diag_embed(q_sqrt) if diagonal else q_sqrt
        trace = (solve_lower(Luu, S_half) ** 2).sum()
        mahalanobis = (solve_lower(Luu, q_mu.unsqueeze(-1)) ** 2).sum()
        log_det_K = 2 * torch.log(Luu.diagonal(dim1=-2, dim2=-1)).expand_as(q_mu).sum()
    return 0.5 * (trace + mahalanobis - num * M + log_det_K - log_det_S)


def q_distribution(q_mu, q_sqrt):
    """``q(u)`` as a distribution with event shape ``batch_shape + (M,)``."""
    if is_diagonal(q_mu, q_sqrt):
        return dist.Normal(q_mu, q_sqrt).to_event(q_mu.dim())
    return dist.MultivariateNormal(q_mu, scale_tril=q_sqrt).to_event(q_mu.dim() - 1)


def prior_distribution(q_mu, Luu=None):
    """``p(u)``: ``N(0, I)`` when whitened (``Luu=None``), else ``N(0, Luu Luu^T)``; same event shape as q."""
    zeros = torch.zeros_like(q_mu)
    if Luu is None:
        return dist.Normal(zeros, 1.0).to_event(q_mu.dim())
    return dist.MultivariateNormal(zeros, scale_tril=Luu).to_event(q_mu.dim() - 1)
