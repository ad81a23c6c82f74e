"""Parameter handling: ``Parameterized`` modules whose parameters live in Pyro's param store.

Every library object with learnable quantities is a :class:`pyro.nn.PyroModule`; its parameters
are named ``<module name>.<attribute>`` (for instance ``gp.kernel.lengthscale``), exactly like
the parameter sites of the NumPyro backend. The classes of the core (``sparsegp_common``) become
Pyro modules by :func:`adapt`.
"""
import functools
import warnings

import pyro
import pyro.distributions
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints

from sparsegp_common import adapt as _adapt

from . import checks, sites
from .sites import active  # noqa: F401  (importable from here, as before)

CONSTRAINTS = {"real": constraints.real, "positive": constraints.positive, "lower_cholesky": constraints.lower_cholesky}


class Parameterized(_adapt.Adapted, PyroModule):
    """A :class:`~pyro.nn.PyroModule` with a helper to declare constrained parameters."""

    _adapted = {}  # core class -> Pyro class, filled by adapt()
    _checks, _sites, _dist = checks, sites, pyro.distributions

    def __init__(self, name=""):
        super().__init__(name)
        if name and any(key.startswith(name + ".") for key in pyro.get_param_store().keys()):
            warnings.warn(
                f"Pyro's param store already holds parameters named '{name}.*' (from an earlier "
                f"model?); they will replace this new module's values. Call "
                "pyro.clear_param_store() first, or give the module another name.",
                stacklevel=3,
            )

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
