"""The training loop ``fit`` in both backends: minibatches, schedules, callbacks, early stopping,
checkpoints (resume reaches the same parameters), safe loading and argument checks."""
import numpy as np
import pytest
import torch

from sparsegp_common.inference.training import EarlyStopping, LossHistory, interval, make_plan, split_param_groups
from resume import crash_and_resume
from trajectories import assert_same_loss_and_gradients, assert_same_trajectory, loss_and_gradients, spread

N, M = 60, 6


def problem(backend, num_data=None, likelihood="Gaussian"):
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (N, 1))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(N)
    gp = backend.svgp(X[:M].copy())
    lik = getattr(backend.lib, likelihood)()
    return backend.lib.GPModel(gp, lik, num_data=num_data), backend.array(X), backend.array(y)


def embedded(backend):
    """A user model around the component: stochastic loss (sampled f, subsampling plate)."""
    model, X, y = problem(backend)
    return (*backend.user_model(model.prior, 0.1), X, y)


def params_np(backend, params):
    return {k: backend.numpy(v) for k, v in params.items()}


def test_plan_draws_each_epoch_without_replacement():
    plan = make_plan((np.zeros(23),), 5, None, 3, seed=4)
    assert plan.num_steps == 3 * 4  # 23 // 5 full batches per epoch
    for epoch in range(3):
        rows = np.concatenate([plan.indices(4 * epoch + j) for j in range(4)])
        assert len(set(rows)) == 20
    assert not np.array_equal(plan.indices(0), plan.indices(4))  # a new permutation per epoch
    assert np.array_equal(plan.indices(5), make_plan((np.zeros(23),), 5, 12, None, seed=4).indices(5))


def test_plan_draws_one_permutation_per_epoch_and_stays_seeded(monkeypatch):
    """The permutation of an epoch is drawn once (not once per step), and the rows of a step do
    not depend on which steps were asked before (resume, or both backends)."""
    plan = make_plan((np.zeros(23),), 5, None, 3, seed=4)
    expected = [np.random.default_rng([4, i // 4]).permutation(23)[(i % 4) * 5 : (i % 4 + 1) * 5] for i in range(12)]
    draws = []
    original = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda *a: draws.append(a) or original(*a))
    for i in range(12):
        np.testing.assert_array_equal(plan.indices(i), expected[i])
    assert len(draws) == 3
    fresh = make_plan((np.zeros(23),), 5, None, 3, seed=4)
    for i in (9, 2, 7, 0):  # out of order, as after a resume
        np.testing.assert_array_equal(fresh.indices(i), expected[i])


def test_fit_reduces_the_loss_and_reports(backend, capsys):
    model, X, y = problem(backend, num_data=N)
    result = backend.lib.fit(model.model, model.guide, (X, y), num_epochs=40, batch_size=20, lr=0.05)
    assert result.losses.shape == (40 * 3,)
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10]) - 20
    assert {"gp.q_mu", "gp.q_sqrt", "gp.kernel.lengthscale", "likelihood.variance"} <= set(result.params)
    assert "fit" in capsys.readouterr().err  # the tqdm bar
    assert result.best_step is None and not result.stopped_early


def same_steps(name, optimizer=None, **options):
    """``{key: array}`` of 15 minibatch steps of ``fit`` in backend ``name``: each step's loss and
    the trained values (``optimizer``: a torch optimiser class, Pyro only)."""
    from backends import BACKENDS

    backend = BACKENDS[name]()
    backend.reset()
    model, X, y = problem(backend, num_data=N)
    options = {"num_steps": 15, **options, **({} if optimizer is None else {"optimizer": optimizer})}
    result = backend.lib.fit(model.model, model.guide, (X, y), batch_size=20, progress=False, **options)
    return {**{f"loss {i}": v for i, v in enumerate(result.losses)}, **params_np(backend, result.params)}


def test_backends_take_the_same_steps():
    """Same seed, same batches, same Adam: Pyro and NumPyro reach the same parameters, from the
    same loss and gradients at the same parameters (to 1e-10); the trajectories to what round-off
    of the gradients can move them (Adam amplifies it where a gradient is near 0, see trajectories.py)."""
    from backends import BACKENDS

    out = []
    for name in ("pyro", "numpyro"):
        backend = BACKENDS[name]()
        backend.reset()
        model, X, y = problem(backend, num_data=N)
        # off the initial values, where two inducing inputs 0.007 apart make Kuu's condition
        # number 8e4 and the gradients agree to eps * 8e4 ~ 1e-11 only (no margin against 1e-10)
        out.append(loss_and_gradients(backend, model.model, model.guide, (X, y), moves=(0.1,)))
    assert_same_loss_and_gradients(*[point for points in out for point in points])
    pyro, numpyro = same_steps("pyro", lr=0.01), same_steps("numpyro", lr=0.01)
    assert_same_trajectory(pyro, numpyro, spread(lambda optimizer: same_steps("pyro", optimizer, lr=0.01), pyro))


def test_losses_are_read_back_every_loss_every_steps(backend, monkeypatch):
    """The losses are read from the device in chunks of ``loss_every`` (one transfer each), the
    progress bar shows a running loss from the first read, and callbacks reading ``state.loss``
    still see every step's loss."""
    import importlib

    import sparsegp_common.inference.training as core

    training = importlib.import_module(backend.lib.__name__ + ".training")
    model, X, y = problem(backend, num_data=N)
    options = dict(num_epochs=8, batch_size=20, lr=0.05, progress=False)
    every_step = backend.lib.fit(model.model, model.guide, (X, y), loss_every=1, **options)
    backend.reset()
    model, X, y = problem(backend, num_data=N)
    reads, shown, to_floats = [], [], training._Trainer.to_floats
    monkeypatch.setattr(training._Trainer, "to_floats", staticmethod(lambda v: reads.append(len(v)) or to_floats(v)))
    monkeypatch.setattr(core, "report", lambda bar, losses, window: shown.append(len(losses)))
    chunked = backend.lib.fit(model.model, model.guide, (X, y), loss_every=10, **options)
    assert chunked.losses.shape == (24,)
    np.testing.assert_array_equal(chunked.losses, every_step.losses)
    assert reads == [10, 10, 4] and shown == [10, 20, 24]  # the bar shows a loss from step 10 on

    seen = []
    backend.reset()
    model, X, y = problem(backend, num_data=N)
    backend.lib.fit(model.model, model.guide, (X, y), callbacks=lambda s: seen.append(s.loss), **options)
    np.testing.assert_array_equal(seen, every_step.losses)
    with pytest.raises(ValueError, match="loss_every"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, loss_every=0, progress=False)


def test_param_groups_have_their_own_learning_rate(backend):
    """A group with lr=0 does not move; the parameters of another group and of no group do."""
    model, X, y = problem(backend, num_data=N)
    bound = backend.bound(model.prior)
    before = {k: backend.numpy(v).copy() for k, v in (("q_mu", bound.q_mu), ("Z", bound.features.Z))}
    result = backend.lib.fit(
        model.model, model.guide, (X, y), num_steps=10, lr=0.05, progress=False,
        param_groups=[{"params": "gp.kernel.*", "lr": 0.0}, {"params": lambda n: n == "gp.features.Z", "lr": 0.1,
                                                            "weight_decay": 1e-2}],
    )
    p = params_np(backend, result.params)
    assert p["gp.kernel.lengthscale"] == pytest.approx(0.8, rel=1e-14)  # up to the exp(log(.)) round trip
    assert p["gp.kernel.variance"] == pytest.approx(1.3, rel=1e-14)
    assert not np.allclose(p["gp.features.Z"], before["Z"]) and not np.allclose(p["gp.q_mu"], before["q_mu"])
    with pytest.raises(ValueError, match="selects no parameter"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=1, progress=False,
                        param_groups=[{"params": "gp.net.*", "lr": 0.1}])
    with pytest.raises(TypeError, match="param_groups"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=1, progress=False, param_groups=[{"lr": 0.1}])


def test_param_group_selectors_are_globs_names_or_predicates():
    """``"params"`` patterns match whole names as globs (a name is no prefix of others); a
    parameter goes to the first group that selects it; the rest keep ``lr``."""
    names = ["gp.kernel", "gp.kernel.lengthscale", "gp.kernel.variance", "gp.q_mu", "lik.variance"]
    groups = split_param_groups(names, [{"params": "gp.kernel", "lr": 1.0}, {"params": ["*.variance", "gp.q_?u"]},
                                        {"params": lambda n: n.startswith("gp."), "lr": 3.0, "betas": (0.5, 0.9)}], 0.1)
    assert groups == [(["gp.kernel"], 1.0, {}), (["gp.kernel.variance", "gp.q_mu", "lik.variance"], 0.1, {}),
                      (["gp.kernel.lengthscale"], 3.0, {"betas": (0.5, 0.9)})]
    assert split_param_groups(names, [{"params": "lik.*"}], 0.2)[-1] == (names[:4], 0.2, {})


def test_param_groups_can_have_their_own_optimiser(backend, tmp_path):
    """A group naming its own optimiser class (SGD for q beside the default Adam): after a step its
    parameters are those of an all-SGD run and the others those of an all-Adam run; a checkpointed
    run with the two optimisers resumes to the uninterrupted result."""
    if backend.name == "pyro":
        sgd = torch.optim.SGD
    else:
        import numpyro

        sgd = numpyro.optim.SGD
    groups = [{"params": "gp.q_*", "optimizer": sgd}]

    def run(num_steps=1, **options):
        backend.reset()
        model, X, y = problem(backend, num_data=N)
        result = backend.lib.fit(model.model, model.guide, (X, y), num_steps=num_steps, lr=0.05, progress=False, **options)
        return params_np(backend, result.params)

    mixed, all_sgd, all_adam = run(param_groups=groups), run(optimizer=sgd), run()
    for name, value in mixed.items():
        expected = all_sgd[name] if name.startswith("gp.q_") else all_adam[name]
        np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-14, err_msg=name)
    assert not np.allclose(all_sgd["gp.q_mu"], all_adam["gp.q_mu"])

    full = run(6, param_groups=groups, batch_size=20)
    resumed = crash_and_resume(lambda **o: run(6, param_groups=groups, batch_size=20, **o), tmp_path, stop_at=4, every=3)
    for name, value in full.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['optimizer'\]"):
        run(param_groups=[{"params": "gp.q_*", "optimizer": "adagrad"}])


def test_backends_take_the_same_steps_with_param_groups():
    """The groups (their lr, weight decay and schedules) mean the same in both backends (the
    trajectories compared as in test_backends_take_the_same_steps); a group's own schedule holds
    the kernel for the first 5 steps."""
    groups = [{"params": "gp.kernel.*", "lr": 0.03, "weight_decay": 0.1, "lr_schedule": lambda t: (t >= 5) * 1.0},
              {"params": "likelihood.*", "lr": 0.03}, {"params": "gp.q_*", "lr": 0.002}]
    options = dict(lr=0.01, lr_schedule=lambda t: 0.95**t, param_groups=groups)
    pyro, numpyro = same_steps("pyro", **options), same_steps("numpyro", **options)
    assert_same_trajectory(pyro, numpyro, spread(lambda optimizer: same_steps("pyro", optimizer, **options), pyro))
    for name in ("pyro", "numpyro"):
        held = same_steps(name, num_steps=5, **options)
        initial = same_steps(name, num_steps=5, lr=0.0)
        np.testing.assert_array_equal(held["gp.kernel.lengthscale"], initial["gp.kernel.lengthscale"])
        assert not np.allclose(held["likelihood.variance"], initial["likelihood.variance"])


@pytest.mark.parametrize("user", [False, True])
def test_predictions_after_fit_use_the_trained_values(backend, user):
    """predict_f after fit equals predict_f(params=result.params): Pyro reads the param store,
    NumPyro's fit writes the values back into the objects the model and guide used (here through
    GPModel's bound methods, or a user model closing over the component)."""
    model, X, y = problem(backend, num_data=N)
    prior = model.prior
    fn, guide = backend.user_model(prior, 0.1) if user else (model.model, model.guide)
    initial = backend.numpy(prior.predict_f(X)[0]).copy()
    result = backend.lib.fit(fn, guide, (X, y), num_steps=20, lr=0.05, progress=False)
    after, var = (backend.numpy(a) for a in prior.predict_f(X))
    expected, expected_var = (backend.numpy(a) for a in prior.predict_f(X, params=result.params))
    np.testing.assert_allclose(after, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, expected_var, rtol=1e-12, atol=1e-12)
    assert not np.allclose(after, initial)


def test_inspect_reads_the_trained_component(backend):
    """gp.inspect() after fit: the dense reference KL of the trained q(u), q(u) itself and the
    parameter values fit returned; with params= it reads those values instead."""
    from reference import gaussian_kl

    model, X, y = problem(backend)
    gp = model.prior
    initial = gp.inspect()
    result = backend.lib.fit(model.model, model.guide, (X, y), num_steps=20, lr=0.05, progress=False)
    state = gp.inspect()
    assert list(state.params) == sorted(n for n in result.params if n.startswith("gp."))
    for name, value in state.params.items():
        np.testing.assert_allclose(backend.numpy(value), backend.numpy(result.params[name]), rtol=1e-12)
    q_mu, q_sqrt = backend.numpy(result.params["gp.q_mu"]), backend.numpy(result.params["gp.q_sqrt"])
    S = q_sqrt @ q_sqrt.T
    np.testing.assert_allclose(backend.numpy(state.q_u.mean), q_mu, rtol=1e-12)
    np.testing.assert_allclose(backend.numpy(state.q_u.covariance_matrix), S, rtol=1e-10, atol=1e-14)
    expected = gaussian_kl(q_mu, S, np.zeros(M), np.eye(M))  # whitened: p(u) = N(0, I)
    assert float(backend.numpy(state.kl)) == pytest.approx(expected, rel=1e-10)
    assert float(backend.numpy(gp.inspect(params=dict(initial.params)).kl)) == pytest.approx(
        float(backend.numpy(initial.kl)), rel=1e-12)
    assert float(backend.numpy(initial.kl)) != pytest.approx(expected, rel=1e-3)


def runaway(backend):
    """A model whose loss is finite while its parameter ``a`` stays below 1 and NaN after; Adam
    at lr 0.1 drives ``a`` from 0 towards 10, past 1 after about ten steps."""
    if backend.name == "pyro":
        import pyro

        def model(x):
            a = pyro.param("a", torch.tensor(0.0, dtype=torch.float64))
            with pyro.validation_enabled(False):  # the NaN is to come from the numbers, not a check
                pyro.factor("boom", -((a - 10) ** 2) + torch.where(a < 1, 0.0, float("nan")))
    else:
        import jax.numpy as jnp
        import numpyro

        def model(x):
            a = numpyro.param("a", jnp.asarray(0.0))
            numpyro.factor("boom", -((a - 10) ** 2) + jnp.where(a < 1, 0.0, jnp.nan))

    return model, lambda x: None, (backend.array(np.zeros((4, 1))),)


@pytest.mark.filterwarnings("ignore:Encountered NaN")  # Pyro's own warning, before fit's error
@pytest.mark.parametrize("loss_every", [1, 7])
def test_fit_stops_when_the_loss_is_not_finite(backend, loss_every):
    model, guide, data = runaway(backend)
    with pytest.raises(FloatingPointError, match=r"the loss became nan at step 1[0-2]\b.*lower learning rate"):
        backend.lib.fit(model, guide, data, num_steps=100, lr=0.1, loss_every=loss_every, progress=False)


def diverging(backend):
    """loss = a^2 from a = 1 at lr 1e3: Adam's steps of about lr overshoot the minimum further
    each time, and the loss runs away from about 1 to about 1e6 (finite all along)."""
    if backend.name == "pyro":
        import pyro

        def model(x):
            pyro.factor("bowl", -pyro.param("a", torch.tensor(1.0, dtype=torch.float64)) ** 2)
    else:
        import jax.numpy as jnp
        import numpyro

        def model(x):
            numpyro.factor("bowl", -numpyro.param("a", jnp.asarray(1.0)) ** 2)

    return model, lambda x: None, (backend.array(np.zeros((4, 1))),)


def read_back(pairs, values=()):
    """``LossHistory.read`` of ``(loss, gradient norm)`` pairs, all in one read."""
    history = LossHistory(list(values), lambda pending: pending)
    for pair in pairs:
        history.append(pair)
    return history.read()


def test_runaway_and_spike_thresholds():
    """A loss runs away at 1e3 times the larger of the first and best losses' magnitudes above the
    best, also within one read of several steps; a gradient spikes at 1e4 times the median of the
    steps before it, from the 11th step on."""
    assert read_back([(1e6, 1.0), (0.5, 1.0), (1e5, 1.0)])[-1] == 1e5  # noise on the start's scale
    with pytest.raises(FloatingPointError, match="ran away"):
        read_back([(1.0, 1.0), (0.5, 1.0), (2000.0, 1.0)])  # the best is the read's own second step
    with pytest.raises(FloatingPointError, match="ran away"):
        read_back([(2000.0, 1.0)], values=[1.0, 0.5])
    calm = [(1.0, 1.0)] * 10
    with pytest.raises(FloatingPointError, match="gradient"):
        read_back(calm + [(1.0, 2e4)])
    assert len(read_back(calm[:9] + [(1.0, 2e4)])) == 10  # nine steps are too few for a median


def test_ties_are_not_improvements_and_evaluations_default_to_epochs():
    tracker = EarlyStopping(patience=1)
    assert tracker.update(1, 3.0) and not tracker.update(2, 3.0)
    assert (tracker.best_step, tracker.should_stop) == (1, True)
    assert interval(None, make_plan((np.zeros(23),), 5, 10, None, seed=0), "eval_every") == 4  # 23 // 5 batches
    assert interval(None, make_plan((np.zeros(23),), None, 10, None, seed=0), "eval_every") == 100
    assert make_plan((np.zeros(23),), 23, None, 2, seed=0).num_steps == 2  # one batch of every row per epoch


@pytest.mark.parametrize("loss_every", [1, 7])
def test_fit_stops_when_the_loss_runs_away(backend, loss_every):
    model, guide, data = diverging(backend)
    with pytest.raises(FloatingPointError, match=r"ran away to .* at step \d+ \(the best so far was .*lower learning rate"):
        backend.lib.fit(model, guide, data, num_steps=50, lr=1e3, loss_every=loss_every, progress=False)
    # a noisy but sane run is left alone
    result = backend.lib.fit(model, guide, data, num_steps=50, lr=0.05, progress=False)
    assert len(result.losses) == 50


def test_fit_steps_yields_fits_steps_and_returns_its_result(backend):
    """fit.steps: the same steps as fit, one FitState per step; stop ends it with the FitResult."""
    model, X, y = problem(backend)
    expected = backend.lib.fit(model.model, model.guide, (X, y), num_steps=5, lr=0.05, progress=False)
    model, X, y = problem(backend)
    running = backend.lib.fit.steps(model.model, model.guide, (X, y), num_steps=5, lr=0.05, progress=False)
    states = [next(running) for _ in range(3)]
    assert [s.step for s in states] == [1, 2, 3]
    states[-1].stop = True
    with pytest.raises(StopIteration) as end:
        next(running)
    result = end.value.value
    np.testing.assert_allclose(result.losses, expected.losses[:3], rtol=1e-12)
    assert result.stopped_early and list(result.params) == list(expected.params)


def test_lr_schedule_and_callbacks(backend):
    model, X, y = problem(backend)
    before = backend.numpy(backend.bound(model.prior).q_mu).copy()
    seen = []
    frozen = backend.lib.fit(
        model.model, model.guide, (X, y), num_steps=5, lr=0.1, lr_schedule=lambda t: 0.0 * t,
        callbacks=[lambda s: seen.append(s.step)], progress=False,
    )
    np.testing.assert_array_equal(backend.numpy(frozen.params["gp.q_mu"]), before)
    assert seen == [1, 2, 3, 4, 5]

    def stop_at_3(state):
        state.stop = state.step == 3

    stopped = backend.lib.fit(model.model, model.guide, (X, y), num_steps=10, lr=0.1, callbacks=stop_at_3, progress=False)
    assert len(stopped.losses) == 3 and stopped.stopped_early
    assert not np.allclose(backend.numpy(stopped.params["gp.q_mu"]), before)


def test_early_stopping_restores_the_best_parameters(backend, tmp_path):
    """The best of 5 evaluations is restored; the stop writes a checkpoint (the schedule's next
    is past the end)."""
    model, X, y = problem(backend)
    path = str(tmp_path / "ckpt")
    scores = iter([5.0, 4.0, 3.0, 3.5, 4.5, 6.0, 7.0])
    snapshots = {}

    def validation(params):
        snapshots[len(snapshots) + 1] = backend.numpy(params["gp.q_mu"]).copy()
        return next(scores)

    result = backend.lib.fit(
        model.model, model.guide, (X, y), num_steps=50, lr=0.05, validation=validation, eval_every=2,
        patience=2, progress=False, checkpoint=path, checkpoint_every=100,
    )
    assert result.stopped_early and len(result.losses) == 10  # 5 evaluations, the best is the 3rd
    saved = torch.load(path, weights_only=True) if backend.name == "pyro" else np.load(path)
    assert int(saved["step"]) == 10
    assert result.best_step == 6 and [s for s, _ in result.validation] == [2, 4, 6, 8, 10]
    np.testing.assert_array_equal(backend.numpy(result.params["gp.q_mu"]), snapshots[3])
    assert not np.allclose(snapshots[3], snapshots[5])


def test_patience_counts_evaluations_since_the_best_and_survives_a_checkpoint():
    """``patience`` evaluations without improvement since the best, not in all: an improvement
    starts the count again; a tracker loaded from a checkpoint's state goes on counting."""
    tracker = EarlyStopping(patience=2)
    for step, value in enumerate([5.0, 6.0, 4.0, 5.0], start=1):
        tracker.update(step, value)
        assert not tracker.should_stop, step
    resumed = EarlyStopping(patience=2)
    resumed.load(tracker.state())
    assert (resumed.best, resumed.best_step, resumed.history) == (4.0, 3, tracker.history)
    resumed.update(5, 4.5)
    assert resumed.should_stop


def test_resume_reaches_the_uninterrupted_parameters(backend, tmp_path):
    """Killed after step 7 with the last checkpoint at step 5, then resumed: the same result as
    one uninterrupted run (stochastic loss, subsampling plate, lr schedule)."""
    options = dict(num_steps=12, lr=0.05, lr_schedule=lambda t: 0.9 ** (t / 4), progress=False, seed=3)

    def run(**extra):
        backend.reset(seed=99)  # a fresh process: empty param store, unrelated global RNG
        model, guide, X, y = embedded(backend)
        return backend.lib.fit(model, guide, (X, y), **options, **extra)

    full = run()
    resumed = crash_and_resume(run, tmp_path, stop_at=7, every=5)
    np.testing.assert_array_equal(resumed.losses, full.losses)
    for k, v in params_np(backend, full.params).items():
        np.testing.assert_array_equal(backend.numpy(resumed.params[k]), v, err_msg=k)
    assert np.isfinite(full.losses).all() and np.std(full.losses) > 0


def test_resume_keeps_the_best_evaluation_from_before_the_crash(backend, tmp_path):
    """The best evaluation (step 2) came before the checkpoint (step 4) and the crash (step 5), and
    none after the resume is better: the resumed run, like the uninterrupted one, ends with the
    values of step 2, which the checkpoint carried."""
    options = dict(num_steps=10, lr=0.05, progress=False, seed=3, eval_every=2)

    def run(scores, **extra):
        backend.reset(seed=99)
        model, guide, X, y = embedded(backend)
        return backend.lib.fit(model, guide, (X, y), validation=lambda params: next(scores), **options, **extra)

    full = run(iter([1.0, 3.0, 4.0, 5.0, 6.0]))
    scores = iter([1.0, 3.0, 4.0, 5.0, 6.0])  # one sequence across the crash and the resume
    resumed = crash_and_resume(lambda **extra: run(scores, **extra), tmp_path, stop_at=5, every=4)
    assert resumed.best_step == full.best_step == 2
    for k, v in params_np(backend, full.params).items():
        np.testing.assert_array_equal(backend.numpy(resumed.params[k]), v, err_msg=k)
    last = run(iter([1.0, 3.0, 4.0, 5.0, 6.0]), restore_best=False).params["gp.q_mu"]
    assert not np.allclose(backend.numpy(last), backend.numpy(full.params["gp.q_mu"]))  # step 2 is not the end


def test_checkpoint_loading_never_unpickles(backend, tmp_path):
    model, X, y = problem(backend)
    path = tmp_path / "evil"
    if backend.name == "pyro":
        torch.save({"step": EarlyStopping()}, path)  # an arbitrary object: needs unpickling
        error = Exception  # torch raises UnpicklingError (weights_only)
    else:
        np.savez(path, step=np.array([EarlyStopping()], dtype=object))
        path = tmp_path / "evil.npz"
        error = ValueError  # "Object arrays cannot be loaded when allow_pickle=False"
    with pytest.raises(error, match="(?i)pickl|weights_only"):
        backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, checkpoint=str(path), resume=True, progress=False)


def test_checkpoint_of_another_model_is_refused(backend, tmp_path):
    model, X, y = problem(backend)
    path = str(tmp_path / "ckpt")
    backend.lib.fit(model.model, model.guide, (X, y), num_steps=2, checkpoint=path, progress=False)
    backend.reset()
    other, X, y = problem(backend, likelihood="StudentT")
    with pytest.raises(ValueError, match="checkpoint"):
        backend.lib.fit(other.model, other.guide, (X, y), num_steps=4, checkpoint=path, resume=True, progress=False)
    backend.reset()  # the same parameters, one inducing input fewer: every shape but the kernel's differs
    smaller = backend.lib.GPModel(backend.svgp(backend.numpy(X)[:M - 1].copy()), backend.lib.Gaussian())
    with pytest.raises(ValueError, match="checkpoint"):
        backend.lib.fit(smaller.model, smaller.guide, (X, y), num_steps=4, checkpoint=path, resume=True, progress=False)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_steps=3, num_epochs=2), ValueError, "exactly one"),
        (dict(), ValueError, "exactly one"),
        (dict(num_steps=0), ValueError, "num_steps"),
        (dict(num_steps=3, batch_size=N + 1), ValueError, "batch_size"),
        (dict(num_steps=3, eval_every=2), ValueError, "eval_every"),
        (dict(num_steps=3, resume=True), ValueError, "checkpoint"),
        (dict(num_steps=3, checkpoint_every=2), ValueError, "checkpoint_every and resume need a checkpoint"),
        (dict(num_steps=3, validation=3.0), TypeError, "validation"),
        (dict(num_steps=3, patience=0, validation=lambda p: 0.0), ValueError, "patience"),
        (dict(num_steps=3, loss="elbo"), TypeError, "loss"),
    ],
)
def test_bad_arguments(backend, kwargs, error, match):
    model, X, y = problem(backend)
    with pytest.raises(error, match=match):
        backend.lib.fit(model.model, model.guide, (X, y), progress=False, **kwargs)
    with pytest.raises(ValueError, match="same length"):
        backend.lib.fit(model.model, model.guide, (X, y[:-1]), num_steps=1, progress=False)


def test_numpyro_fit_compiles_its_step_once(monkeypatch):
    """The state from ``SVI.init`` is committed to its device like the updates' outputs, so the
    jitted update compiles once (it compiled again at the second step before)."""
    from numpyro_sparsegp import training

    from backends import NumPyroBackend

    backend = NumPyroBackend()
    model, X, y = problem(backend, num_data=N)
    sizes, step = [], training._Trainer.step
    monkeypatch.setattr(training._Trainer, "step", lambda self, i: (step(self, i), sizes.append(self.update._cache_size()))[0])
    backend.lib.fit(model.model, model.guide, (X, y), num_steps=4, batch_size=20, progress=False)
    assert sizes == [1, 1, 1, 1]


def test_numpyro_fit_sets_up_svi_compiled():
    """``SVI.init`` runs as one compiled program (the model and guide traced, nothing run
    operation by operation, the same initial state) unless the guide asks for a key while traced:
    an autoguide setting itself up then runs once eagerly, as before."""
    import jax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro_sparsegp import training

    from backends import NumPyroBackend

    backend = NumPyroBackend()
    model, X, y = problem(backend, num_data=N)
    calls = []

    def counted(X, y):
        calls.append(not isinstance(X, jax.core.Tracer))  # True: run eagerly
        model.guide(X, y)

    backend.lib.fit(model.model, counted, (X, y), num_steps=2, batch_size=20, progress=False)
    assert calls.count(True) == 0 and calls.count(False) >= 2
    model, X, y = problem(backend, num_data=N)
    svis = [SVI(model.model, model.guide, backend.ppl.optim.Adam(0.01), Trace_ELBO()) for _ in range(2)]
    key, batch = jax.random.PRNGKey(0), (X[:20], y[:20])
    states = training._init(svis[0], key, batch, {}), svis[1].init(key, *batch)
    compiled, eager = (svi.get_params(state) for svi, state in zip(svis, states))
    assert set(compiled) == set(eager)
    for name in eager:
        np.testing.assert_allclose(np.asarray(compiled[name]), np.asarray(eager[name]), rtol=1e-12, err_msg=name)

    rng = np.random.default_rng(3)
    Xh = rng.uniform(-2, 2, (70, 1))
    data = (backend.array(Xh), backend.array(rng.integers(0, 5, 70), dtype=np.int64), backend.array(rng.integers(0, 2, 70)))
    user_model, user_guide = backend.hierarchical_model(backend.svgp(Xh[:8].copy()), 5, 16)
    calls.clear()

    def counted_user(X, g, y):
        calls.append(not isinstance(X, jax.core.Tracer))
        user_guide(X, g, y)

    backend.lib.fit(user_model, counted_user, data, num_steps=2, progress=False)
    assert calls.count(True) == 1  # the autoguide's set-up, in SVI.init


def test_numpyro_fit_sets_up_eagerly_where_a_constraint_reads_the_batch():
    """A parameter whose constraint is computed from the data cannot keep a compiled
    ``SVI.init``'s constraints (they would be the trace's): ``fit`` then sets up eagerly."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    y = jnp.asarray(np.random.default_rng(0).normal(3.0, 1.0, 50))

    def model(y):
        loc = numpyro.sample("loc", dist.Normal(0.0, 10.0))
        numpyro.sample("y", dist.Normal(loc, 1.0), obs=y)

    def guide(y):
        floor = jnp.min(y) - 1.0
        centre = numpyro.param("centre", floor + 1.0, constraint=constraints.greater_than(floor))
        numpyro.sample("loc", dist.Normal(centre, 0.1))

    from numpyro_sparsegp import fit

    result = fit(model, guide, (y,), num_steps=20, lr=0.05, progress=False)
    assert np.isfinite(result.losses).all() and float(result.params["centre"]) > float(jnp.min(y)) - 1.0
