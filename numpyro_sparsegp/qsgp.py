"""Quadruply stochastic GPs for NumPyro (written once in :mod:`sparsegp_common.priors.qsgp`): the
index draws come from the loss's key, the loss is a NumPyro ``ELBO``."""
import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer.elbo import ELBO

from sparsegp_common.priors import qsgp as core
from sparsegp_common.priors.qsgp import ChevronPosterior, quadruply_stochastic_loss

from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)
from .params import adapt

__all__ = ["ChevronPosterior", "QSGP", "QuadruplyStochasticELBO", "quadruply_stochastic_loss"]

(QSGP,) = adapt((core.QSGP,), module=__name__)


class QuadruplyStochasticELBO(core.QuadruplyStochasticELBO, ELBO):
    __doc__ = core.QuadruplyStochasticELBO.__doc__ + """
    ``num_particles`` independent estimates are averaged.
    """

    def __init__(self, num_basis=1000, num_columns=None, replacement=True, num_particles=1):
        core.QuadruplyStochasticELBO.__init__(self, num_basis, num_columns, replacement)
        ELBO.__init__(self, num_particles=num_particles)

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        def single(key):
            with handlers.substitute(data=param_map):
                return self.negative_elbo(model, *args, key=key, **kwargs)

        keys = jax.random.split(rng_key, self.num_particles)
        return {"loss": jnp.mean(self.vectorize_particles_fn(single, keys)), "mutable_state": None}
