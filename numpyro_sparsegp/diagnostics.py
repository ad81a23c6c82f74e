"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.inference.diagnostics`); NumPyro
draws through one compiled program per model and guide, vectorised over the draws, one batch of a
subsampling plate's rows at a time (the plate's indices substituted)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.primitives import Messenger

from sparsegp_common.features.nystrom import trace_floor
from sparsegp_common.inference.diagnostics import Draws, full_data_draws, make_to_inference_data, plate_axis, site_dims, subsampling_plate

from . import sites
from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data", "trace_floor"]


def _draw(model, guide, data, num_samples, seed, params, kwargs, parallel):
    key = jax.random.PRNGKey(seed)
    arrays, static = _split(data)
    sites = _sites(model, guide, data, arrays, static, kwargs, key, params or {})
    params = {**sites.params, **(params or {})}  # every parameter an input of the program
    plate = subsampling_plate(sites.plates)
    axes = {k: _axis(s, plate) for k, s in {**sites.latent, **sites.observed}.items()}
    dims = {k: _dims(k, s) for k, s in {**sites.latent, **sites.observed}.items()}
    settings = (model, guide, num_samples, parallel, tuple(sorted(kwargs.items())), static, plate and plate[0],
                tuple(sites.latent), tuple(sites.observed))
    try:
        program = _program(*settings)
    except TypeError:  # settings that cannot be a key (an array among kwargs, say): compiled for this call
        program = _program.__wrapped__(*settings)

    def draw(chunk, index, fixed):  # fixed unused: the sites outside the plate draw alike in every batch
        index = {k: jnp.asarray(v) for k, v in index.items()}
        values = jax.device_get(program(key, chunk, index, params, arrays))
        latent, log_lik, predictive, observed = ({k: np.asarray(v) for k, v in group.items()} for group in values)
        return Draws(latent, log_lik, predictive, {k: v[0] for k, v in observed.items()}, dims, axes)

    return full_data_draws(draw, plate)


@functools.lru_cache(maxsize=8)
def _program(model, guide, num_samples, parallel, kwargs, static, plate, latent, observed):
    """One compiled program, not hundreds of eager operations: for each draw, one trace of the
    guide and one of the model replaying it (as Pyro's export: the predictive draws come from the
    model's observation sites given that draw). The sites outside ``plate`` draw from keys that
    do not depend on the batch of rows, so every batch sees the same values of them. The
    parameters, the data's arrays and the plate's rows are inputs, so a later export of the same
    model and guide (after more training, say) runs the program again; anything else the
    functions read is taken as it was when it was first compiled."""
    kwargs = dict(kwargs)

    @jax.jit
    def draws(key, chunk, index, params, arrays):
        data = _with_arrays(static, arrays)
        model_, guide_ = (handlers.substitute(f, data={**params, **index}) for f in (model, guide))

        def one(key):
            shared, batch = jax.random.split(key)
            local, key_model, key_predictive = jax.random.split(jax.random.fold_in(batch, chunk), 3)
            guide_trace = handlers.trace(_Seeded(guide_, shared, local, plate)).get_trace(*data, **kwargs)
            values = {k: s["value"] for k, s in guide_trace.items() if s["type"] == "sample"}
            model_trace = handlers.trace(handlers.seed(handlers.substitute(model_, data=values), key_model)
                                         ).get_trace(*data, **kwargs)
            obs = [model_trace[k] for k in observed]
            return ({k: values[k] for k in latent},
                    {k: s["fn"].log_prob(s["value"]) for k, s in zip(observed, obs)},
                    {k: s["fn"].sample(jax.random.fold_in(key_predictive, i)) for i, (k, s) in enumerate(zip(observed, obs))},
                    {k: s["value"] for k, s in zip(observed, obs)})

        keys = jax.random.split(key, num_samples)
        return jax.vmap(one)(keys) if parallel else jax.lax.map(one, keys)

    return draws


class _Seeded(Messenger):
    """``handlers.seed`` with two streams of keys: sites inside ``plate`` (the subsampling plate)
    draw from ``local`` (a batch of rows' own), the others from ``shared``."""

    def __init__(self, fn, shared, local, plate):
        super().__init__(fn)
        self.keys, self.plate = {False: shared, True: local}, plate

    def process_message(self, msg):
        if (msg["type"] not in ("sample", "prng_key", "plate", "control_flow") or msg["value"] is not None
                or msg["kwargs"].get("rng_key") is not None):
            return
        inside = any(f.name == self.plate for f in msg.get("cond_indep_stack", ()))
        self.keys[inside], msg["kwargs"]["rng_key"] = jax.random.split(self.keys[inside])


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
    """The model's and guide's sites, traced abstractly (nothing runs). A guide that asks for a
    key there (an autoguide does on its first call, to set itself up from what it sees, which must
    not be a tracer) runs once eagerly first."""
    found = []

    def find(key, params, arrays, guard):
        model_, guide_ = (handlers.substitute(f, data=params) for f in (model, guide))
        found.append(_Sites(*_traces(model_, guard(guide_), _with_arrays(static, arrays), kwargs, key)))

    try:
        jax.eval_shape(lambda *args: find(*args, sites.refusing_keys), key, params, arrays)
    except sites.AsksForKey:
        handlers.seed(handlers.substitute(guide, data=params), key)(*data, **kwargs)
        jax.eval_shape(lambda *args: find(*args, lambda fn: fn), key, params, arrays)
    return found[-1]


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
