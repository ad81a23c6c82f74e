"""The GP prior component as Pyro sample sites (see :mod:`sparsegp_common.priors`)."""
import contextlib

import pyro
from pyro.nn import pyro_method
from pyro.poutine.runtime import get_plates

from sparsegp_common import priors as core

from . import checks, predict
from .params import Parameterized


class GPPrior(core.GPPrior, Parameterized):
    __doc__ = core.GPPrior.__doc__

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
