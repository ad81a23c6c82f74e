"""Prediction from any GP prior component (documented in :mod:`sparsegp_common.prediction`)."""
import contextlib

import torch
from pyro import poutine

from sparsegp_common import prediction as core
from sparsegp_common.prediction import Prediction

from . import checks
from .sites import active

__all__ = ["Prediction", "predict_f", "predict_y", "sample_f"]


@contextlib.contextmanager
def _evaluating(module, params, seed=None):
    """``module`` active, without autograd graph, with optional parameter values and a local RNG seed."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if params is not None:  # only the module's own: substitute warns about names it does not see
            own = {k: v for k, v in params.items() if k.startswith(module.name + ".")}
            stack.enter_context(poutine.substitute(data=own))
        stack.enter_context(active(module))
        if seed is not None:
            stack.enter_context(torch.random.fork_rng())  # the global RNG is left as it was
            torch.manual_seed(seed)
        yield


def _batches(X, batch_size):
    batch_size = checks.positive_int(batch_size, "batch_size")
    return [X[i : i + batch_size] for i in range(0, X.shape[0], batch_size)]


def predict_f(prior, X, *, full_cov=False, batch_size=4096, params=None):
    X = checks.inputs(X, "X", prior.input_dim)
    with _evaluating(prior, params):
        posterior = prior.posterior()
        if full_cov:
            return posterior.marginals(X, full_cov=True)
        parts = [posterior.marginals(Xb) for Xb in _batches(X, batch_size)]
    return torch.cat([m for m, _ in parts]), torch.cat([v for _, v in parts])


def predict_y(prior, likelihood, X, *, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
    levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
    mean, var = predict_f(prior, X, batch_size=batch_size, params=params)
    with _evaluating(likelihood, params, seed):
        moments = [likelihood.predictive_moments(m, v) for m, v in zip(mean.split(batch_size), var.split(batch_size))]
        q = None
        if levels is not None:
            q = torch.cat([
                likelihood.predictive_quantiles(m, v, torch.as_tensor(levels, dtype=m.dtype), num_samples)
                for m, v in zip(mean.split(batch_size), var.split(batch_size))
            ], dim=-1)
    return Prediction(torch.cat([a for a, _ in moments]), torch.cat([b for _, b in moments]), q)


def sample_f(prior, X, num_samples=1, *, seed=0, jitter=1e-6, params=None):
    num_samples = checks.positive_int(num_samples, "num_samples")
    mean, cov = predict_f(prior, X, full_cov=True, params=params)
    key = torch.Generator(mean.device).manual_seed(seed)  # a local generator: the global RNG is left as it was
    return core.joint_draws(mean, cov, num_samples, key, jitter)


predict_f.__doc__, predict_y.__doc__, sample_f.__doc__ = core.PREDICT_F, core.PREDICT_Y, core.SAMPLE_F
