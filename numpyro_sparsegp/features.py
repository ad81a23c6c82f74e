"""Inducing features and their covariances ``Kuu``/``Kuf`` (see :mod:`sparsegp_common.features`);
both take bound objects (see :mod:`~numpyro_sparsegp.params`)."""
from sparsegp_common import features as core
from sparsegp_common.features import Kuf, Kuu

from .params import adapt

__all__ = ["Features", "InducingPoints", "Kuf", "Kuu"]

Features, InducingPoints = adapt((core.Features, core.InducingPoints), module=__name__)
