"""The GP prior component: how any sparse GP method becomes sample sites.

A method (SVGP, decoupled bases, orthogonal features, ...) subclasses :class:`GPPrior` and
implements ``_posterior()``, the posterior of its zero-mean GP: an object with

* ``kl()``: ``KL[q || p]`` of its global variational parameters (a scalar);
* ``marginals(X, full_cov=False)``: the moments of ``q(f(X))``;
* ``prior_u()`` / ``q_u()``: distributions of its global latent site ``<name>.u`` (or None).

``GPPrior.posterior()`` adds the prior's mean function (``mean_function=``, see
:mod:`sparsegp_common.priors.mean_functions`) to those marginals. From these, ``GPPrior.model`` and
``GPPrior.guide`` emit the same sites for every method:

* ``<name>.u`` (outside any plate): ``u`` from the prior in the model and from ``q(u)`` in the
  guide. Its density is masked: the KL enters instead as the exact factor ``<name>.kl`` =
  ``-KL`` in the model, so ``Trace_ELBO`` and ``TraceMeanField_ELBO`` both get the closed form.
* ``<name>.f`` (inside the data plate): in the guide a reparameterised draw from the marginals
  ``q(f_n)``, which is all a factorising likelihood needs (Hensman et al., 2013); in the model a
  masked placeholder with the prior marginal ``N(0, k(x_n, x_n))``.

The user's own likelihood site then scores ``f`` like any other latent variable. Note that the
``<name>.kl`` factor makes the model depend on the variational parameters (as in
``pyro.contrib.gp``), so the pair is meant for SVI with its own guide.
"""
import contextlib

from sparsegp_common.objectives import rows
from sparsegp_common.ops import namespace
from sparsegp_common.priors.mean_functions import CoupledMean, MeanFunction, MeanShifted, Zero, add_mean


class Components:
    """The components ``g_t`` of the zero-mean GP ``g = sum_t g_t`` of a prior whose features
    declare a component axis (e.g. the harmonic decomposition's even and odd parts): marginals
    of shape ``(N, T)`` (``(N, T, L)`` with ``num_latent``), variances only."""

    def __init__(self, posterior):
        if len(getattr(posterior, "component_shape", ())) != 1 or not hasattr(posterior, "component_marginals"):
            raise ValueError("part='components' needs a prior whose features declare one component axis "
                             "(e.g. HarmonicFeatures)")
        self.posterior = posterior

    def marginals(self, X, full_cov=False):
        if full_cov:
            raise ValueError("part='components' gives variances (full_cov=False)")
        moments = self.posterior.component_marginals(X)
        xp = namespace(*moments)
        return tuple(xp.permute_dims(a, (a.ndim - 1,) + tuple(range(a.ndim - 1))) for a in moments)


class GPPrior:
    """Base class of GP prior components; see the module docstring."""

    num_latent = None
    component_shape = ()  # see Features.component_shape

    @property
    def input_dim(self):
        raise NotImplementedError

    @property
    def latent_shape(self):
        """``()`` for one latent function, ``(L,)`` for L of them."""
        return () if self.num_latent is None else (self.num_latent,)

    @property
    def site_names(self):
        """Names of this component's sites, e.g. to hide them from an autoguide with
        ``block(model, hide=gp.site_names)``."""
        names = tuple(f"{self.name}.{s}" for s in ("u", "kl", "f"))
        mean_function = getattr(self, "mean_function", None)
        if mean_function is not None and mean_function.coefficient_prior is not None:
            names += (self._coefficient_site,)
        return names

    @property
    def _coefficient_site(self):
        return f"{self.name}.mean_function.coefficients"

    def _posterior(self):
        """The method's posterior of the zero-mean GP (see the module docstring)."""
        raise NotImplementedError

    def posterior(self, part="f"):
        """``q`` of this component with its parameters read once: ``marginals`` of ``f = m + g``
        (``part="f"``), of the mean function ``m`` alone (``"mean"``), of the GP ``g`` alone
        (``"gp"``) or of each component ``g_t`` of ``g = sum_t g_t`` (``"components"``: features
        with a component axis, see :class:`Components`); ``kl``, ``q_u`` and ``prior_u`` are the GP's."""
        if part == "components":
            return Components(self._posterior())
        return self._with_mean(self._posterior(), part)

    def _with_mean(self, posterior, part="f"):
        """``posterior`` (of the zero-mean GP) with the mean function's part selected."""
        mean_function = getattr(self, "mean_function", None)  # not a class attribute: torch keeps modules apart
        if mean_function is None or isinstance(mean_function, Zero):
            if part == "mean":
                return MeanShifted(posterior, self._adapted[Zero](), part)
            return posterior
        cross = getattr(self, "q_sqrt_cross", None)
        if cross is not None:
            return CoupledMean(posterior, mean_function, part, cross)
        return MeanShifted(posterior, mean_function, part)

    def plus_mean_function(self, f, X):
        """``f + m(X)``, for methods that form ``f`` of the zero-mean GP themselves."""
        mean_function = getattr(self, "mean_function", None)
        return f if mean_function is None else add_mean(f, mean_function.evaluate(X))

    def _set_mean_function(self, mean_function, like):
        """Attach ``mean_function`` (None: zero) with its parameters in the dtype/device of ``like``."""
        if mean_function is None:
            return
        if not isinstance(mean_function, MeanFunction):
            raise TypeError(f"mean_function must be a MeanFunction (Zero, Constant, Linear, Covariates), "
                            f"got {type(mean_function).__name__}")
        shape = mean_function.shape
        if len(shape) == 2 and shape[0] != self.num_latent:
            raise ValueError(f"the mean function has coefficients for {shape[0]} latent functions "
                             f"but the prior has num_latent={self.num_latent}")
        mean_function._follow(like)
        self.mean_function = mean_function

    def prior_variance(self, X):
        """Prior variances ``k(x_n, x_n)``: ``(N,)`` or ``(N, L)``."""
        raise NotImplementedError

    def _f_dist(self, mean, var):
        d = self._dist.Normal(mean, namespace(var).sqrt(var), validate_args=False)  # valid by construction
        return (d if self.num_latent is None else d.to_event(1)).mask(False)

    def predict_f(self, X, full_cov=False, batch_size=4096, part="f", params=None):
        """Moments of ``q(f(X))``: mean ``(N,)`` (``(N, L)`` for L latents) and variance of
        the same shape, or covariance ``(N, N)`` (``(L, N, N)``) when ``full_cov``; ``part``:
        ``"f"``, the mean function's ``"mean"``, the GP's ``"gp"`` or its ``"components"``
        (``(N, T)``); see the backend's ``predict.predict_f``."""
        return self._predict.predict_f(self, X, full_cov=full_cov, batch_size=batch_size, part=part, params=params)

    def inspect(self, params=None):
        """The KL, ``q(u)`` and parameter values of this component after training (or with
        ``params``): a :class:`~sparsegp_common.inference.prediction.ComponentState`; see the backend's
        ``predict.inspect``."""
        return self._predict.inspect(self, params=params)

    def sample_global_sites(self, posterior, guide):
        """The sites outside the data plate: the mean function's coefficients (when they have a
        prior), ``<name>.u`` (masked) and, in the model, the factor ``<name>.kl`` = ``-KL``.
        Returns ``(posterior, u)``: the posterior given the sampled coefficients (``posterior``
        itself without them) and ``u`` (None for methods without one). Used by :meth:`model`,
        :meth:`guide` and the objectives."""
        if isinstance(posterior, MeanShifted) and posterior.mean_function.coefficient_prior is not None:
            # first: q(u) may depend on them (CoupledMean)
            posterior = posterior.given(self._sites.sample(
                self._coefficient_site, posterior.mean_function.coefficient_distribution(guide)))
        u_dist, kl = self._sites.compiled(_global_terms, posterior, guide)
        u = None if u_dist is None else self._sites.sample(f"{self.name}.u", u_dist.mask(False))
        if not guide:  # the GP's KL given the coefficients: sampled, they are scored by their own site
            self._sites.factor(f"{self.name}.kl", -kl)
        return posterior, u

    @contextlib.contextmanager
    def _data(self, X, plate):
        """Enter the data plate and yield the rows of ``X`` it selects."""
        if plate is None:
            plate = self._sites.plate(f"{self.name}.data", X.shape[0], like=X)
        if self._sites.inside(plate.name):
            raise ValueError(
                f"{self.name}.model/guide was called inside `with {plate.name}:`; call it outside "
                "the data plate and pass the plate object as `plate=` (u is global)"
            )
        with rows(plate, X.shape[0]) as select:
            Xb = select(X)  # only the rows a step uses are checked: O(batch), not O(N), per step
            yield self._checks.finite(Xb, "X" if Xb.shape[0] == X.shape[0] else "X's minibatch")

    def model(self, X, plate=None):
        """Prior sites of this component; returns ``f`` at the inputs the plate selects.

        Args:
            X: inputs ``(N, D)``, either the full data set (the plate subsamples it) or the
                current minibatch; converted to the dtype (and device) of the parameters.
            plate: the user's data plate (``pyro.plate``/``numpyro.plate``; entered here, pass
                the same object to the guide); by default a full-batch plate ``<name>.data``.

        Returns:
            ``f`` of shape ``(B,)`` (``(B, L)`` with L latent functions), B the batch size.
        """
        X = self._checks.inputs(X, "X", self.input_dim, values=False, like=self.first_parameter())
        with self._sites.bound(self, hyperpriors=True) as (prior,):  # drawn outside the data plate
            prior.sample_global_sites(prior.posterior(), guide=False)
            with prior._data(X, plate) as Xb:
                var = self._sites.compiled(_prior_variance, prior, Xb)
                return self._sites.sample(f"{self.name}.f", prior._f_dist(namespace(var).zeros_like(var), var))

    def guide(self, X, plate=None):
        """Variational sites of this component (same arguments as :meth:`model`); returns ``f``."""
        X = self._checks.inputs(X, "X", self.input_dim, values=False, like=self.first_parameter())
        with self._sites.bound(self, hyperpriors=True) as (prior,):  # drawn outside the data plate
            posterior, _ = prior.sample_global_sites(prior.posterior(), guide=True)
            with prior._data(X, plate) as Xb:
                return self._sites.sample(f"{self.name}.f", prior._f_dist(*self._sites.compiled(marginals, posterior, Xb)))


# The formulas of a step as functions of the component's objects, for ``sites.compiled`` (one
# compiled program each where the PPL runs them eagerly; see numpyro_sparsegp/compiled.py).


def marginals(posterior, X):
    return posterior.marginals(X)


def _global_terms(posterior, guide):
    """The distribution of ``u`` (q's in the guide, the prior's in the model) and, in the model, the KL."""
    return (posterior.q_u(), None) if guide else (posterior.prior_u(), posterior.kl())


def _prior_variance(prior, X):
    return prior.prior_variance(X)
