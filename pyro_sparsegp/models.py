"""A stand-alone GP model (see :mod:`sparsegp_common.objectives.gp_model`), as a torch module."""
import torch

from sparsegp_common.objectives import gp_model as core

from . import checks, predict, sites
from .distributions import ExpectedLikelihood


class GPModel(core.GPModel, torch.nn.Module):
    _checks, _sites, _predict, _expected_likelihood = checks, sites, predict, ExpectedLikelihood
