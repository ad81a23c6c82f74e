"""Log-Gaussian Cox processes: point patterns whose log-intensity is a GP prior (any ``GPPrior``).

Events ``x_1..x_n`` in a window ``W`` form a Poisson process with intensity
``lambda(x) = exp(f(x) + offset(x))``. With ``q(f(x)) = N(mu(x), s2(x))`` from the prior's
``posterior().marginals``, the expected log-likelihood is in closed form up to the integral::

    E_q[log p(x_1..x_n | f)] = sum_i (mu(x_i) + offset(x_i)) - int_W exp(mu + s2 / 2 + offset) dx

since ``E_q[exp f] = exp(mu + s2 / 2)``; the integral is a Gauss-Legendre sum, an unbiased
stratified Monte Carlo estimate, or a user's rule (``sparsegp_common.windows``). The binned form
scores cell counts ``c_k ~ Poisson(|cell| lambda(centre_k))`` instead::

    sum_k c_k (log|cell| + mu_k + offset_k) - |cell| exp(mu_k + s2_k / 2 + offset_k) - log c_k!

which, less ``n log|cell|`` (a probability of counts, not a density of locations), tends to the
continuous form as the cells shrink.
"""
import contextlib
import numbers

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

from sparsegp_common import windows
from sparsegp_common.prediction import Prediction
from sparsegp_common.windows import (
    Binned,
    GaussLegendre,
    Interval,
    Rectangle,
    StratifiedMC,
    UserRule,
)

from . import checks, predict
from .params import active
from .priors import GPPrior

__all__ = ["Binned", "CoxEvents", "CoxProcess", "GaussLegendre", "Interval", "Rectangle", "StratifiedMC", "UserRule"]


def expected_intensity(mean, var, offset):
    """``E_q[exp(f + offset)] = exp(mean + var / 2 + offset)`` under ``f ~ N(mean, var)``."""
    return torch.exp(mean + var / 2 + offset)


def lognormal_summary(mean, var, levels):
    """Mean, variance and quantiles ``(Q, N)`` (or None) of ``exp(f)``, ``f ~ N(mean, var)``."""
    rate = torch.exp(mean + var / 2)
    q = None
    if levels is not None:
        z = torch.special.ndtri(torch.as_tensor(levels, dtype=mean.dtype, device=mean.device))
        q = torch.exp(mean + z.unsqueeze(-1) * var.sqrt())
    return rate, torch.expm1(var) * rate**2, q


class CoxEvents(TorchDistribution):
    """The observed pattern ``(n, d)`` of :meth:`CoxProcess.sampled_model`, scored per event.

    ``log_prob`` is ``log lambda(x_i) - Lambda / n`` (``Lambda = int_W lambda``): the terms sum
    to the log-likelihood of the pattern, and ``az.loo`` treats each event as one observation.
    ``sample()`` draws ``n`` events i.i.d. from the normalised intensity on the integration
    points (the distribution of a Poisson pattern given its size, discretised on the rule).

    Args:
        log_intensity: ``(n,)`` ``log lambda`` at the events.
        integral: ``()`` the integral ``Lambda``.
        points: ``(P, d)`` integration points.
        log_masses: ``(P,)`` ``log(weight_j lambda(points_j))``.
    """

    arg_constraints = {}
    support = constraints.real_vector

    def __init__(self, log_intensity, integral, points, log_masses, validate_args=None):
        self.log_intensity, self.integral, self.points, self.log_masses = log_intensity, integral, points, log_masses
        super().__init__(log_intensity.shape, points.shape[-1:], validate_args=validate_args)

    def log_prob(self, value):
        return self.log_intensity - self.integral / self.log_intensity.shape[-1]

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            shape = torch.Size(sample_shape) + self.log_intensity.shape
            index = torch.distributions.Categorical(logits=self.log_masses).sample(shape)
            return self.points[index]


class CoxProcess(torch.nn.Module):
    """A log-Gaussian Cox process on ``window`` with log-intensity ``f + offset``, ``f`` from ``prior``.

    ``model``/``guide`` form a Pyro model/guide pair whose ELBO is
    ``(n / B) sum_batch E_q[f(x_i) + offset] - int_W E_q[exp(f + offset)] - KL`` (see the module
    docstring); it is deterministic for fixed rules and unbiased for :class:`StratifiedMC`.

    Args:
        prior: a :class:`~pyro_sparsegp.priors.GPPrior` with one latent function; only its
            ``posterior()`` (``marginals``, ``kl``) is used, so every prior works.
        window: an ``Interval``, ``Rectangle`` or ``UserRule`` (``sparsegp_common.windows``), or
            bounds ``(d, 2)`` such as ``PointPattern.window``.
        integration: ``GaussLegendre(n)``, ``StratifiedMC(n)`` or ``Binned(n)`` (n per
            dimension); None: Gauss-Legendre with 64 nodes in 1-D, 32 x 32 in 2-D.
        offset: a number, or a function ``offset(X (N, d)) -> (N,)`` of known log-intensity
            terms (covariates, log exposure). Set it near ``log(n / |W|)``: the prior is zero-mean.
        num_events: size of the whole pattern when ``model`` is given external minibatches of
            events; by default the number of events passed.
        integration_batch: evaluate the integral on this many of the rule's points drawn at
            random each step (weights scaled up; unbiased); None: all of them.
        name: name of the events plate and prefix of the sites.

    Sites: the prior's ``<name>.u``/``<name>.kl``; the plate ``<name>``, the factors
    ``<name>.log_intensity`` (per event) and ``<name>.integral``; binned: ``<name>.counts``.
    """

    def __init__(self, prior, window, integration=None, offset=0.0, num_events=None, integration_batch=None,
                 name="events"):
        super().__init__()
        if not isinstance(prior, GPPrior):
            raise TypeError(f"prior must be a GPPrior, got {type(prior).__name__}")
        if prior.num_latent is not None:
            raise ValueError(f"a Cox process needs one latent function, but the prior has num_latent={prior.num_latent}")
        self.window = windows.as_window(window)
        if prior.input_dim != self.window.dim:
            raise ValueError(f"the window is {self.window.dim}-D but the prior takes {prior.input_dim}-D inputs")
        self.rule = windows.as_rule(integration, self.window)
        self.layout = windows.rule_layout(self.rule, self.window)
        if not (callable(offset) or (isinstance(offset, numbers.Real) and np.isfinite(offset))):
            raise TypeError(f"offset must be a finite number or a function of X, got {offset!r}")
        self.offset = offset
        self.num_events = None if num_events is None else checks.positive_int(num_events, "num_events")
        self.integration_batch = None
        if integration_batch is not None:
            self.integration_batch = checks.positive_int(integration_batch, "integration_batch")
            if self.integration_batch > len(self.layout.weights):
                raise ValueError(f"integration_batch={integration_batch} exceeds the rule's "
                                 f"{len(self.layout.weights)} points")
        self.prior, self.name = prior, name

    # ------------------------------------------------------------ pieces of the objective

    def _tensor(self, a):
        like = self.prior.first_parameter()
        return torch.as_tensor(a, dtype=like.dtype, device=like.device)

    def _offset(self, X):
        if callable(self.offset):
            return checks.as_tensor(self.offset(X), "offset(X)", like=X).expand(X.shape[:1])
        return X.new_full(X.shape[:1], float(self.offset))

    def _events(self, events, full=False):
        events = checks.inputs(events, "events", self.window.dim).to(self.prior.first_parameter())
        windows.check_events(events.detach().cpu().numpy(), self.window)
        if self.num_events is not None and events.shape[0] > self.num_events:
            raise ValueError(f"events has {events.shape[0]} rows, more than num_events={self.num_events}")
        if (full or self.rule.binned) and self.num_events not in (None, events.shape[0]):
            raise ValueError("this form needs the whole pattern: drop num_events or pass all events")
        return events

    def _points(self, random=None):
        """Integration points ``(P', d)``, weights ``(P',)`` and the selected indices (or None)."""
        layout = self.layout
        points, weights = self._tensor(layout.points), self._tensor(layout.weights)
        if self.rule.random if random is None else random:  # one uniform point per cell
            points = points + torch.rand(points.shape, dtype=points.dtype, device=points.device) * self._tensor(layout.widths)
        elif self.rule.random:  # a fixed stand-in: the cells' midpoints
            points = points + self._tensor(layout.widths) / 2
        if self.integration_batch is None or random is False:
            return points, weights, None
        index = torch.randperm(len(weights), device=points.device)[: self.integration_batch]
        return points[index], weights[index] * (len(weights) / self.integration_batch), index

    def _integral(self, posterior):
        """``sum_j w_j E_q[lambda(points_j)]``: the rule's estimate of ``int_W E_q[lambda]``."""
        points, weights, _ = self._points()
        return (weights * expected_intensity(*posterior.marginals(points), self._offset(points))).sum()

    def counts(self, events):
        """Events per cell of a :class:`~sparsegp_common.windows.Binned` rule: ``(P,)``."""
        layout = self.layout
        cells = torch.floor((events - self._tensor(layout.low)) / self._tensor(layout.widths)).long()
        cells = torch.minimum(cells.clamp_min(0), torch.as_tensor(layout.shape, device=cells.device) - 1)
        flat = cells @ torch.as_tensor(layout.strides, device=cells.device)
        return torch.zeros(len(layout.weights), dtype=events.dtype, device=events.device).index_add_(
            0, flat, torch.ones_like(flat, dtype=events.dtype))

    def _binned(self, posterior, events):
        """``sum_k E_q[log Poisson(c_k | |cell| lambda(centre_k))]``, over a random subset of cells
        (scaled) when ``integration_batch`` is set."""
        points, weights, index = self._points()
        counts = self.counts(events) if index is None else self.counts(events)[index]
        scale = 1.0 if index is None else len(self.layout.weights) / len(index)
        mean, var = posterior.marginals(points)
        offset = self._offset(points)
        cell = weights / scale
        terms = counts * (torch.log(cell) + mean + offset) - cell * expected_intensity(mean, var, offset) - torch.lgamma(counts + 1)
        return scale * terms.sum()

    def _plate(self, n, subsample_size, device):
        """The events plate and a function selecting the rows of the batch it draws."""
        N = self.num_events or n
        if N == n:
            subsampled = subsample_size is not None and subsample_size < n
            return pyro.plate(self.name, n, subsample_size=subsample_size, dim=-1, device=device), (
                lambda a, idx: a[idx] if subsampled else a)
        if subsample_size is None:  # events is already a minibatch: scale instead of subsampling
            return _scaled_plate(self.name, n, N / n), lambda a, idx: a
        raise ValueError(f"subsample_size needs the whole pattern, but events has {n} rows and num_events={N}")

    # ------------------------------------------------------------ model / guide

    def model(self, events, subsample_size=None):
        """Args: events ``(n, d)`` (the whole pattern, or a minibatch with ``num_events``);
        subsample_size: events per step drawn by the plate (continuous forms only)."""
        events = self._events(events)
        with active(self.prior):
            posterior = self.prior.posterior()
            self.prior.sample_global_sites(posterior, guide=False)
            if self.rule.binned:
                if subsample_size is not None:
                    raise ValueError("the binned form scores whole cells: subsample_size must be None")
                pyro.factor(f"{self.name}.counts", self._binned(posterior, events))
                return
            pyro.factor(f"{self.name}.integral", -self._integral(posterior))
            plate, select = self._plate(events.shape[0], subsample_size, events.device)
            with plate as idx:
                Xb = select(events, idx)
                pyro.factor(f"{self.name}.log_intensity", posterior.marginals(Xb)[0] + self._offset(Xb))

    def guide(self, events, subsample_size=None):
        with active(self.prior):
            self.prior.sample_global_sites(self.prior.posterior(), guide=True)

    def elbo(self, events):
        """The bound for the whole pattern (one draw of the integral for random rules)."""
        events = self._events(events)
        with active(self.prior):
            posterior = self.prior.posterior()
            if self.rule.binned:
                return self._binned(posterior, events) - posterior.kl()
            scale = (self.num_events or events.shape[0]) / events.shape[0]
            log_intensity = posterior.marginals(events)[0] + self._offset(events)
            return scale * log_intensity.sum() - self._integral(posterior) - posterior.kl()

    # ------------------------------------------------------------ diagnostics

    def sampled_model(self, events):
        """The model with ``f`` a sample site ``<prior>.f`` at the events and the integration
        points (random rules use the cells' midpoints), for ``to_inference_data``. The observed
        site ``<name>.x`` scores each event by ``log lambda(x_i) - Lambda / n``
        (:class:`CoxEvents`); binned: ``<name>.counts``, a Poisson per cell."""
        events = self._events(events, full=True)
        points, weights, _ = self._points(random=False)
        X = points if self.rule.binned else torch.cat([events, points])
        f = self.prior.model(X, pyro.plate(f"{self.name}.sites", X.shape[0], dim=-1, device=X.device))
        log_lam = f + self._offset(X)
        if self.rule.binned:
            with pyro.plate(f"{self.name}.cells", len(weights), dim=-1, device=X.device):
                return pyro.sample(f"{self.name}.counts", pyro.distributions.Poisson(weights * log_lam.exp()),
                                   obs=self.counts(events))
        n = events.shape[0]
        log_masses = torch.log(weights) + log_lam[n:]
        with pyro.plate(self.name, n, dim=-1, device=X.device):
            return pyro.sample(f"{self.name}.x", CoxEvents(log_lam[:n], log_masses.exp().sum(), points, log_masses),
                               obs=events)

    def sampled_guide(self, events):
        """The guide of :meth:`sampled_model`."""
        events = self._events(events, full=True)
        points, _, _ = self._points(random=False)
        X = points if self.rule.binned else torch.cat([events, points])
        self.prior.guide(X, pyro.plate(f"{self.name}.sites", X.shape[0], dim=-1, device=X.device))

    # ------------------------------------------------------------ prediction

    def intensity(self, X, quantiles=(0.025, 0.975), batch_size=4096, params=None):
        """Posterior intensity ``lambda = exp(f + offset)`` at ``X``, log-normal under ``q(f)``.

        Args:
            X: ``(N, d)`` locations (e.g. a grid over the window).
            quantiles: levels in (0, 1) of the credible bands (exact: ``exp(m + z_q sqrt(v))``), or None.
            batch_size, params: as for :func:`~pyro_sparsegp.predict.predict_f`.

        Returns:
            Prediction: ``mean = exp(m + v / 2 + offset)`` ``(N,)``, ``variance`` ``(N,)`` and
            ``quantiles`` ``(Q, N)``.
        """
        levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
        mean, var = predict.predict_f(self.prior, X, batch_size=batch_size, params=params)
        X = checks.inputs(X, "X", self.window.dim).to(mean)
        with torch.no_grad():
            return Prediction(*lognormal_summary(mean + self._offset(X), var, levels))

    def simulate(self, num_samples=1, seed=0, params=None):
        """Patterns from the posterior predictive by thinning: per pattern, one joint draw of
        ``f`` from ``q`` at candidate points (see ``sparsegp_common.windows.thin``).

        Returns:
            a list of ``num_samples`` tensors ``(n_s, d)``.
        """
        num_samples = checks.positive_int(num_samples, "num_samples")
        grid = self._tensor(windows.rule_layout(self.window.default_rule(), self.window).points)
        mean, var = predict.predict_f(self.prior, grid, params=params)
        log_bound = float((mean + 5 * var.sqrt() + self._offset(grid)).max())

        def draw(candidates, draw_seed):
            X = self._tensor(candidates)
            f = predict.sample_f(self.prior, X, 1, seed=draw_seed, params=params)[0]
            return (f + self._offset(X)).detach().cpu().numpy()

        rng = np.random.default_rng(seed)
        return [self._tensor(windows.thin(self.window, log_bound, draw, rng)) for _ in range(num_samples)]


@contextlib.contextmanager
def _scaled_plate(name, size, scale):
    with poutine.scale(scale=scale), pyro.plate(name, size, dim=-1) as idx:
        yield idx
