"""A stand-alone GP model: a prior component observed through a likelihood."""
import contextlib

import numpyro
from numpyro import handlers

from . import checks, predict
from .distributions import ExpectedLikelihood
from .priors import GPPrior


class GPModel:
    """``y_n ~ likelihood(f(x_n))`` with ``f`` from a :class:`~numpyro_sparsegp.priors.GPPrior`.

    ``model``/``guide`` form a NumPyro model/guide pair whose ELBO is the uncollapsed sparse-GP
    bound ``(N / B) * sum_batch E_q[log p(y_n | f_n)] - KL[q(u) || p(u)]``, with the data term in
    closed form (Gaussian, Poisson-exp) or by quadrature, so the loss is deterministic for
    those likelihoods. It works with ``Trace_ELBO`` and ``TraceMeanField_ELBO``.

    Args:
        prior: the GP prior component (e.g. :class:`~numpyro_sparsegp.SVGP`).
        likelihood: a :class:`~numpyro_sparsegp.likelihoods.Likelihood`; its parameters are
            cast to the dtype of the prior.
        num_data: size of the full data set when ``model`` is given external minibatches; by
            default the length of ``X``.

    Sites: the prior's ``<name>.u`` and ``<name>.kl``, the plate ``data`` and the observed site ``y``.
    """

    def __init__(self, prior, likelihood, num_data=None):
        if not isinstance(prior, GPPrior):
            raise TypeError(f"prior must be a GPPrior, got {type(prior).__name__}")
        if prior.num_latent != likelihood.num_latent:
            raise ValueError(
                f"the likelihood needs num_latent={likelihood.num_latent} latent functions but the "
                f"prior has num_latent={prior.num_latent}"
            )
        self.num_data = None if num_data is None else checks.positive_int(num_data, "num_data")
        self.prior, self.likelihood = prior, likelihood.to(prior.first_parameter().dtype)

    def _data(self, X, y):
        X = checks.inputs(X, "X", self.prior.input_dim)
        if self.num_data is not None and X.shape[0] > self.num_data:
            raise ValueError(f"X has {X.shape[0]} rows, more than num_data={self.num_data}")
        if y is not None:
            y = checks.same_length(self.likelihood.check_y(y, like=X), X.shape[0])
        return X, y

    def _plate(self, n, subsample_size):
        """The data plate and a function selecting the rows of the batch it draws."""
        N = self.num_data or n
        if N == n:
            subsampled = subsample_size is not None and subsample_size < n
            return numpyro.plate("data", n, subsample_size=subsample_size, dim=-1), (
                lambda a, idx: a[idx] if subsampled and a is not None else a
            )
        if subsample_size is None:  # X is already a minibatch: scale instead of subsampling
            return _scaled_plate(n, N / n), lambda a, idx: a
        raise ValueError(f"subsample_size needs the full data set, but X has {n} rows and num_data={N}")

    def model(self, X, y=None, subsample_size=None):
        """Args: X ``(N, D)``; y ``(N,)`` or None to sample; subsample_size: minibatch size.
        Returns the observations (sampled or ``y``) of the batch."""
        X, y = self._data(X, y)
        plate, select = self._plate(X.shape[0], subsample_size)
        prior, likelihood = self.prior.bind(), self.likelihood.bind()
        posterior = prior.posterior()
        prior.sample_global_sites(posterior, guide=False)
        with plate as idx:
            mean, var, yb = *posterior.marginals(select(X, idx)), select(y, idx)
            return numpyro.sample("y", ExpectedLikelihood(likelihood, mean, var, obs=yb), obs=yb)

    def guide(self, X, y=None, subsample_size=None):
        prior = self.prior.bind()
        prior.sample_global_sites(prior.posterior(), guide=True)

    def sampled_model(self, X, y=None):
        """The model with ``f`` a sample site ``<name>.f`` and ``y ~ likelihood(f)``, full batch in
        the plate ``data``: the ELBO of this pair is the same in expectation, and its pointwise
        ``log p(y_n | f_n)`` is what diagnostics (LOO, WAIC) replay."""
        X, y = self._data(X, y)
        plate = numpyro.plate("data", X.shape[0], dim=-1)
        f = self.prior.model(X, plate)
        with plate:
            return numpyro.sample("y", self.likelihood(f), obs=y)

    def sampled_guide(self, X, y=None):
        """The guide of :meth:`sampled_model`."""
        X, _ = self._data(X, None)
        self.prior.guide(X, numpyro.plate("data", X.shape[0], dim=-1))

    def elbo(self, X, y, key=None):
        """The bound itself (full batch), as a differentiable scalar (``key`` for Monte Carlo likelihoods)."""
        X, y = self._data(X, y)
        prior, likelihood = self.prior.bind(), self.likelihood.bind()
        posterior = prior.posterior()
        mean, var = posterior.marginals(X)
        scale = (self.num_data or X.shape[0]) / X.shape[0]
        return scale * likelihood.expected_log_prob(y, mean, var, key=key).sum() - posterior.kl()

    def predict_f(self, X, full_cov=False, batch_size=4096, params=None):
        """Moments of ``q(f(X))``; see :func:`~numpyro_sparsegp.predict.predict_f`."""
        return predict.predict_f(self.prior, X, full_cov=full_cov, batch_size=batch_size, params=params)

    def predict_y(self, X, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
        """Predictive moments and quantiles of ``y``; see :func:`~numpyro_sparsegp.predict.predict_y`."""
        return predict.predict_y(self.prior, self.likelihood, X, quantiles=quantiles, batch_size=batch_size,
                                 num_samples=num_samples, seed=seed, params=params)

    def sample_f(self, X, num_samples=1, seed=0, params=None):
        """Joint posterior draws of ``f(X)``; see :func:`~numpyro_sparsegp.predict.sample_f`."""
        return predict.sample_f(self.prior, X, num_samples, seed=seed, params=params)


@contextlib.contextmanager
def _scaled_plate(size, scale):
    with handlers.scale(scale=scale), numpyro.plate("data", size, dim=-1) as idx:
        yield idx
