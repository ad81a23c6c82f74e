"""Log-Gaussian Cox processes (the formulas are :mod:`sparsegp_common.cox`), for NumPyro; random
integration points draw from ``key``, by default ``numpyro.prng_key()``, and :meth:`simulate`
compiles its joint draws of ``f``."""
import math

import jax
import numpy as np
import numpyro.distributions
from numpyro import handlers
from numpyro.distributions import Distribution, constraints

from sparsegp_common import cox as core
from sparsegp_common.raster import PixelRule
from sparsegp_common.windows import Binned, GaussLegendre, Interval, Polygon, Rectangle, StratifiedMC, UserRule

from . import checks, predict, sites
from .linalg import cholesky

__all__ = ["Binned", "CoxEvents", "CoxProcess", "GaussLegendre", "Interval", "PixelRule", "Polygon", "Rectangle", "StratifiedMC",
           "UserRule"]


class CoxEvents(core.CoxEvents, Distribution):
    support = constraints.real_vector

    def sample(self, key, sample_shape=()):
        return self._draw(key, sample_shape)


class CoxProcess(core.CoxProcess):
    _checks, _sites, _predict, _dist, _cox_events = checks, sites, predict, numpyro.distributions, CoxEvents

    def _log_intensity_draws(self, params):
        @jax.jit
        def joint(X, key):  # one joint draw of f + offset at X, compiled once per padded size
            with handlers.substitute(data=params or {}):
                mean, cov = self.prior.bind().posterior().marginals(X, full_cov=True)
            eps = jax.random.normal(key, mean.shape, dtype=mean.dtype)
            return mean + cholesky(cov, 1e-6) @ eps + self._offset(X)

        def draw(candidates, draw_seed):
            # padded with extra uniform points to a power of two, so that few sizes are compiled
            box, n = self.window.bounds, len(candidates)
            extra = np.random.default_rng(draw_seed).uniform(box[:, 0], box[:, 1], (2 ** math.ceil(math.log2(n)) - n, box.shape[0]))
            return np.asarray(joint(self._array(np.concatenate([candidates, extra])), jax.random.PRNGKey(draw_seed)))[:n]

        return draw
