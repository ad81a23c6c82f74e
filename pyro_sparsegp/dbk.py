"""Deep basis kernels for Pyro (written once in :mod:`sparsegp_common.priors.dbk`): the networks as
``torch.nn`` modules, whose weights become PyroParams; the moments run through the blocked
float64 op of :mod:`sparsegp_common.ops._torch`.
"""
import torch
from pyro import poutine
from pyro.nn.module import PyroParam, to_pyro_module_

from sparsegp_common.features.networks import network_classes
from sparsegp_common.priors import dbk as common
from sparsegp_common.priors.dbk import ExactDBKPosterior, SVDBKPosterior, correction, lowrank_lml, trace_penalty, weight_posterior

from . import checks, predict
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)
from .params import Parameterized, adapt, owned

__all__ = common.NAMES


# ---------------------------------------------------------------- networks


class _Network(torch.nn.Module):
    _sequence = torch.nn.ModuleList

    @staticmethod
    def _linears(sizes, dtype, seed):
        """Torch's default initialisation, from ``seed`` when given (the global RNG is left as it was)."""
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return [torch.nn.Linear(a, b, dtype=dtype) for a, b in sizes]

    def forward(self, X):
        return self._forward(X)


MLP, ResNet = network_classes(_Network, __name__)


# ---------------------------------------------------------------- models


class _DeepBasis(common._DeepBasis, Parameterized):
    """The Pyro hooks of :class:`sparsegp_common.priors.dbk._DeepBasis`."""

    _network = (torch.nn.Module, "a torch.nn.Module")
    _as_array = staticmethod(checks.as_tensor)

    @staticmethod
    def _register(net):
        """Convert the network in place to a PyroModule whose weights are PyroParams: read through
        ``pyro.param`` like every other parameter, so ``params=`` (``poutine.substitute``) reaches
        them (a plain ``nn.Parameter`` is registered but always read from the module)."""
        to_pyro_module_(net)
        for module in net.modules():
            for name, weight in list(module.named_parameters(recurse=False)):
                setattr(module, name, PyroParam(weight.detach().clone()))
        return owned(net)  # the weights are the module's own, mirrored in the store like every parameter

    @staticmethod
    def _net_like(net):
        return next(net.parameters())

    def _parameter_values(self, params):
        with poutine.trace(param_only=True) as trace, predict._evaluating(self, params):
            dict(self.named_pyro_params())  # reads each parameter through pyro.param
        return {name: site["value"].detach().clone() for name, site in trace.trace.nodes.items()}

    def _map_rows(self, fn, X, batch_size, params, *extra):
        if batch_size is None:
            with predict._evaluating(self, params):
                return fn(self, X, *extra)
        if params is not None:  # only the features': substitute warns about names it does not use
            params = {k: v for k, v in params.items() if k.startswith(f"{self.name}.net.") or k == f"{self.name}.variance"}
        with predict._evaluating(self, params):
            parts = [fn(self, Xb, *extra) for Xb in X.split(batch_size)]
        return tuple(map(torch.cat, zip(*parts))) if isinstance(parts[0], tuple) else torch.cat(parts)


class CalibratedSVDBK(common.CalibratedSVDBK):
    @property
    def _pyro_context(self):  # predict reads the prior's parameters in its module context
        return self.prior._pyro_context


ExactDBK, SVDBK = adapt((common.ExactDBK, common.SVDBK), module=__name__)
Parameterized._adapted[common.CalibratedSVDBK] = CalibratedSVDBK  # what the core's SVDBK.calibrate builds
