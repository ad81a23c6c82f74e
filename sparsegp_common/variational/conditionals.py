"""From q(u) to q(f(X)): the one place where the sparse-GP predictive formulas live.

With ``A = Luu^{-1} Kuf`` and ``B = A`` (whitened) or ``B = Luu^{-T} A`` (unwhitened):

    mean = B^T q_mu,    cov = Kff - A^T A + B^T S B,    S = q_sqrt q_sqrt^T.

For ``f = sum_t f_t`` over independent components the changes ``-A^T A + B^T S B`` are summed
and ``Kff`` is added once.

``Luu=None`` stands for ``Kuu = I`` (features that are orthonormal by construction), where
whitening is the identity. The strategies say which ``B``: :class:`Whitened` and
:class:`Unwhitened` here; decoupled and weight-space strategies reuse :func:`conditional`.
"""
from sparsegp_common.linalg import solve_lower
from sparsegp_common.ops import device, namespace

__all__ = ["Unwhitened", "WeightSpace", "Whitened", "add_prior", "conditional", "prior_covariance", "strategy",
           "update"]  # what the backends re-export


def conditional(Kuf, Luu, Kff, q, *, whiten=True, full_cov=False, cross=None):
    """Moments of q(f(X)) for one block of features: the prior ``Kff`` plus :func:`update`.

    Args:
        Kuf: ``(M, N)`` or ``batch_shape + (M, N)``.
        Luu: lower Cholesky factor of Kuu, ``(..., M, M)``, or None for ``Kuu = I``.
        Kff: prior covariance, ``(..., N)`` diagonal, or ``(..., N, N)`` when ``full_cov``.
        q: the variational distribution (a family of :mod:`~sparsegp_common.variational`).
        whiten: whether ``u = Luu v`` with ``q(v) = N(q_mu, S)``.
        full_cov: return the full ``(..., N, N)`` covariance instead of the variances.
        cross: ``batch_shape + (M, P)``, directions of ``q_mu`` (see
            :class:`~sparsegp_common.priors.mean_functions.CoupledMean`); given, ``B^T cross``
            (``batch_shape + (N, P)``) is returned as a third value.

    Returns:
        ``mean`` of shape ``batch_shape + (N,)`` and ``var`` (``batch_shape + (N,)``) or
        ``cov`` (``batch_shape + (N, N)``).
    """
    mean, change, *rest = update(Kuf, Luu, q, whiten=whiten, full_cov=full_cov, cross=cross)
    return (mean, add_prior(Kff, change, full_cov), *rest)


def update(Kuf, Luu, q, *, whiten=True, full_cov=False, cross=None):
    """What q(u) does to the prior at X: the mean ``B^T q_mu`` and the covariance change
    ``-A^T A + B^T S B`` (diagonal unless ``full_cov``), shapes and ``cross`` as in
    :func:`conditional`. Components of ``f = sum_t f_t`` add their changes
    (:func:`sum_components`) before the prior covariance is added once (:func:`add_prior`):
    ``sum_t k_t(x, x) = k(x, x)`` whatever the decomposition."""
    xp = namespace(Kuf, Luu)
    A = Kuf if Luu is None else solve_lower(Luu, Kuf)
    B = A if (whiten or Luu is None) else solve_lower(Luu, A, transpose=True)
    mean, explained = project(q, B, full_cov)
    prior = A.mT @ A if full_cov else xp.sum(A * A, axis=-2)  # A * A: eager torch's pow backward takes two more passes
    change = -prior if explained is None else explained - prior
    return (mean, change) if cross is None else (mean, change, B.mT @ cross)


def project(q, B, full_cov=False):
    """``B^T q_mu`` (``batch_shape + (N,)``) and ``B^T S B`` (its diagonal unless ``full_cov``;
    None for a q without covariance, a point mass): q's part of :func:`update`."""
    mean = (q.q_mu[..., None, :] @ B)[..., 0, :]
    SB = q.scale_project(B)
    if SB is None:
        return mean, None
    return mean, (SB.mT @ SB if full_cov else namespace(SB).sum(SB * SB, axis=-2))


def add_prior(Kff, change, full_cov=False):
    """The prior (co)variance plus the change of :func:`update`; variances are kept above the
    smallest positive number (round-off can take ``k(x, x) - |A|^2`` below 0)."""
    var = Kff + change
    if full_cov:
        return var
    xp = namespace(var)
    return xp.clip(var, min=float(xp.finfo(var.dtype).tiny))


def prior_covariance(kernel, X, component_shape, latent_shape, full_cov=False):
    """``k(X, X)`` (``full_cov``) or ``k(x, x)`` of ``f = sum_t f_t``: a kernel with a batch axis
    per component (an additive model) gives each ``k_t``, summed here; a kernel without one is
    already the sum (the components of a decomposition of ``k``). Batch axes align from the
    right, the latent ones last. Returns ``latent batch + (N,)`` or ``... + (N, N)``."""
    K = kernel.K(X) if full_cov else kernel.K_diag(X)
    extra = K.ndim - (2 if full_cov else 1) - len(latent_shape)
    if extra > len(component_shape):
        raise shape_error(f"the kernel's {'K' if full_cov else 'K_diag'} has shape {tuple(K.shape)}",
                          component_shape, latent_shape)
    return namespace(K).sum(K, axis=tuple(range(extra))) if extra > 0 else K


def sum_components(mean, var, component_shape, latent_shape, num_points, full_cov=False):
    """``f = sum_t f_t`` over the leading ``component_shape`` axes of independent components:
    means and (co)variance changes (:func:`update`) add. The one place a component axis of q(f)
    is reduced, and where the shapes a prior promises are asserted, so that a batch axis nobody
    declared (in the features, the kernel or q) is an error instead of an ELBO silently
    broadcast over it.

    Args:
        mean: ``component_shape + latent_shape + (N,)``; var: the same, or ``... + (N, N)``.
        latent_shape: ``()`` or ``(L,)``.
    """
    want = tuple(component_shape) + tuple(latent_shape) + (num_points,)
    if (tuple(mean.shape), tuple(var.shape)) != (want, want + (num_points,) * full_cov):
        raise shape_error(f"q(f) at {num_points} inputs has mean shape {tuple(mean.shape)} and variance shape "
                          f"{tuple(var.shape)}", component_shape, latent_shape)
    if not component_shape:
        return mean, var
    xp, axes = namespace(mean, var), tuple(range(len(component_shape)))
    return xp.sum(mean, axis=axes), xp.sum(var, axis=axes)


def check_batch(shape, component_shape, latent_shape, what):
    """``shape`` must broadcast to ``component_shape + latent_shape`` (the batch shape of q(u))."""
    want = tuple(component_shape) + tuple(latent_shape)
    if len(shape) > len(want) or any(s not in (1, w) for s, w in zip(reversed(shape), reversed(want))):
        raise shape_error(f"{what} has batch shape {tuple(shape)}", component_shape, latent_shape)


def shape_error(found, component_shape, latent_shape):
    return ValueError(
        f"{found}, but the prior has component shape {tuple(component_shape)} and latent shape "
        f"{tuple(latent_shape)}: a batch axis of the features, kernel or q(u) is neither a latent function "
        "(num_latent) nor a component the features declare (Features.component_shape)"
    )


class Whitened:
    """``u = Luu v`` with q over ``v`` and prior ``N(0, I)``."""

    whiten = True

    def update(self, Kuf, Luu, q, full_cov=False, cross=None):
        return update(Kuf, Luu, q, whiten=self.whiten, full_cov=full_cov, cross=cross)


class Unwhitened(Whitened):
    """q over ``u`` itself, prior ``N(0, Kuu)``."""

    whiten = False


class WeightSpace(Whitened):
    """``f = Phi w`` with q over the weights ``w`` and prior ``N(0, I)``: the features are the basis
    (``Kuf = Phi^T``, ``Kuu = I``). The prior covariance the basis explains, ``Phi Phi^T``, is not
    added and subtracted (for a finite-rank kernel ``k(x, x) - |A|^2`` would cancel exactly,
    leaving round-off): the change is ``B^T S B`` alone, and what is added is the prior's residual,
    ``k - Phi Phi^T`` (zero, or a method's correction)."""

    def update(self, Kuf, Luu, q, full_cov=False):
        """As :meth:`Whitened.update`, without a coupled mean (no weight-space prior has one)."""
        if Luu is not None:
            raise ValueError("weight-space features have Kuu = I: pass Luu=None")
        mean, change = project(q, Kuf, full_cov)
        if change is None:  # a point mass over the weights changes no covariance
            shape = mean.shape + (mean.shape[-1],) * full_cov
            change = namespace(mean).zeros(shape, dtype=mean.dtype, device=device(mean))
        return mean, change


def strategy(whiten):
    return Whitened() if whiten else Unwhitened()
