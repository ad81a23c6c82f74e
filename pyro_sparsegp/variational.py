"""Variational families q(u) (:mod:`sparsegp_common.variational`); pass ``pyro.distributions`` as the
``dist`` of ``prior_distribution``."""
from sparsegp_common.variational import CholeskyGaussian, DiagonalGaussian, family, prior_distribution

__all__ = ["CholeskyGaussian", "DiagonalGaussian", "family", "prior_distribution"]
