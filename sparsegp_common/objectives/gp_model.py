"""A stand-alone GP model: a prior component observed through a likelihood."""
from sparsegp_common.adapt import Documented
from sparsegp_common.objectives import data_plate, data_scale
from sparsegp_common.priors import GPPrior, marginals


class GPModel(Documented):
    """``y_n ~ likelihood(f(x_n))`` with ``f`` from a :class:`~sparsegp_common.priors.GPPrior`.

    ``model``/``guide`` form a model/guide pair whose ELBO is the uncollapsed sparse-GP bound
    ``(N / B) * sum_batch E_q[log p(y_n | f_n)] - KL[q(u) || p(u)]``, with the data term in
    closed form (Gaussian, Poisson-exp) or by quadrature, so the loss is deterministic for
    those likelihoods. It works with ``Trace_ELBO`` and ``TraceMeanField_ELBO``.

    Args:
        prior: the GP prior component (e.g. ``SVGP``).
        likelihood: a ``Likelihood``; its parameters follow the dtype (and device) of the prior.
        num_data: size of the full data set when ``model`` is given external minibatches; by
            default the length of ``X``.

    Sites: the prior's ``<name>.u`` and ``<name>.kl``, the plate ``data`` and the observed site ``y``.
    ``X`` is converted to the dtype (and device) of the prior's parameters, ``y`` ``(N,)`` to that
    of ``X``. Shapes are checked on every call, values on the rows a step uses, and all of them
    once by ``fit`` (:meth:`check_data`).
    """

    def __init__(self, prior, likelihood, num_data=None):
        super().__init__()
        if not isinstance(prior, GPPrior):
            raise TypeError(f"prior must be a GPPrior, got {type(prior).__name__}")
        if prior.num_latent != likelihood.num_latent:
            raise ValueError(
                f"the likelihood needs num_latent={likelihood.num_latent} latent functions but the "
                f"prior has num_latent={prior.num_latent}"
            )
        self.num_data = None if num_data is None else self._checks.positive_int(num_data, "num_data")
        likelihood._follow(prior.first_parameter())
        self.prior, self.likelihood = prior, likelihood

    def check_data(self, X, y=None):
        """Check all of ``X`` and ``y``, values included (``fit`` does, before its first step)."""
        self._data(X, y)

    def _data(self, X, y, values=True):
        """``X`` ``(N, D)`` and ``y`` ``(N,)`` as arrays; their values are checked only when
        ``values`` (else by :meth:`_batch`, on the rows a step uses)."""
        checks = self._checks
        X = checks.inputs(X, "X", self.prior.input_dim, values=values, like=self.prior.first_parameter())
        if self.num_data is not None and X.shape[0] > self.num_data:
            raise ValueError(f"X has {X.shape[0]} rows, more than num_data={self.num_data}")
        if y is not None:
            y = checks.observations(checks.as_array(y, "y", like=X), X.shape[0])
            if values:
                y = self.likelihood.check_y(y)
        return X, y

    def _batch(self, X, y):
        """The value checks of :meth:`_data` on one batch."""
        return self._checks.finite(X, "X"), None if y is None else self.likelihood.check_y(y, like=X)

    def _plate(self, X, subsample_size):
        return data_plate(self._sites, "data", X.shape[0], self.num_data, subsample_size, X)

    def model(self, X, y=None, subsample_size=None):
        """Args: X ``(N, D)``; y ``(N,)`` or None to sample; subsample_size: minibatch size.
        Returns the observations (sampled or ``y``) of the batch."""
        X, y = self._data(X, y, values=False)
        with self._sites.bound(self.prior, self.likelihood, hyperpriors=True) as (prior, likelihood):
            posterior, u = prior.sample_global_sites(prior.posterior(), guide=False)
            with self._plate(X, subsample_size) as select:
                return self._observe(prior, likelihood, posterior, u, *self._batch(select(X), select(y)))

    def _observe(self, prior, likelihood, posterior, u, X, y):
        """The observed site of one batch: ``y`` scored by ``E_q[log p(y | f)]``."""
        mean, var = self._sites.compiled(marginals, posterior, X)
        return self._sites.sample("y", self._expected_likelihood(likelihood, mean, var, obs=y), obs=y)

    def guide(self, X, y=None, subsample_size=None):
        with self._sites.bound(self.prior) as (prior,):
            prior.sample_global_sites(prior.posterior(), guide=True)

    def sampled_model(self, X, y=None):
        """The model with ``f`` a sample site ``<name>.f`` and ``y ~ likelihood(f)``, full batch in
        the plate ``data``: the ELBO of this pair is the same in expectation, and its pointwise
        ``log p(y_n | f_n)`` is what diagnostics (LOO, WAIC) replay."""
        X, y = self._data(X, y)
        plate = self._sites.plate("data", X.shape[0], like=X)
        f = self.prior.model(X, plate)
        with self._sites.bound(self.likelihood) as (likelihood,), plate:
            return self._sites.sample("y", likelihood.forward(f), obs=y)

    def sampled_guide(self, X, y=None):
        """The guide of :meth:`sampled_model`."""
        X, _ = self._data(X, None)
        self.prior.guide(X, self._sites.plate("data", X.shape[0], like=X))

    def elbo(self, X, y, key=None):
        """The bound itself (full batch), as a differentiable scalar (``key``: for Monte Carlo
        likelihoods with NumPyro)."""
        X, y = self._data(X, y)
        with self._sites.bound(self.prior, self.likelihood) as (prior, likelihood):
            posterior = prior.posterior()
            mean, var = posterior.marginals(X)
            scale = data_scale(self.num_data, X.shape[0])
            return scale * likelihood.expected_log_prob(y, mean, var, key=key).sum() - posterior.kl()

    def predict_f(self, X, full_cov=False, batch_size=4096, part="f", params=None):
        """Moments of ``q(f(X))`` (``part``: ``"f"``, the mean function's ``"mean"``, the GP's
        ``"gp"`` or its ``"components"``); see the backend's ``predict.predict_f``."""
        return self._predict.predict_f(self.prior, X, full_cov=full_cov, batch_size=batch_size, part=part,
                                       params=params)

    def predict_y(self, X, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
        """Predictive moments and quantiles of ``y``; see the backend's ``predict.predict_y``."""
        return self._predict.predict_y(self.prior, self.likelihood, X, quantiles=quantiles, batch_size=batch_size,
                                       num_samples=num_samples, seed=seed, params=params)

    def sample_f(self, X, num_samples=1, seed=0, params=None):
        """Joint posterior draws of ``f(X)``; see the backend's ``predict.sample_f``."""
        return self._predict.sample_f(self.prior, X, num_samples, seed=seed, params=params)
