"""Log-Gaussian Cox processes (the formulas are :mod:`sparsegp_common.objectives.cox`), for NumPyro; random
integration points draw from ``key``, by default ``numpyro.prng_key()``; :meth:`simulate`'s
moments of ``f`` run in ``predict_f``'s compiled programs (batches padded to one shape)."""
import numpyro.distributions
from numpyro.distributions import Distribution, constraints

from sparsegp_common.data.raster import PixelRule
from sparsegp_common.objectives import cox as core
from sparsegp_common.objectives.windows import Binned, GaussLegendre, Interval, Polygon, Rectangle, StratifiedMC, UserRule

from . import checks, predict, sites

__all__ = ["Binned", "CoxEvents", "CoxProcess", "GaussLegendre", "Interval", "PixelRule", "Polygon", "Rectangle", "StratifiedMC",
           "UserRule"]


class CoxEvents(core.CoxEvents, Distribution):
    support = constraints.real_vector

    def sample(self, key, sample_shape=()):
        return self._draw(key, sample_shape)


class CoxProcess(core.CoxProcess):
    _checks, _sites, _predict, _dist, _cox_events = checks, sites, predict, numpyro.distributions, CoxEvents
