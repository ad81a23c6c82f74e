"""Parameter handling: ``Parameterized`` objects whose parameters are ``numpyro.param`` sites.

An unbound object holds initial values. ``bind()`` returns a copy whose parameters are the
current values of the sites ``<name>.<attribute>`` (for instance ``gp.kernel.lengthscale``),
registering them when run under NumPyro's handlers, exactly like the Pyro backend's names.
Children that are themselves ``Parameterized`` are bound under ``<name>.<attribute>``. The
classes of the core (``sparsegp_common``) get this parameter handling by :func:`adapt`.
"""
import contextvars
import copy
import functools

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions
from numpyro.distributions import constraints
from numpyro.distributions.transforms import LowerCholeskyTransform, biject_to

from sparsegp_common import adapt as _adapt

from . import checks, sites


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


class _LowerCholesky(type(constraints.lower_cholesky)):
    """``lower_cholesky`` reached from an unconstrained square matrix (see the transform)."""


class _LowerCholeskyTransform(LowerCholeskyTransform):
    """Square matrix ``x`` -> ``tril(x, -1) + diag(exp(diag(x)))``, the transform torch uses for
    ``lower_cholesky``; the strictly upper triangle of ``x`` is ignored (its gradient is zero)."""

    # NumPyro's own transform packs the M (M + 1) / 2 free entries into a vector and unpacks them
    # by a scatter, which XLA runs serially on CPU (and constant-folds for seconds when compiling
    # at M >= 1024); it also builds the matrix on float64 zeros under jax_enable_x64, which breaks
    # float32 models that factorise Kuu in float64. Masking a square matrix avoids both.
    domain = constraints.real_matrix
    codomain = _LowerCholesky()

    def __call__(self, x):
        return _map_diagonal(x, jnp.exp)

    def _inverse(self, y):
        return _map_diagonal(y, jnp.log)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        return jnp.diagonal(x, axis1=-2, axis2=-1).sum(-1)

    def forward_shape(self, shape):
        return shape

    def inverse_shape(self, shape):
        return shape


@functools.partial(jax.jit, static_argnums=1)  # one program, not eager operations, in SVI.init
def _map_diagonal(x, fn):
    """``x``'s strict lower triangle with ``fn`` of its diagonal on the diagonal."""
    d = fn(jnp.diagonal(x, axis1=-2, axis2=-1))
    return jnp.tril(x, -1) + d[..., None] * jnp.eye(d.shape[-1], dtype=d.dtype)


_lower_cholesky = _LowerCholeskyTransform.codomain
biject_to.register(_LowerCholesky, lambda constraint: _LowerCholeskyTransform())

#: The list that records ``(object, prefix)`` of every ``bind()`` inside ``fit``'s set-up (None
#: elsewhere): a context variable, so that fits in other threads or tasks keep their own.
bind_log = contextvars.ContextVar("bind_log", default=None)


CONSTRAINTS = {"real": constraints.real, "positive": constraints.positive, "lower_cholesky": _lower_cholesky}


class Parameterized(_adapt.Adapted):
    """Base class with named, constrained parameters (see the module docstring)."""

    _adapted = {}  # core class -> NumPyro class, filled by adapt()
    _checks, _sites, _dist = checks, sites, numpyro.distributions

    def __init__(self, name=""):
        self._name = name
        self._constraints = {}
        self._bound = False

    def _param(self, name, value, constraint=constraints.real):
        self._constraints[name] = CONSTRAINTS[constraint] if isinstance(constraint, str) else constraint
        setattr(self, name, value)

    def _follow(self, like):
        """Cast every parameter to the dtype of ``like``."""
        self.to(like.dtype)

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
        log = bind_log.get()
        if log is not None:
            log.append((self, prefix))
        new = copy.copy(self)
        for name, constraint in self._constraints.items():
            setattr(new, name, numpyro.param(_join(prefix, name), getattr(self, name), constraint=constraint))
        for name, child in self._children().items():
            setattr(new, name, child.bind(_join(prefix, name)))
        new._bound = True
        return new

    def _assign(self, prefix, params):
        """Take the values of this object's own sites ``<prefix>.<attribute>`` from ``params``
        (``fit`` writes its final values back this way)."""
        for name in self._constraints:
            key = _join(prefix, name)
            if key in params:
                setattr(self, name, params[key])

    def to(self, dtype):
        """Cast the initial parameter values (recursively) to ``dtype``; returns self."""
        for name in self._constraints:
            setattr(self, name, jnp.asarray(getattr(self, name), dtype=dtype))
        for child in self._children().values():
            child.to(dtype)
        return self


adapt = functools.partial(_adapt.adapt, base=Parameterized)
