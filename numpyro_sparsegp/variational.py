"""Variational families q(u) (:mod:`sparsegp_common.variational`); pass ``numpyro.distributions`` as
the ``dist`` of ``prior_distribution``."""
from sparsegp_common.variational import *  # noqa: F403  (its __all__)
