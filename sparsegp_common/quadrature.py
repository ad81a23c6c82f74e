"""Expectations of ``fn(f)`` under ``f ~ N(mean, var)``: Gauss-Hermite or Monte Carlo.

Random draws follow one contract for every array library: ``key`` is a JAX PRNG key for JAX
arrays, and for torch a ``torch.Generator`` or None (torch's global RNG); see the ``normal``
operation of :mod:`sparsegp_common.ops`.
"""
import functools

import numpy as np

from .ops import backend, device, namespace


@functools.lru_cache(maxsize=None)
def standard_normal_nodes(num_points):
    """Nodes z and weights w with sum(w * g(z)) ~= E[g(Z)], Z ~ N(0, 1); exact for polynomials
    of degree < 2 * num_points."""
    if int(num_points) != num_points or num_points < 1:
        raise ValueError(f"num_gauss_hermite must be a positive integer, got {num_points}")
    x, w = np.polynomial.hermite.hermgauss(int(num_points))
    return x * np.sqrt(2.0), w / np.sqrt(np.pi)


def gauss_hermite(fn, mean, var, num_points=20):
    """``E[fn(f)]`` by ``num_points``-node Gauss-Hermite quadrature; ``fn`` maps an array of
    shape ``mean.shape + (num_points,)`` elementwise to the same shape."""
    xp = namespace(mean, var)
    z, w = standard_normal_nodes(num_points)
    z = xp.asarray(z, dtype=mean.dtype, device=device(mean))
    w = xp.asarray(w, dtype=mean.dtype, device=device(mean))
    f = mean[..., None] + xp.sqrt(var)[..., None] * z
    return fn(f) @ w


def monte_carlo(fn, mean, var, num_samples, key=None):
    """Unbiased reparameterised estimate of ``E[fn(f)]`` from ``num_samples`` draws, with
    ``fn`` mapping ``(num_samples,) + mean.shape`` to the same shape; the draws come from
    ``key`` (see the module docstring)."""
    xp = namespace(mean, var)
    eps = backend(mean, var).normal(key, (num_samples,) + tuple(mean.shape), mean)
    return xp.mean(fn(mean + xp.sqrt(var) * eps), axis=0)
