"""Observation models p(y | f).

Each likelihood is usable two ways:

* as an ordinary observation distribution, ``numpyro.sample("y", likelihood(f), obs=y)``;
* through its expected log-likelihood under ``q(f) = N(mean, var)``,
  ``expected_log_prob(y, mean, var)`` (shape ``(N,)``), the data term of the SVGP ELBO. It is
  in closed form for ``Gaussian`` and ``Poisson(link="exp")``, by Gauss-Hermite quadrature with
  ``num_gauss_hermite`` nodes otherwise, and by a Monte Carlo average of ``num_samples``
  reparameterised draws when ``num_samples`` is given (the only option for ``Softmax``).

``f`` has shape ``(N,)``, or ``(N, C)`` for ``Softmax``.
"""
import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import gammaln, log_ndtr, ndtr
from numpyro.distributions import constraints

from . import checks
from .params import Parameterized
from .quadrature import gauss_hermite, monte_carlo


def log_softplus(f):
    """``log(softplus(f))`` without underflow for very negative ``f``."""
    return jnp.where(f < -20, f, jnp.log(jax.nn.softplus(jnp.maximum(f, -20))))


def _key(key):
    key = numpyro.prng_key() if key is None else key
    if key is None:
        raise ValueError("Monte Carlo estimates need `key` or a numpyro seed handler")
    return key


class Likelihood(Parameterized):
    """Base class. ``num_latent`` is the number of latent functions per observation (None: one)."""

    num_latent = None
    support = constraints.real

    def __init__(self, *, num_gauss_hermite=20, num_samples=None, name="likelihood"):
        super().__init__(name)
        self.num_gauss_hermite = checks.positive_int(num_gauss_hermite, "num_gauss_hermite")
        self.num_samples = None if num_samples is None else checks.positive_int(num_samples, "num_samples")

    def __call__(self, f):
        """The distribution of ``y`` given latent values ``f``."""
        return self.bind().forward(f)

    def forward(self, f):
        raise NotImplementedError

    def log_prob(self, y, f):
        """``log p(y | f)``, elementwise with broadcasting."""
        return self.forward(f).log_prob(y)

    def expected_log_prob(self, y, mean, var, key=None):
        """``E[log p(y | f)]`` under ``f ~ N(mean, var)``, per observation: shape ``(N,)``.

        The Monte Carlo option draws from ``key``, or from ``numpyro.prng_key()``."""
        if self.num_samples is not None:
            return monte_carlo(lambda f: self.log_prob(y, f), mean, var, self.num_samples, _key(key))
        return self._expected_log_prob(y, mean, var)

    def _expected_log_prob(self, y, mean, var):
        return gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var, self.num_gauss_hermite)

    def predictive_moments(self, mean, var, key=None):
        """Mean and variance of ``y`` under ``p(y) = int p(y | f) N(f | mean, var) df``, per
        observation: ``E[y] = E[E[y | f]]`` and ``Var[y] = E[Var[y | f]] + Var[E[y | f]]``, by
        Gauss-Hermite quadrature unless in closed form (``key``: for Monte Carlo likelihoods)."""
        n = self.num_gauss_hermite
        first = gauss_hermite(lambda f: self.forward(f).mean, mean, var, n)
        second = gauss_hermite(lambda f: self.forward(f).mean ** 2 + self.forward(f).variance, mean, var, n)
        return first, jnp.maximum(second - first**2, 0)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        """Quantiles ``(Q, N)`` of ``p(y)`` at ``levels`` ``(Q,)``, from ``num_samples`` draws of ``y``."""
        key_f, key_y = jax.random.split(_key(key))
        f = mean + jnp.sqrt(var) * jax.random.normal(key_f, (num_samples,) + mean.shape, dtype=mean.dtype)
        method = "linear" if self.support is constraints.real else "lower"  # stay on a discrete support
        return jnp.quantile(self.forward(f).sample(key_y).astype(mean.dtype), levels, axis=0, method=method)

    def check_y(self, y, like=None):
        """Validate observations; returns them as an array (dtype of ``like``)."""
        return checks.finite(checks.as_array(y, "y", like), "y")


class Gaussian(Likelihood):
    """``y ~ N(f, variance)``; closed-form expected log-likelihood (Hensman et al., 2013)."""

    def __init__(self, variance=1.0, **kwargs):
        super().__init__(**kwargs)
        self._param("variance", checks.positive(variance, "variance"), constraints.positive)

    def forward(self, f):
        return dist.Normal(f, jnp.sqrt(self.variance))

    def log_prob(self, y, f):
        return -0.5 * (jnp.log(2 * math.pi * self.variance) + (y - f) ** 2 / self.variance)

    def _expected_log_prob(self, y, mean, var):
        return -0.5 * (jnp.log(2 * math.pi * self.variance) + ((y - mean) ** 2 + var) / self.variance)

    def predictive_moments(self, mean, var, key=None):
        return mean, var + self.variance

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        return dist.Normal(mean, jnp.sqrt(var + self.variance)).icdf(levels[:, None])


class Poisson(Likelihood):
    """``y ~ Poisson(link(f))`` with ``link`` ``"exp"`` (closed form) or ``"softplus"``."""

    support = constraints.nonnegative_integer

    def __init__(self, link="exp", **kwargs):
        super().__init__(**kwargs)
        self.link = checks.one_of(link, "link", ("exp", "softplus"))

    def rate(self, f):
        return jnp.exp(f) if self.link == "exp" else jax.nn.softplus(f)

    def forward(self, f):
        return dist.Poisson(self.rate(f))

    def log_prob(self, y, f):
        log_rate = f if self.link == "exp" else log_softplus(f)
        return y * log_rate - self.rate(f) - gammaln(y + 1)

    def _expected_log_prob(self, y, mean, var):
        if self.link == "exp":
            return y * mean - jnp.exp(mean + var / 2) - gammaln(y + 1)
        return super()._expected_log_prob(y, mean, var)

    def predictive_moments(self, mean, var, key=None):
        if self.link == "exp":  # log-normal rate: E = exp(m + v/2), Var = E + (e^v - 1) E^2
            rate = jnp.exp(mean + var / 2)
            return rate, rate + jnp.expm1(var) * rate**2
        return super().predictive_moments(mean, var)

    def check_y(self, y, like=None):
        y = checks.integer_valued(super().check_y(y, like), "y")
        if not checks.all_true(lambda a: a >= 0, y):
            raise ValueError("y must hold non-negative counts")
        return y


class Bernoulli(Likelihood):
    """``y ~ Bernoulli(sigmoid(f))`` (``link="logit"``) or ``Bernoulli(Phi(f))`` (``"probit"``); y in {0, 1}."""

    support = constraints.boolean

    def __init__(self, link="logit", **kwargs):
        super().__init__(**kwargs)
        self.link = checks.one_of(link, "link", ("logit", "probit"))

    def forward(self, f):
        if self.link == "logit":
            return dist.Bernoulli(logits=f)
        return dist.Bernoulli(probs=ndtr(f))

    def log_prob(self, y, f):
        signed = (2 * y - 1) * f
        return -jax.nn.softplus(-signed) if self.link == "logit" else log_ndtr(signed)

    def check_y(self, y, like=None):
        y = super().check_y(y, like)
        if not checks.all_true(lambda a: (a == 0) | (a == 1), y):
            raise ValueError("y must hold binary labels 0 or 1")
        return y


class StudentT(Likelihood):
    """``y ~ StudentT(df, loc=f, scale)``, robust regression."""

    def __init__(self, df=3.0, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self._param("df", checks.positive(df, "df"), constraints.positive)
        self._param("scale", checks.positive(scale, "scale"), constraints.positive)

    def forward(self, f):
        return dist.StudentT(self.df, f, self.scale)

    def log_prob(self, y, f):
        df, scale = self.df, self.scale
        z = (y - f) / scale
        return (
            gammaln((df + 1) / 2)
            - gammaln(df / 2)
            - 0.5 * jnp.log(df * math.pi)
            - jnp.log(scale)
            - (df + 1) / 2 * jnp.log1p(z**2 / df)
        )


class Softmax(Likelihood):
    """``y ~ Categorical(softmax(f))`` over ``num_classes`` latent functions, labels 0..C-1.

    The expected log-likelihood has no closed form and C-dimensional quadrature is too costly,
    so it is a Monte Carlo average of ``num_samples`` draws (default 100).
    """

    support = constraints.nonnegative_integer

    def __init__(self, num_classes, num_samples=100, **kwargs):
        super().__init__(num_samples=num_samples, **kwargs)
        self.num_latent = checks.positive_int(num_classes, "num_classes")

    def forward(self, f):
        return dist.Categorical(logits=f)

    def log_prob(self, y, f):
        index = jnp.broadcast_to(jnp.asarray(y, jnp.int32), f.shape[:-1])[..., None]
        return jnp.take_along_axis(f, index, -1)[..., 0] - jax.nn.logsumexp(f, -1)

    def predictive_moments(self, mean, var, key=None):
        """Class probabilities ``(N, C)`` (Monte Carlo, ``num_samples`` draws) and their ``p (1 - p)``."""
        probs = monte_carlo(lambda f: jax.nn.softmax(f, -1), mean, var, self.num_samples, _key(key))
        return probs, probs * (1 - probs)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        raise ValueError("quantiles are not defined for class labels; use the class probabilities (the mean)")

    def check_y(self, y, like=None):
        y = checks.integer_valued(super().check_y(y, like), "y")
        if not checks.all_true(lambda a: (a >= 0) & (a < self.num_latent), y):
            raise ValueError(f"y must hold class labels in 0..{self.num_latent - 1}")
        return y.astype(jnp.int32)
