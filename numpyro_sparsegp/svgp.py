"""Stochastic variational GP with inducing points (see :mod:`sparsegp_common.priors.svgp`), with
NumPyro parameters: ``<name>.q_mu``, ``<name>.q_sqrt`` and the features' ``numpyro.param`` sites."""
from sparsegp_common.priors import svgp as core
from sparsegp_common.priors.svgp import SVGPPosterior

from .params import adapt
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)

__all__ = ["SVGP", "SVGPPosterior"]

(SVGP,) = adapt((core.SVGP,), module=__name__)
