"""ArviZ export of a model fitted by SVI: ``to_inference_data``."""
import jax
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import Predictive, log_likelihood

from sparsegp_common.diagnostics import draws_layout, inference_data, model_guide_pair, site_dims

from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data"]


def to_inference_data(model, guide=None, data=(), *, num_samples=1000, num_chains=4, seed=0, result=None, **kwargs):
    """Draws from the guide turned into an ``arviz.InferenceData``.

    Groups: ``posterior`` (the guide's latent sites), ``posterior_predictive`` and
    ``log_likelihood`` (every observed site of the model, replayed on each draw; pointwise, so
    ``az.loo`` and ``az.waic`` run), ``observed_data``, and ``sample_stats.elbo`` (the ELBO of
    every training step, when ``result`` is given). Dimensions are named after the plates.

    Args:
        model: a NumPyro model, or a :class:`~numpyro_sparsegp.GPModel` (then ``guide`` is None
            and its :meth:`~numpyro_sparsegp.GPModel.sampled_model` pair is used, whose
            ``<name>.f`` draws come from the marginals ``q(f_n)``: all per-observation
            diagnostics need), or a :class:`~numpyro_sparsegp.CoxProcess` (its sampled pair likewise).
        guide: the guide fitted with ``model``.
        data: tuple of arguments of the model and guide (all observations, e.g. ``(X, y)``).
        num_samples: number of draws, split into ``num_chains`` chains of independent draws so
            that ArviZ's per-chain diagnostics run (``r_hat`` is 1 up to noise by construction).
        seed: seed of the draws.
        result: the :class:`~numpyro_sparsegp.FitResult` of training: its ``params`` are used and
            its losses become ``sample_stats.elbo``; without it the initial values are used.
        **kwargs: passed to the model and guide.
    """
    model, guide = model_guide_pair(model, guide, (GPModel, CoxProcess))
    num_chains, _ = draws_layout(num_samples, num_chains)
    params = {} if result is None else result.params
    model, guide = handlers.substitute(model, data=params), handlers.substitute(guide, data=params)
    key_guide, key_model, key_predictive = jax.random.split(jax.random.PRNGKey(seed), 3)
    samples = Predictive(guide, num_samples=num_samples)(key_guide, *data, **kwargs)
    guide_trace = handlers.trace(handlers.seed(guide, key_guide)).get_trace(*data, **kwargs)
    one_draw = {k: v[0] for k, v in samples.items()}
    model_trace = handlers.trace(handlers.seed(handlers.substitute(model, data=one_draw), key_model)).get_trace(*data, **kwargs)
    observed = {k: site for k, site in model_trace.items() if _sample(site) and site["is_observed"]}
    if not observed:
        raise ValueError("the model has no observed sites: pass the observations in data")
    latent = {k: site for k, site in guide_trace.items() if _sample(site) and not site["is_observed"]}
    predictive = Predictive(handlers.uncondition(model), posterior_samples=samples, return_sites=list(observed))
    dims = {k: _dims(k, site) for k, site in {**latent, **observed}.items()}
    return inference_data(
        {k: np.asarray(samples[k]) for k in latent},
        {k: np.asarray(v) for k, v in predictive(key_predictive, *data, **kwargs).items()},
        {k: np.asarray(v) for k, v in log_likelihood(model, samples, *data, **kwargs).items() if k in observed},
        {k: np.asarray(site["value"]) for k, site in observed.items()},
        dims, num_chains, None if result is None else result.losses,
    )


def _sample(site):
    """Sample sites, without factors (such as the KL term), which are not observations."""
    return site["type"] == "sample" and not isinstance(site["fn"], dist.Unit)


def _dims(name, site):
    plates = [(f.name, f.dim) for f in site["cond_indep_stack"]]
    return site_dims(name, tuple(np.shape(site["value"])), site["fn"].event_dim, plates)
