"""Expectations of ``fn(f)`` under ``f ~ N(mean, var)``: Gauss-Hermite or Monte Carlo."""
import torch

from sparsegp_common.quadrature import standard_normal_nodes


def gauss_hermite(fn, mean, var, num_points=20):
    """``E[fn(f)]`` by ``num_points``-node Gauss-Hermite quadrature; ``fn`` maps a tensor of
    shape ``mean.shape + (num_points,)`` elementwise to the same shape."""
    z, w = standard_normal_nodes(num_points)
    z = torch.as_tensor(z, dtype=mean.dtype, device=mean.device)
    w = torch.as_tensor(w, dtype=mean.dtype, device=mean.device)
    f = mean.unsqueeze(-1) + var.sqrt().unsqueeze(-1) * z
    return fn(f) @ w


def monte_carlo(fn, mean, var, num_samples):
    """Unbiased reparameterised estimate of ``E[fn(f)]`` from ``num_samples`` draws, with
    ``fn`` mapping ``(num_samples,) + mean.shape`` to the same shape."""
    eps = torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device)
    return fn(mean + var.sqrt() * eps).mean(0)
