"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.inference.diagnostics`); NumPyro
draws with its vectorised ``Predictive`` and ``log_likelihood``, one batch of a subsampling plate's
rows at a time (the plate's indices substituted)."""
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import Predictive, log_likelihood

from sparsegp_common.features.nystrom import trace_floor
from sparsegp_common.inference.diagnostics import Draws, full_data_draws, make_to_inference_data, plate_axis, site_dims, subsampling_plate

from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data", "trace_floor"]


def _draw(model, guide, data, num_samples, seed, params, kwargs, parallel):
    model, guide = handlers.substitute(model, data=params or {}), handlers.substitute(guide, data=params or {})
    key = jax.random.PRNGKey(seed)
    guide_trace, model_trace = _traces(model, guide, data, kwargs, key)
    plates = {(s["name"], *s["args"]) for t in (guide_trace, model_trace) for s in t.values() if s["type"] == "plate"}
    plate = subsampling_plate(plates)

    def draw(chunk, index, fixed):
        key_guide, key_model, key_predictive = jax.random.split(jax.random.fold_in(key, chunk), 3)
        index = {k: jnp.asarray(v) for k, v in index.items()}
        m, g = handlers.substitute(model, data=index), handlers.substitute(guide, data=index)
        samples = Predictive(g, posterior_samples=fixed, num_samples=None if fixed else num_samples,
                             parallel=parallel)(key_guide, *data, **kwargs)
        samples = {**(fixed or {}), **samples}
        guide_trace, model_trace = _traces(m, g, data, kwargs, key_model, {k: v[0] for k, v in samples.items()})
        latent = {k: s for k, s in guide_trace.items() if _sample(s) and not s["is_observed"]
                  and not s["infer"].get("is_auxiliary")}
        observed = {k: s for k, s in model_trace.items() if _sample(s) and s["is_observed"]}
        axes = {k: _axis(s, plate) for k, s in {**latent, **observed}.items()}
        predictive = Predictive(handlers.uncondition(m), posterior_samples=samples, return_sites=list(observed),
                                parallel=parallel)(key_predictive, *data, **kwargs) if observed else {}
        log_lik = log_likelihood(m, samples, *data, parallel=parallel, **kwargs) if observed else {}
        return Draws(
            {k: np.asarray(samples[k]) for k in latent},
            {k: np.asarray(v) for k, v in log_lik.items() if k in observed},
            {k: np.asarray(v) for k, v in predictive.items()},
            {k: np.asarray(s["value"]) for k, s in observed.items()},
            {k: _dims(k, s) for k, s in {**latent, **observed}.items()},
            axes,
            {k: samples[k] for k in latent if axes[k] is None},
        )

    return full_data_draws(draw, plate)


def _traces(model, guide, data, kwargs, key, values=None):
    """Traces of the guide and of the model replaying it (one draw: ``values`` or the guide's)."""
    key_guide, key_model = jax.random.split(key)
    guide_trace = handlers.trace(handlers.seed(handlers.substitute(guide, data=values or {}), key_guide)).get_trace(*data, **kwargs)
    drawn = values or {k: s["value"] for k, s in guide_trace.items() if s["type"] == "sample"}
    model_trace = handlers.trace(handlers.seed(handlers.substitute(model, data=drawn), key_model)).get_trace(*data, **kwargs)
    return guide_trace, model_trace


def _sample(site):
    """Sample sites, without factors (such as the KL term), which are not observations."""
    return site["type"] == "sample" and not isinstance(site["fn"], dist.Unit)


def _axis(site, plate):
    dims = [f.dim for f in site["cond_indep_stack"] if plate is not None and f.name == plate[0]]
    return plate_axis(np.shape(site["value"]), site["fn"].event_dim, dims[0] if dims else None)


def _dims(name, site):
    plates = [(f.name, f.dim) for f in site["cond_indep_stack"]]
    return site_dims(name, tuple(np.shape(site["value"])), site["fn"].event_dim, plates)


to_inference_data = make_to_inference_data(
    _draw, (GPModel, CoxProcess), __name__, ppl="NumPyro", package="numpyro_sparsegp",
    seed="", without="the values the model's objects hold (trained ones after ``fit``)",
    parallel="draw with ``jax.vmap`` over the draws (else ``lax.map``, less memory).",
)
