"""``compiled(fn, *args)``: eager calls of the library's formulas as one compiled program.

JAX runs eager code one operation at a time, compiling each operation (shape and dtype) the first
time it meets it: the first eager call of an SVGP's formulas (``SVI.init`` runs the model and the
guide eagerly; so does the export's first run of a guide) compiled some hundred small programs,
seconds before a user's first step. Here the arguments (the library's objects, arrays, numbers) are
taken apart into their arrays and a hashable description of everything else, and ``fn`` runs as
one ``jax.jit`` program of the arrays, cached per ``(fn, description)``: components built alike
share it, as eager operations share theirs. Under a trace (``jit``, ``grad``, ``vmap``) ``fn``
simply runs inside it; code that needs concrete values to decide (a user's subclass, say) runs
eagerly, as before.
"""
import jax
import jax.numpy as jnp

_OURS = ("sparsegp_common", "numpyro_sparsegp")
_VALUES = (type(None), bool, int, float, complex, str, bytes)
_MAX_PROGRAMS = 256
_programs = {}  # (fn, description) -> jitted program, or None where fn cannot be traced
_NEW = object()
_NEEDS_VALUES = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError)


def compiled(fn, *args):
    """``fn(*args)``; compiled as one program where every array among ``args`` is concrete.

    ``fn`` must be a pure function of its arguments returning arrays (or pytrees of them, such as
    NumPyro distributions). A non-finite result runs ``fn`` again eagerly, so that the errors of
    eager code (a failed Cholesky factorisation, with its advice) are raised as before.
    """
    leaves = []
    spec = _flatten(args, leaves)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves) or _staged():
        return fn(*args)
    key = (fn, spec)
    program = _programs.get(key, _NEW)
    if program is _NEW:
        if len(_programs) >= _MAX_PROGRAMS:
            _programs.clear()
        program = _programs[key] = jax.jit(lambda leaves: _with_check(fn(*_unflatten(spec, iter(leaves)))))
    if program is None:
        return fn(*args)
    # jit keys its programs on whether each array is committed to its device as well: the same rows
    # drawn with a committed key (fit's set-up) or not (the export's first run) would compile twice
    leaves = [x if x.committed else jax.device_put(x, x.sharding) for x in leaves]
    try:
        out, finite = program(leaves)
    except _NEEDS_VALUES:  # code that reads values to decide (a user's class, say): eager, as before
        _programs[key] = None
        return fn(*args)
    return out if finite else fn(*args)


def _staged():
    """Whether JAX stages operations out here (under ``jit``: new arrays are tracers)."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def _with_check(out):
    """``out`` and whether its floating-point arrays are all finite."""
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(out)
             if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return out, jnp.all(jnp.stack(flags)) if flags else True


class _Leaf:
    """An array's place in a description."""

    def __eq__(self, other):
        return isinstance(other, _Leaf)

    def __hash__(self):
        return 0


_LEAF = _Leaf()


class _Static:
    """A value kept as it is: numbers and strings compared by value, anything else by identity."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _key(self):
        value = self.value
        return (type(value), value) if type(value) in _VALUES else (id(value),)

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


def _ours(obj):
    return any(cls.__module__.split(".")[0] in _OURS for cls in type(obj).__mro__[:-1])


def _flatten(obj, leaves, path=()):
    """A hashable description of ``obj``, its JAX arrays appended to ``leaves`` (``path``: the
    ids of the objects above it; an object met again below itself is kept as it is)."""
    if isinstance(obj, jax.Array):
        leaves.append(obj)
        return _LEAF
    if id(obj) in path:
        return _Static(obj)
    path = path + (id(obj),)
    if type(obj) in (tuple, list):
        return (type(obj), tuple(_flatten(x, leaves, path) for x in obj))
    if type(obj) is dict:
        return (dict, tuple((k, _flatten(v, leaves, path)) for k, v in obj.items()))
    if _ours(obj) and hasattr(obj, "__dict__") and not isinstance(obj, type):
        return (object, type(obj), tuple((k, _flatten(v, leaves, path)) for k, v in vars(obj).items()))
    return _Static(obj)


def _unflatten(spec, leaves):
    if spec is _LEAF:
        return next(leaves)
    if isinstance(spec, _Static):
        return spec.value
    if spec[0] is object:
        obj = object.__new__(spec[1])
        obj.__dict__.update((k, _unflatten(v, leaves)) for k, v in spec[2])
        return obj
    if spec[0] is dict:
        return {k: _unflatten(v, leaves) for k, v in spec[1]}
    return spec[0](_unflatten(x, leaves) for x in spec[1])
