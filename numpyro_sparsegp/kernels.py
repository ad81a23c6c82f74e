"""Covariance functions.

Shapes: inputs ``X`` (N, D) and ``Z`` (M, D); ``K(X, Z)`` is ``batch_shape + (N, M)`` and
``K_diag(X)`` is ``batch_shape + (N,)``, where ``batch_shape`` is the leading shape of the
hyperparameters (empty for a single kernel, ``(L,)`` for L independent outputs).

Stationary kernels take ``lengthscale`` of shape ``batch_shape + (D,)`` (ARD) or
``batch_shape + (1,)`` (isotropic) and ``variance`` of shape ``batch_shape``; both are kept
positive by NumPyro's ``positive`` constraint (an exp/log transform).

Spectral densities follow one convention (see ``specs/vof.md``, section 1): with
``kappa(tau) = k(x, x + tau)``,

    kappa(tau) = (2 pi)^(-D/2) * integral s(omega) exp(-i omega . tau) d omega,

so ``(2 pi)^(-D/2) * integral s = variance``. For the squared exponential
``s(omega) = variance * prod(l) * exp(-|omega * l|^2 / 2)``.
"""
import math

import jax.numpy as jnp
from numpyro.distributions import constraints

from . import checks
from .params import Parameterized


class Kernel(Parameterized):
    """Base class: ``K``, ``K_diag`` and (where it exists) ``spectral_density``."""

    def K(self, X, Z=None):
        raise NotImplementedError

    def K_diag(self, X):
        raise NotImplementedError

    def K_matvec(self, X, Z, v):
        """``K(X, Z) @ v``: ``v`` is ``batch_shape + (M, K)``, the result ``batch_shape + (N, K)``
        (under ``jit``, XLA fuses the elementwise work on ``K`` into few passes)."""
        return self.K(X, Z) @ v

    def spectral_density(self, omega):
        """Spectral density at frequencies ``omega`` (..., D): shape ``batch_shape + omega.shape[:-1]``."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form spectral density")

    def __call__(self, X, Z=None, diag=False):
        kernel = self.bind()
        return kernel.K_diag(X) if diag else kernel.K(X, Z)

    def __add__(self, other):
        return Sum(self, other)

    def __mul__(self, other):
        return Product(self, other)


class Stationary(Kernel):
    """A kernel ``variance * shape(r)`` of the scaled distance ``r = |(x - z) / lengthscale|``."""

    def __init__(self, lengthscale=1.0, variance=1.0):
        super().__init__()
        lengthscale = jnp.atleast_1d(checks.positive(lengthscale, "lengthscale"))
        variance = checks.positive(variance, "variance", like=lengthscale)
        self._param("lengthscale", lengthscale, constraints.positive)
        self._param("variance", variance, constraints.positive)

    def scaled_sqdist(self, X, Z=None):
        """Squared scaled distances, ``batch_shape + (N, M)``; centred first for accuracy."""
        ls = self.lengthscale[..., None, :]
        shift = X.mean(-2, keepdims=True)
        Xs = (X - shift) / ls
        Zs = Xs if Z is None else (Z - shift) / ls
        r2 = (Xs**2).sum(-1)[..., :, None] + (Zs**2).sum(-1)[..., None, :] - 2 * Xs @ jnp.swapaxes(Zs, -1, -2)
        if Z is None:  # exact zeros on the diagonal: sqrt would amplify the round-off
            r2 = jnp.where(jnp.eye(X.shape[-2], dtype=bool), 0.0, r2)
        return jnp.maximum(r2, 0)

    def shape_fn(self, r2):
        raise NotImplementedError

    def K(self, X, Z=None):
        return self.variance[..., None, None] * self.shape_fn(self.scaled_sqdist(X, Z))

    def K_diag(self, X):
        return jnp.broadcast_to(self.variance[..., None], self.variance.shape + X.shape[-2:-1])

    def _scaled_frequencies(self, omega):
        ls = jnp.broadcast_to(self.lengthscale, self.lengthscale.shape[:-1] + omega.shape[-1:])
        batch = ls.shape[:-1]
        ls = ls.reshape(batch + (1,) * (omega.ndim - 1) + ls.shape[-1:])
        log_prod_ls = jnp.log(ls).sum(-1)
        return ((omega * ls) ** 2).sum(-1), log_prod_ls


class SquaredExponential(Stationary):
    """``k(x, z) = variance * exp(-r^2 / 2)``."""

    def shape_fn(self, r2):
        return jnp.exp(-0.5 * r2)

    def spectral_density(self, omega):
        w2, log_prod_ls = self._scaled_frequencies(omega)
        var = self.variance.reshape(self.variance.shape + (1,) * (omega.ndim - 1))
        return var * jnp.exp(log_prod_ls - 0.5 * w2)


RBF = SquaredExponential


class Matern(Stationary):
    """Matérn kernel with half-integer smoothness ``nu`` (set by the subclasses)."""

    nu = None

    def shape_fn(self, r2):
        # Clamp before sqrt so the gradient at r = 0 (the diagonal of Kuu) is finite.
        r = jnp.sqrt(jnp.maximum(r2, 1e-36))
        return self.polynomial(r) * jnp.exp(-math.sqrt(2 * self.nu) * r)

    def spectral_density(self, omega):
        D = omega.shape[-1]
        nu = self.nu
        w2, log_prod_ls = self._scaled_frequencies(omega)
        log_const = (
            0.5 * D * math.log(2 * math.pi)
            + math.lgamma(nu + D / 2)
            - math.lgamma(nu)
            - 0.5 * D * math.log(math.pi)
            + nu * math.log(2 * nu)
        )
        var = self.variance.reshape(self.variance.shape + (1,) * (omega.ndim - 1))
        return var * jnp.exp(log_const + log_prod_ls - (nu + D / 2) * jnp.log(2 * nu + w2))


class Matern12(Matern):
    """``k = variance * exp(-r)`` (the exponential kernel)."""

    nu = 0.5

    def polynomial(self, r):
        return jnp.ones_like(r)


class Matern32(Matern):
    """``k = variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``."""

    nu = 1.5

    def polynomial(self, r):
        return 1 + math.sqrt(3) * r


class Matern52(Matern):
    """``k = variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``."""

    nu = 2.5

    def polynomial(self, r):
        return 1 + math.sqrt(5) * r + (5.0 / 3.0) * r**2


class Sum(Kernel):
    """``k1 + k2``; its spectral density is the sum of the two."""

    def __init__(self, k1, k2):
        super().__init__()
        self.k1, self.k2 = k1, k2

    def K(self, X, Z=None):
        return self.k1.K(X, Z) + self.k2.K(X, Z)

    def K_diag(self, X):
        return self.k1.K_diag(X) + self.k2.K_diag(X)

    def spectral_density(self, omega):
        return self.k1.spectral_density(omega) + self.k2.spectral_density(omega)


class Product(Kernel):
    """``k1 * k2`` (its spectral density is a convolution and is not provided)."""

    def __init__(self, k1, k2):
        super().__init__()
        self.k1, self.k2 = k1, k2

    def K(self, X, Z=None):
        return self.k1.K(X, Z) * self.k2.K(X, Z)

    def K_diag(self, X):
        return self.k1.K_diag(X) * self.k2.K_diag(X)
