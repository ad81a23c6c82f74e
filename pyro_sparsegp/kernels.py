"""Covariance functions.

Shapes: inputs ``X`` (N, D) and ``Z`` (M, D); ``K(X, Z)`` is ``batch_shape + (N, M)`` and
``K_diag(X)`` is ``batch_shape + (N,)``, where ``batch_shape`` is the leading shape of the
hyperparameters (empty for a single kernel, ``(L,)`` for L independent outputs).

Stationary kernels take ``lengthscale`` of shape ``batch_shape + (D,)`` (ARD) or
``batch_shape + (1,)`` (isotropic) and ``variance`` of shape ``batch_shape``; both are kept
positive by Pyro's ``positive`` constraint (an exp/log transform).

Spectral densities follow one convention (see ``specs/vof.md``, section 1): with
``kappa(tau) = k(x, x + tau)``,

    kappa(tau) = (2 pi)^(-D/2) * integral s(omega) exp(-i omega . tau) d omega,

so ``(2 pi)^(-D/2) * integral s = variance``. For the squared exponential
``s(omega) = variance * prod(l) * exp(-|omega * l|^2 / 2)``.
"""
import math

import torch
from torch.distributions import constraints

from . import checks
from .params import Parameterized


class Kernel(Parameterized):
    """Base class: ``K``, ``K_diag`` and (where it exists) ``spectral_density``."""

    def K(self, X, Z=None):
        raise NotImplementedError

    def K_diag(self, X):
        raise NotImplementedError

    def K_matvec(self, X, Z, v):
        """``K(X, Z) @ v``: ``v`` is ``batch_shape + (M, K)``, the result ``batch_shape + (N, K)``.

        For the products with a large basis (the decoupled mean ``K_{x alpha} a``), where ``K(X, Z)``
        is big: kernels may compute it without keeping ``K``'s intermediates for the backward pass.
        """
        return self.K(X, Z) @ v

    def spectral_density(self, omega):
        """Spectral density at frequencies ``omega`` (..., D): shape ``batch_shape + omega.shape[:-1]``."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form spectral density")

    def forward(self, X, Z=None, diag=False):
        return self.K_diag(X) if diag else self.K(X, Z)

    def __add__(self, other):
        return Sum(self, other)

    def __mul__(self, other):
        return Product(self, other)


class Stationary(Kernel):
    """A kernel ``variance * shape(r)`` of the scaled distance ``r = |(x - z) / lengthscale|``."""

    def __init__(self, lengthscale=1.0, variance=1.0):
        super().__init__()
        lengthscale = checks.positive(lengthscale, "lengthscale")
        if lengthscale.dim() == 0:
            lengthscale = lengthscale.unsqueeze(-1)
        variance = checks.positive(variance, "variance", like=lengthscale)
        self._param("lengthscale", lengthscale, constraints.positive)
        self._param("variance", variance, constraints.positive)

    def scaled_sqdist(self, X, Z=None):
        """Squared scaled distances, ``batch_shape + (N, M)``; centred first for accuracy."""
        ls = self.lengthscale.unsqueeze(-2)
        shift = X.mean(-2, keepdim=True)
        Xs = (X - shift) / ls
        Zs = Xs if Z is None else (Z - shift) / ls
        r2 = (Xs**2).sum(-1).unsqueeze(-1) + (Zs**2).sum(-1).unsqueeze(-2) - 2 * Xs @ Zs.transpose(-1, -2)
        if Z is None:  # exact zeros on the diagonal: sqrt would amplify the round-off
            r2 = torch.where(torch.eye(X.shape[-2], dtype=torch.bool, device=X.device), 0.0, r2)
        return r2.clamp_min(0)

    def shape_fn(self, r2):
        raise NotImplementedError

    def K(self, X, Z=None):
        return self.variance[..., None, None] * self.shape_fn(self.scaled_sqdist(X, Z))

    def K_diag(self, X):
        return self.variance[..., None].expand(self.variance.shape + X.shape[-2:-1])

    def _scaled_frequencies(self, omega):
        ls = self.lengthscale.expand(self.lengthscale.shape[:-1] + omega.shape[-1:])
        batch = ls.shape[:-1]
        ls = ls.reshape(batch + (1,) * (omega.dim() - 1) + ls.shape[-1:])
        log_prod_ls = torch.log(ls).sum(-1)
        return ((omega * ls) ** 2).sum(-1), log_prod_ls


class SquaredExponential(Stationary):
    """``k(x, z) = variance * exp(-r^2 / 2)``."""

    def shape_fn(self, r2):
        return torch.exp(-0.5 * r2)

    def K_matvec(self, X, Z, v):
        # one fused autograd node instead of a dozen elementwise ones over the (N, M) matrix
        return _SEMatvec.apply(X, Z, self.lengthscale, self.variance, v)

    def spectral_density(self, omega):
        w2, log_prod_ls = self._scaled_frequencies(omega)
        var = self.variance.reshape(self.variance.shape + (1,) * (omega.dim() - 1))
        return var * torch.exp(log_prod_ls - 0.5 * w2)


class _SEMatvec(torch.autograd.Function):
    """``K(X, Z) @ v`` for the squared exponential with ``K`` as the only (N, M) buffer.

    Forward: one product of augmented inputs gives ``log K = log var + Xs.Zs - |Xs|^2 / 2 -
    |Zs|^2 / 2`` for the scaled inputs ``Xs = (X - shift) / l`` (the shift cancels), then an
    in-place clamp and exp. Backward, with ``E = K * (g v^T)``: ``dv = K^T g``,
    ``dXs = E Zs - rowsum(E) Xs``, ``dZs = E^T Xs - colsum(E) Zs``, ``dvar = sum(E) / var``,
    the row and column sums coming out of the same two products.
    """

    @staticmethod
    def forward(ctx, X, Z, lengthscale, variance, v):
        ls = lengthscale.unsqueeze(-2)
        shift = X.mean(-2, keepdim=True)
        Xs, Zs = (X - shift) / ls, (Z - shift) / ls
        log_var = variance.log()[..., None, None]
        A = torch.cat([Xs, log_var - 0.5 * (Xs**2).sum(-1, keepdim=True), torch.ones_like(Xs[..., :1])], -1)
        B = torch.cat([Zs, torch.ones_like(Zs[..., :1]), -0.5 * (Zs**2).sum(-1, keepdim=True)], -1)
        K = (A @ B.transpose(-1, -2)).clamp_(max=log_var).exp_()  # r2 >= 0: log K <= log var
        ctx.save_for_backward(Xs, Zs, lengthscale, variance, v, K)
        ctx.shapes, ctx.consumed = (X.shape, Z.shape), False
        return K @ v

    @staticmethod
    def backward(ctx, g):
        if ctx.consumed:
            raise RuntimeError("K_matvec's backward pass reuses its buffer and runs once (no retain_graph)")
        ctx.consumed = True
        Xs, Zs, lengthscale, variance, v, K = ctx.saved_tensors
        dv = K.transpose(-1, -2) @ g
        # E = K * (g v^T) overwrites K: allocating a second (N, M) buffer costs more than the products
        batch = torch.broadcast_shapes(K.shape[:-2], g.shape[:-2], v.shape[:-2])
        E = K if K.shape[:-2] == batch else K.expand(batch + K.shape[-2:]).clone()
        E = E.mul_(g).mul_(v.transpose(-1, -2)) if v.shape[-1] == 1 else E.mul_(g @ v.transpose(-1, -2))
        EZ = E @ torch.cat([Zs, torch.ones_like(Zs[..., :1])], -1)
        EX = (torch.cat([Xs, torch.ones_like(Xs[..., :1])], -1).transpose(-1, -2) @ E).transpose(-1, -2)
        rowsum, colsum = EZ[..., -1:], EX[..., -1:]
        dXs, dZs = EZ[..., :-1] - rowsum * Xs, EX[..., :-1] - colsum * Zs
        ls = lengthscale.unsqueeze(-2)
        dvar = rowsum.sum((-1, -2)) / variance
        dls = -((dXs * Xs).sum(-2) + (dZs * Zs).sum(-2)) / lengthscale
        X_shape, Z_shape = ctx.shapes
        grads = (dXs / ls, dZs / ls, dls, dvar, dv)
        shapes = (X_shape, Z_shape, lengthscale.shape, variance.shape, v.shape)
        # inputs broadcast over the kernel's batch get the sum over it
        return tuple(d.sum_to_size(shape) for d, shape in zip(grads, shapes))


RBF = SquaredExponential


class Matern(Stationary):
    """Matérn kernel with half-integer smoothness ``nu`` (set by the subclasses)."""

    nu = None

    def shape_fn(self, r2):
        # Clamp before sqrt so the gradient at r = 0 (the diagonal of Kuu) is finite.
        r = torch.sqrt(r2.clamp_min(1e-36))
        return self.polynomial(r) * torch.exp(-math.sqrt(2 * self.nu) * r)

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
        var = self.variance.reshape(self.variance.shape + (1,) * (omega.dim() - 1))
        return var * torch.exp(log_const + log_prod_ls - (nu + D / 2) * torch.log(2 * nu + w2))


class Matern12(Matern):
    """``k = variance * exp(-r)`` (the exponential kernel)."""

    nu = 0.5

    def polynomial(self, r):
        return torch.ones_like(r)


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
