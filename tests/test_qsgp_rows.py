"""The quadruply stochastic GP's step by rows (its strict ``O(1)`` path): the loss reads gathered
rows of the q tables exactly as it reads the whole tables, the row-wise AdaGrad and SGD rules are
the dense ones, ``fit`` takes the dense path's steps, and a step's gradients and working memory
do not grow with ``m``."""
import warnings

import numpy as np
import pytest
from backends import xla_optimisations

from sparsegp_common.inference import row_updates


def _sine(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, 1))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def _model(backend, m, likelihood="gaussian", cv=True, refresh_every=7, num_basis=12, paper_literal=False,
           num_dense=2, basis="fourier"):
    lib = backend.lib
    X, y = _sine()
    if likelihood == "bernoulli":
        y = (y > 0) * 1.0
    kernel = backend.kernel("rbf", [1.0], 1.0)
    if basis == "fourier":
        prior = lib.QSGP(kernel, m, 1, num_dense=num_dense)
    else:  # kernel functions at m of the inputs: the dense S, or the relevance vector machine's diagonal one
        prior = lib.QSGP(kernel, inducing_points=backend.array(X[:m]), num_dense=num_dense, jitter=1e-4,
                         relevance=basis == "relevance")
    like = backend.set(lib.Gaussian(), variance=0.05) if likelihood == "gaussian" else lib.Bernoulli()
    model = lib.GPModel(prior, like, num_data=len(X))
    support = backend.array(X[:20]) if cv else None
    loss = lib.QuadruplyStochasticELBO(num_basis=num_basis, control_variates=support, refresh_every=refresh_every,
                                       paper_literal=paper_literal)
    return model, loss, backend.array(X), backend.array(y)


# -- the rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize("library", ["numpy", "torch", "jax"])
def test_row_rules_equal_the_dense_rules(library, rng):
    """AdaGrad and SGD at rows with repeats (their gradient on the first copy, zero on the others)
    equal the dense rules with the gradient scattered into the table, over three steps."""
    convert = {"numpy": np.asarray, "torch": lambda a: pytest.importorskip("torch").as_tensor(a),
               "jax": lambda a: pytest.importorskip("jax.numpy").asarray(a)}[library]
    m, steps, lr = 12, 3, 0.3
    table, dense_table = rng.normal(size=(m, 2)), None
    accumulator = np.zeros((m, 2))
    dense_table, dense_acc, sgd, dense_sgd = table.copy(), accumulator.copy(), table.copy(), table.copy()
    table, accumulator, sgd = convert(table), convert(accumulator), convert(sgd)
    for _ in range(steps):
        rows = np.sort(rng.integers(0, m, size=9))
        grad = rng.normal(size=(9, 2)) * (np.r_[True, rows[1:] != rows[:-1]])[:, None]  # repeats: zero
        table, accumulator = row_updates.adagrad_rows(table, accumulator, convert(rows), convert(grad), lr)
        sgd = row_updates.sgd_rows(sgd, convert(rows), convert(grad), lr)
        full = np.zeros((m, 2))
        np.add.at(full, rows, grad)
        dense_acc += full**2
        dense_table -= lr * np.where(dense_acc > 0, full / np.sqrt(np.where(dense_acc > 0, dense_acc, 1.0)), 0.0)
        dense_sgd -= lr * full
    np.testing.assert_allclose(np.asarray(table), dense_table, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(accumulator), dense_acc, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sgd), dense_sgd, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("library", ["numpy", "torch", "jax"])
def test_row_rules_keep_the_table_dtype(library):
    """A float64 step size (a schedule's under JAX's x64) leaves a float32 table float32, with no
    promotion warning (JAX's scatter warns that this will be an error)."""
    lib = {"numpy": np, "torch": pytest.importorskip("torch"), "jax": pytest.importorskip("jax.numpy")}[library]
    table, grad = lib.asarray(np.ones((4, 2), np.float32)), lib.asarray(np.ones((2, 2), np.float32))
    rows, lr = lib.asarray(np.array([0, 2])), lib.asarray(np.float64(0.3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        updated, accumulator = row_updates.adagrad_rows(table, lib.zeros_like(table), rows, grad, lr)
        sgd = row_updates.sgd_rows(table, rows, grad, lr)
    assert updated.dtype == accumulator.dtype == sgd.dtype == table.dtype
    np.testing.assert_allclose(np.asarray(updated)[:, 0], [0.7, 1.0, 0.7, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(sgd)[:, 0], [0.7, 1.0, 0.7, 1.0], rtol=1e-6)


# -- the loss on gathered rows ---------------------------------------------------------------------


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli", "bernoulli-literal"])
def test_gathered_rows_give_the_loss_and_its_gradient(backend, rng, likelihood):
    """On one draw, the loss that reads only the gathered rows equals the loss on the whole tables
    (with the control variates' state for the Gaussian likelihood; the literal Theorem 3 too),
    and its gradient at the rows, scattered into the tables, equals the whole tables' gradient
    (zero off the rows)."""
    model, loss, X, y = _model(backend, 50, likelihood.split("-")[0], cv=likelihood == "gaussian",
                               paper_literal=likelihood.endswith("literal"))
    prior = model.prior
    values = {"q_mu": rng.normal(size=50), "q_log_diag": rng.normal(size=50) * 0.2 - 1.0,
              "q_dense": rng.normal(size=(50, 2)) * 0.3}
    backend.set(prior, **values)
    names = loss.tables(model.model)
    assert names == ("gp.q_mu", "gp.q_log_diag", "gp.q_dense")
    if backend.name == "pyro":
        import torch

        state = loss.initial_state(model.model, X, y)
        drawn = loss.draw(model.model, X, y)
        rows = loss.rows(drawn, state)
        tables = [prior.q_mu, prior.q_log_diag, prior.q_dense]

        def value(out):
            return out[0] if isinstance(out, tuple) else out

        whole = value(loss.negative_elbo(model.model, X, y, state=state, drawn=drawn))
        whole_grads = [backend.numpy(g) for g in torch.autograd.grad(whole, tables)]
        whole = whole.detach()
        slices = [t.detach()[rows].requires_grad_() for t in tables]
        part = value(loss.negative_elbo(model.model, X, y, state=state, drawn=drawn, gathered=(rows, slices)))
        part_grads = [backend.numpy(g) for g in torch.autograd.grad(part, slices, allow_unused=True,
                                                                    materialize_grads=True)]
        part = part.detach()
    else:
        import jax
        from numpyro import handlers

        key = jax.random.PRNGKey(3)
        state = loss.initial_state(model.model, X, y)
        drawn = loss.draw(model.model, X, y, key=key)
        rows = loss.rows(drawn, state)
        tables = {n: backend.array(values[n.split(".")[1]]) for n in names}

        def value(out):
            return out[0] if isinstance(out, tuple) else out

        def whole_loss(tables):
            with handlers.substitute(data=tables):
                return value(loss.negative_elbo(model.model, X, y, state=state, drawn=drawn))

        def part_loss(slices):
            return value(loss.negative_elbo(model.model, X, y, state=state, drawn=drawn,
                                            gathered=(rows, tuple(slices))))

        whole, whole_grads = jax.jit(jax.value_and_grad(whole_loss))(tables)
        whole_grads = [np.asarray(whole_grads[n]) for n in names]
        part, part_grads = jax.jit(jax.value_and_grad(part_loss))([tables[n][rows] for n in names])
        part_grads = [np.asarray(g) for g in part_grads]
    np.testing.assert_allclose(float(part), float(whole), rtol=1e-12)
    index = backend.numpy(rows)
    assert len(index) < 50 + 50  # a few rows of each table, with repeats
    for full, piece in zip(whole_grads, part_grads):
        scattered = np.zeros_like(full)
        np.add.at(scattered, index, piece)
        np.testing.assert_allclose(scattered, full, rtol=1e-10, atol=1e-12)


# -- fit -------------------------------------------------------------------------------------------


def _fit_groups(backend):
    """AdaGrad on the q tables (NumPyro: without momentum): the step by rows."""
    if backend.name == "pyro":
        import torch

        return [{"params": "gp.q_*", "optimizer": torch.optim.Adagrad, "lr": 0.1}]
    import numpyro

    return [{"params": "gp.q_*", "optimizer": numpyro.optim.Adagrad, "lr": 0.1, "momentum": 0.0}]


def _fit(backend, model, loss, X, y, by_rows, monkeypatch, optimizer="adagrad", steps=25, tables=("gp.q_*",)):
    lib = backend.lib
    if backend.name == "pyro":
        import torch

        from pyro_sparsegp import training

        cls = torch.optim.Adagrad if optimizer == "adagrad" else torch.optim.SGD
        options = {}
        if not by_rows:
            monkeypatch.setattr(training, "SPARSE_OPTIMISERS", ())
    else:
        import numpyro

        from numpyro_sparsegp import training

        cls = numpyro.optim.Adagrad if optimizer == "adagrad" else numpyro.optim.SGD
        options = {"momentum": 0.0} if optimizer == "adagrad" else {}
        if not by_rows:
            monkeypatch.setattr(training, "_row_rule", lambda *args: None)
    backend.reset(0)
    groups = [{"params": list(tables), "optimizer": cls, "lr": 0.1 if optimizer == "adagrad" else 1e-4,
               "lr_schedule": lambda t: 0.97**t, **options}]
    result = lib.fit(model.model, model.guide, (X, y), num_steps=steps, batch_size=50, lr=0.01, seed=1,
                     progress=False, loss=loss, param_groups=groups)
    monkeypatch.undo()
    return result


@pytest.mark.parametrize("case", ["mean-field", "sgd", "literal", "inducing", "relevance"])
def test_fit_by_rows_takes_the_dense_steps(backend, monkeypatch, case):
    """``fit`` by rows (AdaGrad or SGD on the q tables) and the dense path take the same steps:
    losses, parameters and the control variates' state (refreshed every 7 steps) over 25 steps;
    for chevron and mean-field q's (the latter an empty dense table), the literal Theorem 3 on
    Bernoulli labels (a loss without control variates; the default bound by rows is checked on one
    draw above), the kernel basis at inducing points (the dense S and the Nystrom rows) and the
    relevance vector machine (its precisions a table read by rows too)."""
    runs = []
    for by_rows in (True, False):
        # mean-field: m and num_basis where torch's sparse AdaGrad failed on the empty dense table
        model, loss, X, y = _model(backend, 500 if case == "mean-field" else 60,
                                   "bernoulli" if case == "literal" else "gaussian",
                                   cv=case in ("sgd", "mean-field", "inducing", "relevance"),
                                   paper_literal=case == "literal", num_dense=0 if case == "mean-field" else 2,
                                   num_basis=50 if case == "mean-field" else 12,
                                   basis=case if case in ("inducing", "relevance") else "fourier")
        calls = []
        if by_rows:
            spied = type(loss).by_rows if backend.name == "pyro" else type(loss).step_draw
            monkeypatch.setattr(type(loss), spied.__name__, lambda self, *a, **k: calls.append(1) or spied(self, *a, **k))
        result = _fit(backend, model, loss, X, y, by_rows, monkeypatch, "sgd" if case == "sgd" else "adagrad",
                      tables=("gp.q_*", "gp.log_precision"))
        assert bool(calls) == by_rows  # the step by rows ran
        state = loss.state if backend.name == "pyro" else (result.state.mutable_state or {}).get(loss.STATE)
        runs.append((result, state))
    (a, state_a), (b, state_b) = runs
    np.testing.assert_allclose(a.losses, b.losses, rtol=1e-10)
    for name in a.params:
        np.testing.assert_allclose(backend.numpy(a.params[name]), backend.numpy(b.params[name]), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    if case in ("sgd", "mean-field", "inducing", "relevance"):
        for field in ("a", "rows", "values", "step"):
            np.testing.assert_allclose(backend.numpy(getattr(state_a, field)), backend.numpy(getattr(state_b, field)),
                                       rtol=1e-9, atol=1e-12, err_msg=field)


def test_a_step_by_rows_does_not_grow_with_m(backend, monkeypatch):
    """Pyro: the q tables' gradients are sparse, with one entry per row read. NumPyro: the
    compiled step's working memory (XLA's temporary buffers and outputs not aliased to inputs) is the same at m = 1e4 and 1e5,
    the tables updated in place (donated), where the dense path's holds m-sized buffers."""
    if backend.name == "pyro":
        model, loss, X, y = _model(backend, 20_000, num_basis=16)
        _fit(backend, model, loss, X, y, True, monkeypatch, steps=2)
        grad = model.prior.q_dense.grad
        assert grad is not None and grad.is_sparse
        assert grad._nnz() <= 3 * 16 + 2 + (2 * 16 + 2)  # I, J, D, the dense columns, the state's rows
        return
    from numpyro_sparsegp import captured, training

    temporaries, compiled_step = {}, {}
    compiled_update = captured.compiled_update

    def spy(update, compiled, donate=False):
        jitted = compiled_update(update, compiled, donate)

        def call(*args):
            if key not in temporaries:
                compiled_step[key] = jitted.lower(*args).compile()  # run as compiled: one compilation
                stats = compiled_step[key].memory_analysis()
                # new buffers: temporaries, and outputs not written in place of an input
                temporaries[key] = stats.temp_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
            return compiled_step[key](*args)

        return call

    for key in ((True, 10_000), (True, 100_000), (False, 100_000)):
        by_rows, m = key
        model, loss, X, y = _model(backend, m, cv=by_rows, num_basis=16)
        monkeypatch.setattr(training.captured, "compiled_update", spy)
        _fit(backend, model, loss, X, y, by_rows, monkeypatch, steps=1)
    assert temporaries[True, 100_000] <= 1.05 * temporaries[True, 10_000], temporaries
    assert temporaries[False, 100_000] > 5 * temporaries[True, 100_000], temporaries  # m-sized buffers seen


def test_float32_fit_by_rows(backend, monkeypatch):
    """In float32 the step by rows and the dense step agree to float32 round-off over 20 steps
    (control variates on): the tables' values, the losses and the hyperparameters."""
    lib, runs = backend.lib, []
    X, y = _sine()
    for by_rows in (True, False):
        kernel = lib.RBF(lengthscale=backend.array([1.0], np.float32), variance=backend.array(1.0, np.float32))
        model = lib.GPModel(lib.QSGP(kernel, 80, 1, num_dense=2),
                            lib.Gaussian(variance=backend.array(0.05, np.float32)), num_data=len(X))
        loss = lib.QuadruplyStochasticELBO(num_basis=12, control_variates=backend.array(X[:20], np.float32),
                                           refresh_every=7)
        with xla_optimisations(by_rows):  # the dense reference compiles faster
            result = _fit(backend, model, loss, backend.array(X, np.float32), backend.array(y, np.float32), by_rows,
                          monkeypatch, steps=20)
        assert backend.numpy(result.params["gp.q_mu"]).dtype == np.float32
        runs.append(result)
    a, b = runs
    np.testing.assert_allclose(a.losses, b.losses, rtol=1e-4)
    for name in a.params:
        np.testing.assert_allclose(backend.numpy(a.params[name]), backend.numpy(b.params[name]), rtol=1e-3,
                                   atol=1e-4, err_msg=name)


def test_restore_best_by_rows(backend, monkeypatch):
    """``fit(validation=..., restore_best=True)`` by rows ends with the values of its best
    evaluation (NumPyro: the snapshot is a copy, not the state its next steps update in place)."""
    model, loss, X, y = _model(backend, 60)
    seen = []

    def validation(params):
        value = float(np.sum(backend.numpy(params["gp.q_mu"]) ** 2))
        seen.append((value, backend.numpy(params["gp.q_mu"]).copy()))
        return -value if len(seen) == 2 else value  # the second evaluation is the best

    backend.reset(0)
    result = backend.lib.fit(model.model, model.guide, (X, y), num_steps=12, batch_size=50, lr=0.01, progress=False,
                             loss=loss, validation=validation, eval_every=4, restore_best=True,
                             param_groups=_fit_groups(backend))
    assert len(seen) == 3
    np.testing.assert_array_equal(backend.numpy(result.params["gp.q_mu"]), seen[1][1])
    assert not np.array_equal(seen[1][1], seen[2][1])


def test_pyro_sparse_adam_on_the_tables():
    """Pyro: ``torch.optim.SparseAdam`` (lazy Adam: moments of the rows with a gradient only) on
    the q tables steps by rows too (it takes only sparse gradients): one step changes at most the
    rows it read."""
    torch = pytest.importorskip("torch")
    from backends import PyroBackend

    backend = PyroBackend()
    model, loss, X, y = _model(backend, 2000, cv=False, num_basis=16)
    backend.set(model.prior, q_mu=np.full(2000, 0.5))
    backend.reset(0)
    backend.lib.fit(model.model, model.guide, (X, y), num_steps=1, batch_size=50, lr=0.01, progress=False, loss=loss,
                    param_groups=[{"params": "gp.q_*", "optimizer": torch.optim.SparseAdam, "lr": 0.01}])
    changed = int(np.sum(backend.numpy(model.prior.q_mu) != 0.5))
    assert 0 < changed <= 3 * 16 + 2


def test_gathered_chevron_reads_its_rows_only(rng):
    """A GatheredChevron reads any held row as the whole Chevron does (repeats from the first copy)
    and refuses to build the dense factor, which needs every row."""
    from sparsegp_common.variational.chevron import Chevron, GatheredChevron

    q = Chevron(rng.normal(size=9), rng.normal(size=9), rng.normal(size=(9, 3)))
    index = np.array([0, 2, 2, 5, 7])
    part = GatheredChevron(index, q.q_mu[index], q.log_diag[index], q.dense[index], 9)
    I, R = np.array([7, 2, 0, 5]), np.array([0, 1, 2, 4, 6])
    np.testing.assert_array_equal(part.mean(I), q.mean(I))
    np.testing.assert_array_equal(part.column_block(I, R[:3]), q.column_block(I, R[:3]))
    np.testing.assert_array_equal(part.entries(I, R), q.entries(I, R))
    np.testing.assert_array_equal(q.entries(np.arange(9), np.arange(9)), q.dense_factor())
    with pytest.raises(TypeError, match="only some rows"):
        part.covariance()
