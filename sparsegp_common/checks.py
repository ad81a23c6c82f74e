"""Argument checks shared by both backends' ``checks`` modules: plain-Python ones, and the
array checks written once over each backend's primitives (:class:`ArrayChecks`)."""
import math
import numbers

from .ops import namespace


def positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def one_of(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def probabilities(values, name):
    """A non-empty sequence of levels strictly between 0 and 1, as a tuple of floats."""
    try:
        levels = tuple(float(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of numbers in (0, 1), got {values!r}") from None
    if not levels or not all(0 < v < 1 and math.isfinite(v) for v in levels):
        raise ValueError(f"{name} must hold numbers strictly between 0 and 1, got {values!r}")
    return levels


class ArrayChecks:
    """The value checks of the backends, written once over three primitives each backend gives:
    ``as_array(value, name, like=None)`` (a floating array, dtype and device of ``like``),
    ``all_true(predicate, array)`` (a Python bool; NumPyro answers True for traced values, whose
    checks ran on the concrete arrays they came from) and ``host(array)`` (a NumPy copy, for
    messages). A backend's ``checks`` module exports :meth:`functions`."""

    def __init__(self, as_array, all_true, host):
        self.as_array, self.all_true, self.host = as_array, all_true, host

    def functions(self):
        """``finite, positive, inputs, same_length, integer_valued`` over this backend's primitives."""
        return self.finite, self.positive, self.inputs, self.same_length, self.integer_valued

    def finite(self, array, name):
        if not self.all_true(lambda a: namespace(a).isfinite(a), array):
            raise ValueError(f"{name} contains NaN or inf")
        return array

    def positive(self, value, name, like=None):
        """A hyperparameter that must be strictly positive (and finite)."""
        array = self.finite(self.as_array(value, name, like), name)
        if not self.all_true(lambda a: a > 0, array):
            raise ValueError(f"{name} must be positive, got {self.host(array)}")
        return array

    def inputs(self, X, name="X", input_dim=None, values=True):
        """Inputs as an (N, D) array; 1-D inputs are read as (N, 1); NaN/inf is an error
        unless ``values=False`` (shape only: the caller checks the rows it uses)."""
        X = self.as_array(X, name)
        if values:
            self.finite(X, name)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2:
            raise ValueError(f"{name} must have shape (N, D), got {tuple(X.shape)}")
        if input_dim is not None and X.shape[-1] != input_dim:
            raise ValueError(f"{name} has {X.shape[-1]} input dimensions but the model expects {input_dim}")
        return X

    @staticmethod
    def same_length(y, n, name="y", other="X"):
        if y.shape[0] != n:
            raise ValueError(f"{name} has length {y.shape[0]} but {other} has {n} rows")
        return y

    def integer_valued(self, y, name):
        if not self.all_true(lambda a: a == namespace(a).round(a), y):
            raise ValueError(f"{name} must hold integers")
        return y
