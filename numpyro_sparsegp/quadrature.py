"""Expectations of ``fn(f)`` under ``f ~ N(mean, var)``: Gauss-Hermite or Monte Carlo."""
import jax
import jax.numpy as jnp

from sparsegp_common.quadrature import standard_normal_nodes


def gauss_hermite(fn, mean, var, num_points=20):
    """``E[fn(f)]`` by ``num_points``-node Gauss-Hermite quadrature; ``fn`` maps an array of
    shape ``mean.shape + (num_points,)`` elementwise to the same shape."""
    z, w = standard_normal_nodes(num_points)
    z, w = jnp.asarray(z, dtype=mean.dtype), jnp.asarray(w, dtype=mean.dtype)
    f = mean[..., None] + jnp.sqrt(var)[..., None] * z
    return fn(f) @ w


def monte_carlo(fn, mean, var, num_samples, key):
    """Unbiased reparameterised estimate of ``E[fn(f)]`` from ``num_samples`` draws, with
    ``fn`` mapping ``(num_samples,) + mean.shape`` to the same shape."""
    eps = jax.random.normal(key, (num_samples,) + mean.shape, dtype=mean.dtype)
    return fn(mean + jnp.sqrt(var) * eps).mean(0)
