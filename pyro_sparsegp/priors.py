"""The GP prior component: how any sparse GP method becomes Pyro sample sites.

A method (SVGP, and later decoupled bases, orthogonal features, ...) subclasses :class:`GPPrior`
and implements ``posterior()``: an object with

* ``kl()``: ``KL[q || p]`` of its global variational parameters (a scalar);
* ``marginals(X, full_cov=False)``: the moments of ``q(f(X))``;
* ``prior_u()`` / ``q_u()``: distributions of its global latent site ``<name>.u`` (or None).

From these, :meth:`GPPrior.model` and :meth:`GPPrior.guide` emit the same sites for every method:

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

import pyro
import pyro.distributions as dist
from pyro.nn import pyro_method
from pyro.poutine.runtime import get_plates

from . import checks, predict
from .params import Parameterized


class GPPrior(Parameterized):
    """Base class of GP prior components; see the module docstring."""

    num_latent = None

    @property
    def input_dim(self):
        raise NotImplementedError

    @property
    def site_names(self):
        """Names of this component's sites, e.g. to hide them from an autoguide with
        ``poutine.block(model, hide=gp.site_names)``."""
        return tuple(f"{self.name}.{s}" for s in ("u", "kl", "f"))

    def posterior(self):
        raise NotImplementedError

    def prior_variance(self, X):
        """Prior variances ``k(x_n, x_n)``: ``(N,)`` or ``(N, L)``."""
        raise NotImplementedError

    def predict_f(self, X, full_cov=False, batch_size=4096, params=None):
        """Moments of ``q(f(X))``: mean ``(N,)`` (``(N, L)`` for L latents) and variance of
        the same shape, or covariance ``(N, N)`` (``(L, N, N)``) when ``full_cov``; see
        :func:`~pyro_sparsegp.predict.predict_f`."""
        return predict.predict_f(self, X, full_cov=full_cov, batch_size=batch_size, params=params)

    def sample_global_sites(self, posterior, guide):
        """The sites outside the data plate: ``<name>.u`` (masked) and, in the model, the factor
        ``<name>.kl`` = ``-KL``; used by :meth:`model`, :meth:`guide` and ``GPModel``."""
        u_dist = posterior.q_u() if guide else posterior.prior_u()
        if u_dist is not None:
            pyro.sample(f"{self.name}.u", u_dist.mask(False))
        if not guide:
            pyro.factor(f"{self.name}.kl", -posterior.kl())

    def _f_dist(self, mean, var):
        d = dist.Normal(mean, var.sqrt())
        return (d if self.num_latent is None else d.to_event(1)).mask(False)

    @contextlib.contextmanager
    def _data(self, X, plate):
        """Enter the data plate and yield the rows of ``X`` it selects."""
        if plate is None:
            plate = pyro.plate(f"{self.name}.data", X.shape[0], dim=-1, device=X.device)
        if any(frame.name == plate.name for frame in get_plates()):
            raise ValueError(
                f"{self.name}.model/guide was called inside `with {plate.name}:`; call it outside "
                "the data plate and pass the plate object as `plate=` (u is global)"
            )
        with plate as idx:
            if X.shape[0] == plate.size:
                yield X if plate.subsample_size == plate.size else X[idx]
            elif X.shape[0] == len(idx):
                yield X
            else:
                raise ValueError(
                    f"X has {X.shape[0]} rows but the plate {plate.name!r} has size {plate.size} "
                    f"and subsample size {len(idx)}: pass either the full inputs or the minibatch"
                )

    @pyro_method
    def model(self, X, plate=None):
        """Prior sites of this component; returns ``f`` at the inputs the plate selects.

        Args:
            X: inputs ``(N, D)``, either the full data set (the plate subsamples it) or the
                current minibatch.
            plate: the user's data ``pyro.plate`` (entered here; pass the same object to the
                guide); by default a full-batch plate ``<name>.data``.

        Returns:
            ``f`` of shape ``(B,)`` (``(B, L)`` with L latent functions), B the batch size.
        """
        X = checks.inputs(X, "X", self.input_dim)
        self.sample_global_sites(self.posterior(), guide=False)
        with self._data(X, plate) as Xb:
            var = self.prior_variance(Xb)
            return pyro.sample(f"{self.name}.f", self._f_dist(var.new_zeros(var.shape), var))

    @pyro_method
    def guide(self, X, plate=None):
        """Variational sites of this component (same arguments as :meth:`model`); returns ``f``."""
        X = checks.inputs(X, "X", self.input_dim)
        posterior = self.posterior()
        self.sample_global_sites(posterior, guide=True)
        with self._data(X, plate) as Xb:
            mean, var = posterior.marginals(Xb)
            return pyro.sample(f"{self.name}.f", self._f_dist(mean, var))
