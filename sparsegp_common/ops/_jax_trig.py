"""``cos`` and ``sin`` for the JAX backend: on a CPU in float32, vectorised polynomials.

XLA:CPU evaluates ``cos`` and ``sin`` by a call into the C library per element, about 5 ns each
on the development machine against 1 ns for the polynomial below: a random Fourier feature
matrix of ``500 x 10^4`` took 23 ms against 4.5 ms, and the cosine and sine fusions were most of a
NumPyro quadruply stochastic step (benchmarks/RESULTS.md). Elsewhere (a GPU, float64) JAX's own
functions run.

The argument is reduced to ``r = x - 2 pi k`` in ``[-pi, pi]`` in three parts (Cody and Waite: the
first two have 8 significant bits, so that ``k`` times them and the subtractions are exact for
``|k| < 2^16``, ``|x| < 4 10^5``), folded into
``[0, pi/2]`` (``cos(r) = -cos(pi - |r|)``, ``sin(r) = sign(r) sin(pi - |r|)``), and the Taylor
polynomials of degree 14 (cos) and 13 (sin) are evaluated there, whose truncation errors are
below 1e-9: the results are within a few float32 ulps of the exact values, and below the
argument's own rounding error wherever ``|x|`` exceeds a few units.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax

_TWO_PI = (6.28125, 0.0019378662109375, 2 * math.pi - 6.28125 - 0.0019378662109375)
_PI_HI, _PI_LO = 3.140625, math.pi - 3.140625  # pi_hi - a is exact for a in [pi / 2, pi]
_COS = [(-1) ** n / math.factorial(2 * n) for n in range(1, 8)]
_SIN = [(-1) ** n / math.factorial(2 * n + 1) for n in range(1, 7)]


def _horner(z, coefficients):
    """``1 + c_1 z + c_2 z^2 + ...``."""
    acc = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        acc = c + z * acc
    return 1 + z * acc


def _cos_sin(x):
    k = jnp.round(x * (1 / (2 * math.pi)))
    r = ((x - k * _TWO_PI[0]) - k * _TWO_PI[1]) - k * _TWO_PI[2]
    a = jnp.abs(r)
    folded = a > math.pi / 2
    a = jnp.where(folded, (_PI_HI - a) + _PI_LO, a)
    z = a * a
    c, s = _horner(z, _COS), a * _horner(z, _SIN)
    return jnp.where(folded, -c, c), jnp.where(r < 0, -s, s)


@jax.custom_jvp
def _cos32(x):
    return _cos_sin(x)[0]


@jax.custom_jvp
def _sin32(x):
    return _cos_sin(x)[1]


@_cos32.defjvp
def _cos32_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _cos32(x), -_sin32(x) * dx


@_sin32.defjvp
def _sin32_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _sin32(x), _cos32(x) * dx


def cos(x):
    if x.dtype != jnp.float32:
        return jnp.cos(x)
    return lax.platform_dependent(x, cpu=_cos32, default=jnp.cos)


def sin(x):
    if x.dtype != jnp.float32:
        return jnp.sin(x)
    return lax.platform_dependent(x, cpu=_sin32, default=jnp.sin)
