"""``fit``: stochastic variational inference for any NumPyro model/guide pair."""
import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.infer import SVI, Trace_ELBO

from sparsegp_common.training import (
    PARAM_GROUPS_DOC, EarlyStopping, FitResult, FitState, check_fit_options, interval, make_plan, run_steps,
    split_param_groups,
)

from . import params as _params

__all__ = ["FitResult", "FitState", "fit"]


def fit(
    model, guide, data=(), *, num_steps=None, num_epochs=None, batch_size=None, loss=None, lr=0.01,
    lr_schedule=None, optimizer=None, callbacks=(), validation=None, eval_every=None, patience=None,
    restore_best=True, checkpoint=None, checkpoint_every=None, resume=False, seed=0, progress=True,
    loss_every=10, param_groups=None, **kwargs,
):
    """Train ``model``/``guide`` by SVI, one jit-compiled ``SVI.update`` per step.

    Args:
        model, guide: the NumPyro model and guide.
        data: tuple of arrays with the same first dimension N (e.g. ``(X, y)``), passed
            positionally to the model and guide, split into minibatches when ``batch_size`` is
            given. The model must then scale its data terms by N / batch_size (``GPModel`` does
            this when built with ``num_data=N``).
        num_steps, num_epochs: the length of training (exactly one of them).
        batch_size: rows per step, drawn without replacement within each epoch (None: all).
        loss: a NumPyro ELBO (``Trace_ELBO()`` by default).
        lr: learning rate.
        lr_schedule: optional ``schedule(step) -> multiplier`` of ``lr`` (``step`` counts from 0;
            it is traced by JAX, so write it with ``jnp`` or plain arithmetic).
        optimizer: a NumPyro optimiser class taking the step size (``numpyro.optim.Adam`` by
            default).
        {param_groups}
        callbacks: callables ``callback(state: FitState)`` run after every step; setting
            ``state.stop = True`` ends training.
        validation: optional ``validation(params) -> float`` (lower is better), run every
            ``eval_every`` steps (default: each epoch, or every 100 steps without minibatches).
        patience: stop after this many evaluations without improvement (None: never).
        restore_best: with ``validation``, end with the parameters of the best evaluation.
        checkpoint: ``.npz`` file to save the SVI state (parameters, optimiser, RNG key) and
            history to, every ``checkpoint_every`` steps (default: each epoch, or every 100 steps)
            and at the end.
        resume: continue from ``checkpoint`` when it exists; the run then reaches the same
            parameters as an uninterrupted one with the same seed.
        seed: seeds the SVI RNG key and the minibatch order.
        progress: show a tqdm progress bar (with the running loss, from the first read).
        loss_every: read the loss back from the device every this many steps (reading waits for
            the step; 1 reads every step). ``FitResult.losses`` still holds every step's loss,
            and callbacks reading ``state.loss`` get it at once.
        **kwargs: passed to the model and guide (held fixed: they are closed over by the jit).

    Returns:
        FitResult: losses ``(num_steps,)``, final (constrained) params, validation history and
        the final ``SVIState``.

    The final params are also written back into the library objects (kernels, priors,
    likelihoods, ...) whose parameters the model and guide read, whichever way they reach them
    (bound methods, closures, globals): every object whose ``bind()`` runs during ``SVI.init``
    gets the values of its sites ``<name>.<attribute>``. So ``predict_f(prior, X)`` after
    ``fit`` uses the trained values without ``params=``, and a second ``fit`` continues from
    them, as the Pyro backend does through its param store. Parameters of other guides (e.g.
    autoguides) are only in ``FitResult.params``.
    """
    plan = make_plan(tuple(data), batch_size, num_steps, num_epochs, seed)
    check_fit_options(validation, eval_every, checkpoint, checkpoint_every, resume, loss_every)
    eval_every = interval(eval_every, plan, "eval_every")
    checkpoint_every = interval(checkpoint_every, plan, "checkpoint_every")
    if loss is not None and not isinstance(loss, numpyro.infer.elbo.ELBO):
        raise TypeError(f"loss must be a NumPyro ELBO, got {type(loss).__name__}")
    tracker = EarlyStopping(patience)
    data = tuple(None if a is None else jnp.asarray(a) for a in data)
    optim = _grouped(optimizer or numpyro.optim.Adam, lr, lr_schedule, param_groups)
    svi = SVI(model, guide, optim, loss or Trace_ELBO())
    # The batch is gathered inside the compiled step: one dispatch per step.
    update = jax.jit(lambda state, data, idx: svi.update(state, *_take(data, idx), **kwargs))

    with _binds() as bound:  # the library objects the model and guide read their parameters through
        state = svi.init(jax.random.PRNGKey(seed), *_batch(data, plan, 0), **kwargs)
    losses, start, best = [], 0, None
    if resume and os.path.exists(checkpoint):
        start, losses, state, best = _load(checkpoint, state, tracker)

    current = [state]  # the state of the last step, read by the closures below

    def step(i):
        current[0], value = update(current[0], data, plan.indices(i))
        return value

    def save(done, best):
        _save(checkpoint, done, current[0], losses, tracker, best)

    best, stopped = run_steps(
        plan, start, losses, best, step, lambda: svi.get_params(current[0]), lambda: current[0],
        None if checkpoint is None else save, tracker=tracker, validation=validation, eval_every=eval_every,
        callbacks=callbacks, checkpoint_every=checkpoint_every, progress=progress,
        loss_every=loss_every, to_floats=_to_floats,
    )
    state = current[0]
    if restore_best and best is not None:
        state = best
    params = svi.get_params(state)
    _write_back(bound, params)
    return FitResult(np.asarray(losses), params, tracker.history, tracker.best_step, stopped, state)


@contextlib.contextmanager
def _binds():
    """Record ``(object, prefix)`` of every ``Parameterized.bind()`` run inside the block."""
    log = []
    _params._bind_logs.append(log)
    try:
        yield log
    finally:
        _params._bind_logs.remove(log)


def _write_back(bound, params):
    """Make the final values the objects' own values, where predictions (and a next ``fit``) read them."""
    for obj, prefix in bound:
        for name in obj._constraints:
            key = f"{prefix}.{name}" if prefix else name
            if key in params:
                setattr(obj, name, params[key])


if fit.__doc__:  # None under python -OO
    fit.__doc__ = fit.__doc__.format(param_groups=PARAM_GROUPS_DOC)


def _step_size(lr, lr_schedule):
    return lr if lr_schedule is None else (lambda i: lr * lr_schedule(i))


def _grouped(optimizer, lr, lr_schedule, param_groups):
    if param_groups is None:
        return optimizer(_step_size(lr, lr_schedule))
    return _Grouped(optimizer, lr, lr_schedule, param_groups)


class _Grouped(numpyro.optim._NumPyroOptim):
    """One NumPyro optimiser per parameter group (what ``optax.multi_transform`` does for optax),
    the groups split by site name when SVI hands over the parameters."""

    def __init__(self, optimizer, lr, lr_schedule, param_groups):
        self.optimizer, self.lr, self.lr_schedule, self.param_groups = optimizer, lr, lr_schedule, param_groups
        self.update_with_value = False
        self.groups = None

    def init(self, params):
        self.groups = []
        for names, lr, options in split_param_groups(sorted(params), self.param_groups, self.lr):
            options = dict(options)
            decay = options.pop("weight_decay", 0.0)
            self.groups.append((names, decay, self.optimizer(_step_size(lr, self.lr_schedule), **options)))
        states = tuple(optim.init({n: params[n] for n in names}) for names, _, optim in self.groups)
        return jnp.array(0), states

    def update(self, g, state, value=None):
        i, states = state
        new = []
        for (names, decay, optim), sub in zip(self.groups, states):
            grads = {n: g[n] for n in names}
            if decay:
                values = optim.get_params(sub)
                grads = {n: grads[n] + decay * values[n] for n in names}
            new.append(optim.update(grads, sub))
        return i + 1, tuple(new)

    def get_params(self, state):
        return {n: v for (_, _, optim), sub in zip(self.groups, state[1]) for n, v in optim.get_params(sub).items()}


def _to_floats(values):
    return [float(v) for v in jax.device_get(values)]  # one wait for all


def _batch(data, plan, step):
    return _take(data, plan.indices(step))


def _take(data, idx):
    return data if idx is None else tuple(None if a is None else a[idx] for a in data)


def _save(path, step, state, losses, tracker, best):
    arrays = {f"state_{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(state))}
    if best is not None:
        arrays.update({f"best_{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(best))})
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, step=step, losses=np.asarray(losses, dtype=np.float64), **tracker.state(), **arrays)
    os.replace(tmp, path)  # never leave a half-written checkpoint


def _load(path, state, tracker):
    """Restore into the structure of a freshly initialised ``state`` (plain arrays, no pickle)."""
    leaves, treedef = jax.tree_util.tree_flatten(state)
    with np.load(path, allow_pickle=False) as saved:
        step = int(saved["step"])
        stored = [saved[f"state_{i}"] for i in range(len(leaves)) if f"state_{i}" in saved]
        if len(stored) != len(leaves) or any(a.shape != jnp.shape(b) for a, b in zip(stored, leaves)):
            raise ValueError(f"checkpoint {path} does not match this model's parameters and optimiser")

        def restore(arrays):
            return treedef.unflatten([jnp.asarray(a, dtype=jnp.asarray(b).dtype) for a, b in zip(arrays, leaves)])

        best = restore([saved[f"best_{i}"] for i in range(len(leaves))]) if "best_0" in saved else None
        tracker.load(saved)
        return step, saved["losses"].tolist(), restore(stored), best
