"""Covariance functions (the formulas are :mod:`sparsegp_common.kernels`), as Pyro modules.

Hyperparameters are constrained positive by Pyro's ``positive`` constraint (exp/log); calling
a kernel, ``kernel(X, Z)`` or ``kernel(X, diag=True)``, is its ``forward``.
"""
from sparsegp_common import kernels as core

from .params import Parameterized, adapt


class Kernel(core.Kernel, Parameterized):
    def forward(self, X, Z=None, diag=False):
        return self.K_diag(X) if diag else self.K(X, Z)


Stationary, SquaredExponential, Matern, Matern12, Matern32, Matern52, Sum, Product = adapt(core.CLASSES, module=__name__)
RBF = SquaredExponential
