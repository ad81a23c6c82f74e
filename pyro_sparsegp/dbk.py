"""Deep basis kernels (the formulas and models are :mod:`sparsegp_common.dbk`), with the basis
networks as ``torch.nn`` modules; the moments run through the blocked float64 op of
:mod:`sparsegp_common.ops._torch`.
"""
import contextlib

import pyro
import torch
from pyro.nn.module import PyroParam, to_pyro_module_

from sparsegp_common import dbk as common
from sparsegp_common.dbk import SVDBKPosterior, correction, lowrank_lml, trace_penalty, weight_posterior

from . import checks, predict
from .params import Parameterized, adapt
from .priors import GPPrior

__all__ = ["MLP", "ResNet", "ExactDBK", "SVDBK", "SVDBKPosterior", "correction", "lowrank_lml", "trace_penalty",
           "weight_posterior"]


# ---------------------------------------------------------------- networks


@contextlib.contextmanager
def _seeded(seed):
    """Torch's default initialisation, from ``seed`` when given (the global RNG is left as it was)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


class MLP(torch.nn.Module):
    __doc__ = common.MLP_DOC.format(default_dtype="torch's default", seed="seeds the (torch default) initialisation",
                                    single_row="")

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        super().__init__()
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        sizes = [self.input_dim] + [hidden] * depth
        with _seeded(seed):
            self.hidden = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=dtype) for a, b in zip(sizes[:-1], sizes[1:]))
            self.head = torch.nn.Linear(hidden, self.rank, dtype=dtype)

    def forward(self, X):
        h = X
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return self.head(h)


class ResNet(torch.nn.Module):
    __doc__ = common.RESNET_DOC

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        super().__init__()
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        with _seeded(seed):
            self.input = torch.nn.Linear(self.input_dim, hidden, dtype=dtype)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, dtype=dtype) for _ in range(depth))
            self.head = torch.nn.Linear(hidden, self.rank, dtype=dtype)

    def forward(self, X):
        h = self.input(X)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h)


# ---------------------------------------------------------------- models


class _DeepBasis(common._DeepBasis, Parameterized):
    """The Pyro hooks of :class:`sparsegp_common.dbk._DeepBasis`."""

    _ppl = pyro
    _as_array = staticmethod(checks.as_tensor)

    @staticmethod
    def _register(net):
        """Check the network and convert it in place to a PyroModule whose weights are PyroParams:
        read through ``pyro.param`` like every other parameter, so ``params=`` (``poutine.substitute``)
        reaches them (a plain ``nn.Parameter`` is registered but always read from the module)."""
        if not isinstance(net, torch.nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        common.check_basis_net(net)
        to_pyro_module_(net)
        for module in net.modules():
            for name, weight in list(module.named_parameters(recurse=False)):
                setattr(module, name, PyroParam(weight.detach().clone()))
        return net

    @staticmethod
    def _net_like(net):
        return next(net.parameters())

    @contextlib.contextmanager
    def _reading(self):
        with self._pyro_context:  # as pyro_method does
            yield self

    def _evaluate(self, fn, params):
        with predict._evaluating(self, params):
            return fn(self)

    def _map_rows(self, fn, X, batch_size, params, *extra):
        if params is not None:  # only the features': substitute warns about names it does not use
            params = {k: v for k, v in params.items() if k.startswith(f"{self.name}.net.") or k == f"{self.name}.variance"}
        batch_size = checks.positive_int(batch_size, "batch_size")
        with predict._evaluating(self, params):
            parts = [fn(self, Xb, *extra) for Xb in X.split(batch_size)]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(p) for p in zip(*parts))
        return torch.cat(parts)


ExactDBK, SVDBK = adapt((common.ExactDBK, common.SVDBK), module=__name__)
