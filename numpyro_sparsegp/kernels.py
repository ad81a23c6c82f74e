"""Covariance functions (the formulas are :mod:`sparsegp_common.kernels`), with NumPyro parameters.

Hyperparameters are constrained positive by NumPyro's ``positive`` constraint (exp/log).
Formulas read the parameters of a bound kernel (``kernel.bind()``); calling a kernel binds it.
"""
from sparsegp_common import kernels as core

from .params import Parameterized, adapt


class Kernel(core.Kernel, Parameterized):
    def __call__(self, X, Z=None, diag=False):
        kernel = self.bind()
        return kernel.K_diag(X) if diag else kernel.K(X, Z)


Stationary, SquaredExponential, Matern, Matern12, Matern32, Matern52, Sum, Product = adapt(core.CLASSES, module=__name__)
RBF = SquaredExponential
