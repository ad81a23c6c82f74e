"""Variational orthogonal features (the formulas are :mod:`sparsegp_common.features.orthogonal` and
:mod:`sparsegp_common.objectives.vof_model`), as Pyro modules: frequencies come from torch's global
RNG, the loss is a plain callable."""
import torch

from sparsegp_common.features import orthogonal as core
from sparsegp_common.features.orthogonal import hermite_kuf, spectral_terms
from sparsegp_common.objectives import vof_model
from sparsegp_common.objectives.vof_model import collapsed_moments, sampled_moments

from .features import Features, Kuf, Kuu  # noqa: F401  (importable from here, as before)
from .likelihoods import Gaussian
from .models import GPModel
from .params import adapt

__all__ = [
    "CollapsedELBO", "FourierFeatures", "HermiteFeatures", "LegendreFeatures", "SpectralFeatures", "VOFModel",
    "collapsed_moments", "estimated_moments", "hermite_kuf", "sampled_moments",
]

_OrthogonalFeatures, HermiteFeatures, SpectralFeatures, FourierFeatures, LegendreFeatures = adapt(
    (core.OrthogonalFeatures, core.HermiteFeatures, core.SpectralFeatures, core.FourierFeatures, core.LegendreFeatures),
    module=__name__,
)


def estimated_moments(prior, X, u=None):
    """:func:`sparsegp_common.objectives.vof_model.estimated_moments` with torch's global RNG; call under
    the prior's parameter context."""
    return vof_model.estimated_moments(prior, X, u)


class VOFModel(vof_model.VOFModel, GPModel):
    _gaussian = Gaussian


class CollapsedELBO:
    """The collapsed VOF objective as a callable loss: ``loss(model, guide, X, y) = -elbo(X, y)``
    for ``model``, ``guide`` the methods of a :class:`VOFModel` (``pyro.infer.SVI(...,
    loss=CollapsedELBO())`` or ``fit(..., loss=CollapsedELBO())``)."""

    def __call__(self, model, guide, *args, **kwargs):
        return -vof_model.collapsed_owner(model, kwargs).elbo(*args)

    def loss(self, model, guide, *args, **kwargs):
        """The loss as a float."""
        with torch.no_grad():
            return float(self(model, guide, *args, **kwargs))
