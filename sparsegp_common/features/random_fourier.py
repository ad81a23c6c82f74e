"""Random Fourier features whose frequencies are recomputed from ``(seed, index)`` (Rahimi and
Recht, 2007), so that a basis of ``m = 10^7`` functions never stores an ``m x D`` table: the
weight-space basis of the quadruply stochastic estimator (Evans and Nair, 2020, Sec. 2.1; see
:mod:`sparsegp_common.objectives.quadruply_stochastic`).

``phi_i(x) = sqrt(2 variance / m) cos(omega_i^T x + b_i)`` with ``omega_i = Omega_i / lengthscale``,
``Omega_i`` drawn from the kernel's normalised spectral density (standard normal for the squared
exponential, a multivariate Student t with ``2 nu`` degrees of freedom for Matern-nu) and ``b_i``
uniform on ``[0, 2 pi)``; the weights' prior is ``N(0, I)`` (``S = I``, whitened), so that
``E[phi(x)^T phi(z)] = k(x, z)`` and a weight's scale does not depend on ``m`` or the
hyperparameters (which optimisers with per-entry steps such as AdaGrad need).

The draws come from a counter-based generator: a 32-bit integer hash of ``(seed, index, stream)``
written with int32 arithmetic that wraps the same way in NumPy, torch and JAX (also without
``jax_enable_x64``), so every backend computes the same frequencies.
"""
import math
from numbers import Integral

from sparsegp_common.features.weight_basis import WeightBasis
from sparsegp_common.kernels import Matern, SquaredExponential
from sparsegp_common.ops import backend, device, namespace

__all__ = ["RandomFourierBasis", "counter_normal", "counter_uniform"]

_MIX = (-1640531535, 1013904223, 668265263)  # odd multipliers (as int32) for seed, index and stream


def _shift(x, bits):
    """Logical right shift of int32 values (``>>`` on signed integers copies the sign bit)."""
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def _wrap(value):
    """A Python integer as the int32 it wraps to."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def _hash(seed, index, streams, xp):
    """One hash per entry of ``index`` and per stream: ``(*index.shape, len(streams))``, one set of
    operations whatever the number of streams (a compiled step holds one, not one per stream)."""
    # "lowbias32" finaliser (C. Wellons, hash-prospector) over a linear mix of the three counters
    offset = xp.asarray([_wrap(seed * _MIX[0] + s * _MIX[2]) for s in streams], dtype=xp.int32, device=device(index))
    x = xp.astype(index, xp.int32)[..., None] * _MIX[1] + offset
    x = x ^ _shift(x, 16)
    x = x * 2146121005  # 0x7feb352d
    x = x ^ _shift(x, 15)
    x = x * -2073254261  # 0x846ca68b
    return x ^ _shift(x, 16)


def _streams(draw, seed, index, stream, dtype):
    """``draw(seed, index, streams, dtype, xp)`` for one stream (an integer: ``index``'s shape) or
    several (a sequence of S integers: ``(*index.shape, S)``)."""
    single = isinstance(stream, Integral)
    draws = draw(seed, index, [int(stream)] if single else [int(s) for s in stream], dtype, namespace(index))
    return draws[..., 0] if single else draws


def _uniforms(seed, index, streams, dtype, xp):
    return (xp.astype(_shift(_hash(seed, index, streams, xp), 8), dtype) + 0.5) / 16777216.0


def _normal_streams(streams):
    """The uniform streams whose Box-Muller pairs give the normal ``streams``: ``2 s`` and ``2 s + 1``."""
    return [2 * s + k for k in (0, 1) for s in streams]


def _box_muller(u, xp):
    """Normals from uniforms laid out as :func:`_normal_streams` lays out their streams."""
    half = u.shape[-1] // 2
    return xp.sqrt(-2.0 * xp.log(u[..., :half])) * backend(u).cos(2 * math.pi * u[..., half:])


def _normals(seed, index, streams, dtype, xp):
    return _box_muller(_uniforms(seed, index, _normal_streams(streams), dtype, xp), xp)


def counter_uniform(seed, index, stream, dtype):
    """Uniform draws on ``(0, 1)`` (24 random bits), one per entry of the integer array ``index``
    and per ``stream`` (an integer, or a sequence of S integers: then ``(*index.shape, S)``), the
    same for the same ``(seed, index, stream)`` in every backend."""
    return _streams(_uniforms, seed, index, stream, dtype)


def counter_normal(seed, index, stream, dtype):
    """Standard normal draws (Box-Muller on the uniform streams ``2 stream`` and ``2 stream + 1``),
    shaped as :func:`counter_uniform`'s."""
    return _streams(_normals, seed, index, stream, dtype)


class RandomFourierBasis(WeightBasis):
    """``m`` random Fourier features of a stationary ``kernel`` (squared exponential or Matern)
    on ``input_dim``-dimensional inputs, read by index.

    Args:
        kernel: a :class:`~sparsegp_common.kernels.SquaredExponential` or
            :class:`~sparsegp_common.kernels.Matern` kernel (its lengthscale and variance are read
            at every call, so they can be learnt).
        num_features: ``m``.
        input_dim: ``D``.
        seed: an integer naming the frequencies.
    """

    diagonal_prior = True

    def __init__(self, kernel, num_features, input_dim, seed=0):
        if isinstance(kernel, SquaredExponential):
            self.degrees = None
        elif isinstance(kernel, Matern):
            self.degrees = int(round(2 * kernel.nu))
        else:
            raise TypeError(f"random Fourier features need a squared exponential or Matern kernel, got {type(kernel).__name__}")
        if int(num_features) < 1 or int(input_dim) < 1:
            raise ValueError(f"num_features and input_dim must be positive, got {num_features} and {input_dim}")
        self.kernel, self.num_features, self.input_dim, self.seed = kernel, int(num_features), int(input_dim), int(seed)

    def frequencies(self, I, dtype):
        """``(Omega_I, b_I)``: the frequencies ``(len(I), D)`` before the lengthscale, from the
        normalised spectral density (normal streams ``1..D``, and ``D + 1..D + 2 nu`` for a
        Matern's chi-squared), and the phases ``(len(I),)`` (uniform stream 0), from one hash
        (a compiled step holds one set of its operations per call, not one per kind of draw)."""
        xp, D = namespace(I), self.input_dim
        u = _uniforms(self.seed, I, [0] + _normal_streams(range(1, 1 + D + (self.degrees or 0))), dtype, xp)
        normals = _box_muller(u[..., 1:], xp)
        omega, phase = normals[..., :D], 2 * math.pi * u[..., 0]
        if self.degrees is None:
            return omega, phase
        chi2 = xp.sum(normals[..., D:] ** 2, axis=-1)
        return omega * xp.sqrt(self.degrees / chi2)[:, None], phase

    def features(self, X, I):
        """``Phi[:, I]`` at the rows ``X`` ``(n, D)``: ``(n, len(I))``."""
        xp = namespace(X)
        if X.shape[-1] != self.input_dim:
            raise ValueError(f"X has {X.shape[-1]} columns but the basis has input_dim={self.input_dim}")
        lengthscale, variance = self._lengthscale_and_variance()
        omega, phase = self.frequencies(I, X.dtype)
        return xp.sqrt(2.0 * variance / self.num_features) * backend(X).cos(X @ (omega / lengthscale).mT + phase)

    def prior_diagonal(self, I):
        """``S_ii = 1`` for ``i`` in ``I`` (whitened weights)."""
        variance = self._lengthscale_and_variance()[1]
        return namespace(variance).ones(tuple(I.shape), dtype=variance.dtype, device=device(variance))
