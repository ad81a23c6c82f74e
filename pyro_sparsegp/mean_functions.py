"""Mean functions (the formulas are :mod:`sparsegp_common.priors.mean_functions`), as Pyro modules."""
from sparsegp_common.data.raster import Raster  # noqa: F401  (covariate images, backend-free)
from sparsegp_common.priors import mean_functions as core

from .params import adapt

MeanFunction, Zero, Constant, Linear, Covariates = adapt(core.CLASSES, module=__name__)
