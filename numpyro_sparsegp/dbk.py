"""Deep basis kernels for NumPyro (written once in :mod:`sparsegp_common.priors.dbk`): the networks as
equinox modules, whose weights are the parameters ``<name>.net.<path>`` when the component is
bound (``gp.net.hidden.0.weight``: the names and shapes of the Pyro backend); calibration and
prediction compile once per shape.
"""
import functools

import equinox as eqx
import jax
import numpyro
from numpyro import handlers

from sparsegp_common.features.networks import network_classes
from sparsegp_common.priors import dbk as common
from sparsegp_common.priors.dbk import ExactDBKPosterior, SVDBKPosterior, correction, lowrank_lml, trace_penalty, weight_posterior

from . import checks, predict
from .params import Parameterized, _join, adapt
from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)

__all__ = common.NAMES


# ---------------------------------------------------------------- networks


class _Network(eqx.Module):
    input_dim: int = eqx.field(static=True, init=False)  # set by the core's __init__
    rank: int = eqx.field(static=True, init=False)
    _sequence = list

    @staticmethod
    def _linears(sizes, dtype, seed):
        keys = jax.random.split(jax.random.PRNGKey(0 if seed is None else seed), len(sizes))
        return [eqx.nn.Linear(a, b, key=key, dtype=dtype) for (a, b), key in zip(sizes, keys)]

    def __call__(self, X):
        """Rows ``(N, D)`` (or one ``(D,)`` row): equinox layers take one example."""
        return jax.vmap(self._forward)(X) if X.ndim == 2 else self._forward(X)


MLP, ResNet = network_classes(_Network, __name__)


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


@functools.partial(jax.jit, static_argnums=(1, 2))
def _call(values, fn, obj, *args):
    with handlers.substitute(data=values):
        return fn(obj.bind(), *args)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _rows(Xb, batch, values, fn, obj, *extra):
    return _call(values, fn, obj, Xb, *extra)


class _DeepBasis(common._DeepBasis, Parameterized):
    """The NumPyro hooks of :class:`sparsegp_common.priors.dbk._DeepBasis`."""

    _network = (eqx.Module, "an equinox Module")
    _as_array = staticmethod(checks.as_array)

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

    def _parameter_values(self, params):
        return predict._values(params, self)

    def _map_rows(self, fn, X, batch_size, params, *extra):
        values = predict._values(params, self)
        if batch_size is None:
            return _call(values, fn, self, X, *extra)
        return predict._map_batches(_rows, X, batch_size, values, fn, self, *extra)


class CalibratedSVDBK(common.CalibratedSVDBK):
    def bind(self):
        # M is read like a parameter value, so it is an argument of the compiled predictions (not
        # part of their static key): one program serves every calibration of the prior.
        return type(self)(self.prior.bind(), numpyro.param(f"{self.name}.max_sq_norm", self.max_sq_norm))

    def __eq__(self, other):
        return type(other) is type(self) and other.prior is self.prior

    def __hash__(self):
        return hash((type(self), id(self.prior)))


ExactDBK, SVDBK = adapt((common.ExactDBK, common.SVDBK), module=__name__)
Parameterized._adapted[common.CalibratedSVDBK] = CalibratedSVDBK  # what the core's SVDBK.calibrate builds
