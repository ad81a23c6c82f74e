"""The GP prior component as NumPyro sample sites (see :mod:`sparsegp_common.priors`).

``model``/``guide`` bind the component (``bind()``), so its formulas read the current values of
its ``numpyro.param`` sites."""
from sparsegp_common import priors as core

from . import predict
from .params import Parameterized


class GPPrior(core.GPPrior, Parameterized):
    _predict = predict
