"""Input validation: clear ``TypeError``/``ValueError`` messages that name the argument.

Value checks run with NumPy on concrete arrays (inside ``jax.jit`` they run once, at trace time,
on arrays closed over); traced values get only the shape checks.
"""

import jax
import jax.numpy as jnp
import numpy as np

from sparsegp_common.checks import one_of, positive_int, probabilities  # noqa: F401  (re-exported)


def concrete(x):
    return not isinstance(x, jax.core.Tracer)


def all_true(predicate, array):
    """``predicate(values).all()`` evaluated with NumPy, or True for traced values."""
    return not concrete(array) or bool(np.all(predicate(np.asarray(array))))


def as_array(value, name, like=None):
    """Convert an array-like to a floating array (dtype of ``like`` when given)."""
    try:
        array = jnp.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array-like of numbers, got {type(value).__name__}") from e
    if array.dtype == jnp.bool_ or jnp.issubdtype(array.dtype, jnp.complexfloating):
        raise TypeError(f"{name} must be real-valued, got dtype {array.dtype}")
    if like is not None:
        return array.astype(like.dtype)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))
    return array


def host(array):
    """A concrete ``array`` as a NumPy array."""
    return np.asarray(array)


def finite(array, name):
    if not all_true(np.isfinite, array):
        raise ValueError(f"{name} contains NaN or inf")
    return array


def positive(value, name, like=None):
    """A hyperparameter that must be strictly positive (and finite)."""
    array = finite(as_array(value, name, like), name)
    if not all_true(lambda a: a > 0, array):
        raise ValueError(f"{name} must be positive, got {np.asarray(array)}")
    return array


def inputs(X, name="X", input_dim=None, values=True):
    """Inputs as an (N, D) array; 1-D inputs are read as (N, 1); NaN/inf is an error
    unless ``values=False`` (shape only: the caller checks the rows it uses)."""
    X = as_array(X, name)
    if values:
        finite(X, name)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{name} must have shape (N, D), got {tuple(X.shape)}")
    if input_dim is not None and X.shape[-1] != input_dim:
        raise ValueError(f"{name} has {X.shape[-1]} input dimensions but the model expects {input_dim}")
    return X


def same_length(y, n, name="y", other="X"):
    if y.shape[0] != n:
        raise ValueError(f"{name} has length {y.shape[0]} but {other} has {n} rows")
    return y


def integer_valued(y, name):
    if not all_true(lambda a: a == np.round(a), y):
        raise ValueError(f"{name} must hold integers")
    return y
