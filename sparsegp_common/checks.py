"""Argument checks shared by both backends' ``checks`` modules: plain-Python ones, and the
array checks written once over each backend's primitives (:class:`ArrayChecks`)."""
import math
import numbers

import numpy as np

from sparsegp_common.ops import namespace


def positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def nonnegative_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def nonnegative_float(value, name):
    """A finite number at least 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return float(value)


def positive_float(value, name):
    """A finite number above 0, as a float."""
    if nonnegative_float(value, name) == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


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


def check_model_data(model, data):
    """Check ``data`` whole, once, where ``model`` is a method of an object that checks its data
    (``check_data(*data)``, e.g. ``GPModel``): what ``fit`` does before its first step."""
    check = getattr(getattr(model, "__self__", None), "check_data", None)
    if check is not None:
        check(*data)


class ArrayChecks:
    """The value checks of the backends, written once over three primitives each backend gives:
    ``as_array(value, name, like=None)`` (a floating array, dtype and device of ``like``),
    ``all_true(predicate, array)`` (a Python bool; NumPyro answers True for traced values, whose
    checks ran on the concrete arrays they came from) and ``host(array)`` (a NumPy copy, for
    messages). A backend's ``checks`` module exports :meth:`functions`."""

    def __init__(self, as_array, all_true, host):
        self.as_array, self.all_true, self.host = as_array, all_true, host

    def functions(self):
        """``finite, positive, inputs, observations, integer_valued, require`` over this backend's
        primitives."""
        return self.finite, self.positive, self.inputs, self.observations, self.integer_valued, self.require

    def require(self, predicate, array, name, message):
        """``array`` (named ``name``) where ``predicate`` holds everywhere, else ``ValueError(message)``
        naming the first entry where it fails."""
        if not self.all_true(predicate, array):
            values = self.host(array)
            index = tuple(int(i) for i in np.argwhere(~np.asarray(predicate(values)))[0])
            entry = f"{name}[{', '.join(map(str, index))}]" if index else name
            raise ValueError(f"{message}: {entry} = {values[index].item()!r}")
        return array

    def finite(self, array, name):
        return self.require(lambda a: namespace(a).isfinite(a), array, name, f"{name} contains NaN or inf")

    def positive(self, value, name, like=None):
        """A hyperparameter that must be strictly positive (and finite)."""
        array = self.finite(self.as_array(value, name, like), name)
        if not self.all_true(lambda a: a > 0, array):
            raise ValueError(f"{name} must be positive, got {self.host(array)}")
        return array

    def inputs(self, X, name="X", input_dim=None, values=True, like=None):
        """Inputs as an (N, D) array, in the dtype (and device) of ``like``, a parameter of the
        model, when given; 1-D inputs are read as (N, 1); NaN/inf is an error unless
        ``values=False`` (shape only: the caller checks the rows it uses)."""
        X = self.as_array(X, name, like)
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
    def observations(y, n, name="y", other="X"):
        """``y`` of shape ``(n,)``: one value per row of ``other``."""
        if y.ndim != 1:
            raise ValueError(f"{name} must have shape (N,), one value per row of {other}, got {tuple(y.shape)}")
        if y.shape[0] != n:
            raise ValueError(f"{name} has length {y.shape[0]} but {other} has {n} rows")
        return y

    def integer_valued(self, y, name):
        return self.require(lambda a: a == namespace(a).round(a), y, name, f"{name} must hold integers")
