"""Shared pieces of the benchmark suites: thread pinning, timing, data, tables and JSON lines.

Nothing here imports torch or JAX at module level: :func:`pin_threads` has to run before either
is imported for the XLA setting to take effect.
"""
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("numpy", "torch", "pyro-ppl", "jax", "jaxlib", "numpyro", "gpytorch", "linear_operator")

# (rows, inputs) of the UCI sets the suites use, for the synthetic stand-ins when the data are absent.
UCI_SHAPES = {"elevators": (16599, 18), "kin40k": (40000, 8), "protein": (45730, 9), "keggdirected": (48827, 20)}


# Environment for glibc's malloc to keep freed memory for reuse rather than hand it back to the
# kernel (PyTorch's CPU tuning guide suggests jemalloc or tcmalloc for the same reason): a step over
# 1e6 rows frees gigabytes of activations, and faulting them back in made it 1.6x slower per row
# than at 1e4 (2026-11-24). Read at start-up only (mallopt cannot set a trim threshold over 2 GiB).
RETAIN_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}


def tiny():
    """``SPARSEGP_BENCH_TINY=1`` shrinks the suites further than ``--quick`` (for the test suite)."""
    return os.environ.get("SPARSEGP_BENCH_TINY", "") not in ("", "0")


def pin_threads(num_threads=2):
    """Run torch and XLA on ``num_threads`` threads (and as many CPUs where more are available).

    Must run before torch or JAX is imported: XLA reads its flags and sizes its thread pool from
    the CPUs this process may use when it starts.
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    if not tiny():  # first steps are timed with empty caches (a tiny run is a test: let it use one)
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if "multi_thread_eigen" not in f and "intra_op_parallelism_threads" not in f]
    flags += ["--xla_cpu_multi_thread_eigen=true", f"intra_op_parallelism_threads={num_threads}"]
    os.environ["XLA_FLAGS"] = " ".join(flags)
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > num_threads:
            os.sched_setaffinity(0, cpus[:num_threads])
    import torch

    torch.set_num_threads(num_threads)
    return num_threads


DEVICE = "cpu"  # set by use_device


def use_device(name):
    """Run the suites on ``name``: ``"cpu"`` or ``"cuda"`` (an NVIDIA GPU: the runners' torch tensors
    go there (:func:`tensor`), and JAX keeps its default GPU backend). Before JAX is imported."""
    global DEVICE
    if name == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"  # JAX would otherwise take a GPU where there is one
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--device {name}: torch sees no CUDA GPU")
        # JAX preallocates 75 % of the GPU's memory by default: leave torch's runners their share
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")
    DEVICE = name


STATE = None  # set by --state: the directory where long runs keep what they need to continue
STALL = 10.0  # a gap between steps this many times the usual one is a stall, not training


class Resumable:
    """What a long run keeps under the ``--state`` directory (:data:`STATE`) so that, stopped,
    it continues where it stopped when the same command runs again: ``fit``'s checkpoint
    (parameters, optimisers, RNG, the objective's state: a resumed fit reaches the parameters of
    an uninterrupted one), the rows measured so far, and its clock (seconds of training at each
    checkpoint; a resumed process adds its own set-up once more). The clock leaves out stalls:
    a gap between two steps over :data:`STALL` times the median of the last gaps (a process
    stopped by ``SIGSTOP`` while other work used the machine, the test set scored at a row)
    counts as one usual step, and a process's set-up counts its CPU seconds where they are fewer
    than its wall-clock ones (a process stopped before its first step).

    Args:
        name: the run's file names under :data:`STATE` (one name per configuration).
        checkpoint_every: steps between checkpoints (the most a stop loses).
        backend: ``"pyro"`` or ``"numpyro"`` (the checkpoint's format).
    """

    def __init__(self, name, checkpoint_every, backend):
        self.name, base = name, Path(STATE) / name
        base.parent.mkdir(parents=True, exist_ok=True)
        self.checkpoint = base.with_name(base.name + (".pt" if backend == "pyro" else ".npz"))
        self._rows_path, self._clock_path = (base.with_name(base.name + s) for s in (".rows.json", ".clock.json"))
        self.every = int(checkpoint_every)
        self.rows = _read_json(self._rows_path, [])
        self._clock = {int(step): seconds for step, seconds in _read_json(self._clock_path, {}).items()}
        self._start, self._offset, self._resumed_from = time.perf_counter(), 0.0, None
        self._cpu_start = time.process_time()
        self._last, self._gaps, self._stalled = None, [], 0.0

    def fit_options(self):
        """``fit``'s arguments that checkpoint the run and continue it (from its first step)."""
        return {"checkpoint": str(self.checkpoint), "checkpoint_every": self.every, "resume": True,
                "callbacks": [self._tick]}

    def _tick(self, state):
        now = time.perf_counter()
        if self._resumed_from is None:  # this process's first step: the fit continued from the step before
            self._resumed_from = state.step - 1
            self._offset = self._clock.get(self._resumed_from, 0.0)
            # a stopped process's clock runs on, its CPU time does not
            self._stalled += max(0.0, (now - self._start) - (time.process_time() - self._cpu_start))
        else:
            self._count(now - self._last)
        self._last = now
        if state.step % self.every == 0:  # fit saves its checkpoint of this step next
            self._clock[state.step] = self.seconds()
            _write_json(self._clock_path, self._clock)

    def _count(self, gap):
        stall = self._stall(gap)
        if stall:
            self._stalled += stall
        else:
            self._gaps = self._gaps[-49:] + [gap]

    def _stall(self, gap):
        """What of ``gap`` (seconds since a step) is a stall: all but one usual step, or nothing."""
        usual = statistics.median(self._gaps) if len(self._gaps) >= 5 else None
        return gap - usual if usual is not None and gap > STALL * usual else 0.0

    def seconds(self):
        """Seconds of training so far, over every process of the run, stalls left out, the one in
        progress too (a process stopped after its last step's callback, during its work, reads
        the clock before the next step's callback counts the stall)."""
        now = time.perf_counter()
        pending = self._stall(now - self._last) if self._last is not None else 0.0
        return self._offset + now - self._start - self._stalled - pending

    def record(self, row):
        """Keep ``row`` (a dict with ``"steps"``), and say so on stderr (a long run's progress);
        rows of later steps, measured after the checkpoint a resumed run continued from, are
        dropped."""
        self.rows = [r for r in self.rows if r["steps"] < row["steps"]] + [row]
        _write_json(self._rows_path, self.rows)
        scores = ", ".join(f"{key} {row[key]:.4f}" for key in ("rmse", "nlpd") if key in row)
        print(f"{self.name}: {row['steps']} steps, {row.get('seconds', 0):.0f} s"
              + (f", {scores}" if scores else ""), file=sys.stderr, flush=True)


def _read_json(path, default):
    return json.loads(path.read_text()) if path.exists() else default


def _write_json(path, value):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)  # a stop never leaves half a file


def tensor(x, dtype=None):
    """``x`` as a torch tensor on the suite's device (float32 unless ``dtype`` says otherwise).
    Explicit rather than ``torch.set_default_device``, whose per-call hook would slow the peers'
    steps in the main thread and not ours in ``fit``'s worker thread."""
    import torch

    return torch.as_tensor(x, dtype=dtype or torch.float32, device=DEVICE)


def synchronize():
    """Wait for the work queued on the suite's GPU (torch); a no-op on the CPU."""
    if DEVICE != "cpu":
        import torch

        torch.cuda.synchronize()


def device_name():
    """The accelerator the suite runs on, for tables and JSON lines (the CPU model on ``cpu``)."""
    if DEVICE == "cpu":
        return _cpu_model()
    import torch

    return torch.cuda.get_device_name()


def threads():
    """Threads torch runs on (set by :func:`pin_threads`)."""
    import torch

    return torch.get_num_threads()


def load_average():
    """The 1-, 5- and 15-minute load averages (None where unknown): other jobs on the machine
    inflate the times, so the suites record the load next to them."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def block(result):
    """Wait for an asynchronously dispatched (JAX) result; a no-op for anything else."""
    wait = getattr(result, "block_until_ready", None)
    if wait is not None:
        wait()
    return result


def python_calls(step, count=5):
    """Python function calls per step (``cProfile``'s count over ``count`` steps): the overhead
    measured independently of the machine's load."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(count):
        step()
    profile.disable()
    return pstats.Stats(profile).total_calls / count


def time_steps(steps, repeats, block_seconds=0.5, warmup=3, max_block=50, pause=None):
    """Seconds per call of each function in ``steps``, in timed blocks that alternate between
    the functions so that the machine's load drifts over all of them alike, each block after a
    pause: the threads of the block before (torch's OpenMP team, OpenBLAS's) spin on after their
    work and slowed the next block's steps (a NumPyro step at M = 256 after GPyTorch's block: 25 ms
    against 16 ms alone and 18 ms after a pause of 0.3 s; benchmarks/RESULTS.md, "steps: one BLAS
    thread").

    Args:
        steps: ``{name: step}``, each a function of no arguments doing one step.
        repeats: timed blocks per function.
        block_seconds: aimed length of a block; its number of calls (1 to ``max_block``) is set
            per function from the last warm-up call.
        warmup: untimed calls first (compilation, allocator, caches); at least 1.
        pause: seconds of sleep before each block (None: 0.3 s, none in a tiny run).

    Returns:
        ``{name: [seconds per call in each block]}`` (``repeats`` values each).
    """
    pause = (0.0 if tiny() else 0.3) if pause is None else pause
    sizes = {}
    for name, step in steps.items():
        for _ in range(max(warmup, 1)):
            start = time.perf_counter()
            block(step())
        elapsed = max(time.perf_counter() - start, 1e-9)
        sizes[name] = int(min(max(block_seconds // elapsed, 1), max_block))
    blocks = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            time.sleep(pause)
            start = time.perf_counter()
            for _ in range(sizes[name]):
                result = step()
            block(result)
            blocks[name].append((time.perf_counter() - start) / sizes[name])
    return blocks


def median(values):
    """Median of a non-empty sequence of numbers."""
    values = list(values)
    if not values:
        raise ValueError("median of an empty sequence")
    return float(statistics.median(values))


def memory():
    """``(resident MB, high-water mark MB)`` of this process from ``/proc/self/status``, or Nones."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None, None


def reset_peak():
    """Reset the high-water mark of the resident set (Linux); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def gaussian_nlpd(mean, var, y):
    """Mean negative log density of ``y`` under independent Gaussians ``N(mean, var)`` (float64)."""
    mean, var, y = (np.asarray(a, dtype=np.float64) for a in (mean, var, y))
    return float(0.5 * np.mean(np.log(2 * np.pi * var) + (y - mean) ** 2 / var))


def minibatches(num_rows, batch_size, seed=0):
    """An endless stream of row-index arrays ``(batch_size,)``: the batches that
    ``fit(batch_size=batch_size, seed=seed)`` draws, step after step (rows of one permutation per
    epoch), so every implementation timed with the same seed sees the same batches as ours."""
    from sparsegp_common.inference.training import Plan

    plan = Plan(num_rows, batch_size, 0, seed)
    step = 0
    while True:
        yield plan.indices(step)
        step += 1


class FitSteps:
    """The product's ``fit`` run one step at a time (``fit.steps``, in the calling thread), so that
    a benchmark can time single steps of it or alternate it with other implementations.

    A step is exactly one of ``fit``'s steps plus reading its loss back (so its device work is
    done). Not a worker thread: each thread brings its own OpenMP team and glibc arena, which cost
    up to 10 ms per step (spinning, page faults) that users' training does not pay.

    Args:
        fit: ``pyro_sparsegp.fit`` or ``numpyro_sparsegp.fit``.
        *args, **kwargs: its arguments; ``num_steps`` defaults to more steps than any benchmark
            takes, and ``progress`` is off.
    """

    def __init__(self, fit, *args, **kwargs):
        kwargs = {"num_steps": 10**12, **kwargs, "progress": False}
        self._running = fit.steps(*args, **kwargs)
        self.state, self.result = None, None

    def step(self):
        """Run the next step (the first also creates the parameters and compiles); returns its loss."""
        if self.result is not None:
            raise RuntimeError("this fit has ended (num_steps reached or closed)")
        try:
            self.state = next(self._running)
        except StopIteration as end:
            self.result = end.value
            raise RuntimeError("this fit has ended (num_steps reached)") from None
        return self.state.loss

    @property
    def params(self):
        """The current constrained parameter values ``{name: value}`` (after at least one step)."""
        if self.state is None:
            raise RuntimeError("no step has run yet")
        return self.state.params

    def close(self):
        """End the fit after the step it has taken; returns its ``FitResult`` (None before any step)."""
        if self.state is not None and self.result is None:
            self.state.stop = True
            try:
                next(self._running)
            except StopIteration as end:
                self.result = end.value
        return self.result


def traced_params(fn, *args):
    """Run ``fn(*args)``; the Pyro parameters it read, ``{name: unconstrained tensor}`` sorted by
    name (a library module's own tensors, which Pyro's param store mirrors)."""
    from pyro import poutine

    with poutine.trace(param_only=True) as capture:
        fn(*args)
    return {n: capture.trace.nodes[n]["value"].unconstrained() for n in sorted(capture.trace.nodes)}


def data_dir():
    """The data directory: ``$SPARSEGP_DATA`` or ``<repo>/../shared/data``."""
    return Path(os.environ.get("SPARSEGP_DATA") or REPO.parent / "shared" / "data")


def load_uci(name, split=0):
    """Train/test split of a UCI set, or a synthetic stand-in of the same shape when the data
    directory is absent.

    Returns:
        ``(split, synthetic)``: a ``sparsegp_common.data.datasets.Split`` (NumPy float64
        ``X_train (N, D)``, ``y_train (N,)``, ``X_test``, ``y_test``) and whether it is synthetic.
    """
    from sparsegp_common.data import datasets

    if (data_dir() / f"uci_{name}").is_dir():
        return datasets.load_uci(name, split=split, data_dir=data_dir()), False
    return synthetic_uci(name), True


def regression_problem(name, split=0):
    """A UCI set with standardised inputs and targets (statistics of the training rows).

    Returns:
        dict with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (T, D)`` (standardised),
        ``y_test (T,)`` (original units), ``y_scaler`` (the targets' ``Standardizer``, to map
        predictions back) and ``synthetic`` (see :func:`load_uci`).
    """
    from sparsegp_common.data.datasets import Standardizer

    data, synthetic = load_uci(name, split)
    x_scaler, y_scaler = Standardizer.fit(data.X_train), Standardizer.fit(data.y_train)
    return {
        "X_train": x_scaler.transform(data.X_train),
        "y_train": y_scaler.transform(data.y_train),
        "X_test": x_scaler.transform(data.X_test),
        "y_test": data.y_test,
        "y_scaler": y_scaler,
        "synthetic": synthetic,
    }


def inducing_inputs(X, num_inducing, seed=0):
    """``num_inducing`` distinct rows of ``X`` drawn at random: ``(M, D)``."""
    if not 0 < num_inducing <= len(X):
        raise ValueError(f"num_inducing must be in 1..{len(X)}, got {num_inducing}")
    return X[np.random.default_rng(seed).choice(len(X), num_inducing, replace=False)]


def exact_gp_hyperparameters(X, y, num_points=1000, seed=0):
    """Empirical Bayes on an exact GP (squared exponential with one lengthscale per input,
    Gaussian noise) fitted to ``num_points`` random rows (L-BFGS on the log marginal likelihood,
    float64): ``(lengthscales (D,), variance, noise)``, the initial values Evans and Nair (2020,
    Sec. 4) give every model they compare."""
    import torch

    rows = np.random.default_rng(seed).choice(len(X), min(num_points, len(X)), replace=False)
    Xs, ys = torch.as_tensor(X[rows], dtype=torch.float64), torch.as_tensor(y[rows], dtype=torch.float64)
    log_ls = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    log_var = torch.zeros((), dtype=torch.float64, requires_grad=True)
    log_noise = torch.tensor(np.log(0.1), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_ls, log_var, log_noise], max_iter=200, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        Xl = Xs / log_ls.exp()
        r2 = ((Xl[:, None, :] - Xl[None, :, :]) ** 2).sum(-1)
        K = log_var.exp() * torch.exp(-0.5 * r2) + (log_noise.exp() + 1e-6) * torch.eye(len(Xs), dtype=torch.float64)
        L = torch.linalg.cholesky(K)
        alpha = torch.cholesky_solve(ys[:, None], L)
        value = 0.5 * (ys[:, None] * alpha).sum() + L.diagonal().log().sum()
        value.backward()
        return value

    opt.step(nll)
    # the noise the fit used, its jitter included (a fit to a few rows can drive the rest to zero)
    return log_ls.detach().exp().numpy(), float(log_var.detach().exp()), float(log_noise.detach().exp()) + 1e-6


def exact_gp_predict(X, y, X_test, hypers):
    """Predictive mean and variance of ``y`` at ``X_test`` of the exact GP (squared exponential,
    ``hypers`` as :func:`exact_gp_hyperparameters` returns them) on all of ``X``, ``y`` (float64,
    ``O(n^3)``)."""
    import torch

    lengthscales, variance, noise = hypers
    scale = torch.as_tensor(np.asarray(lengthscales), dtype=torch.float64)
    Xs, Xt = (torch.as_tensor(a, dtype=torch.float64) / scale for a in (X, X_test))

    def k(A, B):
        return variance * torch.exp(-0.5 * torch.cdist(A, B) ** 2)

    L = torch.linalg.cholesky(k(Xs, Xs) + noise * torch.eye(len(Xs), dtype=torch.float64))
    alpha = torch.cholesky_solve(torch.as_tensor(y, dtype=torch.float64)[:, None], L)
    mean, var = [], []
    for start in range(0, len(Xt), 2000):
        cross = k(Xt[start:start + 2000], Xs)
        mean.append((cross @ alpha)[:, 0])
        var.append(variance - (torch.linalg.solve_triangular(L, cross.T, upper=False) ** 2).sum(0) + noise)
    return torch.cat(mean).numpy(), torch.cat(var).numpy()


def synthetic_uci(name, seed=0):
    """A smooth regression problem with the shape of UCI set ``name`` (90% train / 10% test)."""
    from sparsegp_common.data import datasets

    n, D = UCI_SHAPES[name]
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    W = rng.normal(size=(D, 3)) / np.sqrt(D)
    y = np.sin(2 * X @ W).sum(-1) + 0.1 * rng.normal(size=n)
    test = np.arange(n) % 10 == 0
    return datasets.Split(X[~test], y[~test], X[test], y[test])


def markdown_table(columns, rows, title=None):
    """A markdown table.

    Args:
        columns: ``[(header, key, fmt), ...]``; a cell is ``fmt.format(row[key])``, or empty when
            the row has no ``key`` (or it is None).
        rows: list of dicts.
        title: optional line printed above the table.

    Returns:
        The table as a string (title, header, separator and one line per row).
    """
    lines = [] if title is None else [title, ""]
    lines.append("| " + " | ".join(header for header, _, _ in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        cells = ["" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment():
    """Versions, machine and command of this run, recorded with every JSON line."""
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "command": " ".join(["python", "-m", "benchmarks", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions,
        "machine": {
            "platform": platform.platform(),
            "processor": _cpu_model(),
            "cpus": os.cpu_count(),
            "cpus_used": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "load_average": load_average(),
            "device": device_name(),
        },
        "git_commit": _git_commit(),
    }


def write_jsonl(path, rows, meta):
    """Append one JSON line per row, each with the run's ``meta`` (see :func:`environment`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps({**row, **meta}) + "\n")
    return path


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
