"""Decoupled mean and covariance bases (see :mod:`sparsegp_common.decoupled`), for NumPyro."""
from sparsegp_common import decoupled as core
from sparsegp_common.decoupled import DecoupledPosterior

from .params import adapt
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)

__all__ = ["DecoupledGP", "DecoupledPosterior"]

(DecoupledGP,) = adapt((core.DecoupledGP,), module=__name__)
