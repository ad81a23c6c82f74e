"""Suite ``gpu``: every method's training step in both backends on the accelerator, beside GPyTorch
at the same sizes and the floor, in one run; and the largest SVGP ``M`` and exact-DBK ``n`` that fit.

``python -m benchmarks gpu --device cuda [--quick]`` on an NVIDIA GPU; without one the suite says
so and measures on the CPU (``--device cpu``, smaller sizes).

* ``steps``: seconds per training step (float32, kin40k split 0 standardised, batch 1024, SE-ARD,
  whitened full-covariance ``q(u)``; :mod:`benchmarks.runners`) of each method through the
  product's ``fit`` in both backends, grouped with the comparisons that give it meaning, each group
  timed in alternating blocks (:func:`~benchmarks.harness.time_steps`, medians): SVGP at each
  ``M`` (``fit``, the plain ``SVI`` path of a user's model at the smaller ``M``, GPyTorch's SVGP
  and the floor of :class:`benchmarks.steps.Floor`); decoupled bases (``M_alpha``, ``M_beta``)
  against GPyTorch's SVGP-1024; HVGP ``T x m`` against SVGP-``m``; Hermite orthogonal features;
  QSGP (quadruply stochastic loss); exact DBK (``fit``'s full-batch step on the 1-D step data,
  r = 128, float64 as ``docs/usage.md`` advises, in a child process with JAX's x64 mode) against
  GPyTorch's exact GP. ``first step`` is the seconds from building the runner to the end of its
  first step (compilation included).
* ``memory``: the largest SVGP ``M`` (one ``fit`` step, batch 1024) and exact-DBK ``n`` (one
  full-batch step) that ran, doubling until the device ran out of memory (or the size cap was
  reached), each backend in a fresh child process with the whole device to itself.
* ``startup``: NumPyro's time to its first step through ``fit`` (SVGP-1024 on a GPU), each in a
  fresh process: as it is, without XLA's GPU autotuning, with cuBLAS instead of Triton for the
  products, and with JAX's persistent compilation cache (a first process filling it, a second
  reading it), beside the step time each setting gives.
* ``graphs`` (only when asked for): Pyro's captured ``fit`` step launched as one CUDA graph and
  replayed operation by operation (:mod:`pyro_sparsegp.captured`), for the SVGP at the smallest
  ``M``, the decoupled bases and HVGP, each in its own group beside GPyTorch's SVGP (the two
  runners' parameters would share names in one group).

Every row names the device. A case that fails (say a size that does not fit) is a row with its
error, so one failure does not lose the rest of a short GPU lease.
"""
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

from . import decoupled, harmonic, harness, runners
from .steps import Floor

DATASET = "kin40k"
PARTS = ("steps", "memory", "startup", "graphs")
DEFAULT_PARTS = PARTS[:3]  # graphs: only asked for (on a CPU it measures the same step twice)
DBK_RANK = 128


def settings(quick):
    """Sizes per group (``svi``: the SVGP sizes that also time the plain SVI path) and timing."""
    timing = {"batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    if harness.tiny():
        return {"svgp": (64,), "svi": (64,), "decoupled": ((128, 16), 64), "hvgp": 16, "vof": 64, "qsgp": 1000,
                "dbk": (2000, 1000), "memory": {"svgp": (128, 128), "dbk": (2000, 2000)},
                **timing, "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 1, "memory_seconds": 120,
                "startup_M": 16, "startup_variants": ("default", "compilation cache, first process",
                                                      "compilation cache, second process")}
    if harness.DEVICE == "cpu":  # what 2 CPU threads measure in minutes
        return {"svgp": (256,) if quick else (256, 1024), "svi": (256, 1024), "decoupled": ((2048, 128), 256),
                "hvgp": 128, "vof": 256, "qsgp": 10_000, "dbk": (10_000, 10_000),
                "memory": {"svgp": (1024,) * 2 if quick else (1024, 2048), "dbk": (10_000, 100_000)},
                "memory_seconds": 300, "startup_M": 256, "startup_variants": tuple(STARTUP_VARIANTS), **timing}
    return {"svgp": (1024,) if quick else (1024, 4096, 8192), "svi": (1024,), "decoupled": ((16384, 128), 1024),
            "hvgp": 1024, "vof": 1024, "qsgp": 100_000, "dbk": (1_000_000, 10_000),
            "memory": {"svgp": (8192, 2**17 if quick else 2**18), "dbk": (2**22, 2**30)}, "memory_seconds": 40,
            "startup_M": 1024, "startup_variants": tuple(STARTUP_VARIANTS),
            **timing, "repeats": 5, "block_seconds": 0.4}


COLUMNS = [
    ("group", "group", "{}"), ("implementation", "implementation", "{}"), ("size", "size", "{}"),
    ("seconds per step", "seconds", "{:.5f}"), ("GPyTorch / this", "vs_gpytorch", "{:.2f}"),
    ("this / floor", "vs_floor", "{:.2f}"), ("first step", "first_step", "{:.1f} s"), ("error", "error", "{}"),
]
STARTUP_COLUMNS = [
    ("variant", "variant", "{}"), ("import and load", "load", "{:.1f} s"), ("build to first step", "first_step", "{:.1f} s"),
    ("seconds per step after", "seconds", "{:.5f}"), ("why", "why", "{}"),
]
MEMORY_COLUMNS = [
    ("model", "model", "{}"), ("backend", "backend", "{}"), ("largest that ran", "largest", "{}"),
    ("its step", "seconds", "{:.3f} s"), ("first that did not", "failed", "{}"), ("why", "why", "{}"),
]


def title(rows):
    row = rows[0]
    return f"gpu: median seconds per training step, float32, {row['device']}, medians of {row['repeats']} blocks"


def tables(rows):
    steps = [r for r in rows if r["part"] == "steps"]
    memory = [r for r in rows if r["part"] == "memory"]
    startup = [r for r in rows if r["part"] == "startup"]
    out = [(title(steps), COLUMNS, steps)] if steps else []
    if memory:
        out.append((f"gpu memory: the largest size one step ran at, {memory[0]['device']}", MEMORY_COLUMNS, memory))
    if startup:
        out.append((f"gpu startup: NumPyro's SVGP-{startup[0]['M']} through fit, each in a fresh process, "
                    f"{startup[0]['device']}", STARTUP_COLUMNS, startup))
    return out


def run(quick, parts=DEFAULT_PARTS):
    if harness.DEVICE == "cpu" and not harness.tiny():
        print("gpu: no GPU asked for (--device cuda); measuring on the CPU at CPU sizes", flush=True)
    opts = settings(quick)
    rows = []
    if "steps" in parts:
        rows += step_rows(opts)
    if "memory" in parts:
        rows += memory_rows(opts)
    if "startup" in parts:
        rows += startup_rows(opts)
    if "graphs" in parts:
        rows += graph_rows(opts)
    return rows


# -- steps ---------------------------------------------------------------------------------------


def _svgp(key, M):
    return f"SVGP-{M}", lambda X, y, batch: runners.RUNNERS[key](X, y, harness.inducing_inputs(X, M), batch, 0.01)


def _method(cls, size, Z_rows):
    return size, lambda X, y, batch: cls(X, y, harness.inducing_inputs(X, Z_rows), batch, 0.01)


def groups(opts):
    """``[(group name, {implementation: (size, factory(X, y, batch) -> runner)})]`` on kin40k."""
    out = []
    for M in opts["svgp"]:
        keys = ("ours_pyro", "ours_pyro_svi", "ours_numpyro", "ours_numpyro_svi", "gpytorch")
        cases = {runners.RUNNERS[key].name: _svgp(key, M) for key in keys if M in opts["svi"] or "svi" not in key}
        cases["floor"] = (f"M = {M}", lambda X, y, batch, M=M: _Floor(X, harness.inducing_inputs(X, M), batch))
        out.append(("SVGP", cases))
    (M_alpha, M_beta), M_ref = opts["decoupled"]
    cases = {cls.name: _method(decoupled.with_beta(cls, M_beta), f"({M_alpha}, {M_beta})", M_alpha)
             for cls in (decoupled.DecoupledPyro, decoupled.DecoupledNumPyro)}
    cases["GPyTorch"] = _svgp("gpytorch", M_ref)
    out.append(("decoupled", cases))
    m = opts["hvgp"]
    T = 2**harmonic.NUM_WAYS
    cases = {cls.name: _method(cls, f"{T} x {m}", m) for cls in (harmonic.HarmonicPyro, harmonic.HarmonicNumPyro)}
    cases.update({runners.RUNNERS[key].name: _svgp(key, m) for key in ("ours_pyro", "ours_numpyro", "gpytorch")})
    out.append(("HVGP", cases))
    M = opts["vof"]
    cases = {f"Hermite ({backend})": (f"M = {M}", lambda X, y, batch, backend=backend: _Hermite(backend, X, y, M, batch))
             for backend in ("Pyro", "NumPyro")}
    cases["GPyTorch"] = _svgp("gpytorch", M)
    out.append(("orthogonal features", cases))
    m = opts["qsgp"]
    out.append(("QSGP", {f"QSGP ({backend})": (f"m = {m}", lambda X, y, batch, backend=backend: _QSGP(backend, X, y, m, batch))
                         for backend in ("Pyro", "NumPyro")}))
    return out


def graph_groups(opts):
    """``[(group name, cases)]`` as :func:`groups`: each Pyro model once with its CUDA graph and once
    without."""
    M = opts["svgp"][0]
    (M_alpha, M_beta), M_ref = opts["decoupled"]
    m, T = opts["hvgp"], 2**harmonic.NUM_WAYS
    models = [("SVGP", "ours (Pyro)", _svgp("ours_pyro", M), M),
              ("decoupled", decoupled.DecoupledPyro.name,
               _method(decoupled.with_beta(decoupled.DecoupledPyro, M_beta), f"({M_alpha}, {M_beta})", M_alpha), M_ref),
              ("HVGP", harmonic.HarmonicPyro.name, _method(harmonic.HarmonicPyro, f"{T} x {m}", m), m)]
    out = []
    for group, label, (size, factory), M_gpytorch in models:
        for how, make in (("one CUDA graph", factory), ("operation by operation", _operation_by_operation(factory))):
            cases = {label: (size, make), "GPyTorch": _svgp("gpytorch", M_gpytorch)}
            if group == "SVGP":
                cases["floor"] = (f"M = {M}", lambda X, y, batch: _Floor(X, harness.inducing_inputs(X, M), batch))
            out.append((f"{group}, {how}", cases))
    return out


def _operation_by_operation(factory):
    """``factory``'s runner with its first step (where ``fit`` records its step) taken with the
    CUDA graph switched off: its replays run operation by operation."""
    def build(X, y, batch):
        from pyro_sparsegp import captured

        on_cuda = captured.CapturedStep._on_cuda
        captured.CapturedStep._on_cuda = lambda self, replay, tensors: replay
        try:
            runner = factory(X, y, batch)
            runner.step()
        finally:
            captured.CapturedStep._on_cuda = on_cuda
        return runner

    return build


def dbk_group(opts):
    n, n_ref = opts["dbk"]
    cases = {f"exact DBK ({backend})": (f"n = {n}", lambda backend=backend: _ExactDBK(backend, n))
             for backend in ("Pyro", "NumPyro")}
    cases["GPyTorch exact GP"] = (f"n = {n_ref}", lambda: _GPyTorchExact(n_ref))
    return "exact DBK", cases


def step_rows(opts):
    rows = _time_groups(groups(opts), opts)
    rows += _child(["dbk-steps", json.dumps(opts)], timeout=None, x64=True)  # float64: JAX's x64 mode
    return rows


def graph_rows(opts):
    return _time_groups(graph_groups(opts), opts)


def _time_groups(named, opts):
    """:func:`_time_group` for each ``(name, cases)`` of :func:`groups`' kind, on kin40k."""
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    rows = []
    for name, cases in named:
        rows += _time_group(name, {k: (size, lambda f=f: f(X, y, opts["batch"])) for k, (size, f) in cases.items()}, opts)
    return rows


def dbk_rows(opts):
    name, cases = dbk_group(opts)
    return _time_group(name, cases, opts, dtype="float64")


def _time_group(name, cases, opts, dtype="float32"):
    """Build each case, time its first step, then time the group's steps side by side."""
    import pyro

    pyro.clear_param_store()  # once per group, before its Pyro runners (see runners.build)
    built, rows = {}, {}
    for label, (size, factory) in cases.items():
        row = {"suite": "gpu", "part": "steps", "group": name, "implementation": label, "size": size,
               "device": harness.device_name(), "dtype": dtype, "repeats": opts["repeats"],
               "threads": harness.threads(), "batch": opts["batch"]}
        start = time.perf_counter()
        try:
            runner = factory()
            harness.block(runner.step())
            harness.synchronize()
            row["first_step"] = time.perf_counter() - start
            built[label] = runner
        except Exception as error:  # noqa: BLE001 - a row says what failed; the lease goes on
            row["error"] = _short(error)
        rows[label] = row
        _release()
    try:
        blocks = harness.time_steps({k: _synchronized(r.step) for k, r in built.items()}, opts["repeats"],
                                    opts["block_seconds"], max(opts["warmup"] - 1, 1))
    except Exception as error:  # noqa: BLE001
        blocks = {}
        for label in built:
            rows[label]["error"] = _short(error)
    runners.close(built)
    seconds = {k: harness.median(v) for k, v in blocks.items()}
    reference = next((seconds[k] for k in seconds if k.startswith("GPyTorch")), None)
    for label, value in seconds.items():
        rows[label].update(seconds=value, blocks=blocks[label])
        if reference is not None and label != "floor" and not label.startswith("GPyTorch"):
            rows[label]["vs_gpytorch"] = reference / value
        if "floor" in seconds and label != "floor":
            rows[label]["vs_floor"] = value / seconds["floor"]
    for row in rows.values():
        print(json.dumps(row), flush=True)  # progress on a short lease (and the rows of a child process)
    built.clear()
    _release()
    return list(rows.values())


def _synchronized(step):
    def run():
        loss = step()
        harness.synchronize()
        return loss

    return run


class _Floor(runners.Runner):
    """:class:`benchmarks.steps.Floor` on the suite's device."""

    def __init__(self, X, Z, batch):
        self._floor = Floor(X, Z, batch, device=harness.DEVICE)

    def step(self):
        return self._floor.step()


class _FitRunner(runners.Runner):
    """A runner whose steps are those of ``self.fit`` (a :class:`~benchmarks.harness.FitSteps`)."""

    def step(self):
        return self.fit.step()

    def close(self):
        self.fit.close()


class _Hermite(_FitRunner):
    """An SVGP on Hermite orthogonal features (``Kuu = I``, diagonal ``S``) trained by ``fit``."""

    def __init__(self, backend, X, y, M, batch):
        lib, array = _lib(backend)
        D = X.shape[1]
        kernel = lib.RBF(lengthscale=array(np.full(D, runners.LENGTHSCALE)), variance=runners.VARIANCE)
        features = lib.vof.HermiteFeatures(M, array(np.ones(D)), kernel=kernel)
        model = lib.GPModel(lib.SVGP(kernel, features, diagonal=True, name="hermite"),
                            lib.Gaussian(variance=runners.NOISE, name="hermite_likelihood"), num_data=len(X))
        self.fit = harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch, lr=0.01)


class _QSGP(_FitRunner):
    """A QSGP (random Fourier features, ``num_dense`` 10) with the quadruply stochastic loss."""

    def __init__(self, backend, X, y, m, batch):
        from . import qsgp

        self.fit, _ = qsgp.qsgp_fit(backend.lower(), X, y, m, qsgp.NUM_DENSE, 1000, 500, batch)


class _ExactDBK(_FitRunner):
    """Exact DBK (a 2 x 128 tanh MLP, r = 128) on ``n`` points of the 1-D step data, full batch,
    through ``fit`` (its model's low-rank Gaussian likelihood and trace term), in float64 as
    ``docs/usage.md`` advises for exact inference (NumPyro: in a process with ``JAX_ENABLE_X64``).
    In float32 the model's r x r capacitance ``I + Phi^T Phi / sigma^2`` fails to factorise from
    n of about 1e5."""

    def __init__(self, backend, n, name="dbk"):
        from sparsegp_common.data.step import step_data

        if backend == "Pyro":
            import torch

            import pyro_sparsegp as lib
            import pyro_sparsegp.dbk  # noqa: F401

            X, y = (harness.tensor(a, dtype=torch.float64) for a in step_data(n, seed=0))
            net = lib.dbk.MLP(1, rank=DBK_RANK, dtype=torch.float64, seed=0).to(harness.DEVICE)
        else:
            import jax.numpy as jnp

            import numpyro_sparsegp as lib
            import numpyro_sparsegp.dbk  # noqa: F401

            X, y = (jnp.asarray(a, dtype=jnp.float64) for a in step_data(n, seed=0))
            net = lib.dbk.MLP(1, rank=DBK_RANK, dtype=jnp.float64, seed=0)
        dbk = lib.dbk.ExactDBK(net, name=name)
        self.fit = harness.FitSteps(lib.fit, dbk.model, dbk.guide, (X, y), lr=0.001)


class _GPyTorchExact(runners.Runner):
    """GPyTorch's exact GP (RBF, ``ExactMarginalLogLikelihood``) on the same data, in float64 as the
    exact DBK: loss and gradient."""

    def __init__(self, n):
        from sparsegp_common.data.step import step_data

        from .dbk import _gpytorch_step

        self._step = _gpytorch_step(*step_data(n, seed=0), device=harness.DEVICE, dtype="float64")

    def step(self):
        return float(self._step().detach())


def _lib(backend):
    """The package of ``backend`` ("Pyro" or "NumPyro") and its float32 array maker on the device."""
    if backend == "Pyro":
        import pyro_sparsegp as lib
        import pyro_sparsegp.vof  # noqa: F401 - used as lib.vof

        return lib, harness.tensor
    import jax.numpy as jnp

    import numpyro_sparsegp as lib
    import numpyro_sparsegp.vof  # noqa: F401

    return lib, lambda a: jnp.asarray(np.asarray(a), dtype=jnp.float32)


def _short(error):
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text[:160]


def _release():
    gc.collect()
    if harness.DEVICE != "cpu":
        import torch

        torch.cuda.empty_cache()


# -- memory --------------------------------------------------------------------------------------


def memory_rows(opts):
    """Per (model, backend), in a fresh child process given at most ``memory_seconds``: the
    doubling sizes until one fails."""
    rows = []
    for model, (start, cap) in opts["memory"].items():
        for backend in ("Pyro", "NumPyro"):
            row = {"suite": "gpu", "part": "memory", "model": "SVGP (M)" if model == "svgp" else "exact DBK (n)",
                   "backend": backend, "device": harness.device_name(), "threads": harness.threads(), "cap": cap}
            lines = _child(["memory", model, backend, str(start), str(cap)], opts["memory_seconds"], row,
                           x64=model == "dbk")
            row.update(lines[-1] if lines else {})
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _child(args, timeout, failure=None, x64=False, xla_flags=""):
    """``python -m benchmarks.gpu *args`` in a fresh process with the whole device (JAX allocating
    as it goes; with ``x64``, JAX's 64-bit mode for the float64 exact DBK; ``xla_flags`` added to
    ``XLA_FLAGS``): the JSON lines it printed. A failure or a timeout is noted in
    ``failure["why"]`` (raised when ``failure`` is None)."""
    command = [sys.executable, "-m", "benchmarks.gpu", *args, harness.DEVICE, str(harness.threads())]
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip(),
           **({"JAX_ENABLE_X64": "1"} if x64 else {})}
    try:
        done = subprocess.run(command, cwd=harness.REPO, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, why = done.stdout, done.returncode and (done.stderr.strip().splitlines() or ["failed"])[-1]
    except subprocess.TimeoutExpired as stopped:
        stdout, why = stopped.stdout or "", f"stopped after {timeout} s"
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    if why and failure is None:
        raise RuntimeError(f"python -m benchmarks.gpu {' '.join(args[:1])} failed: {why}")
    if why:
        failure["why"] = why[:160]
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


# -- startup --------------------------------------------------------------------------------------

# NumPyro's first step under XLA settings a user can choose: (XLA flags, compilation cache)
STARTUP_VARIANTS = {
    "default": ("", False),
    "no autotuning (--xla_gpu_autotune_level=0)": ("--xla_gpu_autotune_level=0", False),
    "cuBLAS products (--xla_gpu_enable_triton_gemm=false)": ("--xla_gpu_enable_triton_gemm=false", False),
    "compilation cache, first process": ("", True),
    "compilation cache, second process": ("", True),
}


def startup_rows(opts):
    """NumPyro's SVGP-``startup_M`` through ``fit``, each variant of :data:`STARTUP_VARIANTS` in a
    fresh process: seconds to import and load, from building the runner to the end of its first
    step, and per step after (the settings may cost speed)."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for name in opts["startup_variants"]:  # the GPU flags do nothing on a CPU: the tiny run leaves them out
            flags, cached = STARTUP_VARIANTS[name]
            row = {"suite": "gpu", "part": "startup", "variant": name, "M": opts["startup_M"],
                   "device": harness.device_name(), "threads": harness.threads(), "dtype": "float32"}
            lines = _child(["first-step", str(opts["startup_M"]), cache if cached else "-"], opts["memory_seconds"],
                           row, xla_flags=flags)
            row.update(lines[-1] if lines else {})
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _first_step(M, cache):
    """In a fresh process: seconds to import JAX and load the data, to the end of the first step
    of NumPyro's SVGP-``M`` through ``fit`` from building it, and the median step after."""
    start = time.perf_counter()
    import jax

    if cache != "-":
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    Z = harness.inducing_inputs(X, M)
    loaded = time.perf_counter()
    runner = runners.OursNumPyro(X, y, Z, 1024, 0.01)
    runner.step()
    first = time.perf_counter()
    blocks = harness.time_steps({"step": runner.step}, 3, 0.2, warmup=1)["step"]
    runner.close()
    print(json.dumps({"load": loaded - start, "first_step": first - loaded, "seconds": harness.median(blocks)}))


def _probe(model, backend, start, cap):
    """Double the size from ``start`` until a step fails or ``cap`` is passed (in this process),
    printing the result so far as a JSON line after each size."""
    import pyro

    problem = harness.regression_problem(DATASET) if model == "svgp" else None
    result, size = {"largest": None}, start
    while size <= cap:
        runner = None
        pyro.clear_param_store()
        try:
            if model == "svgp":
                X, y = problem["X_train"], problem["y_train"]
                if size > len(X):  # more inducing inputs than rows: jittered copies of the rows
                    reps = -(-size // len(X))
                    X = np.concatenate([X + 1e-3 * i for i in range(reps)])[:size]
                    y = np.tile(y, reps)[:size]
                key = "ours_pyro" if backend == "Pyro" else "ours_numpyro"
                runner = runners.RUNNERS[key](X, y, harness.inducing_inputs(X, size), 1024, 0.01)
            else:
                runner = _ExactDBK(backend, size)
            runner.step()  # creates the parameters and compiles
            start_time = time.perf_counter()
            harness.block(runner.step())
            harness.synchronize()
            result.update(largest=size, seconds=time.perf_counter() - start_time)
        except Exception as error:  # noqa: BLE001 - the first size that does not run ends the probe
            result.update(failed=size, why=_short(error))
        finally:
            if runner is not None:
                runner.close()
            runner = None
            _release()
        print(json.dumps(result), flush=True)
        if "failed" in result:
            return result
        size *= 2
    result["why"] = f"size cap {cap} reached"
    print(json.dumps(result), flush=True)
    return result


def main(argv=None):
    """``python -m benchmarks.gpu memory MODEL BACKEND START CAP DEVICE THREADS``: one memory probe
    (:func:`_probe`), its result so far as the last line of JSON; ``python -m benchmarks.gpu
    dbk-steps OPTS DEVICE THREADS``: the exact-DBK group's rows (:func:`dbk_rows`), a JSON line each;
    ``python -m benchmarks.gpu first-step M CACHE DEVICE THREADS``: :func:`_first_step` (CACHE a
    directory, or ``-`` for none)."""
    argv = sys.argv[1:] if argv is None else argv
    *args, device, threads = argv
    harness.pin_threads(int(threads))
    harness.use_device(device)
    if args[0] == "memory":
        _, model, backend, start, cap = args
        _probe(model, backend, int(start), int(cap))
    elif args[0] == "first-step":
        _first_step(int(args[1]), args[2])
    else:
        dbk_rows(json.loads(args[1]))


if __name__ == "__main__":
    main()
