"""Parameter handling: ``Parameterized`` objects whose parameters are ``numpyro.param`` sites.

An unbound object holds initial values. ``bind()`` returns a copy whose parameters are the
current values of the sites ``<name>.<attribute>`` (for instance ``gp.kernel.lengthscale``),
registering them when run under NumPyro's handlers, exactly like the Pyro backend's names.
Children that are themselves ``Parameterized`` are bound under ``<name>.<attribute>``.
"""
import copy

import jax.numpy as jnp
import numpyro
from numpyro.distributions import constraints


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


class Parameterized:
    """Base class with named, constrained parameters (see the module docstring)."""

    def __init__(self, name=""):
        self._name = name
        self._constraints = {}
        self._bound = False

    def _param(self, name, value, constraint=constraints.real):
        self._constraints[name] = constraint
        setattr(self, name, value)

    @property
    def name(self):
        return self._name

    def first_parameter(self):
        """A parameter whose dtype the rest of a model follows."""
        if self._constraints:
            return jnp.asarray(getattr(self, next(iter(self._constraints))))
        return next(iter(self._children().values())).first_parameter()

    def _children(self):
        return {k: v for k, v in vars(self).items() if isinstance(v, Parameterized)}

    def bind(self, prefix=None):
        """The object with its parameters read from ``numpyro.param`` sites."""
        if self._bound:
            return self
        prefix = self._name if prefix is None else prefix
        new = copy.copy(self)
        for name, constraint in self._constraints.items():
            setattr(new, name, numpyro.param(_join(prefix, name), getattr(self, name), constraint=constraint))
        for name, child in self._children().items():
            setattr(new, name, child.bind(_join(prefix, name)))
        new._bound = True
        return new

    def to(self, dtype):
        """Cast the initial parameter values (recursively) to ``dtype``; returns self."""
        for name in self._constraints:
            setattr(self, name, jnp.asarray(getattr(self, name), dtype=dtype))
        for child in self._children().values():
            child.to(dtype)
        return self
