"""Deep basis kernels (the formulas and models are :mod:`sparsegp_common.dbk`), with the basis
networks as equinox modules, whose weights are the parameters ``<name>.net.<path>`` when the
component is bound (``gp.net.hidden.0.weight``: the names and shapes of the Pyro backend).
"""
import contextlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpyro
from numpyro import handlers

from sparsegp_common import dbk as common
from sparsegp_common.dbk import SVDBKPosterior, correction, lowrank_lml, trace_penalty, weight_posterior

from . import checks, predict
from .params import Parameterized, _join, adapt
from .priors import GPPrior

__all__ = ["MLP", "ResNet", "ExactDBK", "SVDBK", "SVDBKPosterior", "correction", "lowrank_lml", "trace_penalty",
           "weight_posterior"]


# ---------------------------------------------------------------- networks


def _linear(a, b, key, dtype):
    return eqx.nn.Linear(a, b, key=key, dtype=dtype)


def _rows(fn, X):
    """Apply a per-example equinox function to ``(N, D)`` rows (or one ``(D,)`` row)."""
    return jax.vmap(fn)(X) if X.ndim == 2 else fn(X)


class MLP(eqx.Module):
    __doc__ = common.MLP_DOC.format(default_dtype="JAX's default float",
                                    seed="seeds equinox's default initialisation (None: 0)",
                                    single_row=" (a single ``(D,)`` row to ``(r,)``)")

    hidden: list
    head: eqx.nn.Linear
    input_dim: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        keys = jax.random.split(jax.random.PRNGKey(0 if seed is None else seed), depth + 1)
        sizes = [self.input_dim] + [hidden] * depth
        self.hidden = [_linear(a, b, k, dtype) for a, b, k in zip(sizes[:-1], sizes[1:], keys[:-1])]
        self.head = _linear(hidden, self.rank, keys[-1], dtype)

    def _one(self, x):
        h = x
        for layer in self.hidden:
            h = jnp.tanh(layer(h))
        return self.head(h)

    def __call__(self, X):
        return _rows(self._one, X)


class ResNet(eqx.Module):
    __doc__ = common.RESNET_DOC

    input: eqx.nn.Linear
    blocks: list
    head: eqx.nn.Linear
    input_dim: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        keys = jax.random.split(jax.random.PRNGKey(0 if seed is None else seed), depth + 2)
        self.input = _linear(self.input_dim, hidden, keys[0], dtype)
        self.blocks = [_linear(hidden, hidden, k, dtype) for k in keys[1:-1]]
        self.head = _linear(hidden, self.rank, keys[-1], dtype)

    def _one(self, x):
        h = self.input(x)
        for block in self.blocks:
            h = h + jnp.tanh(block(h))
        return self.head(h)

    def __call__(self, X):
        return _rows(self._one, X)


def _map_weights(net, fn):
    """``net`` with each weight ``w`` replaced by ``fn(path, w)``, ``path`` as torch names it
    (``hidden.0.weight``)."""
    weights, static = eqx.partition(net, eqx.is_inexact_array)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(weights)
    new = [fn(".".join(_key_name(k) for k in path), w) for path, w in leaves]
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, new), static)


def _key_name(key):
    for attr in ("name", "idx", "key"):  # GetAttrKey, SequenceKey, DictKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


# ---------------------------------------------------------------- models


class _DeepBasis(common._DeepBasis, Parameterized):
    """The NumPyro hooks of :class:`sparsegp_common.dbk._DeepBasis`."""

    _ppl = numpyro
    _as_array = staticmethod(checks.as_array)

    @staticmethod
    def _register(net):
        if not isinstance(net, eqx.Module):
            raise TypeError(f"net must be an equinox Module, got {type(net).__name__}")
        common.check_basis_net(net)
        return net

    @staticmethod
    def _net_like(net):
        return jax.tree_util.tree_leaves(eqx.filter(net, eqx.is_inexact_array))[0]

    def bind(self, prefix=None):
        """Also registers each weight of the network as a parameter ``<prefix>.net.<path>``
        (``gp.net.hidden.0.weight``: the names and shapes the Pyro backend gives a torch network),
        its initial value outside any handler, as for every other parameter."""
        if self._bound:
            return self
        new = super().bind(prefix)
        net = _join(self.name if prefix is None else prefix, "net")
        new.net = _map_weights(self.net, lambda path, w: numpyro.param(f"{net}.{path}", w))
        return new

    def _assign(self, prefix, params):
        super()._assign(prefix, params)
        net = _join(prefix, "net")
        self.net = _map_weights(self.net, lambda path, w: params.get(f"{net}.{path}", w))

    @contextlib.contextmanager
    def _reading(self):
        yield self.bind()

    def _evaluate(self, fn, params):
        def run(values):
            with handlers.substitute(data=values):
                return fn(self.bind())

        return jax.jit(run)(params or {})

    def _map_rows(self, fn, X, batch_size, params, *extra):
        def run(Xb, batch, values, *extra):
            with handlers.substitute(data=values):
                return fn(self.bind(), Xb, *extra)

        return predict._map_batches(run, X, batch_size, params or {}, *extra)


ExactDBK, SVDBK = adapt((common.ExactDBK, common.SVDBK), module=__name__)
