"""The GP prior component: how any sparse GP method becomes sample sites.

A method (SVGP, decoupled bases, orthogonal features, ...) subclasses :class:`GPPrior` and
implements ``posterior()``: an object with

* ``kl()``: ``KL[q || p]`` of its global variational parameters (a scalar);
* ``marginals(X, full_cov=False)``: the moments of ``q(f(X))``;
* ``prior_u()`` / ``q_u()``: distributions of its global latent site ``<name>.u`` (or None).

From these, ``GPPrior.model`` and ``GPPrior.guide`` emit the same sites for every method:

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
from .ops import namespace


class GPPrior:
    """Base class of GP prior components; see the module docstring."""

    num_latent = None

    @property
    def input_dim(self):
        raise NotImplementedError

    @property
    def site_names(self):
        """Names of this component's sites, e.g. to hide them from an autoguide with
        ``block(model, hide=gp.site_names)``."""
        return tuple(f"{self.name}.{s}" for s in ("u", "kl", "f"))

    def posterior(self):
        raise NotImplementedError

    def prior_variance(self, X):
        """Prior variances ``k(x_n, x_n)``: ``(N,)`` or ``(N, L)``."""
        raise NotImplementedError

    def _f_dist(self, mean, var):
        d = self._dist.Normal(mean, namespace(var).sqrt(var))
        return (d if self.num_latent is None else d.to_event(1)).mask(False)
