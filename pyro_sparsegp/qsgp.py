"""Quadruply stochastic GPs for Pyro (written once in :mod:`sparsegp_common.priors.qsgp`): the
index draws come from torch's global RNG, the loss is a plain callable."""
import torch

from sparsegp_common.priors import qsgp as core
from sparsegp_common.priors.qsgp import ChevronPosterior, quadruply_stochastic_loss

from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)
from .params import adapt

__all__ = ["ChevronPosterior", "QSGP", "QuadruplyStochasticELBO", "quadruply_stochastic_loss"]

(QSGP,) = adapt((core.QSGP,), module=__name__)


class QuadruplyStochasticELBO(core.QuadruplyStochasticELBO):
    def __call__(self, model, guide, *args, **kwargs):
        return self.negative_elbo(model, *args, **kwargs)

    def loss(self, model, guide, *args, **kwargs):
        """The loss as a float."""
        with torch.no_grad():
            return float(self(model, guide, *args, **kwargs))
