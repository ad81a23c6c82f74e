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

On a CUDA device the replay is itself recorded once more, as a CUDA graph: the step's few hundred
kernels then cost one launch instead of a Python call and a launch each.
"""
import warnings

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
    reparameterised (raises ``NotImplementedError`` for others: their gradient needs a score term).
    A plate's subsample site is none of those: its log-density is 0, and so is its score term."""
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    for name, site in guide_trace.nodes.items():
        if (site["type"] == "sample" and not site["is_observed"] and not site["fn"].has_rsample
                and not poutine.util.site_is_subsample(site)):
            raise NotImplementedError(f"the guide's site {name!r} is not reparameterised")
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    return guide_trace.log_prob_sum() - model_trace.log_prob_sum()


class CapturedStep:
    """``step(batch) -> (loss, grads)`` of ``trace_elbo`` with respect to ``params`` (the
    unconstrained leaf tensors the model and guide read, as ``fit`` collected them), ``grads[i]``
    None where the loss does not depend on ``params[i]``; or None when the replay is not finite.
    One graph per shape of the batch (``fit``'s batches all have one shape). ``explicit``: the
    user asked for it (``fit`` then warns when recording fails)."""

    def __init__(self, model, guide, params, kwargs, explicit=False):
        self.model, self.guide, self.params, self.kwargs, self.explicit = model, guide, list(params), kwargs, explicit
        self.graphs = {}

    def __call__(self, batch):
        key = tuple(None if a is None else (tuple(a.shape), a.dtype, a.device) for a in batch)
        tensors = [a for a in batch if a is not None]
        if key not in self.graphs:
            replay, used = self._record(batch)
            self.graphs[key] = (self._on_cuda(replay, tensors) if self.params[0].is_cuda else replay), used
        replay, used = self.graphs[key]
        loss, grads, finite = replay(*self.params, *tensors)
        if not bool(finite):
            return None
        it = iter(grads)
        return loss, [next(it) if u else None for u in used]

    def _on_cuda(self, replay, tensors):
        """``replay`` as a CUDA graph, or as it was where capturing fails (warned when asked for)."""
        try:
            return CudaGraph(replay, self.params, tensors)
        except Exception as error:  # an operation that cannot be captured (say one reading back to the host)
            if isinstance(error, CaptureFailed):  # graphs of other shapes would draw from the generator's old state
                self.graphs = {key: (getattr(step, "replay", step), used) for key, (step, used) in self.graphs.items()}
            if self.explicit:
                warnings.warn(f"fit(compiled=True): the step could not be captured as a CUDA graph "
                              f"({type(error).__name__}: {error}); replaying it kernel by kernel",
                              RuntimeWarning, stacklevel=4)
            return replay

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

        # the values were checked by fit; validation would read them back (and cannot while recording);
        # the recording's draws leave the generators as they were: the replay then draws what a
        # traced step would have drawn
        cuda = sorted({p.device.index or 0 for p in self.params if p.is_cuda})
        with pyro.validation_enabled(False), torch.enable_grad(), torch.random.fork_rng(devices=cuda):
            graph = make_fx(step, tracing_mode="real")(*self.params, *(batch[i] for i in positions))
        return Replay(converted_once(graph)), used


_FRESH = (torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.clone.default)


def converted_once(graph):
    """``graph`` with each conversion of a recorded constant (``_to_copy``: another dtype or
    device) done once, now. ``xp.asarray(numpy_array, device=...)`` is recorded as a host constant
    and a copy to the device, which would otherwise run every step, synchronise with the host, and
    keep the step out of a CUDA graph. The converted constant is still copied per step (on the
    device), as the recording copied the original, in case an operation writes into it."""
    nodes = graph.graph
    for node in list(nodes.nodes):
        if node.target is not torch.ops.aten._to_copy.default:
            continue
        chain = [node]
        while chain[-1].args[0].op == "call_function" and chain[-1].args[0].target in _FRESH:
            chain.append(chain[-1].args[0])
        source = chain[-1].args[0]
        if source.op != "get_attr":
            continue
        name = f"{source.target}_converted_{node.name}"
        graph.register_buffer(name, torch.ops.aten._to_copy.default(getattr(graph, source.target), **node.kwargs),
                              persistent=False)
        with nodes.inserting_before(node):
            fresh = nodes.call_function(torch.ops.aten.clone.default, (nodes.get_attr(name),))
        node.replace_all_uses_with(fresh)
        for unused in chain + [source]:  # the copies of the original, where nothing else reads them
            if not unused.users:
                nodes.erase_node(unused)
    graph.recompile()
    return graph


class Replay:
    """A recorded step run operation by operation: ``(loss, grads, finite)``, ``finite`` a boolean
    tensor (read by the caller: one transfer)."""

    def __init__(self, graph):
        self.graph = graph

    def __call__(self, *tensors):
        with torch.no_grad():
            loss, *grads = self.graph(*tensors)
            finite = torch.isfinite(torch.stack([loss, *(g.sum() for g in grads)])).all()
        return loss, grads, finite


class CaptureFailed(RuntimeError):
    """Capturing a CUDA graph failed after its warm-up: the CUDA generator now holds a new state."""


class CudaGraph:
    """A :class:`Replay` captured as one CUDA graph (``torch.cuda.CUDAGraph``) and launched at once.

    A graph reads and writes fixed addresses: the parameters are ``fit``'s own tensors (the
    optimiser updates them in place), the batch is copied into buffers, and every call returns the
    same output tensors, overwritten by the next call. The warm-up runs with CUDA's sync debug mode
    set to raise, so that a step reading back to the host fails there rather than while capturing.
    Warm-up and capture leave the CUDA generator where they found it: the replays draw what the
    replay would have drawn."""

    WARMUP = 2  # runs before capturing (cuBLAS and cuSOLVER set up their workspaces)

    def __init__(self, replay, params, tensors):
        self.params, self.buffers = list(params), [a.clone() for a in tensors]
        self.device = device = self.params[0].device
        generator = torch.cuda.default_generators[device.index]
        rng, fresh = generator.get_state(), generator.clone_state()
        self.replay = replay
        try:
            with torch.cuda.device(device):  # the parameters' device, whichever is current
                self._warm_up(replay, device)
                self.graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(self.graph):
                        self.outputs = replay(*self.params, *self.buffers)
                except Exception as error:
                    # the generator's state stays marked as capturing (every later draw would
                    # raise): the generator takes a copy; graphs captured before hold the old one
                    generator.graphsafe_set_state(fresh)
                    raise CaptureFailed(f"{type(error).__name__}: {error}") from error
        finally:
            generator.set_state(rng)

    def _warm_up(self, replay, device):
        side = torch.cuda.Stream(device)  # off the current stream, as capturing requires
        side.wait_stream(torch.cuda.current_stream(device))
        mode = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():  # torch calls the mode a prototype that may miss some operations
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(side):
                for _ in range(self.WARMUP):
                    replay(*self.params, *self.buffers)
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream(device).wait_stream(side)

    def __call__(self, *tensors):
        for buffer, a in zip(self.buffers, tensors[len(self.params):]):
            buffer.copy_(a)
        with torch.cuda.device(self.device):  # the graph's device, whichever is current
            self.graph.replay()
        return self.outputs
