"""Mean functions (the formulas are :mod:`sparsegp_common.mean_functions`), with NumPyro parameters."""
from sparsegp_common import mean_functions as core
from sparsegp_common.raster import Raster  # noqa: F401  (covariate images, backend-free)

from .params import adapt

MeanFunction, Zero, Constant, Linear, Covariates = adapt(core.CLASSES, module=__name__)
