"""``fit``: stochastic variational inference for any Pyro model/guide pair."""
import os

import numpy as np
import pyro
import torch
from pyro import poutine

from sparsegp_common.training import (
    PARAM_GROUPS_DOC, EarlyStopping, FitResult, FitState, check_fit_options, interval, make_plan, run_steps,
    split_param_groups,
)

__all__ = ["FitResult", "FitState", "fit"]


def fit(
    model, guide, data=(), *, num_steps=None, num_epochs=None, batch_size=None, loss=None, lr=0.01,
    lr_schedule=None, optimizer=None, callbacks=(), validation=None, eval_every=None, patience=None,
    restore_best=True, checkpoint=None, checkpoint_every=None, resume=False, seed=0, progress=True,
    loss_every=10, param_groups=None, **kwargs,
):
    """Train ``model``/``guide`` by SVI; each step calls ``loss(model, guide, *batch, **kwargs)``.

    Args:
        model, guide: the Pyro model and guide.
        data: tuple of tensors with the same first dimension N (e.g. ``(X, y)``), passed
            positionally to the model and guide, split into minibatches when ``batch_size`` is
            given. The model must then scale its data terms by N / batch_size (``GPModel`` does
            this when built with ``num_data=N``).
        num_steps, num_epochs: the length of training (exactly one of them).
        batch_size: rows per step, drawn without replacement within each epoch (None: all).
        loss: a Pyro ELBO (``Trace_ELBO()`` by default) or a callable
            ``loss(model, guide, *args, **kwargs) -> tensor``.
        lr: learning rate.
        lr_schedule: optional ``schedule(step) -> multiplier`` of ``lr`` (``step`` counts from 0).
        optimizer: a ``torch.optim.Optimizer`` class (``torch.optim.Adam`` by default).
        {param_groups}
        callbacks: callables ``callback(state: FitState)`` run after every step; setting
            ``state.stop = True`` ends training.
        validation: optional ``validation(params) -> float`` (lower is better), run every
            ``eval_every`` steps (default: each epoch, or every 100 steps without minibatches).
        patience: stop after this many evaluations without improvement (None: never).
        restore_best: with ``validation``, end with the parameters of the best evaluation.
        checkpoint: file to save parameters, optimiser, RNG state and history to, every
            ``checkpoint_every`` steps (default: each epoch, or every 100 steps) and at the end.
        resume: continue from ``checkpoint`` when it exists; the run then reaches the same
            parameters as an uninterrupted one with the same seed.
        seed: seeds Pyro's RNG and the minibatch order.
        progress: show a tqdm progress bar (with the running loss, from the first read).
        loss_every: read the loss back from the device every this many steps (reading waits for
            the step; 1 reads every step). ``FitResult.losses`` still holds every step's loss,
            and callbacks reading ``state.loss`` get it at once.
        **kwargs: passed to the model and guide.

    Returns:
        FitResult: losses ``(num_steps,)``, final (constrained) params, validation history.
    """
    plan = make_plan(tuple(data), batch_size, num_steps, num_epochs, seed)
    check_fit_options(validation, eval_every, checkpoint, checkpoint_every, resume, loss_every)
    eval_every = interval(eval_every, plan, "eval_every")
    checkpoint_every = interval(checkpoint_every, plan, "checkpoint_every")
    loss_fn = _loss_fn(loss)
    tracker = EarlyStopping(patience)

    pyro.set_rng_seed(seed)
    names, params = _capture_params(loss_fn, model, guide, _batch(data, plan, 0), kwargs)
    by_name = dict(zip(names, params))
    groups = [{"params": [by_name[n] for n in group], "lr": group_lr, **options}
              for group, group_lr, options in split_param_groups(names, param_groups, lr)]
    opt = (optimizer or torch.optim.Adam)(groups, lr=lr)
    schedule = None if lr_schedule is None else torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule)
    losses, start, best = [], 0, None
    if resume and os.path.exists(checkpoint):
        start, losses, best = _load(checkpoint, names, params, opt, schedule, tracker)

    def constrained():
        store = pyro.get_param_store()
        return {name: store[name].detach().clone() for name in names}

    def step(i):
        opt.zero_grad()
        value = loss_fn(model, guide, *_batch(data, plan, i), **kwargs)
        value.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        return value.detach()

    def save(done, best):
        _save(checkpoint, done, names, params, opt, schedule, losses, tracker, best)

    best, stopped = run_steps(
        plan, start, losses, best, step, constrained, lambda: [p.detach().clone() for p in params],
        None if checkpoint is None else save, tracker=tracker, validation=validation, eval_every=eval_every,
        callbacks=callbacks, checkpoint_every=checkpoint_every, progress=progress,
        loss_every=loss_every, to_floats=_to_floats,
    )
    if restore_best and best is not None:
        with torch.no_grad():
            for p, b in zip(params, best):
                p.copy_(b)
    return FitResult(np.asarray(losses), constrained(), tracker.history, tracker.best_step, stopped, opt)


if fit.__doc__:  # None under python -OO
    fit.__doc__ = fit.__doc__.format(param_groups=PARAM_GROUPS_DOC)


def _to_floats(values):
    return torch.stack([v.reshape(()) for v in values]).tolist()  # one transfer for all


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
    """Run the loss once to create and collect the unconstrained parameters it uses."""
    with poutine.trace(param_only=True) as capture:
        loss_fn(model, guide, *batch, **kwargs)
    names = sorted(capture.trace.nodes)
    if not names:
        raise ValueError("the model and guide have no parameters to fit")
    store = pyro.get_param_store()
    return names, [store.get_param(name).unconstrained() for name in names]


def _save(path, step, names, params, opt, schedule, losses, tracker, best):
    state = {
        "step": step,
        "names": names,
        "params": [p.detach().clone() for p in params],
        "best": best,
        "optimizer": opt.state_dict(),
        "schedule": None if schedule is None else schedule.state_dict(),
        "rng": torch.get_rng_state(),
        "losses": torch.as_tensor(losses, dtype=torch.float64),
        **{k: torch.as_tensor(v) for k, v in tracker.state().items()},
    }
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint


def _load(path, names, params, opt, schedule, tracker):
    state = torch.load(path, weights_only=True)  # plain tensors only: nothing is unpickled
    if list(state["names"]) != names:
        raise ValueError(
            f"checkpoint {path} holds parameters {list(state['names'])}, but this model has {names}"
        )
    with torch.no_grad():
        for p, value in zip(params, state["params"]):
            p.copy_(value)
    opt.load_state_dict(state["optimizer"])
    if schedule is not None and state["schedule"] is not None:
        schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["rng"])
    tracker.load({k: state[k].numpy() for k in ("es_steps", "es_values", "es_best")})
    return state["step"], state["losses"].tolist(), state["best"]
