"""Parameter handling: ``Parameterized`` modules that own their parameters.

Every library object with learnable quantities is a :class:`pyro.nn.PyroModule`; its parameters
are named ``<module name>.<attribute>`` (for instance ``gp.kernel.lengthscale``), exactly like
the parameter sites of the NumPyro backend. Each module holds its own values and Pyro's global
param store mirrors them under their names (see :class:`Owned`), so
``pyro.get_param_store().save``/``load`` keep a trained GP. The classes of the core
(``sparsegp_common``) become Pyro modules by :func:`adapt`.
"""
import functools
import weakref

import pyro
import pyro.distributions
import torch
from pyro.nn import PyroModule, PyroParam
from pyro.poutine.runtime import _PYRO_STACK
from torch.distributions import constraints

from sparsegp_common import adapt as _adapt

from . import checks, sites
from .sites import active  # noqa: F401  (importable from here, as before)

CONSTRAINTS = {"real": constraints.real, "positive": constraints.positive, "lower_cholesky": constraints.lower_cholesky}

# name -> weak references to (the module, its tensor, the outermost handler of that read) of the
# library's last entry in the store under the name
_PUT = {}
_NOBODY = (lambda: None, lambda: None, lambda: None)


class Owned:
    """A :class:`~pyro.nn.PyroModule` mixin: the module owns its parameters (``PyroParam`` values and
    the plain ``nn.Parameter`` values of converted networks) and Pyro's global param store mirrors them.

    A read inside the module's context is a ``pyro.param`` site of the store, so
    ``poutine.trace``/``substitute``, SVI, autoguides, ``fit`` and ``pyro.get_param_store()``
    (``save``, ``load``, ``named_parameters``) see it. Before that read the store's entry is made
    the module's own tensor: put there when missing or put by another module of this library
    (the store follows the module last used under a name; no module takes another's values, as
    Pyro's shared names would), copied into the module when it came from elsewhere (``load``,
    ``pyro.param``), and a clear error when two modules with one name are read by one model run."""

    def __getattr__(self, name):
        pyro_params = self.__dict__.get("_pyro_params")
        if pyro_params is not None and name in pyro_params:
            if self._pyro_context.active:
                return _read(self, name, name + "_unconstrained", *pyro_params[name])
        elif name in self.__dict__.get("_parameters", ()) and self._pyro_context.active:
            return _read(self, name, name, constraints.real, None)
        return super().__getattr__(name)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if (name in self.__dict__.get("_pyro_params", ()) or name in self.__dict__.get("_parameters", ())) \
                and self._pyro_context.active:
            self._pyro_context.cache.pop(self._pyro_get_fullname(name), None)  # a new value: read it again


def _read(module, name, attribute, constraint, event_dim):
    """One ``param`` site per parameter and module context: later reads in the same context (a
    model or guide call, a prediction) return the same value."""
    fullname = module._pyro_get_fullname(name)
    cache = module._pyro_context.cache
    value = cache.get(fullname)
    if value is None:
        own = module._parameters[attribute]
        store = pyro.get_param_store()
        if store._params.get(fullname) is not own:
            _settle(store, module, fullname, own, constraint)
        value = cache[fullname] = pyro.param(fullname, constraint=constraint, event_dim=event_dim)
    return value


def _settle(store, module, fullname, own, constraint):
    """Make ``own`` (``module``'s tensor) the store's entry ``fullname``."""
    held = store._params.get(fullname)
    run = _PYRO_STACK[0] if _PYRO_STACK else None  # the outermost handler: one model run
    if held is not None:
        owner, tensor, put_in = _PUT.get(fullname, _NOBODY)
        if tensor() is not held:  # loaded, or set outside this library: the module takes the value
            _take(fullname, own, held)
        elif run is not None and put_in() is run and owner() not in (None, module):
            raise ValueError(
                f"two components named {fullname.split('.')[0]!r} in one model both read {fullname!r}: "
                f"give each its own name (name=...)")
        store._param_to_name.pop(held, None)
    store._params[fullname] = own
    store._param_to_name[own] = fullname
    store._constraints[fullname] = constraint
    _PUT[fullname] = (weakref.ref(module), weakref.ref(own), _NOBODY[0] if run is None else weakref.ref(run))


def _take(fullname, own, held):
    if held.shape != own.shape:
        raise ValueError(
            f"Pyro's param store holds {fullname!r} with shape {tuple(held.shape)}, but this component's has "
            f"shape {tuple(own.shape)}: build the component as the one whose parameters were saved, or call "
            f"pyro.clear_param_store() before building it")
    with torch.no_grad():
        own.copy_(held)  # in place: an optimiser that holds ``own`` keeps training it


def owned(module):
    """Give every submodule of a PyroModule (a network converted by ``to_pyro_module_``) the
    reads of :class:`Owned`, in place."""
    for m in module.modules():
        if not isinstance(m, Owned):
            m.__class__ = _owned_class(type(m))
    return module


@functools.cache
def _owned_class(cls):
    return type(cls.__name__, (Owned, cls), {})


class Parameterized(_adapt.Adapted, Owned, PyroModule):
    """A :class:`~pyro.nn.PyroModule` that owns its parameters (:class:`Owned`), with a
    helper to declare constrained parameters."""

    _adapted = {}  # core class -> Pyro class, filled by adapt()
    _checks, _sites, _dist = checks, sites, pyro.distributions

    def __init__(self, name=""):  # PyroModule's, with the signature of NumPyro's Parameterized
        super().__init__(name)

    def _param(self, name, value, constraint=constraints.real):
        setattr(self, name, PyroParam(value, constraint=CONSTRAINTS[constraint] if isinstance(constraint, str) else constraint))

    def _follow(self, like):
        """Move every parameter to the dtype and device of ``like``."""
        self.to(dtype=like.dtype, device=like.device)

    @property
    def name(self):
        return self._pyro_name

    def first_parameter(self):
        """A parameter whose dtype and device the rest of a model follows."""
        return next(self.parameters())


adapt = functools.partial(_adapt.adapt, base=Parameterized)
