"""Observation models p(y | f).

Each likelihood is usable two ways:

* as an ordinary observation distribution, ``pyro.sample("y", likelihood(f), obs=y)``;
* through its expected log-likelihood under ``q(f) = N(mean, var)``,
  ``expected_log_prob(y, mean, var)`` (shape ``(N,)``), the data term of the SVGP ELBO. It is
  in closed form for ``Gaussian`` and ``Poisson(link="exp")``, by Gauss-Hermite quadrature with
  ``num_gauss_hermite`` nodes otherwise, and by a Monte Carlo average of ``num_samples``
  reparameterised draws when ``num_samples`` is given (the only option for ``Softmax``).

``f`` has shape ``(N,)``, or ``(N, C)`` for ``Softmax``.
"""
import math

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch.distributions import constraints

from . import checks
from .params import Parameterized
from .quadrature import gauss_hermite, monte_carlo


def log_softplus(f):
    """``log(softplus(f))`` without underflow for very negative ``f``."""
    return torch.where(f < -20, f, torch.log(F.softplus(f.clamp_min(-20))))


class Likelihood(Parameterized):
    """Base class. ``num_latent`` is the number of latent functions per observation (None: one)."""

    num_latent = None
    support = constraints.real

    def __init__(self, *, num_gauss_hermite=20, num_samples=None, name="likelihood"):
        super().__init__(name)
        self.num_gauss_hermite = checks.positive_int(num_gauss_hermite, "num_gauss_hermite")
        self.num_samples = None if num_samples is None else checks.positive_int(num_samples, "num_samples")

    def forward(self, f):
        """The distribution of ``y`` given latent values ``f``."""
        raise NotImplementedError

    def log_prob(self, y, f):
        """``log p(y | f)``, elementwise with broadcasting."""
        return self(f).log_prob(y)

    def expected_log_prob(self, y, mean, var):
        """``E[log p(y | f)]`` under ``f ~ N(mean, var)``, per observation: shape ``(N,)``."""
        if self.num_samples is not None:
            return monte_carlo(lambda f: self.log_prob(y, f), mean, var, self.num_samples)
        return self._expected_log_prob(y, mean, var)

    def _expected_log_prob(self, y, mean, var):
        return gauss_hermite(lambda f: self.log_prob(y.unsqueeze(-1), f), mean, var, self.num_gauss_hermite)

    def predictive_moments(self, mean, var):
        """Mean and variance of ``y`` under ``p(y) = int p(y | f) N(f | mean, var) df``, per
        observation: ``E[y] = E[E[y | f]]`` and ``Var[y] = E[Var[y | f]] + Var[E[y | f]]``, by
        Gauss-Hermite quadrature unless in closed form."""
        n = self.num_gauss_hermite
        first = gauss_hermite(lambda f: self.forward(f).mean, mean, var, n)
        second = gauss_hermite(lambda f: self.forward(f).mean ** 2 + self.forward(f).variance, mean, var, n)
        return first, (second - first**2).clamp_min(0)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000):
        """Quantiles ``(Q, N)`` of ``p(y)`` at ``levels`` ``(Q,)``, from ``num_samples`` draws of ``y``."""
        f = mean + var.sqrt() * torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device)
        method = "linear" if self.support is constraints.real else "lower"  # stay on a discrete support
        return torch.quantile(self.forward(f).sample().to(mean.dtype), levels, dim=0, interpolation=method)

    def check_y(self, y, like=None):
        """Validate observations; returns them as a tensor (dtype/device of ``like``)."""
        return checks.finite(checks.as_tensor(y, "y", like), "y")


class Gaussian(Likelihood):
    """``y ~ N(f, variance)``; closed-form expected log-likelihood (Hensman et al., 2013)."""

    def __init__(self, variance=1.0, **kwargs):
        super().__init__(**kwargs)
        self._param("variance", checks.positive(variance, "variance"), constraints.positive)

    def forward(self, f):
        return dist.Normal(f, self.variance.sqrt())

    def log_prob(self, y, f):
        return -0.5 * (torch.log(2 * math.pi * self.variance) + (y - f) ** 2 / self.variance)

    def _expected_log_prob(self, y, mean, var):
        return -0.5 * (torch.log(2 * math.pi * self.variance) + ((y - mean) ** 2 + var) / self.variance)

    def predictive_moments(self, mean, var):
        return mean, var + self.variance

    def predictive_quantiles(self, mean, var, levels, num_samples=1000):
        return dist.Normal(mean, (var + self.variance).sqrt()).icdf(levels.unsqueeze(-1))


class Poisson(Likelihood):
    """``y ~ Poisson(link(f))`` with ``link`` ``"exp"`` (closed form) or ``"softplus"``."""

    support = constraints.nonnegative_integer

    def __init__(self, link="exp", **kwargs):
        super().__init__(**kwargs)
        self.link = checks.one_of(link, "link", ("exp", "softplus"))

    def rate(self, f):
        return torch.exp(f) if self.link == "exp" else F.softplus(f)

    def forward(self, f):
        return dist.Poisson(self.rate(f))

    def log_prob(self, y, f):
        log_rate = f if self.link == "exp" else log_softplus(f)
        return y * log_rate - self.rate(f) - torch.lgamma(y + 1)

    def _expected_log_prob(self, y, mean, var):
        if self.link == "exp":
            return y * mean - torch.exp(mean + var / 2) - torch.lgamma(y + 1)
        return super()._expected_log_prob(y, mean, var)

    def predictive_moments(self, mean, var):
        if self.link == "exp":  # log-normal rate: E = exp(m + v/2), Var = E + (e^v - 1) E^2
            rate = torch.exp(mean + var / 2)
            return rate, rate + torch.expm1(var) * rate**2
        return super().predictive_moments(mean, var)

    def check_y(self, y, like=None):
        y = checks.integer_valued(super().check_y(y, like), "y")
        if not bool((y >= 0).all()):
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
        return dist.Bernoulli(probs=torch.special.ndtr(f))

    def log_prob(self, y, f):
        signed = (2 * y - 1) * f
        return -F.softplus(-signed) if self.link == "logit" else torch.special.log_ndtr(signed)

    def check_y(self, y, like=None):
        y = super().check_y(y, like)
        if not bool(((y == 0) | (y == 1)).all()):
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
            torch.lgamma((df + 1) / 2)
            - torch.lgamma(df / 2)
            - 0.5 * torch.log(df * math.pi)
            - torch.log(scale)
            - (df + 1) / 2 * torch.log1p(z**2 / df)
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
        index = y.long().expand(f.shape[:-1]).unsqueeze(-1)
        return f.gather(-1, index).squeeze(-1) - torch.logsumexp(f, -1)

    def predictive_moments(self, mean, var):
        """Class probabilities ``(N, C)`` (Monte Carlo, ``num_samples`` draws) and their ``p (1 - p)``."""
        probs = monte_carlo(lambda f: torch.softmax(f, -1), mean, var, self.num_samples)
        return probs, probs * (1 - probs)

    def predictive_quantiles(self, mean, var, levels, num_samples=1000):
        raise ValueError("quantiles are not defined for class labels; use the class probabilities (the mean)")

    def check_y(self, y, like=None):
        y = checks.integer_valued(super().check_y(y, like), "y")
        if not bool(((y >= 0) & (y < self.num_latent)).all()):
            raise ValueError(f"y must hold class labels in 0..{self.num_latent - 1}")
        return y.long()
