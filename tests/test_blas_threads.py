"""NumPyro's ``fit`` on CPU times its first steps with the BLAS library limited to one thread and
as it was, keeps the faster setting, and restores the library's own when it ends."""
import time
import types

import numpy as np
import pytest

pytest.importorskip("numpyro")
threadpoolctl = pytest.importorskip("threadpoolctl")

from sparsegp_common.inference import threads  # noqa: E402

CPU, GPU = True, False  # whether the steps run on a CPU


def wait(out):
    return out


class FakeBlas:
    """A BLAS library's thread count, as a ``ThreadpoolController`` shows and sets it."""

    def __init__(self, num_threads):
        self.num_threads = self.original = num_threads

    def select(self, user_api):
        assert user_api == "blas"
        return self

    def info(self):
        return [{"num_threads": self.num_threads}]

    def limit(self, limits):
        self.num_threads = limits
        return types.SimpleNamespace(restore_original_limits=lambda: setattr(self, "num_threads", self.original))


def run_steps(tuner, blas, seconds, count):
    """``count`` steps through ``tuner`` lasting ``seconds[threads]``; the threads seen by each."""
    seen = []

    def step():
        seen.append(blas.num_threads)
        time.sleep(seconds[blas.num_threads])
        return np.zeros(2)

    with tuner:
        for _ in range(count):
            tuner.run(step)
        held = blas.num_threads
    return seen, held


@pytest.fixture(autouse=True)
def short_settle(monkeypatch):
    monkeypatch.setattr(threads, "SETTLE", 0.01)


@pytest.mark.parametrize("one, default, choice", [(0.002, 0.02, 1), (0.02, 0.002, 0)])
def test_the_faster_setting_is_kept_and_the_library_setting_restored(one, default, choice):
    blas = FakeBlas(4)
    tuner = threads.BlasThreads(CPU, wait, blas)
    seen, held = run_steps(tuner, blas, {1: one, 4: default}, 40)
    assert tuner.choice == choice
    assert seen[0] == 4 and 1 in seen  # the compiling step as it was; then both settings timed
    assert len(tuner.times[0]) == len(tuner.times[1]) == threads.TRIALS
    assert held == (1 if choice else 4) and seen[-1] == held
    assert blas.num_threads == 4  # restored on exit


@pytest.mark.parametrize("pause, timed", [(0.05, 0), (0.0, 3)])
def test_steps_after_other_work_settle_before_they_are_timed(monkeypatch, pause, timed):
    """Steps of 20 ms, settling 30 ms: without pauses the fourth to sixth steps are timed; a pause
    before every other step restarts the settling each time, and none is."""
    monkeypatch.setattr(threads, "SETTLE", 0.03)
    monkeypatch.setattr(threads, "GAP", 0.01)
    blas = FakeBlas(4)
    tuner = threads.BlasThreads(CPU, wait, blas)
    with tuner:
        for i in range(7):
            time.sleep(pause if i % 2 == 1 else 0.0)
            tuner.run(lambda: time.sleep(0.02))
    assert len(tuner.times[0]) == timed and tuner.times[1] == []


def test_long_steps_are_timed_after_pauses_and_an_unfinished_timing_gives_up(monkeypatch):
    """Steps that take ``LONG`` seconds count whatever ran before them; when too few steps count
    (other work between every two), the threads go back as they were at step ``GIVE_UP``."""
    monkeypatch.setattr(threads, "GAP", 0.005)
    monkeypatch.setattr(threads, "LONG", 0.015)
    monkeypatch.setattr(threads, "GIVE_UP", 1 + 2 * threads.TRIALS)
    for step_seconds, choice, timed in ((0.02, 1, threads.TRIALS), (0.002, 0, 0)):
        blas = FakeBlas(4)
        tuner = threads.BlasThreads(CPU, wait, blas)
        with tuner:
            for _ in range(2 + 2 * threads.TRIALS):
                time.sleep(0.02)  # other work
                tuner.run(lambda: time.sleep(step_seconds * (1 if blas.num_threads == 1 else 2)))
            assert tuner.choice == choice and blas.num_threads == (1 if choice else 4)
        assert len(tuner.times[0]) == len(tuner.times[1]) == timed and blas.num_threads == 4


@pytest.mark.parametrize("device, num_threads", [(GPU, 4), (CPU, 1)])
def test_nothing_changes_off_cpu_or_with_one_thread(device, num_threads):
    blas = FakeBlas(num_threads)
    tuner = threads.BlasThreads(device, wait, blas)
    seen, held = run_steps(tuner, blas, {1: 0.003, num_threads: 0.003}, 12)  # past SETTLE: would be timed
    assert set(seen) == {num_threads} and held == num_threads
    assert tuner.times == ([], [])


def blas_threads():
    return [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]


def test_fit_restores_the_blas_threads():
    """A real fit, run to its end and closed early: the BLAS threads are as before either way."""
    import jax.numpy as jnp

    import numpyro_sparsegp as nsg

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (200, 1)).astype(np.float32)
    y = np.sin(2 * X[:, 0]).astype(np.float32)
    gp = nsg.GPModel(nsg.SVGP(nsg.RBF(), jnp.asarray(X[:8])), nsg.Gaussian(variance=0.1), num_data=200)
    data = (jnp.asarray(X), jnp.asarray(y))
    nsg.fit(gp.model, gp.guide, data, num_steps=2, batch_size=50, progress=False)  # loads JAX's BLAS
    before, seen = blas_threads(), []
    result = nsg.fit(gp.model, gp.guide, data, num_steps=30, batch_size=50, progress=False,
                     callbacks=lambda state: seen.append(blas_threads()))
    assert np.all(np.isfinite(result.losses)) and blas_threads() == before
    if max(before) > 1:  # the steps ran with one thread for a while
        assert [1] * len(before) in seen and seen[0] == before
    running = nsg.fit.steps(gp.model, gp.guide, data, num_steps=10**6, batch_size=50, progress=False)
    for _ in range(20):
        next(running)
    running.close()
    assert blas_threads() == before
