"""Variational families q(u): see :mod:`sparsegp_common.variational`."""
from sparsegp_common.variational import CholeskyGaussian, DiagonalGaussian, family, prior_distribution

__all__ = ["CholeskyGaussian", "DiagonalGaussian", "family", "prior_distribution"]
