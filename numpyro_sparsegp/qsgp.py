"""Quadruply stochastic GPs for NumPyro (written once in :mod:`sparsegp_common.priors.qsgp`): the
index draws come from the loss's key, the loss is a NumPyro ``ELBO`` whose control-variate state
is SVI's mutable state (``fit`` adds it; with ``SVI`` yourself, :meth:`with_initial_state`)."""
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

STATE = "control_variates"  # the key of the state in SVI's mutable state


class QuadruplyStochasticELBO(core.QuadruplyStochasticELBO, ELBO):
    __doc__ = core.QuadruplyStochasticELBO.__doc__ + """
    ``num_particles`` independent estimates are averaged (one, with control variates).
    """
    STATE = STATE

    def __init__(self, num_basis=1000, num_columns=None, replacement=True, control_variates=None, refresh_every=1000,
                 paper_literal=False, snapshot=None, snapshot_every=20, num_particles=1):
        core.QuadruplyStochasticELBO.__init__(self, num_basis, num_columns, replacement, control_variates, refresh_every,
                                              paper_literal, snapshot, snapshot_every)
        if self.stateful and num_particles != 1:
            raise ValueError("control_variates and snapshot carry one state from step to step: use num_particles=1")
        ELBO.__init__(self, num_particles=num_particles)

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        if self.stateful:
            if STATE not in param_map:
                raise ValueError("the control variates' state is missing from SVI's state: start from "
                                 "loss.with_initial_state(svi, svi.init(key, X, y), X, y) (fit does this)")
            params = {k: v for k, v in param_map.items() if k != STATE}
            with handlers.substitute(data=params):
                loss, state = self.negative_elbo(model, *args, key=rng_key, state=param_map[STATE], **kwargs)
            return {"loss": loss, "mutable_state": {STATE: state}}

        def single(key):
            with handlers.substitute(data=param_map):
                return self.negative_elbo(model, *args, key=key, **kwargs)

        keys = jax.random.split(rng_key, self.num_particles)
        return {"loss": jnp.mean(self.vectorize_particles_fn(single, keys)), "mutable_state": None}

    def step_draw(self, model, X, y, rng_key):
        """The draw :meth:`loss_with_mutable_state` makes from SVI's step key ``rng_key`` (one
        particle): for a step that gathers the rows it reads first (``fit``)."""
        key = rng_key if self.stateful else jax.random.split(rng_key, 1)[0]
        return self.draw(model, X, y, key=key)

    def with_initial_state(self, svi, svi_state, *args):
        """``svi_state`` with the control variates' (or the snapshot's) first state (at its
        parameter values) in its mutable state; unchanged without them. ``args``: the model's
        ``(X, y)``."""
        if not self.stateful:
            return svi_state
        with handlers.substitute(data=svi.get_params(svi_state)):
            state = self.initial_state(svi.model, *args)
        return svi_state._replace(mutable_state={**(svi_state.mutable_state or {}), STATE: state})
