"""Decoupled mean and covariance bases (see :mod:`sparsegp_common.priors.decoupled`), as Pyro modules."""
import torch

from sparsegp_common.priors import decoupled as core
from sparsegp_common.priors.decoupled import DecoupledPosterior

from .priors import GPPrior

__all__ = ["DecoupledGP", "DecoupledPosterior"]


class DecoupledGP(core.DecoupledGP, GPPrior):
    def add_basis(self, X, num_new, params=None):
        with torch.no_grad():
            new = super().add_basis(X, num_new, params)
            if params is None:  # in place: an optimiser holding the parameters keeps its state
                for name, value in new.items():
                    setattr(self, name[len(self.name) + 1:], value)
        return new

