"""Observation models p(y | f) (the formulas are :mod:`sparsegp_common.likelihoods`), as Pyro modules.

``likelihood(f)`` is the distribution of ``y`` given ``f``. Monte Carlo estimates and predictive
quantiles draw from torch's global RNG (seed it with ``pyro.set_rng_seed``); ``key`` stays None.
"""
from sparsegp_common import likelihoods as core
from sparsegp_common.likelihoods import log_softplus  # noqa: F401  (re-exported)

from .params import adapt

Likelihood, Gaussian, Poisson, Bernoulli, StudentT, Softmax = adapt((core.Likelihood, *core.CLASSES), module=__name__)
