"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.inference.diagnostics`); Pyro
draws all at once under an outer plate (as ``Predictive(parallel=True)``) where the model allows,
else one trace per draw, one batch of a subsampling plate's rows at a time (the plate's indices
conditioned)."""
import contextlib
import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from sparsegp_common.features.nystrom import trace_floor
from sparsegp_common.inference.diagnostics import Draws, full_data_draws, make_to_inference_data, plate_axis, site_dims, subsampling_plate

from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data", "trace_floor"]


def _draw(model, guide, data, num_samples, seed, params, kwargs, parallel):
    # the plates' layout, before the fitted values are substituted: a guide not yet run (an
    # autoguide) then creates its parameters here
    with torch.no_grad(), torch.random.fork_rng():
        probe = _traces(model, guide, data, kwargs)
    with _replaying(params, seed):
        sites = [s for t in probe for s in t.nodes.values()]
        plate = subsampling_plate({(s["name"], s["fn"].size, s["fn"].subsample_size) for s in sites if site_is_subsample(s)})
        device = next((s["value"].device for s in sites if plate is not None and s["name"] == plate[0]), None)
        nesting = max((-f.dim for s in sites if s["type"] == "sample" for f in s["cond_indep_stack"] if f.vectorized),
                      default=0)
        mode = {"parallel": parallel}

        def draw(chunk, index, fixed):
            index = {k: torch.as_tensor(v, device=device) for k, v in index.items()}
            m, g = (poutine.condition(fn, data=index) for fn in (model, guide))
            layout = _Layout(*_traces(m, g, data, kwargs), plate)
            if mode["parallel"]:
                try:
                    return _all_at_once(m, g, data, kwargs, num_samples, nesting, fixed, layout)
                except (RuntimeError, ValueError, IndexError) as error:
                    if chunk:
                        raise
                    mode["parallel"] = False
                    warnings.warn(f"the model could not be run for all draws at once ({error}); drawing one at a "
                                  "time (pass parallel=False to skip the attempt)", UserWarning, stacklevel=4)
            return _one_at_a_time(m, g, data, kwargs, num_samples, fixed, layout)

        return full_data_draws(draw, plate)


class _Layout:
    """Which sites are exported, their per-draw shapes, dimension names and plate axes, read off
    one draw's traces of the guide and of the model replaying it."""

    def __init__(self, guide_trace, model_trace, plate):
        self.latent = {k: s for k, s in _sample_sites(guide_trace) if not s["is_observed"]
                       and not s["infer"].get("is_auxiliary")}
        self.observed = {k: s for k, s in _sample_sites(model_trace) if s["is_observed"]}
        every = {**self.latent, **self.observed}
        self.shapes = {k: tuple(s["value"].shape) for k, s in every.items()}
        self.batch_shapes = {k: tuple(s["fn"].batch_shape) for k, s in self.observed.items()}
        self.dims = {k: _dims(k, s) for k, s in every.items()}
        self.axes = {k: _axis(s, plate) for k, s in every.items()}

    def globals_of(self, guide_trace):
        """The latent sites outside the subsampling plate, as a trace to replay."""
        fixed = Trace()
        for k in self.latent:
            if self.axes[k] is None:
                fixed.add_node(k, **guide_trace.nodes[k])
        return fixed

    def draws(self, latent, log_lik, predictive, fixed):
        numpy = {k: {s: v.cpu().numpy() for s, v in group.items()} for k, group in
                 (("latent", latent), ("log_lik", log_lik), ("predictive", predictive))}
        observed = {k: s["value"].cpu().numpy() for k, s in self.observed.items()}
        return Draws(numpy["latent"], numpy["log_lik"], numpy["predictive"], observed, self.dims, self.axes, fixed)


def _all_at_once(model, guide, data, kwargs, num_samples, nesting, fixed, layout):
    """All draws in one trace of each, under an outer plate left of the model's plates."""
    draws = pyro.plate("_draws", num_samples, dim=-nesting - 1)
    guide_trace = poutine.trace(draws(guide if fixed is None else poutine.replay(guide, trace=fixed))).get_trace(*data, **kwargs)
    model_trace = poutine.trace(poutine.replay(draws(model), trace=guide_trace)).get_trace(*data, **kwargs)

    def each(value, shape):  # (S, 1, ..., *shape) with the plate's broadcast dims -> (S, *shape)
        if value.numel() != num_samples * torch.Size(shape).numel():
            raise ValueError(f"a site has shape {tuple(value.shape)} with all draws, {shape} with one")
        return value.reshape((num_samples,) + shape)

    nodes = model_trace.nodes
    return layout.draws(
        {k: each(guide_trace.nodes[k]["value"], layout.shapes[k]) for k in layout.latent},
        {k: each(nodes[k]["fn"].log_prob(nodes[k]["value"]), layout.batch_shapes[k]) for k in layout.observed},
        {k: each(nodes[k]["fn"].sample(), layout.shapes[k]) for k in layout.observed},
        fixed if fixed is not None else layout.globals_of(guide_trace),
    )


def _one_at_a_time(model, guide, data, kwargs, num_samples, fixed, layout):
    latent, log_lik, predictive, globals_ = [], [], [], []
    for s in range(num_samples):
        guide_trace, model_trace = _traces(model, guide if fixed is None else poutine.replay(guide, trace=fixed[s]),
                                           data, kwargs)
        nodes = model_trace.nodes
        latent.append({k: guide_trace.nodes[k]["value"] for k in layout.latent})
        log_lik.append({k: nodes[k]["fn"].log_prob(nodes[k]["value"]) for k in layout.observed})
        predictive.append({k: nodes[k]["fn"].sample() for k in layout.observed})
        globals_.append(layout.globals_of(guide_trace))
    stack = lambda group: {k: torch.stack([d[k] for d in group]) for k in (group[0] if group else {})}
    return layout.draws(stack(latent), stack(log_lik), stack(predictive), fixed if fixed is not None else globals_)


def _traces(model, guide, data, kwargs):
    guide_trace = poutine.trace(guide).get_trace(*data, **kwargs)
    return guide_trace, poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*data, **kwargs)


@contextlib.contextmanager
def _replaying(params, seed):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.random.fork_rng())
        torch.manual_seed(seed)
        if params is not None:  # a user model need not use every fitted parameter
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=".*did not find params", category=UserWarning)
            stack.enter_context(poutine.substitute(data=params))
        yield


def _sample_sites(trace):
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site) or isinstance(site["fn"], dist.Unit):
            continue  # plates' index sites and factors (such as the KL term) are not observations
        yield name, site


def _axis(site, plate):
    dims = [f.dim for f in site["cond_indep_stack"] if plate is not None and f.name == plate[0]]
    return plate_axis(tuple(site["value"].shape), site["fn"].event_dim, dims[0] if dims else None)


def _dims(name, site):
    plates = [(f.name, f.dim) for f in site["cond_indep_stack"] if f.vectorized]
    return site_dims(name, tuple(site["value"].shape), site["fn"].event_dim, plates)


to_inference_data = make_to_inference_data(
    _draw, (GPModel, CoxProcess), __name__, ppl="Pyro", package="pyro_sparsegp",
    seed=" (the global RNG is left as it was)", without="the current values are used",
    parallel="draw all at once under an outer plate where the model allows (else, with a warning, one "
             "trace per draw); False draws one at a time.",
)
