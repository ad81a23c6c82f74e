"""The benchmark entry point runs its suites end to end (shrunk by ``SPARSEGP_BENCH_TINY=1``), and
the harness's timing and table pieces do what they say."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402

pytest.importorskip("gpytorch")


def run_suite(suite, tmp_path, *options):
    out = tmp_path / f"{suite}.jsonl"
    env = {**os.environ, "SPARSEGP_BENCH_TINY": "1", "PYTHONWARNINGS": "ignore"}
    # XLA_FLAGS kept: the harness replaces its thread flags and keeps the rest (the suite's emitters)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", suite, "--quick", "--out", str(out), *options],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return proc.stdout, rows


def table_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("|")]


def check_meta(row, suite):
    assert row["suite"] == suite
    assert row["command"].startswith(f"python -m benchmarks {suite} --quick")
    assert row["quick"] is True and row["tiny"] is True
    assert row["versions"]["torch"] and row["versions"]["jax"] and row["versions"]["gpytorch"]
    assert row["machine"]["cpus"] >= 1 and row["date"]
    assert row["threads"] == 2


@pytest.mark.slow
def test_peers_quick(tmp_path):
    stdout, rows = run_suite("peers", tmp_path)
    lines = table_lines(stdout)
    assert lines[0].startswith("| M | ours (Pyro) | ours (NumPyro, jit) | GPyTorch | pyro.contrib.gp |")
    assert len(lines) == 2 + len(rows) and len(rows) >= 1
    for row in rows:
        check_meta(row, "peers")
        for key in ("ours_pyro", "ours_numpyro", "gpytorch", "contrib_gp"):
            assert row[f"seconds_{key}"] > 0
            assert all(b > 0 for b in row[f"blocks_{key}"]) and len(row[f"blocks_{key}"]) == row["repeats"]
            if key != "gpytorch":
                assert row[f"ratio_{key}"] == pytest.approx(row["seconds_gpytorch"] / row[f"seconds_{key}"])
        assert f"| {row['M']} |" in stdout


@pytest.mark.slow
def test_heap_quick(tmp_path):
    """Each case in fresh processes, with the freed memory kept and not."""
    stdout, rows = run_suite("heap", tmp_path)
    lines = table_lines(stdout)
    assert lines[0].startswith("| case | freed memory | s per step | page faults per step | peak resident |")
    assert [(row["case"], row["setting"]) for row in rows] == [
        (case, setting) for case in ("SVGP, fit", "SVGP, pyro.infer.SVI", "HVGP 8 x m, fit")
        for setting in ("kept", "given back (glibc's default)")]
    for row in rows:
        check_meta(row, "heap")
        assert row["seconds"] > 0 and row["faults"] >= 0 and row["peak_mb"] > 0 and row["after_mb"] > 0


@pytest.mark.slow
def test_steps_quick(tmp_path):
    stdout, rows = run_suite("steps", tmp_path)
    lines = table_lines(stdout)
    assert lines[0].startswith("| M | ours (Pyro) | ours (Pyro, SVI) | ours (NumPyro, jit) | ours (NumPyro, SVI) | GPyTorch "
                               "| GPyTorch, second group | floor |")
    assert len(lines) == 2 + len(rows) and len(rows) >= 1
    for row in rows:
        check_meta(row, "steps")
        for key in ("ours_pyro", "ours_pyro_svi", "ours_numpyro", "ours_numpyro_svi"):
            peer = row["seconds_gpytorch_apart" if key == "ours_numpyro_svi" else "seconds_gpytorch"]
            assert row[f"ratio_{key}"] == pytest.approx(peer / row[f"seconds_{key}"])
            assert row[f"floor_ratio_{key}"] == pytest.approx(row[f"seconds_{key}"] / row["seconds_floor"])
        assert all(len(row[f"blocks_{key}"]) == row["repeats"]
                   for key in ("floor", "floor_fused", "gpytorch", "gpytorch_apart", "ours_numpyro_svi"))
        assert row["calls_ours_pyro"] > row["calls_floor"] > 0


@pytest.mark.slow
def test_startup_quick(tmp_path):
    stdout, rows = run_suite("startup", tmp_path)
    lines = table_lines(stdout)
    assert lines[0].startswith("| model | seconds to the first step | seconds of the export |")
    assert [row["variant"] for row in rows] == ["with the SVGP component", "without it (f = 0)", "the library's share",
                                                "a GPModel (SVGP, no autoguide)"]
    for row in rows[:2] + rows[3:]:
        check_meta(row, "startup")
        assert len(row["runs"]) == row["repeats"] and all(r["first_step"] > 0 and r["export"] > 0 for r in row["runs"])
    for key in ("first_step", "export"):
        assert rows[2][key] == pytest.approx(rows[0][key] - rows[1][key])


@pytest.mark.slow
def test_gpu_graphs(tmp_path):
    """Each Pyro model's captured step with and without its CUDA graph (the same step on a CPU),
    each in its own group beside GPyTorch (and the SVGP's floor)."""
    _, rows = run_suite("gpu", tmp_path, "--part", "graphs")
    groups = {}
    for row in rows:
        assert "error" not in row and row["seconds"] > 0
        groups.setdefault(row["group"], {})[row["implementation"]] = row
    names = {"SVGP": "ours (Pyro)", "decoupled": "decoupled (Pyro)", "HVGP": "HVGP (Pyro)"}
    assert set(groups) == {f"{model}, {how}" for model in names for how in ("one CUDA graph", "operation by operation")}
    for group, cases in groups.items():
        model = group.split(",")[0]
        assert set(cases) == {names[model], "GPyTorch"} | ({"floor"} if model == "SVGP" else set())
        ours = cases[names[model]]
        assert ours["vs_gpytorch"] == pytest.approx(cases["GPyTorch"]["seconds"] / ours["seconds"])


@pytest.mark.slow
def test_gpu_quick(tmp_path):
    """Every method's group runs (on the CPU here, saying so), each row names the device, the
    ratios are those of the group's own GPyTorch and floor, the memory probes reach their caps, and
    each startup variant's fresh process reports its times."""
    import torch

    stdout, rows = run_suite("gpu", tmp_path)
    if not torch.cuda.is_available():
        assert "no CUDA GPU: measuring on the CPU" in stdout
    steps = [row for row in rows if row["part"] == "steps"]
    memory = [row for row in rows if row["part"] == "memory"]
    assert {row["group"] for row in steps} == {"SVGP", "decoupled", "HVGP", "orthogonal features", "QSGP", "exact DBK"}
    for row in rows:
        check_meta(row, "gpu")
        assert row["device"] == row["machine"]["device"] and "error" not in row
    for row in steps:
        group = [r for r in steps if r["group"] == row["group"]]
        assert row["seconds"] > 0 and len(row["blocks"]) == row["repeats"] and row["first_step"] > 0
        reference = [r for r in group if r["implementation"].startswith("GPyTorch")]
        if reference and row not in reference and row["implementation"] != "floor":
            assert row["vs_gpytorch"] == pytest.approx(reference[0]["seconds"] / row["seconds"])
        floor = [r for r in group if r["implementation"] == "floor"]
        if floor and row not in floor:
            assert row["vs_floor"] == pytest.approx(row["seconds"] / floor[0]["seconds"])
    assert {row["dtype"] for row in steps if row["group"] == "exact DBK"} == {"float64"}  # as docs/usage.md runs it
    svgp = {row["implementation"] for row in steps if row["group"] == "SVGP"}
    assert svgp == {"ours (Pyro)", "ours (Pyro, SVI)", "ours (NumPyro, jit)", "ours (NumPyro, SVI)", "GPyTorch", "floor"}
    assert len(memory) == 4 and all(row["largest"] == row["cap"] and row["seconds"] > 0 for row in memory)
    startup = [row for row in rows if row["part"] == "startup"]
    assert [row["variant"] for row in startup] == ["default", "compilation cache, first process",
                                                   "compilation cache, second process"]
    assert all(row["load"] > 0 and row["first_step"] > 0 and row["seconds"] > 0 for row in startup)
    assert sum(line.startswith("| SVGP |") for line in table_lines(stdout)) == len(svgp)


@pytest.mark.slow
def test_accuracy_quick(tmp_path):
    stdout, rows = run_suite("accuracy", tmp_path)
    lines = table_lines(stdout)
    assert lines[0] == "| dataset | implementation | test RMSE | test NLPD | train seconds |"
    assert len(lines) == 2 + len(rows)
    assert {row["implementation"] for row in rows} == {"ours (Pyro)", "ours (NumPyro, jit)", "GPyTorch"}
    for row in rows:
        check_meta(row, "accuracy")
        assert row["seconds"] > 0 and math.isfinite(row["final_loss"])
        assert math.isfinite(row["rmse"]) and row["rmse"] > 0 and math.isfinite(row["nlpd"])
    # same data, same steps: the three fits agree on the test RMSE to within a few percent
    rmse = [row["rmse"] for row in rows]
    assert max(rmse) < 1.05 * min(rmse)


@pytest.mark.slow
def test_export_quick(tmp_path):
    stdout, rows = run_suite("export", tmp_path)
    assert table_lines(stdout)[0].startswith("| backend | model at export | draws | points | log_likelihood shape |")
    assert [(row["backend"], row["variant"]) for row in rows] == [
        (b, v) for b in ("pyro", "numpyro") for v in ("subsampling plate", "full plate")]
    for row in rows:
        check_meta(row, "export")
        assert row["error"] == "" and row["seconds"] > 0
        assert row["shape"] == [4, row["draws"] // 4, row["points"]]  # every observation, once


@pytest.mark.slow
def test_decoupled_quick(tmp_path):
    stdout, rows = run_suite("decoupled", tmp_path)
    lines = table_lines(stdout)
    speed = [row for row in rows if row["part"] == "speed"]
    accuracy = [row for row in rows if row["part"] == "accuracy"]
    assert lines[0].startswith("| M_alpha | M_beta | decoupled (Pyro) | decoupled (NumPyro, jit) |")
    assert sum(line.startswith("| dataset | model |") for line in lines) == 1
    assert len(lines) == 4 + len(rows) and len(speed) == 1 and accuracy
    for row in rows:
        check_meta(row, "decoupled")
    for key in ("decoupled", "decoupled_numpyro", "svgp", "gpytorch"):
        assert speed[0][f"seconds_{key}"] > 0
    assert speed[0]["ratio"] == pytest.approx(speed[0]["seconds_gpytorch"] / speed[0]["seconds_decoupled"])
    for dataset in {row["dataset"] for row in accuracy}:
        pair = [row for row in accuracy if row["dataset"] == dataset]
        assert len(pair) == 2 and {row["model"].split()[0] for row in pair} == {"decoupled", "SVGP"}
        for row in pair:  # equal budgets: each trained for at least its budget, in at least one step
            assert row["steps"] >= 1 and row["seconds"] >= row["budget"]
            if dataset == "sarcos":
                assert len(row["nmse"]) == 7 and row["nmse_mean"] == pytest.approx(sum(row["nmse"]) / 7)
                assert all(0 < v < 2 for v in row["nmse"])
            else:
                assert math.isfinite(row["rmse"]) and row["rmse"] > 0 and math.isfinite(row["nlpd"])


@pytest.mark.slow
def test_harmonic_quick(tmp_path):
    stdout, rows = run_suite("harmonic", tmp_path)
    lines = table_lines(stdout)
    speed = [row for row in rows if row["part"] == "speed"]
    accuracy = [row for row in rows if row["part"] == "accuracy"]
    classification = [row for row in rows if row["part"] == "classification"]
    assert lines[0].startswith("| m | HVGP (Pyro) | HVGP (NumPyro, jit) | SVGP (Pyro) M=1m |")
    assert len(lines) == 3 * 2 + len(rows) and len(speed) == 1
    row = speed[0]
    check_meta(row, "harmonic")
    assert row["T"] == 8 and row["multiples"] == [1, 8]
    for backend in ("pyro", "numpyro"):
        assert row[f"hvgp_over_svgp_{backend}"] == pytest.approx(row[f"seconds_hvgp_{backend}"] / row[f"seconds_ours_{backend}_1"])
        assert row[f"svgp_over_hvgp_{backend}"] == pytest.approx(row[f"seconds_ours_{backend}_8"] / row[f"seconds_hvgp_{backend}"])
    assert row["seconds_gpytorch_8"] > 0
    assert [row["model"] for row in accuracy] == ["HVGP 8 x 8", "SVGP 8", "SVGP 16"]
    hvgp = accuracy[0]
    for row in accuracy:  # the same steps for all; the SVGPs on for at least HVGP's training time
        assert row["steps"] == 3 and 0 < row["trace_error"] < 1  # per point, k(x, x) = 1
        assert row["seconds"] >= hvgp["seconds"] * (row is not hvgp) and row["steps_at_time"] >= row["steps"]
        assert all(math.isfinite(row[key]) for key in ("rmse_at_steps", "nlpd_at_steps", "rmse_at_time", "nlpd_at_time"))
    assert hvgp["steps_at_time"] == 3 and hvgp["rmse_at_time"] == hvgp["rmse_at_steps"]
    assert [row["model"] for row in classification] == ["TRAN 16 x 2", "TRAN-S 16 x 2", "SVGP 4"]
    for row in classification:
        assert 0 <= row["accuracy"] <= 1 and 0 < row["nll"] < 10


def test_translated_mnist_10k_splits_every_class():
    """mnist_10k's file holds its rows grouped by class: the classification part's split draws
    both sets from all ten (skipped without the shared data)."""
    from benchmarks import harmonic

    if not (harness.data_dir() / "mnist_10k").is_dir():
        pytest.skip(f"mnist_10k is not in {harness.data_dir()}")
    X, y, Xt, yt, synthetic = harmonic.translated_images("mnist_10k", {"train": 8000, "test": 2000})
    assert not synthetic and X.shape == (8000, 784) and Xt.shape == (2000, 784)
    assert set(np.unique(y)) == set(np.unique(yt)) == set(range(10))


@pytest.mark.slow
def test_qsgp_quick(tmp_path):
    stdout, rows = run_suite("qsgp", tmp_path)
    lines = table_lines(stdout)
    speed = [row for row in rows if row["part"] == "speed"]
    accuracy = [row for row in rows if row["part"] == "accuracy"]
    inducing = [row for row in rows if row["part"] == "inducing"]
    convergence = [row for row in rows if row["part"] == "convergence"]
    variance = [row for row in rows if row["part"] == "variance"]
    assert lines[0].startswith("| model | m | loss | Pyro | NumPyro (jit) |")
    assert len(lines) == 5 * 2 + len(rows)
    check_meta(speed[0], "qsgp")
    assert [row["m"] for row in speed] == [200, 200, 16]
    assert all(row["seconds_pyro"] > 0 and row["seconds_numpyro"] > 0 for row in speed)
    assert [(row["dataset"], row["model"], row["backend"]) for row in accuracy] == [
        ("kin40k", "QSGP-0", "pyro"), ("kin40k", "QSGP-0, C's diagonal at Proposition 1", "pyro"),
        ("kin40k", "QSGP-2", "pyro"), ("kin40k", "SVGP-16", "pyro")]
    assert [row["steps"] for row in accuracy[:3]] == [3, 3, 3] and accuracy[3]["steps"] >= 1
    assert [(row["paper_rmse"], row["paper_mnlp"]) for row in accuracy] == [
        (0.174, 0.135), (0.174, 0.135), (0.175, 0.139), (0.247, 0.055)]
    assert accuracy[3]["seconds"] >= accuracy[0]["seconds"]  # the SVGP trains as long as QSGP-0
    assert accuracy[1]["nlpd"] != accuracy[0]["nlpd"]  # the diagonal's start changes the predictive variance
    for row in accuracy:
        assert math.isfinite(row["nlpd"]) and 0 < row["rmse"] < 2
    whitened = "QSGP-0, whitened (AdaGrad 0.1 on q_mu)"
    snapshot = "QSGP-0, whitened, snapshot every 5 (AdaGrad 0.3 on q_mu)"
    assert [(row["model"], row["steps"]) for row in inducing][:7] == [
        ("exact GP (n = 300)", 0), ("QSGP-0", 2), ("QSGP-0", 4), (whitened, 2), (whitened, 4), (snapshot, 2),
        (snapshot, 4)]
    assert inducing[7]["model"] == "SVGP-16 (held, same seconds)" and inducing[7]["steps"] >= 1
    assert inducing[7]["seconds"] >= inducing[2]["seconds"]  # as long as QSGP-0 on the kernel functions
    assert all(math.isfinite(row["nlpd"]) and 0 < row["rmse"] < 3 for row in inducing)
    qsgp0, svgp = convergence[:2], convergence[2:]
    assert [(row["steps"], row["total_steps"], row["hyper_lr"]) for row in qsgp0] == [(2, 4, 1e-5), (4, 4, 1e-5)]
    assert qsgp0[1]["seconds"] > qsgp0[0]["seconds"] and qsgp0[0]["paper_rmse"] == 0.174
    assert qsgp0[1]["rmse"] != qsgp0[0]["rmse"]  # the model trained between the two
    # the SVGP scored once QSGP-0's seconds at each row have passed, a step at least between rows
    assert [row["model"] for row in svgp] == ["SVGP-16 (as many seconds)"] * 2 and svgp[0]["paper_rmse"] == 0.247
    assert [row["budget"] for row in svgp] == [row["seconds"] for row in qsgp0]
    assert all(row["seconds"] >= row["budget"] for row in svgp) and 1 <= svgp[0]["steps"] < svgp[1]["steps"]
    assert all(math.isfinite(row["nlpd"]) and 0 < row["rmse"] < 3 for row in convergence)
    assert [row["support"] for row in variance] == [0, 10, 40]
    assert variance[0]["value_ratio"] == variance[0]["gradient_ratio"] == 1.0
    assert all(row["value_variance"] > 0 and row["gradient_variance"] > 0 and math.isfinite(row["z"]) for row in variance)


@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_qsgp_convergence_continues_a_stopped_run(tmp_path, monkeypatch, backend):
    """With ``--state`` a stopped convergence run continues from its checkpoint and ends with the
    rows of an uninterrupted one; run again once finished, it trains no more. The rows are those of
    the parameters at each checkpoint (NumPyro's in the middle of ``fit`` too). The SVGP scored at
    the same seconds continues alike."""
    from benchmarks import qsgp

    monkeypatch.setenv("SPARSEGP_BENCH_TINY", "1")
    opts = qsgp.settings(quick=True)
    problem = qsgp.convergence_problem("kin40k", opts)
    expected = qsgp.convergence_run(opts, backend, problem)  # without a state directory: one uninterrupted run
    assert expected[1]["rmse"] != expected[0]["rmse"]
    monkeypatch.setattr(harness, "STATE", str(tmp_path))
    step, calls, stop = harness.FitSteps.step, [], [3]

    def counted(self):  # a stop before the third step (a KeyboardInterrupt, as a session's end)
        if len(calls) + 1 == stop[0]:
            raise KeyboardInterrupt
        calls.append(1)
        return step(self)

    monkeypatch.setattr(harness.FitSteps, "step", counted)
    with pytest.raises(KeyboardInterrupt):
        qsgp.convergence_run(opts, backend, problem)
    stored = json.loads(next(tmp_path.glob("*.rows.json")).read_text())
    assert [row["steps"] for row in stored] == [2] and len(calls) == 2
    calls.clear()
    stop[0] = None
    # fit saves a step's checkpoint when asked for the next step: the run continues from step 1
    rows = qsgp.convergence_run(opts, backend, problem)
    assert len(calls) == 3 and [row["steps"] for row in rows] == [2, 4] and rows[1]["seconds"] > rows[0]["seconds"]
    for row, want in zip(rows, expected):
        assert row["rmse"] == pytest.approx(want["rmse"], rel=1e-6) and row["nlpd"] == pytest.approx(want["nlpd"], rel=1e-6)
    assert qsgp.convergence_run(opts, backend, problem) == rows and len(calls) == 3  # finished: nothing more to step
    # the SVGP beside it, scored at those seconds: stopped after its first row, it goes on to the second
    budgets = [row["seconds"] for row in rows]
    record = harness.Resumable.record

    def record_then_stop(self, row):
        record(self, row)
        if row["budget"] == budgets[0]:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(harness.Resumable, "record", record_then_stop)
        with pytest.raises(KeyboardInterrupt):
            qsgp.equal_time_run(opts, backend, problem, budgets)
    first = json.loads(next(tmp_path.glob("*svgp*.rows.json")).read_text())
    svgp = qsgp.equal_time_run(opts, backend, problem, budgets)
    assert svgp[0] == first[0] and [row["budget"] for row in svgp] == budgets
    assert svgp[0]["steps"] < svgp[1]["steps"] and all(row["seconds"] >= row["budget"] for row in svgp)
    calls.clear()
    assert qsgp.equal_time_run(opts, backend, problem, budgets) == svgp and not calls


def test_resumable_clock_leaves_out_stalls(tmp_path, monkeypatch, capsys):
    """A long run's clock counts a stall between two steps (the process stopped while other work
    ran) as one usual step, also in the clock it keeps for a resumed run and while the next step
    is still running, and a stop before a process's first step by the CPU time its set-up took;
    each row it keeps is reported on stderr."""
    now, cpu = [100.0], [5.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(harness.time, "process_time", lambda: cpu[0])
    monkeypatch.setattr(harness, "STATE", str(tmp_path))
    run = harness.Resumable("run", 4, "pyro")
    tick = run.fit_options()["callbacks"][0]
    for step in range(1, 21):
        now[0] += 30.0 if step == 12 else 0.5  # stopped for 30 s before step 12
        cpu[0] += 0.5
        tick(SimpleNamespace(step=step))
    assert run.seconds() == pytest.approx(20 * 0.5)
    now[0] += 60.0  # stopped during step 21's work, read before its callback
    assert run.seconds() == pytest.approx(20 * 0.5 + 0.5)
    now[0] -= 60.0
    clock = json.loads(next(tmp_path.glob("*.clock.json")).read_text())
    assert clock == pytest.approx({"4": 2.0, "8": 4.0, "12": 6.0, "16": 8.0, "20": 10.0})
    resumed = harness.Resumable("run", 4, "pyro")  # a new process, continuing after step 16's checkpoint
    now[0] += 0.5
    cpu[0] += 0.75  # two threads
    resumed.fit_options()["callbacks"][0](SimpleNamespace(step=17))
    assert resumed.seconds() == pytest.approx(8.5)  # from the clock at step 16, stalls left out
    resumed.record({"steps": 17, "seconds": resumed.seconds(), "rmse": 0.25})
    assert capsys.readouterr().err == "run: 17 steps, 8 s, rmse 0.2500\n"
    stopped = harness.Resumable("run", 4, "pyro")  # stopped for an hour while it set up
    now[0] += 3600.0 + 2.0
    cpu[0] += 2.0
    stopped.fit_options()["callbacks"][0](SimpleNamespace(step=17))
    assert stopped.seconds() == pytest.approx(8.0 + 2.0)


def test_train_for_gives_each_runner_the_budget():
    from benchmarks.decoupled import train_for

    class Sleeper:
        def __init__(self, seconds):
            self.seconds = seconds

        def step(self):
            import time

            time.sleep(self.seconds)

    result = train_for({"fast": Sleeper(0.002), "slow": Sleeper(0.01)}, seconds=0.1, slice_seconds=0.03)
    for key, (steps, spent) in result.items():
        assert 0.1 <= spent < 0.13
    assert result["fast"][0] > 2.5 * result["slow"][0] > 0


def test_fit_steps_are_the_steps_of_fit(backend):
    """``FitSteps`` (how the suites time and slice our training) runs exactly ``fit``'s steps."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (40, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)

    def setup():
        backend.reset()
        model = backend.lib.GPModel(backend.svgp(X[:5].copy()), backend.lib.Gaussian(), num_data=40)
        return model, (backend.array(X), backend.array(y)), {"batch_size": 10, "lr": 0.05, "seed": 3}

    model, data, options = setup()
    expected = backend.lib.fit(model.model, model.guide, data, num_steps=6, progress=False, **options)
    model, data, options = setup()
    steps = harness.FitSteps(backend.lib.fit, model.model, model.guide, data, **options)
    losses = [steps.step() for _ in range(6)]
    np.testing.assert_allclose(losses, expected.losses, rtol=1e-12)
    params = steps.params
    for name, value in expected.params.items():
        np.testing.assert_allclose(backend.numpy(params[name]), backend.numpy(value), rtol=1e-10)
    result = steps.close()
    assert result.stopped_early and len(result.losses) == 6 and steps.close() is result
    with pytest.raises(RuntimeError, match="ended"):
        steps.step()

    failing = harness.FitSteps(backend.lib.fit, model.model, model.guide, data, batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        failing.step()


def test_median_and_table():
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError, match="empty"):
        harness.median([])
    columns = [("M", "M", "{}"), ("time", "seconds", "{:.2f} s"), ("ratio", "ratio", "{:.1f}")]
    rows = [{"M": 256, "seconds": 0.0123, "ratio": 2.04}, {"M": 1024, "seconds": 1.5}]
    assert harness.markdown_table(columns, rows, title="T").splitlines() == [
        "T",
        "",
        "| M | time | ratio |",
        "|---|---|---|",
        "| 256 | 0.01 s | 2.0 |",
        "| 1024 | 1.50 s |  |",
    ]


def test_time_steps_alternates_and_counts():
    calls = []
    steps = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    blocks = harness.time_steps(steps, repeats=3, block_seconds=0.0, warmup=2)
    assert set(blocks) == {"a", "b"} and all(len(v) == 3 and min(v) >= 0 for v in blocks.values())
    # 2 warm-up calls each, then one call per block (block_seconds=0), blocks alternating
    assert calls == ["a", "a", "b", "b"] + ["a", "b"] * 3


def test_minibatches_cover_each_epoch():
    stream = harness.minibatches(10, 3, seed=1)
    epoch = [next(stream) for _ in range(3)]
    assert all(len(b) == 3 for b in epoch)
    assert len(set(map(int, [i for b in epoch for i in b]))) == 9  # without replacement
    again = harness.minibatches(10, 3, seed=1)
    assert all((next(again) == b).all() for b in epoch)


def test_write_jsonl_appends_meta(tmp_path):
    path = harness.write_jsonl(tmp_path / "sub" / "x.jsonl", [{"a": 1}, {"a": 2}], {"command": "c"})
    harness.write_jsonl(path, [{"a": 3}], {"command": "d"})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"a": 1, "command": "c"}, {"a": 2, "command": "c"}, {"a": 3, "command": "d"}]
