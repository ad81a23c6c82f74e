"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.diagnostics`); NumPyro
draws with its vectorised ``Predictive`` and ``log_likelihood``."""
import jax
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import Predictive, log_likelihood

from sparsegp_common.diagnostics import make_to_inference_data, site_dims
from sparsegp_common.nystrom import trace_floor

from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data", "trace_floor"]


def _draw(model, guide, data, num_samples, seed, params, kwargs):
    model, guide = handlers.substitute(model, data=params or {}), handlers.substitute(guide, data=params or {})
    key_guide, key_model, key_predictive = jax.random.split(jax.random.PRNGKey(seed), 3)
    samples = Predictive(guide, num_samples=num_samples)(key_guide, *data, **kwargs)
    guide_trace = handlers.trace(handlers.seed(guide, key_guide)).get_trace(*data, **kwargs)
    one_draw = {k: v[0] for k, v in samples.items()}
    model_trace = handlers.trace(handlers.seed(handlers.substitute(model, data=one_draw), key_model)).get_trace(*data, **kwargs)
    observed = {k: site for k, site in model_trace.items() if _sample(site) and site["is_observed"]}
    if not observed:
        return {}, {}, {}, {}, {}
    latent = {k: site for k, site in guide_trace.items() if _sample(site) and not site["is_observed"]}
    predictive = Predictive(handlers.uncondition(model), posterior_samples=samples, return_sites=list(observed))
    return (
        {k: np.asarray(samples[k]) for k in latent},
        {k: np.asarray(v) for k, v in predictive(key_predictive, *data, **kwargs).items()},
        {k: np.asarray(v) for k, v in log_likelihood(model, samples, *data, **kwargs).items() if k in observed},
        {k: np.asarray(site["value"]) for k, site in observed.items()},
        {k: _dims(k, site) for k, site in {**latent, **observed}.items()},
    )


def _sample(site):
    """Sample sites, without factors (such as the KL term), which are not observations."""
    return site["type"] == "sample" and not isinstance(site["fn"], dist.Unit)


def _dims(name, site):
    plates = [(f.name, f.dim) for f in site["cond_indep_stack"]]
    return site_dims(name, tuple(np.shape(site["value"])), site["fn"].event_dim, plates)


to_inference_data = make_to_inference_data(
    _draw, (GPModel, CoxProcess), __name__, ppl="NumPyro", package="numpyro_sparsegp",
    seed="", without="the values the model's objects hold (trained ones after ``fit``)",
)
