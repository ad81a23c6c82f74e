"""Variational orthogonal features (the formulas are :mod:`sparsegp_common.features.orthogonal` and
:mod:`sparsegp_common.objectives.vof_model`), with NumPyro parameters: frequencies come from
``numpyro.prng_key()`` (or an explicit ``key``), the collapsed loss is a NumPyro ``ELBO``."""
import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer.elbo import ELBO

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


def estimated_moments(prior, X, u=None, key=None):
    """:func:`sparsegp_common.objectives.vof_model.estimated_moments` of a bound prior, with frequencies
    from ``key`` (default ``numpyro.prng_key()``)."""
    return vof_model.estimated_moments(prior, X, u, key)


class VOFModel(vof_model.VOFModel, GPModel):
    _gaussian = Gaussian


class CollapsedELBO(ELBO):
    """The collapsed VOF objective as a NumPyro ELBO: ``-elbo(X, y)`` of the :class:`VOFModel`
    whose ``model`` method is passed (``SVI(vof.model, vof.guide, optim, CollapsedELBO())`` or
    ``fit(..., loss=CollapsedELBO())``); ``num_particles`` independent estimates are averaged."""

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        owner = vof_model.collapsed_owner(model, kwargs)

        def single(key):
            with handlers.seed(rng_seed=key), handlers.substitute(data=param_map):
                return -owner.elbo(*args)

        keys = jax.random.split(rng_key, self.num_particles)
        return {"loss": jnp.mean(self.vectorize_particles_fn(single, keys)), "mutable_state": None}
