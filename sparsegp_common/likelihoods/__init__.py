"""Observation models p(y | f), written once for every backend.

Each likelihood is usable two ways:

* as an ordinary observation distribution, ``pyro.sample("y", likelihood(f), obs=y)``
  (``numpyro.sample`` alike);
* through its expected log-likelihood under ``q(f) = N(mean, var)``,
  ``expected_log_prob(y, mean, var)`` (shape ``(N,)``), the data term of the SVGP ELBO. It is
  in closed form for ``Gaussian`` and ``Poisson(link="exp")``; for ``Bernoulli(link="logit")``
  by Gauss-Hermite below variance 3 and above it by an exact split with Gauss-Laguerre for the
  bend at 0; for the other likelihoods by Gauss-Hermite quadrature with ``num_gauss_hermite``
  nodes where ``q(f)`` is narrow next to the bend of ``log p(y | f)``, and by a graded
  Gauss-Legendre rule where it is wide (both within 1e-6 relative at variances up to 100); and
  by a Monte Carlo average of ``num_samples`` reparameterised draws when ``num_samples`` is
  given (the only option for ``Softmax``).

``f`` has shape ``(N,)``, or ``(N, C)`` for ``Softmax``.

Random draws (Monte Carlo estimates, predictive quantiles) take ``key``: with NumPyro a JAX PRNG
key, by default ``numpyro.prng_key()`` (under a seed handler); with Pyro torch's global RNG
(seed it with ``pyro.set_rng_seed``), and ``key`` stays None.
"""
import math

from sparsegp_common import checks
from sparsegp_common.likelihoods.quadrature import expectation, expected_log_sigmoid, gauss_hermite, monte_carlo
from sparsegp_common.ops import backend, namespace


def log_softplus(f):
    """``log(softplus(f))`` without underflow for very negative ``f``."""
    xp = namespace(f)
    return xp.where(f < -20, f, xp.log(backend(f).softplus(xp.clip(f, min=-20.0))))


class _Support:
    """The support constraint ``name`` of the backend's ``constraints`` module."""

    def __init__(self, name):
        self.name = name

    def __get__(self, obj, cls):
        dist = getattr(cls, "_dist", None)  # None on the core class itself
        return self if dist is None else getattr(dist.constraints, self.name)


class Likelihood:
    """Base class. ``num_latent`` is the number of latent functions per observation (None: one)."""

    num_latent = None
    support = _Support("real")

    def __init__(self, *, num_gauss_hermite=20, num_samples=None, name="likelihood"):
        super().__init__(name)
        self.num_gauss_hermite = checks.positive_int(num_gauss_hermite, "num_gauss_hermite")
        self.num_samples = None if num_samples is None else checks.positive_int(num_samples, "num_samples")

    def forward(self, f):
        """The distribution of ``y`` given latent values ``f``."""
        raise NotImplementedError

    def log_prob(self, y, f):
        """``log p(y | f)``, elementwise with broadcasting."""
        return self.forward(f).log_prob(y)

    def expected_log_prob(self, y, mean, var, key=None):
        """``E[log p(y | f)]`` under ``f ~ N(mean, var)``, per observation: shape ``(N,)``.

        The Monte Carlo option draws from ``key`` (see the module docstring)."""
        if self.num_samples is not None:
            return monte_carlo(lambda f: self.log_prob(y, f), mean, var, self.num_samples, self._sites.key(key))
        return self._expected_log_prob(y, mean, var)

    def _expected_log_prob(self, y, mean, var):
        return expectation(lambda f: self.log_prob(y[..., None], f), mean, var, self.num_gauss_hermite, self._bend(y))

    def _bend(self, y):
        """``(center, width)`` of the bend of ``log p(y | f)`` in ``f``: where it bends, and the
        distance from there to its nearest singularity off the real line (see
        :func:`~sparsegp_common.likelihoods.quadrature.expectation`); None where Gauss-Hermite suffices."""
        return None

    def predictive_moments(self, mean, var, key=None):
        """Mean and variance of ``y`` under ``p(y) = int p(y | f) N(f | mean, var) df``, per
        observation: ``E[y] = E[E[y | f]]`` and ``Var[y] = E[Var[y | f]] + Var[E[y | f]]``, by
        Gauss-Hermite quadrature unless in closed form (``key``: for Monte Carlo likelihoods)."""
        n = self.num_gauss_hermite
        first = gauss_hermite(lambda f: self.forward(f).mean, mean, var, n)
        second = gauss_hermite(lambda f: self.forward(f).mean ** 2 + self.forward(f).variance, mean, var, n)
        return first, namespace(first).clip(second - first**2, min=0.0)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        """Quantiles ``(Q, N)`` of ``p(y)`` at ``levels`` ``(Q,)``, from ``num_samples`` draws of ``y``."""
        xp, ops = namespace(mean, var), backend(mean, var)
        key_f, key_y = ops.split(self._sites.key(key), 2)
        f = mean + xp.sqrt(var) * ops.normal(key_f, (num_samples,) + tuple(mean.shape), mean)
        method = "linear" if self.support is self._dist.constraints.real else "lower"  # stay on a discrete support
        return ops.quantile(xp.astype(self._sites.draw(self.forward(f), key_y), mean.dtype), levels, 0, method)

    def check_y(self, y, like=None):
        """Check that the values of ``y`` are in the support (``ValueError`` naming the first that
        is not); returns them as an array (dtype and device of ``like``)."""
        return self._checks.finite(self._checks.as_array(y, "y", like), "y")


class Gaussian(Likelihood):
    """``y ~ N(f, variance)``; closed-form expected log-likelihood (Hensman et al., 2013)."""

    def __init__(self, variance=1.0, **kwargs):
        super().__init__(**kwargs)
        self._param("variance", self._checks.positive(variance, "variance"), "positive")

    def forward(self, f):
        return self._dist.Normal(f, namespace(f, self.variance).sqrt(self.variance))

    def log_prob(self, y, f):
        xp = namespace(y, f, self.variance)
        return -0.5 * (xp.log(2 * math.pi * self.variance) + (y - f) ** 2 / self.variance)

    def _expected_log_prob(self, y, mean, var):
        xp = namespace(mean, var, self.variance)
        return -0.5 * (xp.log(2 * math.pi * self.variance) + ((y - mean) ** 2 + var) / self.variance)

    def predictive_moments(self, mean, var, key=None):
        return mean, var + self.variance

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        return self._dist.Normal(mean, namespace(var).sqrt(var + self.variance)).icdf(levels[..., None])


class Poisson(Likelihood):
    """``y ~ Poisson(link(f))`` with ``link`` ``"exp"`` (closed form) or ``"softplus"``."""

    support = _Support("nonnegative_integer")

    def __init__(self, link="exp", **kwargs):
        super().__init__(**kwargs)
        self.link = checks.one_of(link, "link", ("exp", "softplus"))

    def rate(self, f):
        return namespace(f).exp(f) if self.link == "exp" else backend(f).softplus(f)

    def forward(self, f):
        return self._dist.Poisson(self.rate(f))

    def log_prob(self, y, f):
        log_rate = f if self.link == "exp" else log_softplus(f)
        return y * log_rate - self.rate(f) - backend(y, f).lgamma(y + 1)

    def _expected_log_prob(self, y, mean, var):
        if self.link == "exp":
            return y * mean - namespace(mean).exp(mean + var / 2) - backend(y, mean).lgamma(y + 1)
        return super()._expected_log_prob(y, mean, var)

    def _bend(self, y):
        return 0.0, 3.0  # log softplus(f) is singular at +-i pi

    def predictive_moments(self, mean, var, key=None):
        if self.link == "exp":  # log-normal rate: E = exp(m + v/2), Var = E + (e^v - 1) E^2
            xp = namespace(mean, var)
            rate = xp.exp(mean + var / 2)
            return rate, rate + xp.expm1(var) * rate**2
        return super().predictive_moments(mean, var)

    def check_y(self, y, like=None):
        y = self._checks.integer_valued(super().check_y(y, like), "y")
        return self._checks.require(lambda a: a >= 0, y, "y", "y must hold non-negative counts")


class Bernoulli(Likelihood):
    """``y ~ Bernoulli(sigmoid(f))`` (``link="logit"``) or ``Bernoulli(Phi(f))`` (``"probit"``); y in {0, 1}."""

    support = _Support("boolean")

    def __init__(self, link="logit", **kwargs):
        super().__init__(**kwargs)
        self.link = checks.one_of(link, "link", ("logit", "probit"))

    def forward(self, f):
        if self.link == "logit":
            return self._dist.Bernoulli(logits=f)
        return self._dist.Bernoulli(probs=backend(f).ndtr(f))

    def log_prob(self, y, f):
        signed = (2 * y - 1) * f
        ops = backend(y, f)
        return -ops.softplus(-signed) if self.link == "logit" else ops.log_ndtr(signed)

    def _expected_log_prob(self, y, mean, var):
        if self.link == "logit":  # accurate for large variances too, where Gauss-Hermite is not
            return expected_log_sigmoid((2 * y - 1) * mean, var, self.num_gauss_hermite)
        return super()._expected_log_prob(y, mean, var)

    def _bend(self, y):
        return 0.0, 2.0  # log Phi(f) turns from -f^2 / 2 to 0 around 0; Phi has zeros at |f| ~ 3.4

    def check_y(self, y, like=None):
        return self._checks.require(lambda a: (a == 0) | (a == 1), super().check_y(y, like), "y",
                                    "y must hold binary labels 0 or 1")


class StudentT(Likelihood):
    """``y ~ StudentT(df, loc=f, scale)``, robust regression."""

    def __init__(self, df=3.0, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self._param("df", self._checks.positive(df, "df"), "positive")
        self._param("scale", self._checks.positive(scale, "scale"), "positive")

    def forward(self, f):
        return self._dist.StudentT(self.df, f, self.scale)

    def log_prob(self, y, f):
        df, scale = self.df, self.scale
        xp, ops = namespace(y, f, df), backend(y, f, df)
        z = (y - f) / scale
        return (
            ops.lgamma((df + 1) / 2)
            - ops.lgamma(df / 2)
            - 0.5 * xp.log(df * math.pi)
            - xp.log(scale)
            - (df + 1) / 2 * xp.log1p(z**2 / df)
        )

    def _bend(self, y):
        return y, self.scale * namespace(self.scale).sqrt(self.df)  # log1p(z^2 / df) is singular at z = +-i sqrt(df)


class Softmax(Likelihood):
    """``y ~ Categorical(softmax(f))`` over ``num_classes`` latent functions, labels 0..C-1.

    The expected log-likelihood has no closed form and C-dimensional quadrature is too costly,
    so it is a Monte Carlo average of ``num_samples`` draws (default 100).
    """

    support = _Support("nonnegative_integer")

    def __init__(self, num_classes, num_samples=100, **kwargs):
        super().__init__(num_samples=num_samples, **kwargs)
        self.num_latent = checks.positive_int(num_classes, "num_classes")

    def forward(self, f):
        return self._dist.Categorical(logits=f)

    def log_prob(self, y, f):
        xp, ops = namespace(f), backend(f)
        index = xp.broadcast_to(ops.as_index(y), tuple(f.shape[:-1]))[..., None]
        return xp.take_along_axis(f, index, axis=-1)[..., 0] - ops.logsumexp(f, -1)

    def predictive_moments(self, mean, var, key=None):
        """Class probabilities ``(N, C)`` (Monte Carlo, ``num_samples`` draws) and their ``p (1 - p)``."""
        softmax = backend(mean, var).softmax
        probs = monte_carlo(lambda f: softmax(f, -1), mean, var, self.num_samples, self._sites.key(key))
        return probs, probs * (1 - probs)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000, key=None):
        raise ValueError("quantiles are not defined for class labels; use the class probabilities (the mean)")

    def check_y(self, y, like=None):
        y = self._checks.integer_valued(super().check_y(y, like), "y")
        self._checks.require(lambda a: (a >= 0) & (a < self.num_latent), y, "y",
                             f"y must hold class labels in 0..{self.num_latent - 1}")
        return backend(y).as_index(y)


CLASSES = (Gaussian, Poisson, Bernoulli, StudentT, Softmax)
