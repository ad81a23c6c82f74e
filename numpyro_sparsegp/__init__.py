"""Scalable variational Gaussian-process priors for NumPyro."""
from . import conditionals, datasets, dbk, harmonic, kernels, likelihoods, mean_functions, qsgp, quadrature, variational, vof
from .conditionals import conditional
from .cox import Binned, CoxEvents, CoxProcess, GaussLegendre, Interval, PixelRule, Polygon, Rectangle, StratifiedMC, UserRule
from .dbk import ExactDBK, SVDBK, SVDBKPosterior
from .decoupled import DecoupledGP
from .diagnostics import to_inference_data
from .distributions import ExpectedLikelihood
from .features import Features, InducingPoints, Kuf, Kuu
from .harmonic import HarmonicFeatures
from .kernels import RBF, Matern12, Matern32, Matern52, Product, SquaredExponential, Sum
from .likelihoods import Bernoulli, Gaussian, Poisson, Softmax, StudentT
from .linalg import CholeskyError, cholesky
from .mean_functions import Constant, Covariates, Linear, MeanFunction, Raster, Zero
from .models import GPModel
from .predict import Prediction, predict_f, predict_y, sample_f
from .priors import GPPrior
from .qsgp import QSGP, QuadruplyStochasticELBO
from .svgp import SVGP
from .training import FitResult, fit
from .vof import CollapsedELBO, FourierFeatures, HermiteFeatures, LegendreFeatures, SpectralFeatures, VOFModel

__all__ = [
    "Bernoulli", "Binned", "CholeskyError", "CollapsedELBO", "Constant", "Covariates", "CoxEvents", "CoxProcess",
    "DecoupledGP", "ExactDBK", "ExpectedLikelihood", "Features", "FitResult", "FourierFeatures",
    "GPModel", "GPPrior", "GaussLegendre", "Gaussian", "HarmonicFeatures", "HermiteFeatures", "InducingPoints",
    "Interval", "Kuf", "Kuu", "LegendreFeatures", "Linear", "MeanFunction", "Matern12", "Matern32", "Matern52", "PixelRule",
    "Poisson", "Polygon", "Prediction", "Product", "QSGP", "QuadruplyStochasticELBO", "RBF", "Raster", "Rectangle", "SVDBK", "SVDBKPosterior", "SVGP", "Softmax",
    "SpectralFeatures", "SquaredExponential", "StratifiedMC", "StudentT", "Sum", "UserRule",
    "VOFModel", "Zero", "cholesky", "conditional", "conditionals", "datasets", "dbk", "fit", "harmonic", "kernels",
    "likelihoods", "mean_functions", "predict_f", "predict_y", "qsgp", "quadrature", "sample_f", "to_inference_data",
    "variational", "vof",
]
