"""ArviZ export of a model fitted by SVI: ``to_inference_data``."""
import contextlib
import warnings
from collections import defaultdict

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

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
        model: a Pyro model, or a :class:`~pyro_sparsegp.GPModel` (then ``guide`` is None and its
            :meth:`~pyro_sparsegp.GPModel.sampled_model` pair is used, whose ``<name>.f`` draws
            come from the marginals ``q(f_n)``: all per-observation diagnostics need), or a
            :class:`~pyro_sparsegp.CoxProcess` (its sampled pair likewise).
        guide: the guide fitted with ``model``.
        data: tuple of arguments of the model and guide (all observations, e.g. ``(X, y)``).
        num_samples: number of draws, split into ``num_chains`` chains of independent draws so
            that ArviZ's per-chain diagnostics run (``r_hat`` is 1 up to noise by construction).
        seed: seed of the draws (the global RNG is left as it was).
        result: the :class:`~pyro_sparsegp.FitResult` of training: its ``params`` are used and its
            losses become ``sample_stats.elbo``; without it the param store is used.
        **kwargs: passed to the model and guide.
    """
    model, guide = model_guide_pair(model, guide, (GPModel, CoxProcess))
    num_chains, _ = draws_layout(num_samples, num_chains)
    posterior, predictive, log_lik = defaultdict(list), defaultdict(list), defaultdict(list)
    observed, dims = {}, {}
    with _replaying(result, seed):
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
                observed[name] = site["value"]
                dims.setdefault(name, _dims(name, site))
    if not log_lik:
        raise ValueError("the model has no observed sites: pass the observations in data")
    return inference_data(
        _stack(posterior), _stack(predictive), _stack(log_lik), {k: v.cpu().numpy() for k, v in observed.items()},
        dims, num_chains, None if result is None else result.losses,
    )


def _stack(group):
    return {k: torch.stack(v).cpu().numpy() for k, v in group.items()}


@contextlib.contextmanager
def _replaying(result, seed):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.random.fork_rng())
        torch.manual_seed(seed)
        if result is not None:  # a user model need not use every fitted parameter
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=".*did not find params", category=UserWarning)
            stack.enter_context(poutine.substitute(data=result.params))
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
