"""Variational orthogonal features (Burt, Rasmussen & van der Wilk, 2020, "Variational orthogonal
features"), written once for every backend.

Inter-domain features ``u_m = int g_m(x) f(x) dx`` built from functions ``psi_m`` that are
orthonormal in the frequency domain, so that ``Kuu = I`` for any stationary kernel with a spectral
density ``s`` and the prior is ``u ~ N(0, I)`` (no Cholesky of ``Kuu``). In the real (Hartley) form,
with ``cas(t) = cos(t) + sin(t)``::

    Kuf[m](x) = (2 pi)^(-D/4) int sqrt(s(w)) psi_m(w) cas(w . x) dw.

* :class:`HermiteFeatures`: scaled Hermite functions for the squared-exponential kernel, where
  ``Kuf`` has a closed form (they are the kernel's eigenfunction features for a Gaussian input
  density of standard deviation ``sigma_x``, the parameter); tensor products in D dimensions.
* :class:`FourierFeatures` and :class:`LegendreFeatures`: the orthonormal Fourier basis
  (``M = 2K + 1``) and normalised Legendre polynomials on the box ``[-a, a]^D`` (``a`` learnable),
  for any stationary kernel. ``Kuf`` is an integral: by Gauss-Legendre quadrature for prediction,
  and estimated without bias from two independent randomised grids of ``num_samples`` frequencies
  in training (:func:`sparsegp_common.objectives.vof_model.estimated_moments`), never forming ``Kuf``.

Randomness has one contract: a ``key`` is resolved by the backend (``sites.key``: Pyro
passes torch's global RNG on as None, NumPyro takes ``numpyro.prng_key()`` when none is given),
split by ``backend(...).split`` and consumed by ``backend(...).uniform`` (stateful torch/NumPy
generators serve each draw in turn, JAX keys are split), so each backend draws exactly what it
drew before. Integer multi-indices and quadrature nodes are NumPy constants, converted to the
device of the arrays they meet.
"""
import math

import numpy as np

from sparsegp_common import ops
from sparsegp_common.features import orthogonal_basis as common
from sparsegp_common.features import Features, Kuf, Kuu
from sparsegp_common.kernels import Kernel, SquaredExponential
from sparsegp_common.ops import backend, device, namespace


def _lengthscale(kernel, D):
    ls = kernel.lengthscale
    return namespace(ls).broadcast_to(ls, (D,)) if ls.ndim == 1 else ls


def _unbatched(kernel):
    variance = getattr(kernel, "variance", None)  # sums of kernels have none of their own
    if variance is not None and len(getattr(variance, "shape", ())) != 0:
        raise ValueError("variational orthogonal features need a kernel without batch dimensions")
    return kernel


def _product(out, table, indices, factor=None):
    """``out * prod_d factor[:, d] table[:, d, indices[:, d]]`` ``(N, M)`` for a table ``(N, D, degree + 1)``."""
    xp = namespace(table)
    idx = xp.asarray(indices, device=device(table))
    for d in range(idx.shape[1]):
        term = table[:, d, idx[:, d]]  # integer-array indexing (torch, JAX and NumPy have it)
        out = out * term if factor is None else out * factor[:, d, None] * term
    return out


def _numbers(values):
    """A ``(D,)`` array's values as float64 NumPy (one read from its device, no gradient)."""
    return np.array([float(v) for v in backend(values).stop_gradient(values)], dtype=np.float64)


class OrthogonalFeatures(Features):
    """Features indexed by the multi-indices ``indices`` ``(M, D)`` of a tensor-product basis."""

    @property
    def num_inducing(self):
        return self.indices.shape[0]

    @property
    def input_dim(self):
        return self.indices.shape[1]

    def _vector(self, value, name, input_dim):
        """A positive ``(D,)`` initial value from a scalar or a vector."""
        value = self._checks.positive(value, name)
        xp = namespace(value)
        value = xp.reshape(value, (-1,))
        if value.shape[0] == 1 and input_dim is not None:
            value = xp.broadcast_to(value, (input_dim,))
        if input_dim is not None and value.shape[0] != input_dim:
            raise ValueError(f"{name} has {value.shape[0]} entries but input_dim is {input_dim}")
        return xp.asarray(value, copy=True)


class HermiteFeatures(OrthogonalFeatures):
    """Hermite-function features of the squared-exponential kernel, closed-form ``Kuf``.

    In 1-D, with ``R_+- = r^2 +- l^2 / 2``, ``rho = R_- / R_+`` and ``z = r x / sqrt(R_- R_+)``::

        Kuf[m](x) = 2^(1/4) sqrt(v l r) R_+^(-1/2) rho^(m/2) exp(-x^2 / (2 R_+)) h_m(z),

    ``h_m`` the normalised Hermite polynomials (stable three-term recurrence). The scale ``r`` is
    parametrised by the implied input-density standard deviation ``sigma_x``:
    ``r^2 = (l / 2) sqrt(4 sigma_x^2 + l^2)``, so the constraint ``2 r^2 > l^2`` always holds. In
    D dimensions the features are tensor products (ARD lengthscales); the ``num_features``
    multi-indices with the largest eigenvalue products are chosen once, at construction, from
    the initial ``sigma_x`` and the lengthscales of ``kernel``. The recurrence runs on the
    enveloped values (bounded, by Bessel's inequality), which underflow to 0 only for
    ``x^2 > 2 R_+ * 87`` in float32 (a conservative ``Kuf``); standardise the inputs.

    The parameter stays on the device of ``sigma_x``; only the D initial values are read (as
    numbers) to choose the multi-indices.

    Args:
        num_features: M.
        sigma_x: initial input-density standard deviation, scalar or ``(D,)`` (learnable).
        input_dim: D when ``sigma_x`` is a scalar (default 1).
        kernel: the ``SquaredExponential`` kernel whose lengthscales rank the multi-indices
            (default: unit lengthscales).
    """

    def __init__(self, num_features, sigma_x=1.0, *, input_dim=None, kernel=None):
        super().__init__()
        if input_dim is not None:
            input_dim = self._checks.positive_int(input_dim, "input_dim")
        sigma_x = self._vector(sigma_x, "sigma_x", input_dim)
        D = sigma_x.shape[0]
        ls = np.ones(D) if kernel is None else _numbers(_lengthscale(kernel, D))
        sx = _numbers(sigma_x)
        log_rho = 2 * np.log(2 * sx / (np.sqrt(4 * sx**2 + ls**2) + ls))
        self.indices = common.multi_indices(num_features, -log_rho)
        self._param("sigma_x", sigma_x, "positive")


def hermite_kuf(sigma_x, lengthscale, variance, indices, X):
    """Closed-form ``Kuf`` of tensor-product Hermite features: ``(M, N)``.

    Args:
        sigma_x, lengthscale: ``(D,)``; variance: scalar; indices: int ``(M, D)``; X: ``(N, D)``.
    """
    xp, ops = namespace(X, sigma_x), backend(X, sigma_x)
    s = xp.sqrt(4 * sigma_x**2 + lengthscale**2)
    R_plus = 0.5 * lengthscale * (s + lengthscale)
    rho = (2 * sigma_x / (s + lengthscale)) ** 2  # R_- / R_+, without the cancellation in R_-
    r = xp.sqrt(0.5 * lengthscale * s)
    z = r * X / (lengthscale * sigma_x)  # R_- R_+ = l^2 sigma_x^2
    degree = int(indices.max())
    # t_m = rho^(m/2) h_m(z) exp(-x^2 / 2R_+) (bounded: Kuf up to a constant), by
    # t_{m+1} = sqrt(2 rho / (m+1)) z t_m - sqrt(m / (m+1)) rho t_{m-1}
    envelope, sqrt_rho = xp.exp(-(X**2) / (2 * R_plus)), xp.sqrt(rho)
    m = np.arange(1, degree)
    table = ops.recurrence(
        lambda prev, cur, c, d: c * sqrt_rho * z * cur - d * rho * prev,
        envelope, math.sqrt(2) * sqrt_rho * z * envelope, (np.sqrt(2 / (m + 1)), np.sqrt(m / (m + 1))), degree + 1,
    )  # (N, D, degree + 1)
    factor = xp.broadcast_to(2**0.25 * xp.sqrt(lengthscale * r / R_plus), tuple(X.shape))  # (N, D)
    out = xp.sqrt(variance) * xp.ones((X.shape[0], indices.shape[0]), dtype=X.dtype, device=device(X))
    return _product(out, table, indices, factor).mT


@Kuu.register(HermiteFeatures, Kernel)
def _kuu_hermite(features, kernel):
    return None


@Kuf.register(HermiteFeatures, SquaredExponential)
def _kuf_hermite(features, kernel, X):
    kernel = _unbatched(kernel)
    return hermite_kuf(features.sigma_x, _lengthscale(kernel, features.input_dim), kernel.variance, features.indices, X)


@Kuf.register(HermiteFeatures, Kernel)
def _kuf_hermite_other(features, kernel, X):
    raise TypeError(f"HermiteFeatures have a closed form for the SquaredExponential kernel only, got "
                    f"{type(kernel).__name__}; use FourierFeatures or LegendreFeatures for other kernels")


class SpectralFeatures(OrthogonalFeatures):
    """Features from an orthonormal basis on the frequency box ``[-a, a]^D`` (band-limited).

    Subclasses set ``basis`` (``"fourier"`` or ``"legendre"``). In D > 1 the basis is a tensor
    product truncated to the ``num_features`` multi-indices of smallest total degree.

    Args:
        num_features: M (odd for 1-D Fourier features: ``2K + 1``).
        a: initial half-width of the box, scalar or ``(D,)`` (learnable).
        input_dim: D when ``a`` is a scalar (default 1).
        num_samples: T, frequencies per independent set in the Monte Carlo estimators.
        num_quadrature: Gauss-Legendre nodes per dimension of the deterministic ``Kuf``
            (prediction; ``Q^D`` nodes in all); the integrand oscillates about
            ``K + a |x| / pi`` times over the box.
        design: ``"grid"`` (randomised grid: one uniform shift of a regular T-point grid per
            dimension, dimensions paired by random permutations; each frequency is uniform on the
            box) or ``"iid"`` (independent uniform frequencies).
    """

    basis = None

    def __init__(self, num_features, a=10.0, *, input_dim=None, num_samples=50, num_quadrature=256, design="grid"):
        super().__init__()
        if input_dim is not None:
            input_dim = self._checks.positive_int(input_dim, "input_dim")
        a = self._vector(a, "a", input_dim)
        _, self.num_samples, self.num_quadrature, self.design = common.check_mc_options(
            self.basis, num_samples, num_quadrature, design)
        num_features = common.check_num_features(num_features, self.basis, a.shape[0])
        self.indices = common.multi_indices(num_features, [1.0] * a.shape[0], self.basis)
        self._param("a", a, "positive")

    def basis_functions(self, omega):
        """``psi_m(omega)`` for frequencies ``omega`` ``(T, D)`` inside the box: ``(T, M)``."""
        xp, ops, dev = namespace(omega, self.a), backend(omega, self.a), device(omega)
        t = omega / self.a  # in [-1, 1]
        degree = int(self.indices.max())
        if self.basis == "fourier":
            j = np.arange(degree + 1)
            frequency = xp.asarray(math.pi * ((j + 1) // 2), dtype=omega.dtype, device=dev)
            arg = frequency * t[..., None]  # (T, D, degree + 1)
            table = xp.where(xp.asarray(j % 2 == 1, device=dev), ops.cos(arg), ops.sin(arg))
            table = xp.where(xp.asarray(j == 0, device=dev), math.sqrt(0.5), table)
        else:  # normalised Legendre polynomials sqrt((2m + 1) / 2) P_m(t), by their three-term recurrence
            m = np.arange(1, degree)
            table = ops.recurrence(
                lambda prev, cur, c, d: c * t * cur - d * prev,
                xp.full_like(t, math.sqrt(0.5)), math.sqrt(1.5) * t,
                (np.sqrt((2 * m + 1) * (2 * m + 3)) / (m + 1), m / (m + 1) * np.sqrt((2 * m + 3) / (2 * m - 1))),
                degree + 1,
            )
        out = xp.ones((omega.shape[0], self.indices.shape[0]), dtype=omega.dtype, device=dev)
        return _product(out, table / xp.sqrt(self.a)[:, None], self.indices)

    def frequencies(self, key, dtype, device=None):
        """One set of T frequencies ``(T, D)``, each uniform on the box, reparameterised in ``a``
        (``omega = a (2 u - 1)`` with ``u`` uniform draws from ``key``), and their weights
        ``prod(2 a) / T`` (the inverse proposal density over T)."""
        xp, ops = namespace(self.a), backend(self.a)
        T, D = self.num_samples, self.input_dim
        key_shift, key_perm = ops.split(key, 2)
        if self.design == "iid":
            u = ops.uniform(key_shift, (T, D), dtype, device)
        else:
            ranks = xp.broadcast_to(xp.arange(T, dtype=dtype, device=device)[:, None], (T, D))
            if D > 1:  # pair the dimensions' grids at random: each point stays uniform on the box
                ranks = xp.astype(xp.argsort(ops.uniform(key_perm, (T, D), None, device), axis=0), dtype)
            u = (ranks + ops.uniform(key_shift, (D,), dtype, device)) / T
        a = xp.astype(self.a, dtype)
        return a * (2 * u - 1), xp.prod(2 * a) / T * xp.ones(T, dtype=dtype, device=device)

    def draw_frequencies(self, key=None, dtype=None, device=None):
        """:meth:`frequencies` from ``key`` (Pyro: None, torch's global RNG; NumPyro: a PRNG key, by
        default ``numpyro.prng_key()``), in ``dtype`` on ``device`` (default: those of ``a``)."""
        where = ops.device(self.a) if device is None else device
        return self.frequencies(self._sites.key(key), self.a.dtype if dtype is None else dtype, where)

    def quadrature(self):
        """Gauss-Legendre nodes ``(Q^D, D)`` on the box and their weights ``(Q^D,)``."""
        xp, dev = namespace(self.a), device(self.a)
        nodes, weights = common.legendre_nodes(self.num_quadrature, self.input_dim)
        nodes = xp.asarray(nodes, dtype=self.a.dtype, device=dev)
        weights = xp.asarray(weights, dtype=self.a.dtype, device=dev)
        return self.a * nodes, xp.prod(self.a) * weights


class FourierFeatures(SpectralFeatures):
    """The orthonormal Fourier basis on ``[-a, a]``: ``1 / sqrt(2a)``, ``cos(k pi w / a) / sqrt(a)``,
    ``sin(k pi w / a) / sqrt(a)`` for ``k = 1..K`` (in this order, ``M = 2K + 1``); see
    :class:`SpectralFeatures` for the arguments."""

    basis = "fourier"


class LegendreFeatures(SpectralFeatures):
    """Normalised Legendre polynomials on ``[-a, a]``: ``sqrt((2m + 1) / (2a)) P_m(w / a)``; see
    :class:`SpectralFeatures` for the arguments."""

    basis = "legendre"


def spectral_terms(features, kernel, omega, weights, X):
    """The two factors of ``Kuf^T ~= A Phi`` at frequencies ``omega`` ``(T, D)`` with weights ``(T,)``:
    ``A[n, t] = weights[t] (2 pi)^(-D/4) sqrt(s(omega_t)) cas(omega_t . x_n)`` ``(N, T)`` and
    ``Phi[t, m] = psi_m(omega_t)`` ``(T, M)``."""
    xp, ops = namespace(X, omega), backend(X, omega)
    beta = weights * common.fourth_root_two_pi(features.input_dim) * xp.sqrt(_unbatched(kernel).spectral_density(omega))
    phase = X @ omega.mT
    return beta * (ops.cos(phase) + ops.sin(phase)), features.basis_functions(omega)


@Kuu.register(SpectralFeatures, Kernel)
def _kuu_spectral(features, kernel):
    return None


@Kuf.register(SpectralFeatures, Kernel)
def _kuf_spectral(features, kernel, X):
    """Deterministic Gauss-Legendre ``Kuf`` ``(M, N)`` (biased by the rule's error; used for prediction)."""
    A, Phi = spectral_terms(features, kernel, *features.quadrature(), X)
    return (A @ Phi).mT


CLASSES = (OrthogonalFeatures, HermiteFeatures, SpectralFeatures, FourierFeatures, LegendreFeatures)
