"""Observation models p(y | f) (the formulas are :mod:`sparsegp_common.likelihoods`), as Pyro modules.

``likelihood(f)`` is the distribution of ``y`` given ``f``. Monte Carlo estimates and predictive
quantiles draw from torch's global RNG (seed it with ``pyro.set_rng_seed``); ``key`` stays None.
"""
from sparsegp_common import likelihoods as core
from sparsegp_common.likelihoods import log_softplus  # noqa: F401  (re-exported)

from .params import Parameterized, adapt


class Likelihood(core.Likelihood, Parameterized):
    __doc__ = core.Likelihood.__doc__

    @staticmethod
    def _key(key):
        if key is not None:
            raise TypeError("the Pyro backend draws from torch's global RNG (seed it with pyro.set_rng_seed); "
                            f"key must be None, got {type(key).__name__}")
        return None

    @staticmethod
    def _sample(distribution, key):
        return distribution.sample()


Gaussian, Poisson, Bernoulli, StudentT, Softmax = adapt(core.CLASSES, module=__name__, known={core.Likelihood: Likelihood})
