"""Quadruply stochastic GPs for Pyro (written once in :mod:`sparsegp_common.priors.qsgp`): the
index draws come from torch's global RNG, the loss is a plain callable that keeps the control
variates' (or the snapshot's) state between calls (``fit`` saves it in checkpoints)."""
import torch

from sparsegp_common.priors import qsgp as core
from sparsegp_common.priors.qsgp import ChevronPosterior, quadruply_stochastic_loss

from . import priors  # noqa: F401  (registers GPPrior, the parent adapt() builds on)
from .params import adapt

__all__ = ["ChevronPosterior", "QSGP", "QuadruplyStochasticELBO", "quadruply_stochastic_loss"]

(QSGP,) = adapt((core.QSGP,), module=__name__)


class QuadruplyStochasticELBO(core.QuadruplyStochasticELBO):
    state = None  # the control variates' (or the snapshot's) state between calls (created at the first)

    def __call__(self, model, guide, X, y, **kwargs):
        if not self.stateful:
            return self.negative_elbo(model, X, y, **kwargs)
        if self.state is None:
            self.state = self.initial_state(model, X, y)
        loss, self.state = self.negative_elbo(model, X, y, state=self.state, **kwargs)
        return loss

    def by_rows(self, model, guide, X, y, tables):
        """One estimate reading only the rows of the q ``tables`` (their tensors, in the order of
        :meth:`tables`) that it needs: ``(loss, rows, slices)``, ``slices`` being new leaf tensors of
        the tables at the sorted ``rows``, whose ``grad`` the loss's backward fills (``fit``'s
        strict ``O(1)`` step)."""
        if self.stateful and self.state is None:
            self.state = self.initial_state(model, X, y)
        drawn = self.draw(model, X, y)
        rows = self.rows(drawn, self.state)
        slices = [table.detach()[rows].requires_grad_() for table in tables]
        return self(model, guide, X, y, drawn=drawn, gathered=(rows, slices)), rows, slices

    def loss(self, model, guide, *args, **kwargs):
        """The loss as a float."""
        with torch.no_grad():
            return float(self(model, guide, *args, **kwargs))

    def state_dict(self):
        """The loss's state as plain tensors (``{}`` before the first call or without one)."""
        return {} if self.state is None else {k: v.detach().clone() for k, v in self.state._asdict().items()}

    def load_state_dict(self, state):
        self.state = self.state_type()(**state) if state else None
