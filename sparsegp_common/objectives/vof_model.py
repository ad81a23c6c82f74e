"""The objectives of variational orthogonal features (Burt, Rasmussen & van der Wilk, 2020): unbiased
estimates of the data term from two independent frequency sets (:func:`collapsed_moments`, ``u``
integrated out; :func:`sampled_moments`, given ``u``), and :class:`VOFModel`, the GP model whose
data term they are. The features are in :mod:`sparsegp_common.features.orthogonal`."""
from sparsegp_common.dispatch import Dispatcher
from sparsegp_common.features import Kuf
from sparsegp_common.features.orthogonal import HermiteFeatures, SpectralFeatures, spectral_terms
from sparsegp_common.objectives import data_scale
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors.svgp import SVGP
from sparsegp_common.variational import PointMass
from sparsegp_common.variational.conditionals import conditional


def collapsed_moments(terms1, terms2, q, Kff):
    """Unbiased estimates of the Gaussian ELBO's ``mu_n``, ``mu_n^2``, ``sigma_n^2`` from two
    independent sets, packed as ``(mean, var)`` with ``mean = (mu1 + mu2) / 2`` and
    ``var = sigma^2 + mu1 mu2 - mean^2``: then ``(y - mean)^2 + var`` is unbiased for
    ``(y - mu)^2 + sigma^2``, so ``Gaussian.expected_log_prob(y, mean, var)`` is an unbiased ELBO
    term. ``var`` may be negative (never clamp it in training). Cost O(N T^2 + T^2 M (+ T M^2)).

    Args:
        terms1, terms2: ``(A (N, T), Phi (T, M))`` of each set (:func:`spectral_terms`).
        q: ``q(u)``, a family of :mod:`~sparsegp_common.variational` with ``q_mu`` ``(M,)``;
            Kff: ``(N,)``.
    """
    (A1, P1), (A2, P2) = terms1, terms2
    xp = namespace(A1, q.q_mu)
    mu1, mu2 = A1 @ (P1 @ q.q_mu), A2 @ (P2 @ q.q_mu)
    G = q.covariance_change(P1, P2)
    mean = 0.5 * (mu1 + mu2)
    return mean, Kff + xp.sum((A1 @ G) * A2, axis=-1) + mu1 * mu2 - mean**2


def sampled_moments(terms1, terms2, u, Kff):
    """As :func:`collapsed_moments` for a sampled ``u`` ``(M,)``: estimates of ``a_n^T u``,
    ``(a_n^T u)^2`` and ``k_nn - |a_n|^2`` (the variance of ``f_n`` given ``u``)."""
    (A1, P1), (A2, P2) = terms1, terms2
    xp = namespace(A1, u)
    h1, h2 = A1 @ (P1 @ u), A2 @ (P2 @ u)
    mean = 0.5 * (h1 + h2)
    return mean, h1 * h2 - mean**2 + Kff - xp.sum((A1 @ (P1 @ P2.mT)) * A2, axis=-1)


def estimated_moments(prior, X, u=None, key=None):
    """``(mean, var)`` of the data term of a VOF prior at ``X`` ``(N, D)``, given ``u`` or
    integrated over ``q(u)`` (``u=None``): exact for Hermite features, else from two fresh
    independent frequency sets drawn from ``key`` (see the module docstring). The prior's
    parameters must be readable (Pyro: under its parameter context; NumPyro: bound)."""
    return data_moments(prior.features, prior, X, u, key)


#: ``data_moments(features, prior, X, u, key)``: :func:`estimated_moments` by the type of the features.
#: Where the moments are estimates, the mean function shifts the estimate of ``E[f]`` and the
#: second moment's estimate stays unbiased.
data_moments = Dispatcher("data_moments")


@data_moments.register(HermiteFeatures)
def _hermite_moments(features, prior, X, u, key):
    """Exact: ``q(f)`` (``u`` integrated out), or ``f`` given ``u`` (``Kff - |Kuf|^2 >= 0``, ``Kuu = I``)."""
    if u is None:
        return prior.posterior().marginals(X)
    Kff = prior.kernel.K_diag(X)
    K = Kuf(features, prior.kernel, X)
    mean, var = conditional(K, None, Kff, PointMass(u))
    # floored at Kff's round-off, not at 0: the quadrature's sqrt then has a finite derivative
    return prior.plus_mean_function(mean, X), namespace(var).maximum(var, namespace(K).finfo(K.dtype).eps * Kff)


@data_moments.register(SpectralFeatures)
def _spectral_moments(features, prior, X, u, key):
    """From two independent frequency sets drawn from ``key``."""
    Kff = prior.kernel.K_diag(X)
    keys = backend(X).split(features._sites.key(key), 2)
    sets = [spectral_terms(features, prior.kernel, *features.frequencies(k, X.dtype, device(X)), X) for k in keys]
    if u is None:
        mean, var = collapsed_moments(*sets, prior.family(prior.q_mu, prior.q_sqrt), Kff)
    else:
        mean, var = sampled_moments(*sets, u, Kff)
    return prior.plus_mean_function(mean, X), var


class VOFModel:
    """``y_n ~ likelihood(f(x_n))`` with an ``SVGP`` prior on variational orthogonal features.

    Same arguments, prediction, sampled pair and ArviZ export as ``GPModel``; two objectives:

    * :meth:`model`/:meth:`guide`: ``u`` is sampled from ``q(u)`` in the guide and the data
      factor ``y`` is an unbiased estimate of ``E[log p(y_n | f_n) | u]`` (two independent
      frequency sets; exact for Hermite features); the KL is the closed-form factor
      ``<name>.kl``. Works with ``Trace_ELBO`` and ``TraceMeanField_ELBO``.
    * :meth:`elbo` (and the loss :class:`CollapsedELBO`): ``u`` integrated out, the
      lower-variance estimator of the paper (exact for Hermite features).

    Monte Carlo features need the ``Gaussian`` likelihood: only its expected log-likelihood is
    linear in ``mu``, ``mu^2`` and ``sigma^2``, which is what makes the estimate unbiased.
    Hermite features take any likelihood.
    """

    _gaussian = None  # the backend's Gaussian likelihood class

    def __init__(self, prior, likelihood, num_data=None):
        if not isinstance(prior, SVGP) or not isinstance(prior.features, (HermiteFeatures, SpectralFeatures)):
            raise TypeError("prior must be an SVGP on HermiteFeatures, FourierFeatures or LegendreFeatures")
        if prior.num_latent is not None:
            raise ValueError("VOFModel supports one latent function (num_latent=None)")
        if isinstance(prior.features, SpectralFeatures) and not isinstance(likelihood, self._gaussian):
            raise TypeError(
                f"{type(prior.features).__name__} estimate Kuf by Monte Carlo, which gives an unbiased ELBO only "
                f"for the Gaussian likelihood (linear in mu, mu^2 and sigma^2), not {type(likelihood).__name__}; "
                "use HermiteFeatures (closed-form Kuf) for other likelihoods"
            )
        super().__init__(prior, likelihood, num_data)

    def model(self, X, y=None, subsample_size=None):
        """Args as ``GPModel.model``, but ``y`` is required (the data term is a factor)."""
        if y is None:
            raise ValueError("VOFModel.model needs y (its data term is an estimate); use sampled_model to simulate")
        return super().model(X, y, subsample_size)

    def _observe(self, prior, likelihood, posterior, u, X, y):
        mean, var = estimated_moments(prior, X, u)
        self._sites.factor("y", likelihood.expected_log_prob(y, mean, var))

    def elbo(self, X, y, key=None):
        """The collapsed estimate (full batch, scaled to ``num_data``), a differentiable scalar;
        NumPyro draws the frequencies from ``key`` (default ``numpyro.prng_key()``)."""
        X, y = self._data(X, y)
        with self._sites.bound(self.prior, self.likelihood) as (prior, likelihood):
            mean, var = estimated_moments(prior, X, key=key)
            scale = data_scale(self.num_data, X.shape[0])
            return scale * namespace(X).sum(likelihood.expected_log_prob(y, mean, var)) - prior.posterior().kl()


def collapsed_owner(model, kwargs):
    """The :class:`VOFModel` whose ``model`` method a collapsed loss was given."""
    owner = getattr(model, "__self__", None)
    if not isinstance(owner, VOFModel):
        raise TypeError("CollapsedELBO needs model=vof_model.model for a VOFModel")
    if kwargs:
        raise ValueError(f"CollapsedELBO takes external minibatches only, got {sorted(kwargs)}")
    return owner
