"""Stochastic variational GP with inducing points (Hensman, Fusi & Lawrence, 2013)."""
import functools
import numbers

from sparsegp_common import checks, variational
from sparsegp_common.features import Features, InducingPoints, Kuf, Kuu, component_variances
from sparsegp_common.linalg import cholesky, solve_lower
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors import GPPrior
from sparsegp_common.variational.conditionals import add_prior, check_batch, prior_covariance, strategy, sum_components
from sparsegp_common.variational.whitened_moments import whitened_update


class SVGP(GPPrior):
    """SVGP prior component on inducing points (or any inducing features), whitened by default.

    Args:
        kernel: a kernel; its parameters are converted to the dtype and device of ``Z``.
        Z: initial inducing inputs ``(M, D)`` (learnable), or a ``Features`` object
            (inter-domain features).
        num_latent: None for one latent function (``f`` of shape ``(N,)``) or L independent
            latent functions sharing ``Z`` and the kernel (``f`` of shape ``(N, L)``).
        whiten: parametrise ``u = Luu v`` with ``q(v) = N(q_mu, q_sqrt q_sqrt^T)`` and prior
            ``N(0, I)``; otherwise ``q(u)`` directly with prior ``N(0, Kuu)``.
        diagonal: mean-field ``q`` (``q_sqrt`` of shape ``(..., M)``) instead of a full
            Cholesky factor ``(..., M, M)``.
        jitter: added to the diagonal of ``Kuu`` (escalated tenfold up to 3 times on failure).
        cholesky_dtype: the dtype (or its name) ``Kuu`` is factorised in, the factor then cast
            to the model's dtype; None: the model's. ``"float64"`` inside a float32 model (what
            GPyTorch's variational strategy does) keeps the factor and its gradient accurate when
            inducing inputs nearly coincide, at the price of an ``O(M^3)`` float64 factorisation
            and backward pass per step; JAX computes it without ``jax_enable_x64`` too (reverse
            mode only). See docs/usage.md, "Numerics".
        mean_function: a :class:`~sparsegp_common.priors.mean_functions.MeanFunction` ``m`` (``f = m + g``);
            None: zero. When its coefficients have a prior, ``q`` couples them with ``u``: the
            parameter ``q_sqrt_cross`` ``(..., M, P)`` is the off-diagonal block of their joint
            Cholesky factor (see :class:`~sparsegp_common.priors.mean_functions.CoupledMean`).
        name: prefix of the parameter and sample-site names (``<name>.q_mu``, ``<name>.u``, ...).

    ``q`` starts at the prior (``KL = 0``); unwhitened and diagonal, at the diagonal ``q`` nearest to it
    (the least KL).
    """

    def __init__(self, kernel, Z, *, num_latent=None, whiten=True, diagonal=False, jitter=1e-6,
                 cholesky_dtype=None, mean_function=None, name="gp"):
        super().__init__(name)
        features = Z if isinstance(Z, Features) else self._adapted[InducingPoints](Z)
        if not isinstance(jitter, numbers.Real) or not jitter >= 0:
            raise ValueError(f"jitter must be a non-negative number, got {jitter!r}")
        self.num_latent = None if num_latent is None else checks.positive_int(num_latent, "num_latent")
        self.whiten, self.jitter, self.cholesky_dtype = whiten, float(jitter), cholesky_dtype
        self.strategy, self.family = strategy(whiten), variational.family(diagonal)
        self.kernel, self.features = kernel, features
        like = features.first_parameter()
        self._follow(like)
        self._set_mean_function(mean_function, like)
        self.component_shape = tuple(features.component_shape)
        batch_shape = self.component_shape + self.latent_shape
        if self.strategy.whiten:  # only Kuu's batch shape is needed: traced, not computed (no compilation)
            Luu, factor_shape = None, backend(like).output_shape(self.posterior_factor)
        else:  # q_sqrt starts at Luu
            Luu = self.posterior_factor()
            factor_shape = None if Luu is None else Luu.shape
            Luu = None if Luu is None else backend(Luu).stop_gradient(Luu)
        if factor_shape is not None:
            check_batch(factor_shape[:-2], self.component_shape, self.latent_shape, "Kuu")
        q_mu, q_sqrt = self.family.initial(features.num_inducing, batch_shape, like, Luu)
        self._param("q_mu", q_mu)
        self._param("q_sqrt", q_sqrt, self.family.q_sqrt_constraint)
        if mean_function is not None and mean_function.coefficient_prior is not None:
            # coefficients and u jointly Gaussian (CoupledMean); 0: independent at the start
            xp = namespace(q_mu)
            self._param("q_sqrt_cross", xp.zeros(tuple(q_mu.shape) + (mean_function.num_features,), dtype=q_mu.dtype,
                                                 device=device(q_mu)))

    @property
    def input_dim(self):
        return self.features.input_dim

    def posterior_factor(self):
        """Cholesky factor of ``Kuu`` at the current parameters (None when ``Kuu = I``)."""
        return _factor(self, self.features, self.kernel)

    def _posterior(self):
        return SVGPPosterior(self)

    def prior_variance(self, X):
        var = prior_covariance(self.kernel, X, self.component_shape, self.latent_shape)
        if self.num_latent is None:
            return var
        return namespace(var).broadcast_to(var, (self.num_latent,) + tuple(var.shape[-1:])).mT


class SVGPPosterior:
    """q(f) of an :class:`SVGP` with its parameters read once; ``Luu`` is computed on first use.

    The methods taking ``cross`` (``batch_shape + (M, P)``) serve a mean function whose coefficients
    are coupled to ``u`` (:class:`~sparsegp_common.priors.mean_functions.CoupledMean`)."""

    def __init__(self, prior):
        self.kernel, self.features, self.num_latent = prior.kernel, prior.features, prior.num_latent
        self.component_shape, self.latent_shape = prior.component_shape, prior.latent_shape
        self.jitter, self.cholesky_dtype, self.strategy = prior.jitter, prior.cholesky_dtype, prior.strategy
        self.q_mu, self.q_sqrt, self.dist = prior.q_mu, prior.q_sqrt, prior._dist
        self.q = prior.family(self.q_mu, self.q_sqrt)

    @functools.cached_property
    def Luu(self):
        return _factor(self, self.features, self.kernel)

    @property
    def prior_Luu(self):
        """The factor of the prior of q's variable: None for ``N(0, I)`` (whitened: ``Luu`` is not
        evaluated, so a model that only scores the prior factorises nothing), else ``Luu``."""
        return None if self.strategy.whiten else self.Luu

    def kl(self):
        return self.q.kl(self.prior_Luu)

    def _whitened(self, B):
        """``Luu^{-1} B`` for the prior's factor (``B`` itself when whitened): ``(..., M, K)``."""
        Luu = self.prior_Luu
        return B if Luu is None else solve_lower(Luu, B)

    def cross_kl(self, cross):
        """``E_e KL[N(q_mu + cross e, S) || p] - KL[q || p]`` for ``e ~ N(0, I)``: the trace of ``cross``'s
        outer product under the prior's precision."""
        return 0.5 * namespace(cross).sum(self._whitened(cross) ** 2)

    def shift_kl(self, shift):
        """``KL[N(q_mu + shift, S) || p] - KL[q || p]``; ``shift`` ``sample_shape + q_mu.shape``,
        the result ``sample_shape``."""
        mu, d = self._whitened(self.q_mu[..., None])[..., 0], self._whitened(shift[..., None])[..., 0]
        return namespace(d).sum(mu * d + 0.5 * d**2, axis=tuple(range(-self.q_mu.ndim, 0)))

    def prior_u(self):
        return variational.prior_distribution(self.dist, self.q_mu, self.prior_Luu)

    def q_u(self, shift=None, cross=None):
        """``q(u)`` (of ``v`` when whitened); with ``shift``, its mean moved (``sample_shape +
        q_mu.shape``); with ``cross``, ``N(q_mu, S + cross cross^T)``."""
        q = self.q
        if shift is not None:
            q = type(q)(self.q_mu + shift, self.q_sqrt)
        if cross is not None:
            S = q.dense_scale()
            q = variational.CholeskyGaussian(q.q_mu, cholesky(S @ S.mT + cross @ cross.mT, 0.0))
        return q.distribution(self.dist)

    def marginals(self, X, full_cov=False, cross=None):
        """Moments of ``q(f(X))``; with ``cross``, also ``B^T cross`` ``latent_shape + (N, P)``."""
        moments = self._updates(X, full_cov, cross)
        mean, change = sum_components(*moments[:2], self.component_shape, self.latent_shape, X.shape[0], full_cov)
        Kff = prior_covariance(self.kernel, X, self.component_shape, self.latent_shape, full_cov)
        var = add_prior(Kff, change, full_cov)
        if self.num_latent is not None:
            mean, var = mean.mT, (var if full_cov else var.mT)
        if cross is None:
            return mean, var
        Bc = moments[2]
        if self.component_shape:
            Bc = namespace(Bc).sum(Bc, axis=tuple(range(len(self.component_shape))))
        return mean, var, Bc

    def _updates(self, X, full_cov=False, cross=None):
        """The strategy's per-component mean and change to the prior covariance (and ``B^T cross``)."""
        Kfu = _latent_axes(Kuf(self.features, self.kernel, X), self.component_shape, self.latent_shape)
        if self.strategy.whiten and "Luu" not in self.__dict__:
            K = _latent_axes(Kuu(self.features, self.kernel), self.component_shape, self.latent_shape)
            if K is not None:  # the factor (cached as Luu) and q(f) from Kuu as one differentiated step
                self.__dict__["Luu"], moments = whitened_update(K, Kfu, self.q, self.jitter, self.cholesky_dtype,
                                                                full_cov, cross)
                return moments
        return self.strategy.update(Kfu, self.Luu, self.q, full_cov, cross)

    def component_marginals(self, X):
        """``q(g_t(X))`` of each component of ``g = sum_t g_t`` (the zero-mean GP): mean and
        variance ``component_shape + latent_shape + (N,)``, the prior variance of each from
        :data:`~sparsegp_common.features.component_variances`."""
        mean, change = self._updates(X)
        Kff = component_variances(self.features, self.kernel, X)
        Kff = namespace(Kff).reshape(Kff, tuple(Kff.shape[:-1]) + (1,) * len(self.latent_shape) + tuple(Kff.shape[-1:]))
        return mean, add_prior(Kff, change)


def _factor(prior, features, kernel):
    K = _latent_axes(Kuu(features, kernel), prior.component_shape, prior.latent_shape)
    return None if K is None else cholesky(K, prior.jitter, dtype=prior.cholesky_dtype)


def _latent_axes(K, component_shape, latent_shape):
    """Covariances with the component axes only (the features do not know ``num_latent``) get the
    latent axes after them: ``component_shape + (1,) * len(latent_shape) + (M, ...)``."""
    if K is None or not component_shape or not latent_shape or K.ndim != len(component_shape) + 2:
        return K
    shape = tuple(K.shape)
    return namespace(K).reshape(K, shape[: len(component_shape)] + (1,) * len(latent_shape) + shape[-2:])
