"""Log-Gaussian Cox processes (the formulas are :mod:`sparsegp_common.objectives.cox`), as a torch module;
random integration points draw from torch's global RNG."""
import pyro.distributions
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

from sparsegp_common.data.raster import PixelRule
from sparsegp_common.objectives import cox as core
from sparsegp_common.objectives.windows import Binned, GaussLegendre, Interval, Polygon, Rectangle, StratifiedMC, UserRule

from . import checks, predict, sites

__all__ = ["Binned", "CoxEvents", "CoxProcess", "GaussLegendre", "Interval", "PixelRule", "Polygon", "Rectangle", "StratifiedMC",
           "UserRule"]


class CoxEvents(core.CoxEvents, TorchDistribution):
    support = constraints.real_vector

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self._draw(None, sample_shape)


class CoxProcess(core.CoxProcess, torch.nn.Module):
    _checks, _sites, _predict, _dist, _cox_events = checks, sites, predict, pyro.distributions, CoxEvents

    def elbo(self, events):
        return super().elbo(events)

