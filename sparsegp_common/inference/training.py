"""The training loop ``fit``, written once: the step plan, minibatch indices, early stopping,
checkpoint schedule, the progress bar and the result objects; each backend gives a
:class:`Trainer` (its optimiser, step and checkpoint format) to :func:`make_fit`."""
import contextlib
import dataclasses
import fnmatch
import functools
import math
import os
from typing import Any, Callable, Optional

import numpy as np
from tqdm.auto import tqdm

from sparsegp_common.checks import check_model_data
from sparsegp_common.messages import gradient_not_finite, gradient_spiked, loss_not_finite, loss_ran_away

#: ``fit`` stops when a loss exceeds the best so far by this many times the larger of the first
#: and best losses' magnitudes: noise never goes that far, a diverging optimiser does.
RUNAWAY = 1e3

#: ``fit`` stops when a step's gradient norm exceeds the median of the (up to 100) steps before it
#: by this factor: after such a step Adam's second-moment estimate is swamped, and every parameter
#: stays frozen for thousands of steps (``2 ln(factor) / (1 - beta2)``) while the loss looks calm.
GRADIENT_SPIKE = 1e4


class LossHistory:
    """The losses and gradient norms of a run: floats already read back, and the device values of
    the steps since.

    Reading a loss back from an accelerator waits for the step that computed it, so ``fit`` reads
    them every ``loss_every`` steps, all at once (``to_floats(values) -> [(loss, grad_norm), ...]``),
    and whenever something needs them (a callback reading ``FitState.loss``, a checkpoint, the end).
    """

    def __init__(self, values, to_floats):
        self.values = values  # floats, appended to in place
        self.grad_norms = []  # of the steps run in this call (not those before a resume)
        self.pending = []
        self.to_floats = to_floats

    def append(self, value):
        self.pending.append(value)

    def read(self):
        """Read the pending losses and gradient norms back; returns the list of every loss so far.

        Raises:
            FloatingPointError: a loss read back is NaN or infinite, or ran away (see
                :data:`RUNAWAY`); a gradient norm is NaN or infinite, or spiked (see
                :data:`GRADIENT_SPIKE`); the message says what to try.
        """
        if self.pending:
            new = [tuple(map(float, pair)) for pair in self.to_floats(self.pending)]
            self.pending = []
            first = self.values[0] if self.values else new[0][0]
            best = min(self.values, default=math.inf)
            for i, (value, norm) in enumerate(new):
                step = len(self.values) + i + 1
                if not math.isfinite(value):
                    raise FloatingPointError(loss_not_finite(step, value))
                if not math.isfinite(norm):
                    raise FloatingPointError(gradient_not_finite(step, norm))
                if value - best > RUNAWAY * max(abs(first), abs(best), 1.0):
                    raise FloatingPointError(loss_ran_away(step, value, best))
                recent = self.grad_norms[-100:]
                if len(recent) >= 10 and norm > GRADIENT_SPIKE * np.median(recent):
                    raise FloatingPointError(gradient_spiked(step, norm, float(np.median(recent))))
                best = min(best, value)
                self.grad_norms.append(norm)
            self.values.extend(value for value, _ in new)
        return self.values

    def __len__(self):
        return len(self.values) + len(self.pending)


@dataclasses.dataclass
class FitState:
    """What a callback sees after each step; set ``stop = True`` to end training.

    ``loss`` (this step's) and ``losses`` (every step's so far) are read from the device when a
    callback asks for them, so callbacks that do not look at them do not slow training down.
    """

    step: int  # number of steps done
    epoch: int
    history: LossHistory = dataclasses.field(repr=False)
    get_params: Callable[[], dict] = dataclasses.field(repr=False)
    stop: bool = False

    @property
    def losses(self):
        """Losses ``[float]`` of every step so far (including the steps before a resume)."""
        return self.history.read()

    @property
    def loss(self):
        """This step's loss."""
        return self.losses[-1]

    @property
    def params(self):
        """Current constrained parameter values ``{name: array}``."""
        return self.get_params()


@dataclasses.dataclass
class FitResult:
    """What ``fit`` returns.

    Attributes:
        losses: ``(num_steps,)`` loss (negative ELBO estimate) of every step run, including the
            steps before a resume.
        params: constrained parameter values ``{name: array}`` at the end (the best ones when
            early stopping restored them).
        validation: ``[(step, value), ...]`` of every validation evaluation.
        best_step: step of the best validation value (None without validation).
        stopped_early: whether early stopping or a callback ended the run.
        state: the backend's optimiser state at the end (NumPyro's ``SVIState``; the torch
            optimiser in Pyro, a tuple of them when ``param_groups`` name several classes).
        grad_norms: the norm of the gradient (w.r.t. the unconstrained parameters) of every step
            run in this call.
    """

    losses: np.ndarray
    params: dict
    validation: list
    best_step: Optional[int]
    stopped_early: bool
    state: Any = None
    grad_norms: Optional[np.ndarray] = None


@dataclasses.dataclass
class Plan:
    """How many steps, and which rows each step uses.

    Minibatches are drawn without replacement within an epoch from a permutation seeded by
    ``(seed, epoch)``, so a resumed run sees the same batches as an uninterrupted one and both
    backends see the same batches for the same seed. The last ``num_rows % batch_size`` rows of
    each permutation are skipped: every batch has the same size (one compiled program in JAX) and
    each is still a uniformly random subset, so the minibatch ELBO stays unbiased. The permutation
    of the current epoch is drawn once and kept (drawing it is O(num_rows), far more than a step
    of a small model at millions of rows); any step, in any order, still gets the same rows.
    """

    num_rows: Optional[int]
    batch_size: Optional[int]
    num_steps: int
    seed: int
    _permutation: tuple = dataclasses.field(default=(None, None), init=False, repr=False, compare=False)

    @property
    def steps_per_epoch(self):
        return 1 if self.batch_size is None else self.num_rows // self.batch_size

    def epoch(self, step):
        return step // self.steps_per_epoch

    def indices(self, step):
        """Row indices of 0-based ``step`` (None: the full data set)."""
        if self.batch_size is None:
            return None
        j = step % self.steps_per_epoch
        return self.permutation(self.epoch(step))[j * self.batch_size : (j + 1) * self.batch_size]

    def permutation(self, epoch):
        """The row order of ``epoch``, seeded by ``(seed, epoch)`` (cached for the last epoch asked)."""
        cached, perm = self._permutation
        if cached != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            self._permutation = (epoch, perm)
        return perm


def make_plan(data, batch_size, num_steps, num_epochs, seed):
    """Validate the arguments of ``fit`` that fix the step plan."""
    if not isinstance(data, (tuple, list)):
        raise TypeError(f"data must be a tuple of arrays (e.g. (X, y)), got {type(data).__name__}")
    lengths = {len(a) for a in data if a is not None}
    if len(lengths) > 1:
        raise ValueError(f"the arrays in data must have the same length, got lengths {sorted(lengths)}")
    num_rows = lengths.pop() if lengths else None
    if batch_size is not None:
        if num_rows is None:
            raise ValueError("batch_size needs data: pass the arrays to split as data=(X, y)")
        if not isinstance(batch_size, (int, np.integer)) or not 0 < batch_size <= num_rows:
            raise ValueError(f"batch_size must be an integer in 1..{num_rows} (len(data)), got {batch_size!r}")
    if (num_steps is None) == (num_epochs is None):
        raise ValueError("give exactly one of num_steps and num_epochs")
    plan = Plan(num_rows, batch_size, 0, seed)
    count, arg = (num_steps, "num_steps") if num_steps is not None else (num_epochs, "num_epochs")
    if not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"{arg} must be a positive integer, got {count!r}")
    plan.num_steps = int(count if num_steps is not None else count * plan.steps_per_epoch)
    return plan


class EarlyStopping:
    """Tracks a validation metric (lower is better) and says when to stop.

    Args:
        patience: stop after this many evaluations without improvement (None: never stop).
    """

    def __init__(self, patience=None):
        if patience is not None and (not isinstance(patience, (int, np.integer)) or patience < 1):
            raise ValueError(f"patience must be a positive integer or None, got {patience!r}")
        self.patience = patience
        self.history = []
        self.best = math.inf
        self.best_step = None
        self.bad = 0

    def update(self, step, value):
        """Record ``value`` at ``step``; returns True when it is the best so far."""
        value = float(value)  # NaN never counts as an improvement
        self.history.append((step, value))
        if value < self.best:
            self.best, self.best_step, self.bad = value, step, 0
            return True
        self.bad += 1
        return False

    @property
    def should_stop(self):
        return self.patience is not None and self.bad >= self.patience

    def state(self):
        """The tracker as plain arrays, for checkpoints."""
        steps, values = zip(*self.history) if self.history else ((), ())
        return {
            "es_steps": np.asarray(steps, dtype=np.int64),
            "es_values": np.asarray(values, dtype=np.float64),
            "es_best": np.asarray([self.best, -1 if self.best_step is None else self.best_step, self.bad]),
        }

    def load(self, state):
        self.history = [(int(s), float(v)) for s, v in zip(state["es_steps"], state["es_values"])]
        best, best_step, bad = (float(x) for x in np.asarray(state["es_best"]))
        self.best, self.best_step, self.bad = best, None if best_step < 0 else int(best_step), int(bad)


def interval(every, plan, name):
    """A positive step interval; default once per epoch (every 100 steps without minibatches)."""
    if every is None:
        return plan.steps_per_epoch if plan.batch_size is not None else 100
    if not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"{name} must be a positive integer, got {every!r}")
    return int(every)


FIT_STEPS_DOC = """``fit`` one step at a time, in the calling thread: a generator with ``fit``'s arguments that
    yields the :class:`FitState` of every step (after the callbacks); set ``stop = True`` on the
    state just yielded to end training. Its return value (``StopIteration.value``, or the value of
    ``yield from``) is the :class:`FitResult`, after the trained values are written back as by ``fit``.
    """

FIT_DOC = """Train ``model``/``guide`` by SVI{how}.

    Args:
        model, guide: the {ppl} model and guide.
        data: tuple of arrays (tensors in Pyro) with the same first dimension N (e.g. ``(X, y)``),
            passed positionally to the model and guide, split into minibatches when
            ``batch_size`` is given. The model must then scale its data terms by N / batch_size
            (``GPModel`` does this when built with ``num_data=N``).
        num_steps, num_epochs: the length of training (exactly one of them).
        batch_size: rows per step, drawn without replacement within each epoch (None: all).
        loss: {loss}
        lr: learning rate.
        lr_schedule: optional ``schedule(step) -> multiplier`` of ``lr`` (``step`` counts from 0;
            NumPyro traces it with JAX, so write it with ``jnp`` or plain arithmetic there).
        optimizer: {optimizer}
        {param_groups}
        callbacks: callables ``callback(state: FitState)`` run after every step; setting
            ``state.stop = True`` ends training.
        validation: optional ``validation(params) -> float`` (lower is better), run every
            ``eval_every`` steps (default: each epoch, or every 100 steps without minibatches).
        patience: stop after this many evaluations without improvement (None: never).
        restore_best: with ``validation``, end with the parameters of the best evaluation.
        checkpoint: file to save parameters, optimiser and RNG state and the history to, every
            ``checkpoint_every`` steps (default: each epoch, or every 100 steps) and at the end
            (plain tensors for ``torch.load(weights_only=True)`` in Pyro, an ``.npz`` of the SVI
            state in NumPyro: loading unpickles no code).
        resume: continue from ``checkpoint`` when it exists; the run then reaches the same
            parameters as an uninterrupted one with the same seed.
        seed: seeds the RNG (Pyro's global one, NumPyro's SVI key) and the minibatch order.
        progress: show a tqdm progress bar (with the running loss, from the first read).
        loss_every: read the loss back from the device every this many steps (reading waits for
            the step; 1 reads every step). ``FitResult.losses`` still holds every step's loss,
            and callbacks reading ``state.loss`` get it at once.
        compiled: run each step as one compiled program. {compiled}
        **kwargs: passed to the model and guide (held fixed in NumPyro: the jit closes over them).

    Returns:
        FitResult: losses ``(num_steps,)``, final (constrained) params, validation history, and
        the optimiser (Pyro) or the final ``SVIState`` (NumPyro).

    Raises:
        FloatingPointError: the loss became NaN or infinite, or ran away (rose above the best so
            far by ``RUNAWAY = 1e3`` times the larger of the first and best losses' magnitudes);
            or the gradient became NaN or infinite, or its norm spiked above ``GRADIENT_SPIKE =
            1e4`` times the median of the steps before (after which Adam leaves every parameter
            frozen for thousands of steps). Checked whenever the losses are read back (every
            ``loss_every`` steps, no extra synchronisation); the message says what to try.

    After ``fit`` the trained values are where predictions read them, in both backends: Pyro's
    library modules (which own their parameters), and in NumPyro the library objects (kernels, priors, likelihoods, ...) whose
    parameters the model and guide read, whichever way they reach them (bound methods, closures,
    globals): every object whose ``bind()`` runs during ``SVI.init`` gets the values of its sites
    ``<name>.<attribute>``. So ``predict_f(prior, X)`` after ``fit`` uses the trained values
    without ``params=``, and a second ``fit`` continues from them. Parameters of other NumPyro
    guides (e.g. autoguides) are only in ``FitResult.params``.
    """

PARAM_GROUPS_DOC = """param_groups: optional list of dicts, each giving some parameters their own
            learning rate and optimiser options, e.g. ``[{"params": "gp.net.*", "lr": 1e-3,
            "weight_decay": 1e-4}]``. ``"params"`` selects parameters by site name: a glob pattern,
            a list of names/patterns, or a predicate ``name -> bool``; a parameter belongs to the
            first group that selects it, and the parameters of no group keep ``lr`` and the
            default options. ``"lr"`` is the group's learning rate (default ``lr``; ``lr_schedule``
            multiplies it too) and ``"lr_schedule"`` its own ``step -> multiplier`` in place of
            ``lr_schedule`` (e.g. ``lambda t: (t >= 1000) * 1.0`` holds the group's
            parameters for the first 1,000 steps). ``"weight_decay"`` adds ``weight_decay * value`` to the gradient of
            the group's (unconstrained) parameters, as torch's ``Adam`` and ``SGD`` do.
            ``"optimizer"`` is the group's optimiser class (default ``optimizer``), e.g. AdaGrad
            for some parameters beside Adam for the rest. Other keys are keyword arguments of the
            group's optimiser (e.g. ``betas`` in torch, ``b1`` in NumPyro)."""


def split_param_groups(names, groups, lr):
    """The parameter ``names`` split as ``fit(param_groups=...)`` asks (see ``PARAM_GROUPS_DOC``).

    Returns:
        ``[(names, lr, options), ...]``: one entry per group, then the parameters of no group with
        ``lr`` and no options (left out when every parameter is in a group).
    """
    if groups is None:
        return [(list(names), lr, {})]
    if not isinstance(groups, (list, tuple)):
        raise TypeError(f"param_groups must be a list of dicts, got {type(groups).__name__}")
    remaining, out = list(names), []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"param_groups[{i}] must be a dict with a 'params' selector, got {group!r}")
        select = _selector(group["params"], i)
        chosen = [n for n in remaining if select(n)]
        if not chosen:
            raise ValueError(f"param_groups[{i}] ({group['params']!r}) selects no parameter left; parameters: {list(names)}")
        remaining = [n for n in remaining if n not in chosen]
        for key, what in (("optimizer", "an optimiser class"), ("lr_schedule", "a function step -> multiplier")):
            if key in group and not callable(group[key]):
                raise TypeError(f"param_groups[{i}][{key!r}] must be {what}, got {group[key]!r}")
        options = {k: v for k, v in group.items() if k not in ("params", "lr")}
        out.append((chosen, group.get("lr", lr), options))
    if remaining:
        out.append((remaining, lr, {}))
    return out


def _selector(spec, i):
    if callable(spec):
        return lambda name: bool(spec(name))
    patterns = [spec] if isinstance(spec, str) else spec
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"param_groups[{i}]['params'] must be a pattern, a list of patterns or a predicate, got {spec!r}")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check_fit_options(validation, eval_every, checkpoint, checkpoint_every, resume, loss_every=1):
    """Options of ``fit`` that only make sense together."""
    if validation is None and eval_every is not None:
        raise ValueError("eval_every was given without a validation function")
    if validation is not None and not callable(validation):
        raise TypeError("validation must be a callable validation(params) -> float")
    if checkpoint is None and (checkpoint_every is not None or resume):
        raise ValueError("checkpoint_every and resume need a checkpoint file (checkpoint=...)")
    if not isinstance(loss_every, (int, np.integer)) or loss_every < 1:
        raise ValueError(f"loss_every must be a positive integer, got {loss_every!r}")


def run_steps(plan, start, losses, best, step, params, snapshot, save, *, tracker, validation, eval_every,
              callbacks, checkpoint_every, progress, loss_every=1, to_floats=None):
    """The loop of both backends' ``fit``, a generator: it yields the :class:`FitState` of every
    step after the callbacks have seen it (setting ``stop`` on it ends the loop).

    Args:
        plan, start: the step plan and the first step to run (after a resume).
        losses, best: the history so far (floats; the new losses are appended to it in place) and
            the best snapshot so far (None).
        step: ``step(i)`` runs 0-based step ``i`` and returns its loss and gradient norm (on the
            device, in one object that ``to_floats`` reads back).
        params: ``params() -> dict`` of the current constrained values.
        snapshot: ``snapshot()`` copies what restoring the best evaluation needs.
        save: ``save(done, best)`` writes a checkpoint, or None for no checkpoints.
        loss_every: read the losses back from the device every this many steps.
        to_floats: ``to_floats([step's value, ...]) -> [(loss, grad_norm), ...]`` in one transfer
            (default: the pairs as they are).

    Returns:
        ``(best, stopped, grad_norms)`` as the generator's return value; ``losses`` then holds
        every step's loss.
    """
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    history = LossHistory(losses, to_floats or (lambda values: values))
    window = max(plan.steps_per_epoch, 10)
    stopped = False
    with progress_bar(plan, start, progress) as bar:
        for i in range(start, plan.num_steps):
            history.append(step(i))
            bar.update(1)
            done = i + 1
            if done % loss_every == 0 or done == plan.num_steps:
                report(bar, history.read(), window)
            if validation is not None and done % eval_every == 0:
                if tracker.update(done, validation(params())):
                    best = snapshot()
                stopped = tracker.should_stop
            state = FitState(done, plan.epoch(i), history, params)
            for callback in callbacks:
                callback(state)
            yield state
            stopped = stopped or state.stop
            if save is not None and (done % checkpoint_every == 0 or stopped or done == plan.num_steps):
                history.read()
                save(done, best)
            if stopped:
                break
        history.read()
    return best, stopped, np.asarray(history.grad_norms)


def progress_bar(plan, start, enabled):
    """A tqdm bar over the steps (disabled with ``progress=False``)."""
    return tqdm(total=plan.num_steps, initial=start, disable=not enabled, desc="fit", unit="step", dynamic_ncols=True)


def report(bar, losses, window):
    """Show the mean of the last ``window`` losses read (a running mean, so it is readable with
    noisy minibatch losses; from the first read on)."""
    if losses:
        bar.set_postfix(loss=f"{np.mean(losses[-window:]):.4g}", refresh=False)


def make_fit(trainer, module, **doc):
    """The ``fit`` of a backend: the loop, options, plan, early stopping and checkpoint schedule
    written once around ``trainer``, the backend's side (see :class:`Trainer`); ``doc`` fills the
    backend's phrases of :data:`FIT_DOC`."""

    def steps(
        model, guide, data=(), *, num_steps=None, num_epochs=None, batch_size=None, loss=None, lr=0.01,
        lr_schedule=None, optimizer=None, callbacks=(), validation=None, eval_every=None, patience=None,
        restore_best=True, checkpoint=None, checkpoint_every=None, resume=False, seed=0, progress=True,
        loss_every=10, param_groups=None, compiled=None, **kwargs,
    ):
        plan = make_plan(tuple(data), batch_size, num_steps, num_epochs, seed)
        check_fit_options(validation, eval_every, checkpoint, checkpoint_every, resume, loss_every)
        check_model_data(model, tuple(data))
        eval_every = interval(eval_every, plan, "eval_every")
        checkpoint_every = interval(checkpoint_every, plan, "checkpoint_every")
        tracker = EarlyStopping(patience)
        run = trainer(model, guide, data, plan, loss=loss, lr=lr, lr_schedule=lr_schedule, optimizer=optimizer,
                      param_groups=param_groups, seed=seed, compiled=compiled, kwargs=kwargs)
        losses, start, best = [], 0, None
        if resume and os.path.exists(checkpoint):
            start, losses, best = run.load(checkpoint, tracker)
        with run.stepping():
            best, stopped, grad_norms = yield from run_steps(
                plan, start, losses, best, run.step, run.params, run.snapshot,
                None if checkpoint is None else (lambda done, best: run.save(checkpoint, done, losses, tracker, best)),
                tracker=tracker, validation=validation, eval_every=eval_every, callbacks=callbacks,
                checkpoint_every=checkpoint_every, progress=progress, loss_every=loss_every, to_floats=run.to_floats,
            )
        if restore_best and best is not None:
            run.restore(best)
        params, state = run.finish()
        return FitResult(np.asarray(losses), params, tracker.history, tracker.best_step, stopped, state, grad_norms)

    @functools.wraps(steps)
    def fit(*args, **kwargs):
        running = steps(*args, **kwargs)
        try:
            while True:
                next(running)
        except StopIteration as end:
            return end.value

    fit.__name__ = fit.__qualname__ = "fit"
    steps.__doc__ = FIT_STEPS_DOC
    fit.steps = steps
    fit.__module__ = steps.__module__ = module
    fit.__doc__ = FIT_DOC.format(param_groups=PARAM_GROUPS_DOC, **doc)
    return fit


class Trainer:
    """The backend's side of ``fit`` (:func:`make_fit`): built as ``Trainer(model, guide, data,
    plan, *, loss, lr, lr_schedule, optimizer, param_groups, seed, compiled, kwargs)``, it creates the
    parameters (running the model and guide once on the first batch), the optimiser and, as
    ``compiled`` asks, the compiled step, and
    answers:

    * ``step(i)``: run 0-based step ``i``; returns its loss and the norm of its gradient (w.r.t.
      the unconstrained parameters) as one device array ``(2,)``;
    * ``params()``: the current constrained values ``{name: value}``;
    * ``snapshot()`` / ``restore(best)``: copy, and go back to, what the best evaluation needs;
    * ``save(path, done, losses, tracker, best)`` / ``load(path, tracker) -> (start, losses, best)``:
      checkpoints of plain arrays (nothing is unpickled);
    * ``finish() -> (params, state)``: the final values, left where predictions read them, and the
      optimiser state for ``FitResult.state``;
    * ``to_floats(values)``: read the steps' values back in one transfer, as ``[(loss, grad_norm), ...]``;
    * ``stepping()``: a context manager held while the steps run (NumPyro on CPU: the BLAS threads
      of :mod:`sparsegp_common.inference.threads`; Pyro on CPU: the freed memory kept by
      :mod:`sparsegp_common.inference.heap`; by default nothing).

    A loss may keep state from step to step (the control variates of ``QuadruplyStochasticELBO``):
    the trainer then carries it (Pyro: ``loss.state_dict()``/``load_state_dict``, saved in
    checkpoints and snapshots; NumPyro: SVI's mutable state, set up by
    ``loss.with_initial_state``), and a loss with ``check_optimiser(name, cls, options)`` may refuse
    the optimiser a parameter group gives one of its parameters.
    """

    def stepping(self):
        return contextlib.nullcontext()
