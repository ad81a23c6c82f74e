"""Prediction (``predict_f``, ``predict_y``, ``sample_f``, written once in
:mod:`sparsegp_common.inference.prediction`); Pyro evaluates inside the module's parameter context, without
an autograd graph."""
import contextlib
import warnings

import torch
from pyro import poutine

from sparsegp_common.inference.prediction import ComponentState, Prediction, make_predictions

from . import checks
from .sites import active

__all__ = ["ComponentState", "Prediction", "inspect", "predict_f", "predict_y", "sample_f"]


@contextlib.contextmanager
def _evaluating(module, params, seed=None):
    """``module`` active, without autograd graph, with optional parameter values and a local RNG seed."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if params is not None:  # only the module's own: substitute warns about names it does not see
            own = {k: v for k, v in params.items() if k.startswith(module.name + ".")}
            stack.enter_context(warnings.catch_warnings())  # nor of those a part leaves unread (part="gp")
            warnings.filterwarnings("ignore", message="pyro.module .* did not find params", category=UserWarning)
            stack.enter_context(poutine.substitute(data=own))
        stack.enter_context(active(module))
        if seed is not None:
            stack.enter_context(torch.random.fork_rng())  # the global RNG is left as it was
            torch.manual_seed(seed)
        yield


def _moments(prior, X, full_cov, batch_size, params, part="f"):
    with _evaluating(prior, params):
        posterior = prior.posterior(part)
        if full_cov:
            return posterior.marginals(X, full_cov=True)
        parts = [posterior.marginals(Xb) for Xb in X.split(batch_size)]
    return torch.cat([m for m, _ in parts]), torch.cat([v for _, v in parts])


def _predictive(prior, likelihood, X, levels, batch_size, num_samples, seed, params):
    mean, var = _moments(prior, X, False, batch_size, params)
    with _evaluating(likelihood, params, seed):
        batches = list(zip(mean.split(batch_size), var.split(batch_size)))
        moments = [likelihood.predictive_moments(m, v) for m, v in batches]
        q = None if levels is None else torch.cat([
            likelihood.predictive_quantiles(m, v, torch.as_tensor(levels, dtype=m.dtype), num_samples) for m, v in batches
        ], dim=-1)
    return torch.cat([a for a, _ in moments]), torch.cat([b for _, b in moments]), q


def _key(seed, like):
    return torch.Generator(like.device).manual_seed(seed)  # a local generator: the global RNG is left as it was


def _evaluate(prior, params, fn):
    with poutine.trace(param_only=True) as capture, _evaluating(prior, params):
        result = fn(prior)
        for module in prior.modules():  # every parameter, also those ``fn`` did not need
            for name in [*getattr(module, "_pyro_params", ()), *dict(module.named_parameters(recurse=False))]:
                if not name.endswith("_unconstrained"):
                    getattr(module, name)
    # copies: an unconstrained parameter's value is the tensor the optimiser updates in place
    return result, {name: site["value"].detach().clone() for name, site in capture.trace.nodes.items()}


predict_f, predict_y, sample_f, inspect = make_predictions(_moments, _predictive, _key, _evaluate, checks, __name__)
