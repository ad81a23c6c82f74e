"""ArviZ export (``to_inference_data``, written once in :mod:`sparsegp_common.diagnostics`); Pyro
draws by tracing the guide and replaying the model once per draw."""
import contextlib
import warnings
from collections import defaultdict

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from sparsegp_common.diagnostics import make_to_inference_data, site_dims
from sparsegp_common.nystrom import trace_floor

from .cox import CoxProcess
from .models import GPModel

__all__ = ["to_inference_data", "trace_floor"]


def _draw(model, guide, data, num_samples, seed, params, kwargs):
    posterior, predictive, log_lik = defaultdict(list), defaultdict(list), defaultdict(list)
    observed, dims = {}, {}
    with _replaying(params, seed):
        for _ in range(num_samples):
            guide_trace = poutine.trace(guide).get_trace(*data, **kwargs)
            replayed = poutine.replay(model, trace=guide_trace)
            model_trace = poutine.trace(replayed).get_trace(*data, **kwargs)
            sampled = poutine.trace(poutine.uncondition(replayed)).get_trace(*data, **kwargs)
            for name, site in _sample_sites(guide_trace, observed=False):
                posterior[name].append(site["value"])
                dims.setdefault(name, _dims(name, site))
            for name, site in _sample_sites(model_trace, observed=True):
                log_lik[name].append(site["fn"].log_prob(site["value"]))
                predictive[name].append(sampled.nodes[name]["value"])
                observed[name] = site["value"].cpu().numpy()
                dims.setdefault(name, _dims(name, site))
    return _stack(posterior), _stack(predictive), _stack(log_lik), observed, dims


def _stack(group):
    return {k: torch.stack(v).cpu().numpy() for k, v in group.items()}


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


def _sample_sites(trace, observed):
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site) or isinstance(site["fn"], dist.Unit):
            continue  # plates' index sites and factors (such as the KL term) are not observations
        if bool(site["is_observed"]) == observed:
            yield name, site


def _dims(name, site):
    plates = [(f.name, f.dim) for f in site["cond_indep_stack"] if f.vectorized]
    return site_dims(name, tuple(site["value"].shape), site["fn"].event_dim, plates)


to_inference_data = make_to_inference_data(
    _draw, (GPModel, CoxProcess), __name__, ppl="Pyro", package="pyro_sparsegp",
    seed=" (the global RNG is left as it was)", without="the current values are used",
)
