"""Decoupled mean and covariance bases (Cheng & Boots, 2017).

The posterior process is ``N(mu, Sigma)`` in the RKHS of the kernel with::

    mu = Psi_alpha a,    Sigma = (I + Psi_beta B Psi_beta^T)^{-1},    B = L L^T,

a mean basis ``Z_alpha`` (M_alpha points, coefficients ``a``) and a separate, smaller covariance
basis ``Z_beta`` (M_beta points, factor ``L``). With ``H = I + L^T K_beta L = L_H L_H^T``::

    mean(x) = K_{x alpha} a,     var(x) = k(x, x) - |L_H^{-1} L^T K_{beta x}|^2,
    KL      = a^T K_alpha a / 2 + sum log diag L_H + |L_H^{-1}|_F^2 / 2 - M_beta / 2,

so one M_beta x M_beta Cholesky is needed and neither ``K_alpha^{-1}`` nor ``chol(K_beta)``. The
quadratic form is computed in blocks of ``kl_chunk_size`` rows of ``K_alpha``, each recomputed in
the backward pass (``ops.blockwise_sum``: torch checkpoints, ``lax.map`` over ``jax.checkpoint``-ed
blocks in JAX), so memory is O(kl_chunk_size x M_alpha). There is no finite ``u`` whose prior and
posterior reproduce this KL, so the component has no ``<name>.u`` site: the KL enters only
through the factor ``<name>.kl`` (the paper's eq. 9, Theorem 1). Shapes are static (growing
bases are preallocated and masked), so everything jits.
"""
import functools
import math
import numbers

from sparsegp_common import variational
from sparsegp_common.checks import one_of, positive_int
from sparsegp_common.linalg import cholesky, solve_lower
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors import GPPrior
from sparsegp_common.priors.svgp import SVGP
from sparsegp_common.variational.conditionals import add_prior, conditional

#: Scale of the initial covariance factor ``L = L_INIT * I``: ``L = 0`` is the prior but a
#: stationary point of the ELBO in ``L`` (its gradient is ``2 (dELBO/dB) L = 0``), so learning would
#: never start there.
L_INIT = 1e-3


class DecoupledGP(GPPrior):
    """GP prior component with decoupled mean and covariance bases.

    Args:
        kernel: a kernel (batch shape ``()`` or ``(L,)``); its parameters are converted to the
            dtype and device of ``Z_alpha``.
        Z_alpha: mean basis ``(M_alpha, D)`` (learnable); with ``"hybrid"`` the residual mean
            points ``alpha_r``.
        Z_beta: covariance basis ``(M_beta, D)`` (learnable); with ``"hybrid"`` the shared points
            ``X~`` of the SVGP part.
        parametrization: ``"direct"``: parameters ``a`` ``(..., M_alpha)`` and ``L``
            ``(..., M_beta, M_beta)``, ``B = L L^T``. ``"jacobi"``: the same names hold the
            preconditioned ``a0 = diag(K_alpha) a`` and ``L0 = diag(K_beta) L``. ``"hybrid"``
            (the paper's Appendix A.3, eq. 11): an unwhitened SVGP ``q_mu`` ``(..., M_beta)``, ``q_sqrt``
            ``(..., M_beta, M_beta)`` on ``Z_beta`` plus the residual mean ``K_{x alpha} a``.
            Default ``"jacobi"``: the mean no longer rescales with the learned kernel variance,
            which speeds Adam up markedly (kin40k, 180 s: test RMSE 0.19 against 0.28 direct).
        num_latent: None for one latent function, or L independent ones (``a`` gets a leading
            dimension L, ``L`` is ``(L, M_beta, M_beta)``).
        kl_chunk_size: rows of ``K_alpha`` per block of the exact KL.
        kl_subsample_size: if given, the KL of a training step estimates ``a^T K_alpha a``
            without bias from this many random columns (cost linear in M_alpha, noisy, may be
            negative). Columns are drawn only during inference (inside a Pyro trace, or under a
            NumPyro ``seed`` handler); evaluated directly (``GPModel.elbo``, ``posterior().kl()``)
            and with ``kl(subsample=False)`` the KL is exact, in both backends.
        active_alpha, active_beta: preallocate the bases and start with only this many points
            active (masks ``<name>.alpha_mask``/``<name>.beta_mask``); grow them with
            :meth:`add_basis`. None: every point is active and there are no masks.
        jitter: added to the diagonal of ``K_beta`` (hybrid only).
        mean_function: a :class:`~sparsegp_common.priors.mean_functions.MeanFunction` ``m`` (``f = m + g``);
            None: zero.
        name: prefix of the parameter and sample-site names.

    ``a = 0`` and ``L = 1e-3 I`` at the start (``L = 0`` would be a stationary point); the hybrid
    starts at the prior, ``q_sqrt = chol(K_beta)``.
    """

    prior_variance = SVGP.prior_variance

    def __init__(self, kernel, Z_alpha, Z_beta, *, parametrization="jacobi", num_latent=None, kl_chunk_size=1024,
                 kl_subsample_size=None, active_alpha=None, active_beta=None, jitter=1e-6, mean_function=None,
                 name="gp"):
        super().__init__(name)
        checks = self._checks
        Z_alpha = checks.inputs(Z_alpha, "Z_alpha")
        Z_beta = checks.as_array(checks.inputs(Z_beta, "Z_beta", Z_alpha.shape[-1]), "Z_beta", like=Z_alpha)
        xp, ops, dev = namespace(Z_alpha), backend(Z_alpha), device(Z_alpha)
        self.parametrization, self.kl_chunk_size, self.kl_subsample_size = _check_options(
            parametrization, kl_chunk_size, kl_subsample_size, Z_alpha.shape[0])
        if not isinstance(jitter, numbers.Real) or not jitter >= 0:
            raise ValueError(f"jitter must be a non-negative number, got {jitter!r}")
        self.jitter = float(jitter)
        self.num_latent = None if num_latent is None else positive_int(num_latent, "num_latent")
        batch = () if self.num_latent is None else (self.num_latent,)
        Ma, Mb = Z_alpha.shape[0], Z_beta.shape[0]
        self.kernel = kernel
        self._param("Z_alpha", xp.asarray(Z_alpha, copy=True))
        self._param("Z_beta", xp.asarray(Z_beta, copy=True))
        self._follow(Z_alpha)
        self._set_mean_function(mean_function, Z_alpha)
        self._param("a", xp.zeros(batch + (Ma,), dtype=Z_alpha.dtype, device=dev))
        self.posterior_class = POSTERIORS[self.parametrization]
        if self.posterior_class.grows is False and (active_alpha is not None or active_beta is not None):
            raise ValueError("active_alpha/active_beta (basis growth) need parametrization 'direct' or 'jacobi'")
        for name, value, constraint in self.posterior_class.initial(self.kernel, Z_beta, batch, self.jitter):
            self._param(name, value, constraint)
        self.growing = active_alpha is not None or active_beta is not None
        if self.growing:
            for key, size, count in (("alpha", Ma, active_alpha), ("beta", Mb, active_beta)):
                count = size if count is None else _check_active(count, f"active_{key}", size)
                self._param(f"{key}_mask", xp.astype(xp.arange(size, device=dev) < count, Z_alpha.dtype))

    @property
    def input_dim(self):
        return self.Z_alpha.shape[-1]

    def _posterior(self):
        return self.posterior_class(self)

    def add_basis(self, X, num_new, params=None):
        """Activate the next ``num_new`` points of both bases at the first ``num_new`` rows of
        ``X`` (Cheng & Boots, Algorithm 1 and A.2: new mean and covariance points start at the
        same inputs); points beyond the preallocated sizes are dropped. Jittable in NumPyro
        (``num_new`` static).

        Args:
            X: inputs ``(B, D)`` with ``B >= num_new`` (e.g. the current minibatch).
            num_new: number of new points per basis.
            params: ``{name: value}`` holding the current values (e.g. ``svi.get_params`` or
                ``FitResult.params``) to grow. None: the current values, and in Pyro the module is
                updated in place (so an optimiser, e.g. inside a ``fit`` callback, keeps
                its state); NumPyro has no store, so None reads the initial values.

        Returns:
            dict: the new values of ``<name>.Z_alpha``, ``<name>.Z_beta`` and the two masks, to
            merge into the parameters (in NumPyro e.g. through ``handlers.substitute`` or a new
            SVI state).
        """
        if not self.growing:
            raise ValueError("add_basis needs a DecoupledGP built with active_alpha or active_beta")
        X = self._checks.inputs(X, "X", self.input_dim)
        num_new = positive_int(num_new, "num_new")
        if X.shape[0] < num_new:
            raise ValueError(f"X has {X.shape[0]} rows, fewer than num_new={num_new}")
        new = {}
        with self._sites.bound(self) as (prior,):
            for key in ("alpha", "beta"):
                names = (f"{self.name}.Z_{key}", f"{self.name}.{key}_mask")
                Z, mask = (params[n] if params is not None else getattr(prior, n.split(".", 1)[1]) for n in names)
                new[names[0]], new[names[1]] = _grow(Z, mask, X[:num_new])
        return new


def _grow(Z, mask, X):
    """``Z`` ``(M, D)`` and ``mask`` ``(M,)`` with the next ``B`` inactive slots holding the rows
    of ``X`` ``(B, D)``; rows past the end are dropped (a gather, so the shapes stay static)."""
    xp, ops = namespace(Z, mask), backend(Z, mask)
    slot = xp.arange(Z.shape[0], dtype=mask.dtype, device=device(Z)) - xp.sum(mask)  # row of X per slot
    new = (slot >= 0) & (slot < X.shape[0])
    rows = xp.take(xp.astype(xp.asarray(X, device=device(Z)), Z.dtype),
                   ops.as_index(xp.clip(slot, 0, X.shape[0] - 1)), axis=0)
    return xp.where(new[:, None], rows, Z), xp.where(new, xp.ones_like(mask), mask)


class DecoupledPosterior:
    """q(f) of a :class:`DecoupledGP` with its parameters read once: the mean basis, shared by
    the parametrisations; a subclass per parametrisation gives the covariance part (``initial``
    parameters, ``covariance_kl`` and ``covariance``).

    Attribute ``a`` holds the effective mean coefficients (the mask applied).
    """

    grows = True  # whether the bases can be preallocated and grown (add_basis)

    def __init__(self, prior):
        self.kernel, self.num_latent = prior.kernel, prior.num_latent
        self.kl_chunk_size, self.kl_subsample_size, self.jitter = prior.kl_chunk_size, prior.kl_subsample_size, prior.jitter
        self.Z_alpha, self.Z_beta, self.a, self._sites = prior.Z_alpha, prior.Z_beta, prior.a, prior._sites
        if prior.growing:  # masked entries get no gradient, so Adam leaves them as they are
            self.a = self.a * backend(self.a).stop_gradient(prior.alpha_mask)

    def kl(self, subsample=True):
        """``KL[q || p]`` summed over latent functions; subsampled as the class docstring says
        (``subsample=False`` forces the exact quadratic form)."""
        random = subsample and self.kl_subsample_size is not None and self._sites.draws()
        key = self._sites.key(None) if random else None
        size = self.kl_subsample_size if random else None
        return 0.5 * quadratic_form(self.kernel, self.Z_alpha, self.a, self.kl_chunk_size, size, key) + self.covariance_kl()

    def prior_u(self):
        return None

    def q_u(self):
        return None

    def marginals(self, X, full_cov=False):
        Kff = self.kernel.K(X) if full_cov else self.kernel.K_diag(X)
        mean = self.kernel.K_matvec(X, self.Z_alpha, self.a[..., None])[..., 0]
        mean, var = self.covariance(self.kernel.K(self.Z_beta, X), Kff, mean, full_cov)
        if self.num_latent is None:
            return mean, var
        return mean.mT, (var if full_cov else var.mT)


class DirectPosterior(DecoupledPosterior):
    """``"direct"``: ``B = L L^T`` with ``L`` the parameter; ``LH`` is factorised on first use."""

    @staticmethod
    def initial(kernel, Z_beta, batch, jitter):
        """``(name, value, constraint)`` of the covariance parameters: ``L = 1e-3 I``."""
        xp = namespace(Z_beta)
        L = L_INIT * xp.eye(Z_beta.shape[0], dtype=Z_beta.dtype, device=device(Z_beta))
        return [("L", xp.asarray(xp.broadcast_to(L, batch + L.shape), copy=True), "real")]

    def __init__(self, prior):
        super().__init__(prior)
        self.L = prior.L
        if prior.growing:
            mask = backend(self.L).stop_gradient(prior.beta_mask)
            self.L = self.L * mask[:, None] * mask

    @functools.cached_property
    def LH(self):
        """Lower Cholesky factor of ``H = I + L^T K_beta L`` (``H >= I``: no jitter, no retries; the
        library's factorisation, whose compiled and captured forms read nothing back to the host)."""
        xp, ops = namespace(self.L), backend(self.L)
        H = ops.precise_matmul(ops.precise_matmul(self.L.mT, self.kernel.K(self.Z_beta)), self.L)
        return cholesky(H + xp.eye(H.shape[-1], dtype=H.dtype, device=device(H)), jitter=0.0, max_tries=0)

    def covariance_kl(self):
        return covariance_kl(self.LH)

    def covariance(self, Kbx, Kff, mean, full_cov):
        """``mean`` and ``Kff - V^T V`` with ``V = LH^{-1} L^T K_beta,x``."""
        V = solve_lower(self.LH, self.L.mT @ Kbx)
        change = -(V.mT @ V) if full_cov else -namespace(V).sum(V**2, axis=-2)
        return mean, add_prior(Kff, change, full_cov)


class JacobiPosterior(DirectPosterior):
    """``"jacobi"``: the parameters hold the preconditioned ``a0 = diag(K_alpha) a`` and
    ``L0 = diag(K_beta) L``, so the mean does not rescale with the learned kernel variance."""

    @staticmethod
    def initial(kernel, Z_beta, batch, jitter):
        (name, L, constraint), = DirectPosterior.initial(kernel, Z_beta, batch, jitter)
        return [(name, backend(L).stop_gradient(kernel.K_diag(Z_beta))[..., None] * L, constraint)]

    def __init__(self, prior):
        super().__init__(prior)
        self.a = self.a / self.kernel.K_diag(self.Z_alpha)
        self.L = self.L / self.kernel.K_diag(self.Z_beta)[..., None]


class HybridPosterior(DecoupledPosterior):
    """``"hybrid"`` (Cheng & Boots, Appendix A.3, eq. 11): an unwhitened SVGP ``q_mu``, ``q_sqrt``
    on ``Z_beta`` plus the residual mean ``K_{x alpha} a``; ``Luu`` is factorised on first use."""

    grows = False

    @staticmethod
    def initial(kernel, Z_beta, batch, jitter):
        """At the prior: ``q_mu = 0``, ``q_sqrt = chol(K_beta)``."""
        Luu = backend(Z_beta).stop_gradient(cholesky(kernel.K(Z_beta), jitter))
        q_mu, q_sqrt = variational.CholeskyGaussian.initial(Z_beta.shape[0], batch, Z_beta, Luu)
        return [("q_mu", q_mu, "real"), ("q_sqrt", q_sqrt, "lower_cholesky")]

    def __init__(self, prior):
        super().__init__(prior)
        self.q_mu, self.q_sqrt = prior.q_mu, prior.q_sqrt

    @functools.cached_property
    def Luu(self):
        return cholesky(self.kernel.K(self.Z_beta), self.jitter)

    def covariance_kl(self):
        """The SVGP part's KL plus its cross term with the residual mean."""
        xp = namespace(self.a)
        Kba_a = self.kernel.K_matvec(self.Z_beta, self.Z_alpha, self.a[..., None])
        cross = xp.sum(solve_lower(self.Luu, self.q_mu[..., None]) * solve_lower(self.Luu, Kba_a))
        return variational.CholeskyGaussian(self.q_mu, self.q_sqrt).kl(self.Luu) + cross

    def covariance(self, Kbx, Kff, mean, full_cov):
        q = variational.CholeskyGaussian(self.q_mu, self.q_sqrt)
        base, var = conditional(Kbx, self.Luu, Kff, q, whiten=False, full_cov=full_cov)
        return mean + base, var


#: The posterior class of each ``parametrization``.
POSTERIORS = {"direct": DirectPosterior, "jacobi": JacobiPosterior, "hybrid": HybridPosterior}


def covariance_kl(LH):
    """``KL[N(0, H^{-1}) || N(0, I)]`` summed over the batch, from ``LH = chol(H)``."""
    xp = namespace(LH)
    M = LH.shape[-1]
    eye = xp.broadcast_to(xp.eye(M, dtype=LH.dtype, device=device(LH)), LH.shape)
    LH_inv = solve_lower(LH, eye)
    return xp.sum(xp.log(xp.linalg.diagonal(LH))) + 0.5 * xp.sum(LH_inv**2) - 0.5 * M * math.prod(LH.shape[:-2])


def quadratic_form(kernel, Z, a, chunk_size, subsample_size=None, key=None):
    """``a^T K(Z, Z) a`` summed over the batch of ``a`` (``(..., M)``).

    Exact: in blocks of ``chunk_size`` rows, each recomputed in the backward pass (memory
    O(chunk_size x M)). With ``subsample_size = n``: ``(M / n) sum_{j in J} a_j K(z_j, Z) a`` over
    ``n`` columns ``J`` drawn uniformly without replacement from ``key`` (the backend's RNG
    contract, ``ops.permutation``): unbiased, linear in M.
    """
    xp, ops = namespace(Z, a), backend(Z, a)
    M = Z.shape[-2]
    if subsample_size is not None:
        J = ops.permutation(key, M, device(Z))[:subsample_size]
        return (M / subsample_size) * _block(kernel, Z, a, J, None)
    if chunk_size >= M:
        return xp.sum(a[..., None, :] @ kernel.K(Z) @ a[..., None])
    return ops.blockwise_sum(functools.partial(_block, kernel, Z, a), M, chunk_size, Z)


def _block(kernel, Z, a, rows, weights):
    """``sum_{j in rows} w_j a_j K(z_j, Z) a`` (``weights`` None: all ones)."""
    xp = namespace(Z, a)
    terms = xp.take(a, rows, axis=-1) * kernel.K_matvec(xp.take(Z, rows, axis=0), Z, a[..., None])[..., 0]
    return xp.sum(terms if weights is None else weights * terms)


def _check_options(parametrization, kl_chunk_size, kl_subsample_size, num_alpha):
    """Validate the constructor options; returns them normalised."""
    one_of(parametrization, "parametrization", tuple(POSTERIORS))
    kl_chunk_size = positive_int(kl_chunk_size, "kl_chunk_size")
    if kl_subsample_size is not None:
        kl_subsample_size = positive_int(kl_subsample_size, "kl_subsample_size")
        if kl_subsample_size > num_alpha:
            raise ValueError(
                f"kl_subsample_size={kl_subsample_size} exceeds the size of the mean basis "
                f"(Z_alpha has {num_alpha} rows)"
            )
    return parametrization, kl_chunk_size, kl_subsample_size


def _check_active(active, name, size):
    """Initial number of active basis points (None: all ``size``)."""
    if isinstance(active, bool) or not isinstance(active, int) or not 0 <= active <= size:
        raise ValueError(f"{name} must be an integer in [0, {size}], got {active!r}")
    return active
