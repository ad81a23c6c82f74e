"""``fit``: stochastic variational inference for any Pyro model/guide pair."""
import contextlib
import os
import warnings

import pyro
import torch
from pyro import poutine
from torch.distributions import transform_to

from sparsegp_common.inference import heap
from sparsegp_common.inference.training import FitResult, FitState, Trainer, make_fit, split_param_groups

from . import captured

__all__ = ["FitResult", "FitState", "fit"]


class _Trainer(Trainer):
    """The parameters the loss reads (library modules' own and the param store's alike), a torch
    optimiser over them per optimiser class (one group per ``param_groups`` entry) and a
    learning-rate schedule for each."""

    def __init__(self, model, guide, data, plan, *, loss, lr, lr_schedule, optimizer, param_groups, seed, compiled,
                 kwargs):
        self.model, self.guide, self.data, self.plan, self.kwargs = model, guide, tuple(data), plan, kwargs
        self.loss_fn = _loss_fn(loss)
        self.loss_state = loss if hasattr(loss, "state_dict") else None  # a loss with state between steps
        pyro.set_rng_seed(seed)
        self.names, self.values, self.constraints = _capture_params(self.loss_fn, model, guide, _batch(self.data, plan, 0),
                                                                    kwargs)
        by_name = dict(zip(self.names, self.values))
        by_class, schedules = {}, {}
        for group, group_lr, options in split_param_groups(self.names, param_groups, lr):
            options = dict(options)
            cls = options.pop("optimizer", None) or optimizer or torch.optim.Adam
            schedules.setdefault(cls, []).append(options.pop("lr_schedule", lr_schedule))
            for name in group:
                getattr(loss, "check_optimiser", lambda *_: None)(name, cls, options)
            by_class.setdefault(cls, []).append({"params": [by_name[n] for n in group], "lr": group_lr, **options})
        self.opts = [cls(groups, lr=lr) for cls, groups in by_class.items()]
        self.tables = _tables(loss, model, by_name, by_class)
        self.schedules = [torch.optim.lr_scheduler.LambdaLR(opt, [s or _constant for s in schedules[cls]])
                          for cls, opt in zip(by_class, self.opts) if any(schedules[cls])]
        self.captured = _captured(compiled, model, guide, loss, self.values, plan, kwargs)

    def step(self, i):
        batch = _batch(self.data, self.plan, i)
        replayed = None if self.tables else self._replay(batch)
        if self.tables:
            value = self._by_rows(batch)
        elif replayed is None:  # traced: Pyro's handlers and autograd, as SVI runs a step
            for opt in self.opts:
                opt.zero_grad()
            value = self.loss_fn(self.model, self.guide, *batch, **self.kwargs)
            value.backward()
        else:
            value, grads = replayed
            for p, g in zip(self.values, grads):
                p.grad = g
        grad_norm = torch.nn.utils.get_total_norm([p.grad._values() if p.grad.is_sparse else p.grad
                                                   for p in self.values if p.grad is not None])
        # torch's sparse AdaGrad builds sparse tensors; their invariants hold by construction
        with torch.sparse.check_sparse_tensor_invariants(enable=False) if self.tables else contextlib.nullcontext():
            for opt in self.opts + self.schedules:
                opt.step()
        return torch.stack([value.detach(), grad_norm.to(value.dtype)])

    def _by_rows(self, batch):
        """The loss, with the q tables read and differentiated at the step's rows only: their
        gradients sparse, which torch's AdaGrad and SGD apply to those rows alone."""
        for opt in self.opts:
            opt.zero_grad()
        value, rows, slices = self.loss_fn.by_rows(self.model, self.guide, *batch, tables=self.tables)
        value.backward()
        for table, piece in zip(self.tables, slices):
            if table.numel():  # a mean-field q's (m, 0) table has nothing to step (torch's sparse AdaGrad fails on it)
                grad = torch.zeros_like(piece) if piece.grad is None else piece.grad
                table.grad = torch.sparse_coo_tensor(rows[None], grad, table.shape, check_invariants=False)
        return value

    def _replay(self, batch):
        """The captured step's ``(loss, grads)``, or None: not captured, or not finite here."""
        if self.captured is None:
            return None
        try:
            return self.captured(batch)
        except Exception as error:  # recording failed: this model's steps are not one graph
            if self.captured.explicit:
                warnings.warn(f"fit(compiled=True): the step could not be captured ({type(error).__name__}: "
                              f"{error}); running it traced", RuntimeWarning, stacklevel=2)
            self.captured = None
            return None

    def stepping(self):
        # on a CPU, glibc would hand a step's freed memory back and page-fault it in again next step
        return heap.kept(all(p.device.type == "cpu" for p in self.values))

    def params(self):
        with torch.no_grad():
            return {name: transform_to(c)(p).clone() for name, p, c in zip(self.names, self.values, self.constraints)}

    def snapshot(self):
        return [p.detach().clone() for p in self.values], self._loss_state()

    def restore(self, best):
        values, loss_state = best if isinstance(best, tuple) else (best, {})  # a list: an older checkpoint's
        with torch.no_grad():
            for p, b in zip(self.values, values):
                p.copy_(b)
        if self.loss_state:
            self.loss_state.load_state_dict(loss_state)

    def _loss_state(self):
        return self.loss_state.state_dict() if self.loss_state else {}

    def save(self, path, done, losses, tracker, best):
        _save(path, done, self.names, self.values, self.opts, self.schedules, losses, tracker, best, self._loss_state())

    def load(self, path, tracker):
        start, losses, best, loss_state = _load(path, self.names, self.values, self.opts, self.schedules, tracker)
        if self.loss_state:
            self.loss_state.load_state_dict(loss_state)
        return start, losses, best

    def finish(self):
        return self.params(), self.opts[0] if len(self.opts) == 1 else tuple(self.opts)

    @staticmethod
    def to_floats(values):
        return torch.stack(values).tolist()  # one transfer for all


fit = make_fit(
    _Trainer, __name__, ppl="Pyro", how="; each step calls ``loss(model, guide, *batch, **kwargs)``",
    loss="a Pyro ELBO (``Trace_ELBO()`` by default) or a callable\n"
         "            ``loss(model, guide, *args, **kwargs) -> tensor``.",
    optimizer="a ``torch.optim.Optimizer`` class (``torch.optim.Adam`` by default).",
    compiled="The loss and its gradient are recorded once as\n"
             "            a graph of tensor operations (``torch.fx``'s ``make_fx``) and replayed without Pyro's\n"
             "            handlers (:mod:`pyro_sparsegp.captured`). None (default): for a model/guide pair of\n"
             "            one of the library's objects (``GPModel``, ``VOFModel``, ``CoxProcess``, ...) with\n"
             "            ``Trace_ELBO``, when at least ``captured.MIN_STEPS = 200`` steps run; True: for any\n"
             "            model whose steps run the same tensor operations every time (no Python branches on\n"
             "            values; every guide site reparameterised); False: never. A replayed step that is\n"
             "            not finite (a Cholesky factorisation needing more jitter) runs traced. On a CUDA\n"
             "            device the replay is one CUDA graph launch per step where the step reads nothing\n"
             "            back to the host.",
)


def _constant(step):
    return 1.0


def _captured(compiled, model, guide, loss, values, plan, kwargs):
    """The captured step ``fit(compiled=...)`` asks for (see :mod:`pyro_sparsegp.captured`), or None."""
    if compiled is None:
        compiled = captured.automatic(model, guide, loss) and plan.num_steps >= captured.MIN_STEPS
    elif compiled and not captured.supported(loss):
        raise ValueError(f"fit(compiled=True) captures Trace_ELBO with one particle, not {type(loss).__name__}")
    if not compiled:
        return None
    return captured.CapturedStep(model, guide, values, kwargs, explicit=compiled is True)


#: torch optimisers that take sparse gradients and then change only the rows that have one
SPARSE_OPTIMISERS = (torch.optim.Adagrad, torch.optim.SGD, torch.optim.SparseAdam)


def _tables(loss, model, by_name, by_class):
    """The q tables' tensors when ``loss`` reads them by rows (``QuadruplyStochasticELBO``) and
    their optimiser changes only the rows with a gradient (AdaGrad, plain SGD): then each step
    reads, differentiates and updates ``O(num_basis)`` rows of them, whatever ``m``. Else ()."""
    if not hasattr(loss, "by_rows"):
        return ()
    names = loss.tables(model)
    if any(n not in by_name for n in names):
        return ()
    for cls, groups in by_class.items():
        for group in groups:
            ours = [p for p in group["params"] if any(p is by_name.get(n) for n in names)]
            moving = group.get("momentum", 0.0) or group.get("weight_decay", 0.0)
            if ours and (not issubclass(cls, SPARSE_OPTIMISERS) or moving):
                return ()
    return tuple(by_name[n] for n in names)


def _loss_fn(loss):
    loss = pyro.infer.Trace_ELBO() if loss is None else loss
    if hasattr(loss, "differentiable_loss"):
        return loss.differentiable_loss
    if callable(loss):
        return loss
    raise TypeError(f"loss must be a Pyro ELBO or a callable, got {type(loss).__name__}")


def _batch(data, plan, step):
    idx = plan.indices(step)
    if idx is None:
        return tuple(data)
    return tuple(None if a is None else a[torch.as_tensor(idx, device=a.device)] for a in data)


def _capture_params(loss_fn, model, guide, batch, kwargs):
    """Run the loss once to create and collect the parameters it uses: names, unconstrained
    tensors and constraints. Each traced value links to its unconstrained tensor, wherever it is
    held (a library module, the param store), as SVI finds them."""
    with poutine.trace(param_only=True) as capture:
        loss_fn(model, guide, *batch, **kwargs)
    names = sorted(capture.trace.nodes)
    if not names:
        raise ValueError("the model and guide have no parameters to fit")
    sites = [capture.trace.nodes[name] for name in names]
    # a PyroModule reading a parameter the store holds (an autoguide's) omits its constraint from
    # the message; the store has it (get_state() would strip the values' links to their tensors)
    stored = pyro.get_param_store()._constraints
    return names, [s["value"].unconstrained() for s in sites], [stored.get(n, s["kwargs"]["constraint"]) for n, s in zip(names, sites)]


def _save(path, step, names, params, opts, schedules, losses, tracker, best, loss_state):
    state = {
        "loss_state": loss_state,
        "step": step,
        "names": names,
        "params": [p.detach().clone() for p in params],
        "best": best,
        "optimizers": [opt.state_dict() for opt in opts],
        "schedules": [schedule.state_dict() for schedule in schedules],
        "rng": torch.get_rng_state(),
        "losses": torch.as_tensor(losses, dtype=torch.float64),
        **{k: torch.as_tensor(v) for k, v in tracker.state().items()},
    }
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint


def _load(path, names, params, opts, schedules, tracker):
    state = torch.load(path, weights_only=True)  # plain tensors only: nothing is unpickled
    if list(state["names"]) != names:
        raise ValueError(
            f"checkpoint {path} holds parameters {list(state['names'])}, but this model has {names}"
        )
    shapes = [(name, tuple(value.shape), tuple(p.shape)) for name, p, value in zip(names, params, state["params"])]
    wrong = [f"{name} {saved} (this model: {own})" for name, saved, own in shapes if saved != own]
    if wrong:
        raise ValueError(f"checkpoint {path} holds parameters of other shapes: {', '.join(wrong)}")
    with torch.no_grad():
        for p, value in zip(params, state["params"]):
            p.copy_(value)
    if len(state["optimizers"]) != len(opts):
        raise ValueError(f"checkpoint {path} holds {len(state['optimizers'])} optimisers, but this fit has {len(opts)}")
    for opt, saved in zip(opts, state["optimizers"]):
        opt.load_state_dict(saved)
    for schedule, saved in zip(schedules, state["schedules"]):
        schedule.load_state_dict(saved)
    torch.set_rng_state(state["rng"])
    tracker.load({k: state[k].numpy() for k in ("es_steps", "es_values", "es_best")})
    return state["step"], state["losses"].tolist(), state["best"], state.get("loss_state", {})
