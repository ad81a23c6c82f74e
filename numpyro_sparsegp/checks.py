"""Input validation: clear ``TypeError``/``ValueError`` messages that name the argument.

Value checks run with NumPy on concrete arrays (inside ``jax.jit`` they run once, at trace time,
on arrays closed over); traced values get only the shape checks.
"""

import jax
import jax.numpy as jnp
import numpy as np

from sparsegp_common.checks import ArrayChecks, one_of, positive_int, probabilities  # noqa: F401  (re-exported)


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


finite, positive, inputs, observations, integer_valued, require = ArrayChecks(as_array, all_true, host).functions()
