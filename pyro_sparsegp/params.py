"""Parameter handling: ``Parameterized`` modules that own their parameters.

Every library object with learnable quantities is a :class:`pyro.nn.PyroModule`; its parameters
are named ``<module name>.<attribute>`` (for instance ``gp.kernel.lengthscale``), exactly like
the parameter sites of the NumPyro backend. Their values live in the module, never in Pyro's
global param store (see :class:`ModuleLocal`). The classes of the core (``sparsegp_common``)
become Pyro modules by :func:`adapt`.
"""
import functools

import pyro
import pyro.distributions
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints

from sparsegp_common import adapt as _adapt

from . import checks, sites
from .sites import active  # noqa: F401  (importable from here, as before)

CONSTRAINTS = {"real": constraints.real, "positive": constraints.positive, "lower_cholesky": constraints.lower_cholesky}


class ModuleLocal:
    """A :class:`~pyro.nn.PyroModule` mixin: its ``PyroParam`` reads take Pyro's
    ``module_local_params`` path whatever the user's global setting. Each read is still a ``param``
    message, so ``poutine.trace``/``substitute``, SVI (which optimises ``value.unconstrained()``)
    and autoguides see it, but the value is the module's own: the global param store neither
    holds it nor overrides it, so two modules with the same name keep their own values."""

    def __getattr__(self, name):
        if name in self.__dict__.get("_pyro_params", ()) and self._pyro_context.active:
            with pyro.settings.context(module_local_params=True):  # only for this read
                return super().__getattr__(name)
        return super().__getattr__(name)


def module_local(module):
    """Give every submodule of a PyroModule (a network converted by ``to_pyro_module_``) the
    reads of :class:`ModuleLocal`, in place."""
    for m in module.modules():
        if not isinstance(m, ModuleLocal):
            m.__class__ = _local_class(type(m))
    return module


@functools.cache
def _local_class(cls):
    return type(cls.__name__, (ModuleLocal, cls), {})


class Parameterized(_adapt.Adapted, ModuleLocal, PyroModule):
    """A :class:`~pyro.nn.PyroModule` that owns its parameters (:class:`ModuleLocal`), with a
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
