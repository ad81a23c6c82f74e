"""Covariance functions, written once for every backend.

Shapes: inputs ``X`` (N, D) and ``Z`` (M, D); ``K(X, Z)`` is ``batch_shape + (N, M)`` and
``K_diag(X)`` is ``batch_shape + (N,)``, where ``batch_shape`` is the leading shape of the
hyperparameters (empty for a single kernel, ``(L,)`` for L independent outputs).

Stationary kernels take ``lengthscale`` of shape ``batch_shape + (D,)`` (ARD) or
``batch_shape + (1,)`` (isotropic) and ``variance`` of shape ``batch_shape``; both are kept
positive by the backend's ``positive`` constraint (an exp/log transform).

Spectral densities follow one convention (Burt, Rasmussen & van der Wilk, 2020, eq. 5): with
``kappa(tau) = k(x, x + tau)``,

    kappa(tau) = (2 pi)^(-D/2) * integral s(omega) exp(-i omega . tau) d omega,

so ``(2 pi)^(-D/2) * integral s = variance``. For the squared exponential
``s(omega) = variance * prod(l) * exp(-|omega * l|^2 / 2)``.

Kernel matrices are computed at full float32 precision (``precise_matmul``) because a Cholesky
depends on them.
"""
import math

from sparsegp_common.ops import backend, device, namespace


class Kernel:
    """Base class: ``K``, ``K_diag`` and (where it exists) ``spectral_density``."""

    def K(self, X, Z=None):
        raise NotImplementedError

    def K_diag(self, X):
        raise NotImplementedError

    def K_matvec(self, X, Z, v):
        """``K(X, Z) @ v``: ``v`` is ``batch_shape + (M, K)``, the result ``batch_shape + (N, K)``.

        For the products with a large basis (the decoupled mean ``K_{x alpha} a``), where ``K(X, Z)``
        is big: backends may compute it without keeping ``K``'s intermediates for the backward pass.
        """
        return self.K(X, Z) @ v

    def spectral_density(self, omega):
        """Spectral density at frequencies ``omega`` (..., D): shape ``batch_shape + omega.shape[:-1]``."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form spectral density")

    def __add__(self, other):
        return self._adapted[Sum](self, other)

    def __mul__(self, other):
        return self._adapted[Product](self, other)


def squared_distances(x2, z2, cross):
    """``|x - z|^2`` for every pair from the squared norms ``x2`` ``(..., N)``, ``z2`` ``(..., M)``
    and the inner products ``cross`` ``(..., N, M)``; clipped at zero (the expansion's round-off)."""
    return namespace(cross).clip(x2[..., :, None] + z2[..., None, :] - 2 * cross, min=0.0)


def pairwise_sqdist(Xs):
    """``|x_i - x_j|^2`` among the rows of ``Xs`` ``(..., M, D)``: ``(..., M, M)``, zero on the
    diagonal, accurate for close pairs.

    The expansion ``|x|^2 + |z|^2 - 2 x.z`` carries a round-off of ``eps |x|^2`` (float32 at
    ``|x| ~ 4``: 1e-6, the jitter's size). That is harmless except for a close pair, which sets
    ``Kuu``'s smallest eigenvalue: two inducing inputs 1e-3 lengthscales apart made float32
    gradients 100 times the true ones under ``jax.jit`` (tutorials/arviz_diagnostics.py, JAX 0.12).
    So the expansion runs in float64 where the backend has it (torch, NumPy, JAX with
    ``jax_enable_x64``) and is cast back; JAX without float64 measures each row's nearest neighbour
    again as a difference (:func:`_nearest_exact`)."""
    ops = backend(Xs)
    wide = ops.wide(Xs, Xs)
    if namespace(wide).finfo(wide.dtype).eps > 1e-12:
        return _nearest_exact(Xs, _expanded_sqdist(Xs))
    return ops.cast_like(_expanded_sqdist(wide), Xs)


def _expanded_sqdist(Xs):
    xp = namespace(Xs)
    x2 = xp.sum(Xs**2, axis=-1)
    r2 = squared_distances(x2, x2, backend(Xs).precise_matmul(Xs, Xs.mT))
    # exact zeros on the diagonal: sqrt would amplify the round-off
    return xp.where(xp.eye(Xs.shape[-2], dtype=xp.bool, device=device(Xs)), 0.0, r2)


def _nearest_exact(Xs, r2):
    """``r2`` with each row's distance to its nearest neighbour computed as a difference: one more
    pass over the ``M x M`` matrix, where differences for every pair would take ``D`` (the float32
    gradient of ``K(Z)`` at ``M = 1024, D = 20`` under ``jax.jit`` on a CPU: 4.0 ms expanded, 7.2 ms
    so, 48 ms as differences). Left inexact is a pair of which neither is the other's nearest
    neighbour, as within three inputs crowded closer than the round-off."""
    xp = namespace(Xs)
    M = Xs.shape[-2]
    if M < 2:
        return r2
    eye = xp.eye(M, dtype=xp.bool, device=device(Xs))
    nearest = xp.argmin(xp.where(eye, xp.inf, r2), axis=-1)
    is_nearest = nearest[..., :, None] == xp.arange(M, device=device(Xs))  # (..., M, M): j is i's
    diff = Xs - xp.take_along_axis(Xs, nearest[..., :, None], axis=-2)
    near = xp.sum(diff * diff, axis=-1)
    return xp.where(is_nearest, near[..., :, None], xp.where(is_nearest.mT, near[..., None, :], r2))


def expanded_product(Xs, Zs, x_term, z_term, scale=1.0):
    """``scale * Xs Zs^T + x_term[..., :, None] + z_term[..., None, :]``, ``(..., N, M)``, as one
    matrix product of the inputs with two columns appended (``[Xs, x_term, 1]`` and ``[scale Zs,
    1, z_term]``): eagerly, one pass over the ``N x M`` result and its cotangent instead of one per
    operation (the broadcast sums and the scaling), which dominate a step at moderate ``M``.

    Args:
        Xs: ``(..., N, D)``; Zs: ``(..., M, D)``; x_term: ``(..., N)``; z_term: ``(..., M)``, whose
            batch shape may be larger than ``Zs``'s (a batched variance).
    """
    xp = namespace(Xs, Zs)
    Zs = xp.broadcast_to(Zs, tuple(z_term.shape) + tuple(Zs.shape[-1:]))
    Xa = xp.concat([Xs, x_term[..., None], xp.ones_like(x_term)[..., None]], axis=-1)
    Za = xp.concat([scale * Zs, xp.ones_like(z_term)[..., None], z_term[..., None]], axis=-1)
    return backend(Xa).precise_matmul(Xa, Za.mT)


class Stationary(Kernel):
    """A kernel ``variance * shape(r)`` of the scaled distance ``r = |(x - z) / lengthscale|``."""

    def __init__(self, lengthscale=1.0, variance=1.0):
        super().__init__()
        lengthscale = self._checks.positive(lengthscale, "lengthscale")
        if lengthscale.ndim == 0:
            lengthscale = namespace(lengthscale).reshape(lengthscale, (1,))
        variance = self._checks.positive(variance, "variance", like=lengthscale)
        self._param("lengthscale", lengthscale, "positive")
        self._param("variance", variance, "positive")

    def scaled_inputs(self, X, Z=None, lengthscale=None):
        """``X`` and ``Z`` (None: ``X``) centred on ``X``'s mean, for accuracy, and divided by
        ``lengthscale`` (None: the kernel's): ``batch_shape + (N, D)`` and ``... + (M, D)``."""
        lengthscale = self.lengthscale if lengthscale is None else lengthscale
        self._check_dimension(X.shape[-1], lengthscale)
        ls = lengthscale[..., None, :]
        shift = namespace(X).mean(X, axis=-2, keepdims=True)
        Xs = (X - shift) / ls
        return Xs, (Xs if Z is None else (Z - shift) / ls)

    def scaled_sqdist(self, X, Z=None, lengthscale=None):
        """Squared scaled distances, ``batch_shape + (N, M)`` (``lengthscale``: a value to use
        instead of the kernel's)."""
        xp = namespace(X, Z)
        Xs, Zs = self.scaled_inputs(X, Z, lengthscale)
        if Z is None:
            return pairwise_sqdist(Xs)
        x2, z2 = xp.sum(Xs**2, axis=-1), xp.sum(Zs**2, axis=-1)
        return xp.clip(expanded_product(Xs, Zs, x2, z2, -2.0), min=0.0)

    def _check_dimension(self, D, lengthscale=None):
        size = (self.lengthscale if lengthscale is None else lengthscale).shape[-1]
        if size not in (1, D):
            raise ValueError(f"lengthscale has {size} entries but the inputs have {D} dimensions: give one "
                             f"per input dimension (ARD) or a single one")

    def shape_fn(self, r2):
        raise NotImplementedError

    def K(self, X, Z=None):
        return self.K_at(X, Z, self.lengthscale, self.variance)

    def K_at(self, X, Z, lengthscale, variance):
        """``K(X, Z)`` at the given ``lengthscale`` and ``variance`` instead of the kernel's own
        (e.g. values held out of the gradient)."""
        return variance[..., None, None] * self.shape_fn(self.scaled_sqdist(X, Z, lengthscale))

    def K_diag(self, X):
        variance = self.variance
        return namespace(X).broadcast_to(variance[..., None], tuple(variance.shape) + tuple(X.shape[-2:-1]))

    def _scaled_frequencies(self, omega):
        xp = namespace(omega)
        self._check_dimension(omega.shape[-1])
        ls = self.lengthscale
        ls = xp.broadcast_to(ls, tuple(ls.shape[:-1]) + tuple(omega.shape[-1:]))
        ls = xp.reshape(ls, tuple(ls.shape[:-1]) + (1,) * (omega.ndim - 1) + tuple(ls.shape[-1:]))
        return xp.sum((omega * ls) ** 2, axis=-1), xp.sum(xp.log(ls), axis=-1)

    def _variance_over(self, omega):
        variance = self.variance
        return namespace(omega).reshape(variance, tuple(variance.shape) + (1,) * (omega.ndim - 1))


class SquaredExponential(Stationary):
    """``k(x, z) = variance * exp(-r^2 / 2)``."""

    def shape_fn(self, r2):
        return namespace(r2).exp(-0.5 * r2)

    @property
    def own_shape(self):
        """Whether ``shape_fn`` is this class's: the squared exponential's closed forms (here and in
        the harmonic features) apply; a subclass that redefines the shape gets the general ones."""
        return type(self).shape_fn is SquaredExponential.shape_fn

    def K_at(self, X, Z, lengthscale, variance):
        if Z is None or not self.own_shape:
            return super().K_at(X, Z, lengthscale, variance)
        # exp(x.z - |x|^2 / 2 - |z|^2 / 2 + log variance): the exponent is one product
        xp = namespace(X, Z)
        Xs, Zs = self.scaled_inputs(X, Z, lengthscale)
        z_term = xp.log(variance)[..., None] - 0.5 * xp.sum(Zs**2, axis=-1)
        exponent = expanded_product(Xs, Zs, -0.5 * xp.sum(Xs**2, axis=-1), z_term)
        return xp.exp(exponent)

    def K_matvec(self, X, Z, v):
        fused = getattr(backend(X), "se_matvec", None) if self.own_shape else None
        return super().K_matvec(X, Z, v) if fused is None else fused(X, Z, self.lengthscale, self.variance, v)

    def spectral_density(self, omega):
        w2, log_prod_ls = self._scaled_frequencies(omega)
        return self._variance_over(omega) * namespace(omega).exp(log_prod_ls - 0.5 * w2)


RBF = SquaredExponential


class Matern(Stationary):
    """Matérn kernel with half-integer smoothness ``nu`` (set by the subclasses)."""

    nu = None

    def shape_fn(self, r2):
        # one elementwise node with its derivative in closed form: the chain of sqrt, polynomial
        # and exp differentiated op by op took five times as long (eager torch, many passes)
        return backend(r2).with_partials(self.shape_and_slope, r2)

    def shape_and_slope(self, r2):
        """``(shape, (d shape / d r2,))`` at the squared scaled distances ``r2`` (round-off below zero
        read as zero): ``p(r) exp(-sqrt(2 nu) r)`` and ``q(r) exp(-sqrt(2 nu) r)`` for the
        subclass's :meth:`polynomials` ``(p, q)`` (arrays or numbers), the slope zero below
        ``r = sqrt(eps)``.

        There ``r2 = |x|^2 + |z|^2 - 2 x.z`` is only round-off, so the direction of its derivative
        (``dr2/dz = 2 (z - x)``) is noise; the true derivative's limit at ``r = 0`` is zero for
        every parameter, and Matern-1/2's slope ``-1 / (2 r)`` is unbounded there. Without the
        floor, that noise times a large cotangent (an ill-conditioned ``Kuu``) made float32 gradient
        spikes of 1e7 under ``jax.jit``."""
        xp = namespace(r2)
        r = xp.sqrt(xp.clip(r2, min=0.0))
        floor = math.sqrt(xp.finfo(r2.dtype).eps)
        decay = xp.exp(-math.sqrt(2 * self.nu) * r)
        value, slope = self.polynomials(r)
        return value * decay, (xp.where(r >= floor, slope * decay, 0.0),)

    def spectral_density(self, omega):
        D, nu = omega.shape[-1], self.nu
        w2, log_prod_ls = self._scaled_frequencies(omega)
        log_const = (
            0.5 * D * math.log(2 * math.pi)
            + math.lgamma(nu + D / 2)
            - math.lgamma(nu)
            - 0.5 * D * math.log(math.pi)
            + nu * math.log(2 * nu)
        )
        xp = namespace(omega)
        return self._variance_over(omega) * xp.exp(log_const + log_prod_ls - (nu + D / 2) * xp.log(2 * nu + w2))


class Matern12(Matern):
    """``k = variance * exp(-r)`` (the exponential kernel)."""

    nu = 0.5

    def polynomials(self, r):
        xp = namespace(r)
        return 1.0, -0.5 / xp.clip(r, min=math.sqrt(xp.finfo(r.dtype).eps))  # finite where the floor masks it


class Matern32(Matern):
    """``k = variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``."""

    nu = 1.5

    def polynomials(self, r):
        return 1 + math.sqrt(3) * r, -1.5


class Matern52(Matern):
    """``k = variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``."""

    nu = 2.5

    def polynomials(self, r):
        linear = 1 + math.sqrt(5) * r
        return linear + (5.0 / 3.0) * r**2, (-5.0 / 6.0) * linear


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


CLASSES = (Stationary, SquaredExponential, Matern, Matern12, Matern32, Matern52, Sum, Product)
