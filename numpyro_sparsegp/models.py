"""A stand-alone GP model (see :mod:`sparsegp_common.models`), for NumPyro."""
from sparsegp_common import models as core

from . import checks, predict, sites
from .distributions import ExpectedLikelihood


class GPModel(core.GPModel):
    _checks, _sites, _predict, _expected_likelihood = checks, sites, predict, ExpectedLikelihood
