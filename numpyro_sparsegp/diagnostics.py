"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.inference.diagnostics`); NumPyro
draws with its vectorised ``Predictive`` and ``log_likelihood``, one batch of a subsampling plate's
rows at a time (the plate's indices substituted)."""
import functools

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
    key = jax.random.PRNGKey(seed)
    arrays, static = _split(data)
    sites = _sites(model, guide, data, arrays, static, kwargs, key, params or {})
    params = {**sites.params, **(params or {})}  # every parameter an input of the programs
    plate = subsampling_plate(sites.plates)
    axes = {k: _axis(s, plate) for k, s in {**sites.latent, **sites.observed}.items()}
    dims = {k: _dims(k, s) for k, s in {**sites.latent, **sites.observed}.items()}
    outside = tuple(k for k in sites.latent if axes[k] is None)
    settings = (model, guide, num_samples, parallel, tuple(sorted(kwargs.items())), static, outside,
                tuple(sites.latent), tuple(sites.observed))
    try:
        fixed_draws, batch_draws = _programs(*settings)
    except TypeError:  # settings that cannot be a key (an array among kwargs, say): compiled for this call
        fixed_draws, batch_draws = _programs.__wrapped__(*settings)

    def draw(chunk, index, fixed):
        index = {k: jnp.asarray(v) for k, v in index.items()}
        if fixed is None:
            fixed = fixed_draws(key, index, params, arrays) if outside else {}
        values = jax.device_get(batch_draws(jax.random.fold_in(key, chunk), index, fixed, params, arrays))
        return Draws(*({k: np.asarray(v) for k, v in group.items()} for group in values), dims, axes, fixed)

    return full_data_draws(draw, plate)


@functools.lru_cache(maxsize=8)
def _programs(model, guide, num_samples, parallel, kwargs, static, outside, latent, observed):
    """Two compiled programs, not hundreds of eager operations: one draws the sites ``outside`` the
    plate from the guide, the other everything else for a batch of rows given those draws. The
    parameters, the data's arrays and the plate's rows are their inputs, so a later export of the
    same model and guide (after more training, say) runs them again; anything else the functions
    read is taken as it was when they were first compiled."""
    kwargs = dict(kwargs)

    @jax.jit
    def fixed_draws(key, index, params, arrays):
        guide_ = handlers.substitute(guide, data={**params, **index})
        samples = Predictive(guide_, num_samples=num_samples, return_sites=list(outside),
                             parallel=parallel)(key, *_with_arrays(static, arrays), **kwargs)
        return {k: samples[k] for k in outside}

    @jax.jit
    def batch_draws(key, index, fixed, params, arrays):
        data = _with_arrays(static, arrays)
        key_guide, key_predictive = jax.random.split(key)
        m, g = (handlers.substitute(f, data={**params, **index}) for f in (model, guide))
        samples = Predictive(g, posterior_samples=fixed or None, num_samples=None if fixed else num_samples,
                             parallel=parallel)(key_guide, *data, **kwargs)
        samples = {**fixed, **samples}
        predictive = Predictive(handlers.uncondition(m), posterior_samples=samples, return_sites=list(observed),
                                parallel=parallel)(key_predictive, *data, **kwargs) if observed else {}
        log_lik = log_likelihood(m, samples, *data, parallel=parallel, **kwargs) if observed else {}
        values = _traces(m, g, data, kwargs, key, {k: v[0] for k, v in samples.items()})[1]
        return ({k: samples[k] for k in latent}, {k: log_lik[k] for k in observed},
                {k: predictive[k] for k in observed}, {k: values[k]["value"] for k in observed})

    return fixed_draws, batch_draws


class _Sites:
    """The sites of a model and guide pair, found by tracing them abstractly (nothing runs):
    ``plates`` ``{(name, size, subsample_size)}``, the guide's ``latent`` and the model's
    ``observed`` sample sites ``{name: site}`` (site values abstract: shapes only), and the values
    ``params`` of the parameters that were not given (their initial values)."""

    def __init__(self, guide_trace, model_trace):
        sites = [s for t in (guide_trace, model_trace) for s in t.values()]
        self.plates = {(s["name"], *s["args"]) for s in sites if s["type"] == "plate"}
        self.latent = {k: s for k, s in guide_trace.items() if _sample(s) and not s["is_observed"]
                       and not s["infer"].get("is_auxiliary")}
        self.observed = {k: s for k, s in model_trace.items() if _sample(s) and s["is_observed"]}
        self.params = {s["name"]: s["value"] for s in sites
                       if s["type"] == "param" and not isinstance(s["value"], jax.core.Tracer)}


def _sites(model, guide, data, arrays, static, kwargs, key, params):
    # the guide runs once first: an autoguide sets itself up on its first call (from what it sees,
    # which must not be a tracer); then both are traced abstractly (nothing runs)
    handlers.seed(handlers.substitute(guide, data=params), key)(*data, **kwargs)
    found = []

    def find(key, params, arrays):
        model_, guide_ = (handlers.substitute(f, data=params) for f in (model, guide))
        found.append(_Sites(*_traces(model_, guide_, _with_arrays(static, arrays), kwargs, key)))

    jax.eval_shape(find, key, params, arrays)
    return found[0]


def _split(data):
    """``(arrays, static)``: the array arguments of ``data`` (the compiled programs' inputs) and
    the rest, ``(length, ((position, value), ...))``, as given (numbers, None, ...)."""
    arrays = [a for a in data if isinstance(a, (jax.Array, np.ndarray))]
    return arrays, (len(data), tuple((i, a) for i, a in enumerate(data) if not isinstance(a, (jax.Array, np.ndarray))))


def _with_arrays(static, arrays):
    """The arguments again from :func:`_split`'s two parts."""
    length, others = static
    full, arrays = dict(others), iter(arrays)
    return tuple(full[i] if i in full else next(arrays) for i in range(length))


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
