"""``fit``'s captured step: a step's loss and gradient recorded once as a graph of tensor
operations (``torch.fx``'s ``make_fx``) and replayed every step without Pyro's handlers.

What a Pyro SVI step spends beyond its arithmetic is Python: Pyro's messengers, the traces,
the parameter reads and autograd's bookkeeping, thousands of calls per step. The replay runs the
same tensor operations, forward and backward, as one flat list. It is exact for models whose
steps run the same operations every time: the library's objectives do, once ``fit`` has checked
their data (value checks read nothing back while a graph is recorded, see
``sparsegp_common.ops._torch.is_concrete``). A Cholesky factorisation is recorded without its
jitter escalation and gives NaN where it fails; such a step reports ``None`` and ``fit`` runs it
traced, which escalates (or raises with advice) as always.
"""
import pyro
import torch
from pyro import poutine
from torch.fx.experimental.proxy_tensor import make_fx

#: ``fit`` captures a library objective's step by default when it runs at least this many steps:
#: recording one costs about as much as 100 to 200 traced steps of a small model.
MIN_STEPS = 200


def automatic(model, guide, loss):
    """Whether ``fit(compiled=None)`` captures: ``model`` and ``guide`` are methods of one of this
    library's objects (``GPModel``, ``VOFModel``, ``CoxProcess``, ``ExactDBK``, ...) and the loss is
    ``Trace_ELBO`` with one particle (the loss the capture computes)."""
    owner = getattr(model, "__self__", None)
    return (owner is not None and getattr(guide, "__self__", None) is owner
            and type(owner).__module__.startswith(("pyro_sparsegp.", "sparsegp_common."))
            and supported(loss))


def supported(loss):
    """Whether the capture computes ``loss``: ``Trace_ELBO`` (None: ``fit``'s default) with one particle."""
    return loss is None or (type(loss) is pyro.infer.Trace_ELBO and loss.num_particles == 1)


def trace_elbo(model, guide, *args, **kwargs):
    """``Trace_ELBO``'s loss of one draw, ``log q - log p``, for a guide whose sample sites are all
    reparameterised (raises ``NotImplementedError`` for others: their gradient needs a score term)."""
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and not site["is_observed"] and not site["fn"].has_rsample:
            raise NotImplementedError(f"the guide's site {name!r} is not reparameterised")
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    return guide_trace.log_prob_sum() - model_trace.log_prob_sum()


class CapturedStep:
    """``step(batch) -> (loss, grads)`` of ``trace_elbo`` with respect to ``params`` (the
    unconstrained leaf tensors the model and guide read, as ``fit`` collected them), ``grads[i]``
    None where the loss does not depend on ``params[i]``; or None when the replay is not finite.
    One graph per shape of the batch (the last batch of an epoch may be shorter). ``explicit``: the
    user asked for it (``fit`` then warns when recording fails)."""

    def __init__(self, model, guide, params, kwargs, explicit=False):
        self.model, self.guide, self.params, self.kwargs, self.explicit = model, guide, list(params), kwargs, explicit
        self.graphs = {}

    def __call__(self, batch):
        key = tuple(None if a is None else (tuple(a.shape), a.dtype, a.device) for a in batch)
        if key not in self.graphs:
            self.graphs[key] = self._record(batch)
        graph, used = self.graphs[key]
        tensors = [a for a in batch if a is not None]
        with torch.no_grad():
            loss, *grads = graph(*self.params, *tensors)
        if not bool(torch.isfinite(torch.stack([loss, *(g.sum() for g in grads)])).all()):
            return None
        it = iter(grads)
        return loss, [next(it) if u else None for u in used]

    def _record(self, batch):
        positions = [i for i, a in enumerate(batch) if a is not None]
        used = []

        def step(*tensors):
            params, given = tensors[:len(self.params)], tensors[len(self.params):]
            args = [None] * len(batch)
            for i, a in zip(positions, given):
                args[i] = a
            loss = trace_elbo(self.model, self.guide, *args, **self.kwargs)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            used[:] = [g is not None for g in grads]
            return (loss, *(g for g in grads if g is not None))

        # the values were checked by fit; validation would read them back (and cannot while recording)
        with pyro.validation_enabled(False), torch.enable_grad():
            graph = make_fx(step, tracing_mode="real")(*self.params, *(batch[i] for i in positions))
        return graph, used
