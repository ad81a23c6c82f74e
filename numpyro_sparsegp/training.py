"""``fit``: stochastic variational inference for any NumPyro model/guide pair."""
import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.svi import SVIState

from sparsegp_common.inference import row_updates
from sparsegp_common.inference.threads import BlasThreads
from sparsegp_common.inference.training import FitResult, FitState, Trainer, make_fit, split_param_groups

from . import captured, sites
from . import params as _params

__all__ = ["FitResult", "FitState", "fit"]


class _Trainer(Trainer):
    """An ``SVI`` state, one jit-compiled ``SVI.update`` per step (the batch gathered inside it:
    one dispatch per step), and the final values written back into the library objects."""

    def __init__(self, model, guide, data, plan, *, loss, lr, lr_schedule, optimizer, param_groups, seed, compiled,
                 kwargs):
        if loss is not None and not isinstance(loss, numpyro.infer.elbo.ELBO):
            raise TypeError(f"loss must be a NumPyro ELBO, got {type(loss).__name__}")
        self.data, self.plan = tuple(None if a is None else jnp.asarray(a) for a in data), plan
        optim = _Grouped(optimizer or numpyro.optim.Adam, lr, lr_schedule, param_groups,
                         getattr(loss, "check_optimiser", lambda *_: None), _tables(loss, model))
        self.svi = SVI(model, guide, optim, loss or Trace_ELBO())
        with _binds() as self.bound:  # the library objects the model and guide read their parameters through
            state = _init(self.svi, jax.random.PRNGKey(seed), _batch(self.data, plan, 0), kwargs)
        if hasattr(loss, "with_initial_state"):  # a loss with state between steps: SVI's mutable state
            state = loss.with_initial_state(self.svi, state, *_batch(self.data, plan, 0))
        # committed to its device, as the updates' outputs are: otherwise the second step compiles again
        device = next(iter(jax.tree_util.tree_leaves(state)[0].devices()))
        self.state = jax.device_put(state, device)
        self.threads = BlasThreads(device.platform == "cpu", jax.block_until_ready)
        # by rows: the state's tables are updated in place (donated), so snapshots copy them
        self.donated = optim.by_rows
        step = self._rows_update if optim.by_rows else self._update
        self.update = captured.compiled_update(lambda state, data, idx: step(state, *_take(data, idx), **kwargs),
                                               compiled, donate=self.donated)

    def _update(self, state, *args, **kwargs):
        state, loss = self.svi.update(state, *args, **kwargs)
        return state, jnp.stack([loss, state.optim_state[2].astype(loss.dtype)])

    def _rows_update(self, state, X, y, **kwargs):
        """SVI's update with the q tables read, differentiated and updated at the step's rows only
        (a loss with ``tables``, e.g. ``QuadruplyStochasticELBO``, and AdaGrad or SGD on them):
        the same draws and, to round-off, the same step as ``_update``, in ``O(num_basis)``."""
        svi, loss = self.svi, self.svi.loss
        rng_key, step_key = jax.random.split(state.rng_key)
        params, tables, mutable = svi.optim.get_params(state.optim_state), svi.optim.tables, state.mutable_state or {}
        with handlers.substitute(data=svi.constrain_fn(params)):
            drawn = loss.step_draw(svi.model, X, y, step_key)
        rows = loss.rows(drawn, mutable.get(loss.STATE))
        slices = {n: params[n][rows] for n in tables}

        def objective(others, slices):
            values = {**svi.constrain_fn({**params, **others}), **mutable}
            out = loss.loss_with_mutable_state(step_key, values, svi.model, svi.guide, X, y, drawn=drawn,
                                               gathered=(rows, tuple(slices[n] for n in tables)), **kwargs)
            return out["loss"], out["mutable_state"]

        others = {n: v for n, v in params.items() if n not in slices}
        (value, mutable), grads = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(others, slices)
        optim_state = svi.optim.update_rows(grads, rows, state.optim_state)
        return SVIState(optim_state, mutable, rng_key), jnp.stack([value, optim_state[2].astype(value.dtype)])

    def step(self, i):
        self.state, value = self.threads.run(lambda: self.update(self.state, self.data, self.plan.indices(i)))
        return value

    def stepping(self):
        return self.threads

    def params(self):
        return self.svi.get_params(self.state)

    def snapshot(self):
        return jax.tree_util.tree_map(jnp.copy, self.state) if self.donated else self.state

    def restore(self, best):
        self.state = best

    def save(self, path, done, losses, tracker, best):
        _save(path, done, self.state, losses, tracker, best)

    def load(self, path, tracker):
        start, losses, self.state, best = _load(path, self.state, tracker)
        return start, losses, best

    def finish(self):
        params = self.params()
        _write_back(self.bound, params)
        return params, self.state

    @staticmethod
    def to_floats(values):
        return [tuple(v) for v in jax.device_get(values)]  # one wait for all


fit = make_fit(
    _Trainer, __name__, ppl="NumPyro", how=", one jit-compiled ``SVI.update`` per step",
    loss="a NumPyro ELBO (``Trace_ELBO()`` by default).",
    optimizer="a NumPyro optimiser class taking the step size (``numpyro.optim.Adam`` by default).",
    compiled="Always, here: the SVI update is one ``jax.jit``\n"
             "            program (None or True; False is refused: to step through it eagerly, call ``fit``\n"
             "            inside ``with jax.disable_jit():``).",
)


def _init(svi, key, batch, kwargs):
    """``svi.init`` as one compiled program: run eagerly, each of its operations (and each of the
    library's formulas) compiles on its own, seconds before the first step. Eagerly where the guide
    asks for a key while traced (an autoguide that sets itself up on its first call)."""
    guarded = SVI(svi.model, sites.refusing_keys(svi.guide), svi.optim, svi.loss)
    try:
        state = jax.jit(lambda key, batch: guarded.init(key, *batch, **kwargs))(key, batch)
    except sites.AsksForKey:
        return svi.init(key, *batch, **kwargs)
    transforms = guarded.constrain_fn.args  # the parameters' constraints, as SVI.init keeps them
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(transforms)):
        return svi.init(key, *batch, **kwargs)  # a constraint computed from the traced batch
    svi.constrain_fn = guarded.constrain_fn
    return state


@contextlib.contextmanager
def _binds():
    """Record ``(object, prefix)`` of every ``Parameterized.bind()`` run inside the block."""
    log = []
    token = _params.bind_log.set(log)
    try:
        yield log
    finally:
        _params.bind_log.reset(token)


def _write_back(bound, params):
    """Make the final values the objects' own values, where predictions (and a next ``fit``) read them."""
    for obj, prefix in bound:
        obj._assign(prefix, params)




def _step_size(lr, lr_schedule):
    return lr if lr_schedule is None else (lambda i: lr * lr_schedule(i))


class _Grouped(numpyro.optim._NumPyroOptim):
    """One NumPyro optimiser per parameter group (what ``optax.multi_transform`` does for optax),
    the groups split by site name when SVI hands over the parameters (one group without
    ``param_groups``); its state also holds the last step's gradient norm, which ``fit`` checks.
    ``tables``: the names of tables a loss reads by rows; when each is in a group of its own
    with AdaGrad (``momentum=0.0``) or SGD, those groups update only the rows a step read
    (:meth:`update_rows`, ``by_rows``)."""

    def __init__(self, optimizer, lr, lr_schedule, param_groups, check, tables=()):
        self.optimizer, self.lr, self.lr_schedule, self.param_groups = optimizer, lr, lr_schedule, param_groups
        self.check = check  # check(name, optimiser class, options): the loss's veto
        self.tables, self.by_rows = tables, False
        self.update_with_value = False
        self.groups = None

    def init(self, params):
        groups = []
        for names, lr, options in split_param_groups(sorted(params), self.param_groups, self.lr):
            options = dict(options)
            cls = options.pop("optimizer", self.optimizer)
            for name in names:
                self.check(name, cls, options)
            decay, schedule = options.pop("weight_decay", 0.0), options.pop("lr_schedule", self.lr_schedule)
            rule = _row_rule(cls, options, decay) if set(names) <= set(self.tables) else None
            groups.append((names, decay, cls, options, _step_size(lr, schedule), rule))
        by_rows = {n for names, *_, rule in groups if rule for n in names}
        self.by_rows = bool(self.tables) and by_rows >= set(self.tables)
        self.groups = [(names, decay, _Rows(rule, step) if rule and self.by_rows else cls(step, **options))
                       for names, decay, cls, options, step, rule in groups]
        states = tuple(optim.init({n: params[n] for n in names}) for names, _, optim in self.groups)
        return jnp.array(0), states, jnp.zeros((), jnp.result_type(float))

    def update(self, g, state, value=None):
        return self._step(g, None, state)

    def update_rows(self, grads, rows, state):
        """The step from ``grads = (others, tables)``: the gradient of every other parameter, and
        that of each table at ``rows`` (the tables' groups then change only those rows)."""
        return self._step({**grads[0], **grads[1]}, rows, state)

    def _step(self, g, rows, state):
        i, states, last = state
        new = []
        for (names, decay, optim), sub in zip(self.groups, states):
            grads = {n: g[n] for n in names}
            if isinstance(optim, _Rows):  # only when by_rows: SVI's dense update is not used then
                updated = optim.update_rows(rows, grads, sub)
            else:
                if decay:
                    values = optim.get_params(sub)
                    grads = {n: grads[n] + decay * values[n] for n in names}
                updated = optim.update(grads, sub)
            # each array keeps its dtype: under jax_enable_x64 an lr_schedule's float64 step size made
            # Adam's float32 parameters float64 in a resumed fit (tests/test_benchmarks.py's QSGP run)
            new.append(jax.tree_util.tree_map(lambda a, b: a if a.dtype == b.dtype else a.astype(b.dtype), updated, sub))
        norm = jnp.linalg.norm(jnp.stack([jnp.linalg.norm(jnp.ravel(leaf)).astype(last.dtype)
                                          for leaf in jax.tree_util.tree_leaves(g)]))
        return i + 1, tuple(new), norm

    def get_params(self, state):
        return {n: v for (_, _, optim), sub in zip(self.groups, state[1]) for n, v in optim.get_params(sub).items()}


def _tables(loss, model):
    """The names of the tables ``loss`` can read by rows (one particle), else ()."""
    if not hasattr(loss, "step_draw") or getattr(loss, "num_particles", 1) != 1:
        return ()
    return loss.tables(model)


def _row_rule(cls, options, decay):
    """``"adagrad"`` or ``"sgd"`` where the optimiser moves only entries with a gradient, else None."""
    if decay or set(options) - {"momentum"}:
        return None
    if cls is numpyro.optim.Adagrad and options.get("momentum", 0.9) == 0:
        return "adagrad"
    if cls is numpyro.optim.SGD and not options:
        return "sgd"
    return None


class _Rows:
    """AdaGrad (as NumPyro's with ``momentum=0.0``) or SGD on tables, stepping at given rows
    (:mod:`sparsegp_common.inference.row_updates`). State: ``(step, values, sums of squares)``."""

    def __init__(self, rule, step_size):
        self.rule, self.step_size = rule, step_size

    def init(self, params):
        squares = {n: jnp.zeros_like(v) for n, v in params.items()} if self.rule == "adagrad" else {}
        return jnp.array(0), dict(params), squares

    def _lr(self, i):
        return self.step_size(i) if callable(self.step_size) else self.step_size

    def update_rows(self, rows, grads, state):
        i, values, squares = state
        lr, values, squares = self._lr(i), dict(values), dict(squares)
        for n in values:
            if self.rule == "adagrad":
                values[n], squares[n] = row_updates.adagrad_rows(values[n], squares[n], rows, grads[n], lr)
            else:
                values[n] = row_updates.sgd_rows(values[n], rows, grads[n], lr)
        return i + 1, values, squares

    def get_params(self, state):
        return state[1]


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
