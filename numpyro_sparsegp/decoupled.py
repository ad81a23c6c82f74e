"""Decoupled mean and covariance bases (see :mod:`sparsegp_common.priors.decoupled`), for NumPyro."""
from sparsegp_common.priors import decoupled as core
from sparsegp_common.priors.decoupled import DecoupledPosterior

from .params import adapt
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)

__all__ = ["DecoupledGP", "DecoupledPosterior"]

(DecoupledGP,) = adapt((core.DecoupledGP,), module=__name__)
