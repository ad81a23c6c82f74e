"""The GP prior component as Pyro sample sites (see :mod:`sparsegp_common.priors`)."""
from sparsegp_common import priors as core

from . import predict
from .params import Parameterized


class GPPrior(core.GPPrior, Parameterized):
    _predict = predict
