"""Argument checks that need no array library (shared by both backends' ``checks`` modules)."""
import math
import numbers


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
