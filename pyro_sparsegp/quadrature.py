"""Expectations of ``fn(f)`` under ``f ~ N(mean, var)`` (see :mod:`sparsegp_common.likelihoods.quadrature`);
Monte Carlo draws come from torch's global RNG."""
from sparsegp_common.likelihoods import quadrature as core
from sparsegp_common.likelihoods.quadrature import gauss_hermite  # noqa: F401  (re-exported)


def monte_carlo(fn, mean, var, num_samples):
    return core.monte_carlo(fn, mean, var, num_samples)


monte_carlo.__doc__ = core.monte_carlo.__doc__
