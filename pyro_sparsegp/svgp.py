"""Stochastic variational GP with inducing points (see :mod:`sparsegp_common.priors.svgp`), as a Pyro
module: ``q_mu``, ``q_sqrt`` and the features' parameters are the module's own PyroParams, not
entries of Pyro's global param store."""
from sparsegp_common.priors import svgp as core
from sparsegp_common.priors.svgp import SVGPPosterior

from .params import adapt
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)

__all__ = ["SVGP", "SVGPPosterior"]

(SVGP,) = adapt((core.SVGP,), module=__name__)
