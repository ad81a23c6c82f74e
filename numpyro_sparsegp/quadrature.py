"""Expectations of ``fn(f)`` under ``f ~ N(mean, var)`` (see :mod:`sparsegp_common.likelihoods.quadrature`);
Monte Carlo draws come from a JAX PRNG ``key``."""
from sparsegp_common.likelihoods import quadrature as core
from sparsegp_common.likelihoods.quadrature import gauss_hermite  # noqa: F401  (re-exported)


def monte_carlo(fn, mean, var, num_samples, key):
    return core.monte_carlo(fn, mean, var, num_samples, key)


monte_carlo.__doc__ = core.monte_carlo.__doc__
