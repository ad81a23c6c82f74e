"""Log-Gaussian Cox processes: point patterns whose log-intensity is a GP prior (any ``GPPrior``).

Events ``x_1..x_n`` in a window ``W`` form a Poisson process with intensity
``lambda(x) = exp(f(x) + offset(x))``. With ``q(f(x)) = N(mu(x), s2(x))`` from the prior's
``posterior().marginals``, the expected log-likelihood is in closed form up to the integral::

    E_q[log p(x_1..x_n | f)] = sum_i (mu(x_i) + offset(x_i)) - int_W exp(mu + s2 / 2 + offset) dx

since ``E_q[exp f] = exp(mu + s2 / 2)``; the integral is a Gauss-Legendre sum, an unbiased
stratified Monte Carlo estimate, or a user's rule (``sparsegp_common.objectives.windows``). The binned form
scores cell counts ``c_k ~ Poisson(|cell| lambda(centre_k))`` instead::

    sum_k c_k (log|cell| + mu_k + offset_k) - |cell| exp(mu_k + s2_k / 2 + offset_k) - log c_k!

which, less ``n log|cell|`` (a probability of counts, not a density of locations), tends to the
continuous form as the cells shrink.

Random integration points draw from torch's global RNG in Pyro (seed it with
``pyro.set_rng_seed``) and from ``key``, by default ``numpyro.prng_key()``, in NumPyro.
"""
import numbers
import warnings

import numpy as np

from sparsegp_common.adapt import Documented
from sparsegp_common.dispatch import Dispatcher
from sparsegp_common.inference import cox_simulation, plots
from sparsegp_common.inference.prediction import Prediction
from sparsegp_common.objectives import data_plate, data_scale, windows
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors import GPPrior


def expected_intensity(mean, var, offset):
    """``E_q[exp(f + offset)] = exp(mean + var / 2 + offset)`` under ``f ~ N(mean, var)``."""
    return namespace(mean, var, offset).exp(mean + var / 2 + offset)


def lognormal_summary(mean, var, levels):
    """Mean, variance and quantiles ``(Q, N)`` (or None) of ``exp(f)``, ``f ~ N(mean, var)``."""
    xp = namespace(mean, var)
    rate = xp.exp(mean + var / 2)
    q = None
    if levels is not None:
        z = backend(mean).ndtri(xp.asarray(levels, dtype=mean.dtype, device=device(mean)))
        q = xp.exp(mean + z[:, None] * xp.sqrt(var))
    return rate, xp.expm1(var) * rate**2, q


class CoxEvents(Documented):
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

    def __init__(self, log_intensity, integral, points, log_masses, validate_args=None):
        self.log_intensity, self.integral, self.points, self.log_masses = log_intensity, integral, points, log_masses
        super().__init__(log_intensity.shape, points.shape[-1:], validate_args=validate_args)

    def log_prob(self, value):
        return self.log_intensity - self.integral[..., None] / self.log_intensity.shape[-1]

    def _draw(self, key, sample_shape):
        """Events ``sample_shape + batch_shape + (d,)``, each a point of the rule drawn with
        probability proportional to its mass (``key``: the backend's, see the module docstring)."""
        n = self.log_intensity.shape[-1]
        index = backend(self.log_masses).categorical(key, self.log_masses, tuple(sample_shape) + (n,))
        return self.points[namespace(index).moveaxis(index, len(sample_shape), -1)]


class EventsForm:
    """The Cox likelihood of the event locations: each event's ``E_q[log lambda]``, in a data
    plate (minibatches scaled to the pattern), less the rule's estimate of ``int_W E_q[lambda]``."""

    whole_pattern = False  # minibatches of events are fine

    def model(self, cox, posterior, events, subsample_size):
        sites = cox._sites
        sites.factor(f"{cox.name}.integral", -cox._integral(posterior))
        with data_plate(sites, cox.name, events.shape[0], cox.num_events, subsample_size, events) as select:
            Xb = select(events)
            sites.factor(f"{cox.name}.log_intensity", posterior.marginals(Xb)[0] + cox.offset_at(Xb))

    def data_term(self, cox, posterior, events, key):
        log_intensity = posterior.marginals(events)[0] + cox.offset_at(events)
        scale = data_scale(cox.num_events, events.shape[0])
        return scale * namespace(log_intensity).sum(log_intensity) - cox._integral(posterior, key)

    def sampled_inputs(self, events, points):
        """Where the sampled model draws ``f``: the events, then the integration points."""
        return namespace(events, points).concat([events, points])

    def observe(self, cox, events, points, weights, X, log_lam):
        """The observed site ``<name>.x`` of the sampled model (:class:`CoxEvents`)."""
        xp, n = namespace(log_lam), events.shape[0]  # log_lam may have batch axes on its left (draws)
        log_masses = xp.log(weights) + log_lam[..., n:]
        with cox._sites.plate(cox.name, n, like=X):
            return cox._sites.sample(f"{cox.name}.x", cox._cox_events(log_lam[..., :n], xp.sum(xp.exp(log_masses), axis=-1),
                                                                     points, log_masses), obs=events)


class CountsForm(EventsForm):
    """The likelihood of the cells' event counts (:class:`~sparsegp_common.objectives.windows.Binned`):
    ``c_k ~ Poisson(|cell| lambda(centre_k))``, whole cells only."""

    whole_pattern = True

    def model(self, cox, posterior, events, subsample_size):
        if subsample_size is not None:
            raise ValueError("the binned form scores whole cells: subsample_size must be None")
        cox._sites.factor(f"{cox.name}.counts", cox._binned(posterior, events))

    def data_term(self, cox, posterior, events, key):
        return cox._binned(posterior, events, key)

    def sampled_inputs(self, events, points):
        """The cells' centres."""
        return points

    def observe(self, cox, events, points, weights, X, log_lam):
        """The observed site ``<name>.counts``, a Poisson per cell."""
        with cox._sites.plate(f"{cox.name}.cells", len(weights), like=X):
            return cox._sites.sample(f"{cox.name}.counts", cox._dist.Poisson(weights * namespace(log_lam).exp(log_lam)),
                                     obs=cox.counts(events))


#: The likelihood a rule's nodes serve, by the rule's type.
data_form = Dispatcher("data_form")
data_form.register(windows.Rule)(lambda rule: EventsForm())
data_form.register(windows.Binned)(lambda rule: CountsForm())


class CoxProcess(Documented):
    """A log-Gaussian Cox process on ``window`` with log-intensity ``f + offset``, ``f`` from ``prior``.

    ``model``/``guide`` form a Pyro (NumPyro) model/guide pair whose ELBO is
    ``(n / B) sum_batch E_q[f(x_i) + offset] - int_W E_q[exp(f + offset)] - KL`` (see the module
    docstring); it is deterministic for fixed rules and unbiased for :class:`StratifiedMC`, whose
    points are drawn at every step (from torch's global RNG in Pyro, ``numpyro.prng_key()`` in NumPyro).

    Args:
        prior: a ``GPPrior`` of the same backend with one latent function; only its
            ``posterior()`` (``marginals``, ``kl``) is used, so every prior works.
        window: an ``Interval``, ``Rectangle``, ``Polygon`` or ``UserRule``
            (``sparsegp_common.objectives.windows``), or bounds ``(d, 2)`` such as ``PointPattern.window``.
        integration: ``StratifiedMC(n)``, ``GaussLegendre(n)``, ``Binned(n)`` (n per dimension)
            or a raster's ``PixelRule``; None: ``StratifiedMC`` with 64 cells in 1-D, 32 x 32 in
            2-D, fresh nodes every step (unbiased; fixed nodes let the optimiser hide intensity
            between them, and a fixed rule warns when a lengthscale falls below their spacing).
        offset: a number, or a function ``offset(X (N, d)) -> (N,)`` of known log-intensity
            terms (log exposure). Set it near ``log(n / |W|)``, or give the prior a learnable
            ``Constant`` mean (``mean_function=``); covariates with learnable coefficients are a
            ``Covariates`` mean function.
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
        checks = self._checks
        if not isinstance(prior, GPPrior):
            raise TypeError(f"prior must be a GPPrior, got {type(prior).__name__}")
        if prior.num_latent is not None:
            raise ValueError(f"a Cox process needs one latent function, but the prior has num_latent={prior.num_latent}")
        self.window = windows.as_window(window)
        if prior.input_dim != self.window.dim:
            raise ValueError(f"the window is {self.window.dim}-D but the prior takes {prior.input_dim}-D inputs")
        self.rule = windows.as_rule(integration, self.window)
        self.layout = self.rule.layout(self.window)
        self.spacing = self.rule.spacing(self.layout, self.window)
        self.form = data_form(self.rule)
        self._warned = False
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

    def as_array(self, a):
        """``a`` (points, weights: NumPy or the backend's arrays) in the dtype and on the device of
        the prior's parameters."""
        like = self.prior.first_parameter()
        return namespace(like).asarray(a, dtype=like.dtype, device=device(like))

    def offset_at(self, X):
        """The known log-intensity ``offset`` at ``X (N, d)``, shape ``(N,)``, in ``X``'s dtype."""
        xp = namespace(X)
        if callable(self.offset):
            return xp.broadcast_to(self._checks.as_array(self.offset(X), "offset(X)", like=X), X.shape[:1])
        return xp.full(X.shape[:1], float(self.offset), dtype=X.dtype, device=device(X))

    def _events(self, events, full=False):
        checks = self._checks
        events = checks.inputs(events, "events", self.window.dim)
        events = backend(events).cast_like(events, self.prior.first_parameter())
        if backend(events).is_concrete(events):
            windows.check_events(checks.host(events), self.window)
        if self.num_events is not None and events.shape[0] > self.num_events:
            raise ValueError(f"events has {events.shape[0]} rows, more than num_events={self.num_events}")
        if (full or self.form.whole_pattern) and self.num_events not in (None, events.shape[0]):
            raise ValueError("this form needs the whole pattern: drop num_events or pass all events")
        return events

    def _points(self, key=None, fixed=False):
        """Integration points ``(P', d)``, weights ``(P',)`` and the selected indices (or None) of
        one evaluation; ``fixed``: the rule's fixed stand-in for random nodes, all of them (the
        sampled models)."""
        layout = self.layout
        points, weights = self.as_array(layout.points), self.as_array(layout.weights)
        draw = self.rule.random and not fixed
        subsample = self.integration_batch is not None and not fixed
        ops = backend(points)
        if draw or subsample:
            key_points, key_index = ops.split(self._sites.key(key), 2)
        widths = None if layout.widths is None else self.as_array(layout.widths)
        uniform = ops.uniform(key_points, points.shape, points.dtype, device(points)) if draw else None
        points = self.rule.nodes(points, widths, uniform)
        points, weights = self.window.restrict(points, weights)
        if not subsample:
            return points, weights, None
        index = ops.permutation(key_index, len(weights), device(points))[: self.integration_batch]
        return points[index], weights[index] * (len(weights) / self.integration_batch), index

    def _integral(self, posterior, key=None):
        """``sum_j w_j E_q[lambda(points_j)]``: the rule's estimate of ``int_W E_q[lambda]``."""
        points, weights, _ = self._points(key)
        return namespace(weights).sum(weights * expected_intensity(*posterior.marginals(points), self.offset_at(points)))

    def counts(self, events):
        """Events per cell of a :class:`~sparsegp_common.objectives.windows.Binned` rule: ``(P,)``."""
        layout = self.layout
        xp, ops = namespace(events), backend(events)
        cells = ops.as_index(xp.floor((events - self.as_array(layout.low)) / self.as_array(layout.widths)))
        cells = xp.clip(cells, 0, xp.asarray(layout.shape, dtype=cells.dtype, device=device(cells)) - 1)
        flat = xp.sum(cells * xp.asarray(layout.strides, dtype=cells.dtype, device=device(cells)), axis=-1)
        return ops.bincount(flat, len(layout.weights), events.dtype)

    def _binned(self, posterior, events, key=None):
        """``sum_k E_q[log Poisson(c_k | |cell| lambda(centre_k))]``, over a random subset of cells
        (scaled) when ``integration_batch`` is set."""
        points, weights, index = self._points(key)
        counts = self.counts(events) if index is None else self.counts(events)[index]
        scale = 1.0 if index is None else len(self.layout.weights) / len(index)
        mean, var = posterior.marginals(points)
        offset = self.offset_at(points)
        cell = weights / scale
        xp = namespace(mean, var)
        terms = (counts * (xp.log(cell) + mean + offset) - cell * expected_intensity(mean, var, offset)
                 - backend(counts).lgamma(counts + 1))
        return scale * xp.sum(terms)

    # ------------------------------------------------------------ model / guide

    def model(self, events, subsample_size=None):
        """Args: events ``(n, d)`` (the whole pattern, or a minibatch with ``num_events``);
        subsample_size: events per step drawn by the plate (continuous forms only)."""
        events = self._events(events)
        sites = self._sites
        with sites.bound(self.prior) as (prior,):
            self._check_resolution(prior)
            posterior, _ = prior.sample_global_sites(prior.posterior(), guide=False)
            self.form.model(self, posterior, events, subsample_size)

    def guide(self, events, subsample_size=None):
        with self._sites.bound(self.prior) as (prior,):
            prior.sample_global_sites(prior.posterior(), guide=True)

    def elbo(self, events, key=None):
        """The bound for the whole pattern (one draw of the integral for random rules, from
        ``key`` in NumPyro)."""
        events = self._events(events)
        with self._sites.bound(self.prior) as (prior,):
            posterior = prior.posterior()
            return self.form.data_term(self, posterior, events, key) - posterior.kl()

    def _check_resolution(self, prior):
        """Warn (once) when a lengthscale of the prior's kernel falls below the spacing of a fixed
        rule's nodes: the optimiser can then put intensity between the nodes, where the integral
        does not see it, and the loss runs away. Runs on the host (in NumPyro when the compiled
        step runs)."""
        lengthscale = getattr(getattr(prior, "kernel", None), "lengthscale", None)
        if self.spacing is None or self._warned or lengthscale is None:
            return
        backend(lengthscale).host_callback(self._warn_below_spacing, lengthscale)

    def _warn_below_spacing(self, lengthscale):
        shortest = np.min(np.reshape(lengthscale, (-1, lengthscale.shape[-1])), axis=0)
        if self._warned or not np.any(shortest < self.spacing):
            return
        self._warned = True
        warnings.warn(
            f"CoxProcess {self.name!r}: a lengthscale of the kernel ({np.round(shortest, 4).tolist()}) fell below the "
            f"spacing of the fixed integration rule's nodes ({np.round(self.spacing, 4).tolist()}), so the intensity can "
            "grow between the nodes unseen by the integral. Use the default randomised rule (integration=None, or "
            "StratifiedMC), a finer rule, or a prior on longer lengthscales.", UserWarning)

    # ------------------------------------------------------------ diagnostics

    def sampled_model(self, events):
        """The model with ``f`` a sample site ``<prior>.f`` at the events and the integration
        points (random rules use the cells' midpoints), for ``to_inference_data``. The observed
        site ``<name>.x`` scores each event by ``log lambda(x_i) - Lambda / n``
        (:class:`CoxEvents`); binned: ``<name>.counts``, a Poisson per cell."""
        events = self._events(events, full=True)
        points, weights, _ = self._points(fixed=True)
        X = self.form.sampled_inputs(events, points)
        f = self.prior.model(X, self._sites.plate(f"{self.name}.sites", X.shape[0], like=X))
        return self.form.observe(self, events, points, weights, X, f + self.offset_at(X))

    def sampled_guide(self, events):
        """The guide of :meth:`sampled_model`."""
        events = self._events(events, full=True)
        points, _, _ = self._points(fixed=True)
        X = self.form.sampled_inputs(events, points)
        self.prior.guide(X, self._sites.plate(f"{self.name}.sites", X.shape[0], like=X))

    # ------------------------------------------------------------ prediction

    def intensity(self, X, quantiles=(0.025, 0.975), batch_size=4096, part="f", params=None):
        """Posterior intensity ``lambda = exp(f + offset)`` at ``X``, log-normal under ``q(f)``,
        or one factor of it: ``part="mean"``, ``exp(m + offset)`` of the prior's mean function
        and the offset (the covariate part; no uncertainty for fitted coefficients), or
        ``part="gp"``, ``exp(g)`` of the zero-mean GP (the residual relative intensity).

        Args:
            X: ``(N, d)`` locations (e.g. a grid over the window).
            quantiles: levels in (0, 1) of the credible bands (exact: ``exp(m + z_q sqrt(v))``), or None.
            batch_size, part, params: as for the backend's ``predict.predict_f``.

        Returns:
            Prediction: ``mean = exp(m + v / 2 + offset)`` ``(N,)``, ``variance`` ``(N,)`` and
            ``quantiles`` ``(Q, N)``.
        """
        levels = None if quantiles is None else self._checks.probabilities(quantiles, "quantiles")
        mean, var = self._predict.predict_f(self.prior, X, batch_size=batch_size, part=part, params=params)
        if part != "gp":
            X = backend(mean).cast_like(self._checks.inputs(X, "X", self.window.dim), mean)
            mean = mean + backend(mean).stop_gradient(self.offset_at(X))  # a prediction, as predict_f's moments
        return Prediction(*lognormal_summary(mean, var, levels))

    def plot_intensity(self, events=None, part="f", stat="mean", resolution=100, ax=None, params=None, **kwargs):
        """Map of the posterior intensity over a 2-D window's bounding box, events overlaid.

        Args:
            events: optional ``(n, 2)`` pattern to draw over the map.
            part: ``"f"``, the covariate part ``"mean"`` or the GP's ``"gp"`` (see :meth:`intensity`).
            stat: ``"mean"`` (the posterior mean), ``"lower"``/``"upper"`` (the 2.5% / 97.5%
                quantiles) or ``"width"`` (the 95% band's width over the mean).
            resolution: grid points along the longer side.
            ax: a matplotlib ``Axes`` (default: a new figure's).
            params: as for :meth:`intensity`; ``kwargs`` go to ``pcolormesh``.

        Returns:
            the ``Axes``.
        """
        return plots.plot_intensity(self, events, part, stat, resolution, ax, params, **kwargs)

    def simulate(self, num_samples=1, seed=0, params=None, batch_size=512, num_anchors=256):
        """Patterns from the posterior predictive by thinning (see ``sparsegp_common.objectives.windows.thin``):
        per pattern, candidates from a homogeneous process whose rate bounds the 5-sd upper band
        of the intensity (at the default rule's nodes and the anchors inside the window), each
        kept with probability ``lambda(x) / bound`` under one draw of ``f`` from ``q`` at all the
        candidates (a draw that exceeds the bound somewhere is redrawn with the bound doubled).

        The draw of ``f`` at the ``C`` candidates
        (:class:`~sparsegp_common.inference.cox_simulation.AnchoredDraws`): with
        ``C <= batch_size``, one joint draw from the full covariance of ``q``. Beyond that (a
        dense ``C x C`` covariance needs ``8 C^2`` bytes: 3 GB at 20,000 candidates), ``f`` is
        drawn jointly at about ``num_anchors`` points on a grid over the window
        (:func:`~sparsegp_common.objectives.windows.anchor_points`), then at the candidates, ``batch_size``
        at a time, from ``q``'s conditional given those values, each candidate with its own
        residual variance. Every candidate's marginal is ``q(f(x))`` exactly (so the expected
        count is ``int_W E_q[lambda]``), and candidates are correlated through the anchors as
        under ``q``; only the correlation of what the anchors leave unexplained is dropped. That
        part is small where the anchors are dense relative to the posterior's lengthscale; a
        warning says when it exceeds 1% of the candidates' variance (then raise ``num_anchors``).
        Time and memory are linear in ``C``, with temporaries of ``(num_anchors + batch_size)^2``.

        Args:
            num_samples: number of patterns.
            seed: the NumPy seed of the candidates, the thinning and the draws of ``f`` (the
                backends' RNGs are left untouched; both backends draw the same random numbers).
            params: as for :meth:`intensity`.
            batch_size: candidates per batch; the largest count drawn jointly in one piece.
            num_anchors: grid points the batches are conditioned on (fewer inside a ``Polygon``).

        Returns:
            a list of ``num_samples`` tensors (Pyro) or arrays (NumPyro) ``(n_s, d)``.
        """
        return cox_simulation.simulate(self, num_samples, seed, params, batch_size, num_anchors)
