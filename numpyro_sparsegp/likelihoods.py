"""Observation models p(y | f) (the formulas are :mod:`sparsegp_common.likelihoods`), with NumPyro parameters.

Calling a likelihood binds it: ``likelihood(f)`` is the distribution of ``y`` given ``f``. Monte
Carlo estimates and predictive quantiles draw from ``key``, by default ``numpyro.prng_key()``.
"""

from sparsegp_common import likelihoods as core
from sparsegp_common.likelihoods import log_softplus  # noqa: F401  (re-exported)

from .params import Parameterized, adapt


class Likelihood(core.Likelihood, Parameterized):
    def __call__(self, f):
        return self.bind().forward(f)


Gaussian, Poisson, Bernoulli, StudentT, Softmax = adapt(core.CLASSES, module=__name__)
