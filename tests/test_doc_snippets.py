"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of a page run in order, one session per backend: a block is NumPyro's when it mentions
``numpyro``, ``nsg``, ``npg`` or ``jnp``, otherwise Pyro's, and it sees what the earlier blocks of
its backend on the page defined. A session starts from :func:`user_data` only: the small arrays
that docs/usage.md says its snippets take as the user's data (``X``, ``y``, ``Z``, ...), as
tensors or JAX arrays; every module is imported by the blocks.

To keep this fast, ``fit`` runs ``MAX_STEPS`` steps (``num_epochs`` included; ``MORE_STEPS`` for
the blocks named there) and ``to_inference_data`` draws at most ``MAX_DRAWS`` (XLA compiles
without most of its optimisations, as in every test: conftest.py); everything else runs as written. Blocks that call a dataset
loader (``load_...``) need the shared data (``$SPARSEGP_DATA``, else ``../shared/data``) and run
in a test of their own, skipped without it (or without their data set). A block that raises fails
the test with its page and line, and the traceback points into the page; ``KNOWN_FAILURES`` lists
the blocks a library bug breaks today, ``CHECKS`` what the tests verify beyond a block's asserts.
"""
import contextlib
import functools
import importlib
import os
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED = pathlib.Path(os.environ.get("SPARSEGP_DATA", ROOT.parent / "shared" / "data"))
NUMPYRO = re.compile(r"\b(numpyro|nsg|npg|jnp)\b")
PACKAGES = {"pyro": "pyro_sparsegp", "numpyro": "numpyro_sparsegp"}
DATA = re.compile(r"\bload_\w+\(")

MAX_STEPS, MAX_DRAWS = 1, 20  # one step: NumPyro's fit compiles its step a second time at step 2
#: Blocks that need more steps, by a text in them: the inducing inputs get a gradient from the
#: second step on (at q = p the ELBO does not depend on them), so a check that frozen ones stay
#: put needs two; an untrained Cox process bounds its intensity so loosely that ``simulate`` draws
#: f jointly at about 20,000 candidate points (minutes).
MORE_STEPS = {"frozen = [": 2, "cox.simulate(": 300}

#: Blocks that raise today because of a library bug: ``(page, text in the block): (error, bug)``.
#: Such a block must raise that error; when it runs, the bug is fixed: remove its entry.
KNOWN_FAILURES = {}


def pyro_hyperprior(ns):
    """The lengthscale is a sample site of the model, and its q is trained."""
    from pyro import poutine

    site = poutine.trace(ns["model"].model).get_trace(ns["X"], ns["y"]).nodes["gp.kernel.lengthscale"]
    assert site["type"] == "sample" and not site["is_observed"]
    assert "AutoNormal.locs.gp.kernel.lengthscale" in ns["result"].params


def numpyro_hyperprior(ns):
    """The sample site replaces the kernel's parameter, and its q is trained."""
    from numpyro import handlers

    trace = handlers.trace(handlers.seed(ns["model_with_prior"], 0)).get_trace(ns["X"], ns["y"])
    assert trace["lengthscale"]["type"] == "sample" and "gp.kernel.lengthscale" not in trace
    assert "lengthscale_auto_loc" in ns["result"].params


#: Checks run on the session after the block containing the text, for what the page says the
#: block does beyond its own asserts.
CHECKS = {"PyroSample(": pyro_hyperprior, "def model_with_prior(": numpyro_hyperprior}


def blocks(page):
    """``[(line, code), ...]``: the ```python blocks of a page (``line``: the first line of code)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, start = [], None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```python":
            start = i + 1
        elif start is not None and line.strip() == "```":
            found.append((start + 1, "\n".join(lines[start:i])))
            start = None
    assert start is None, f"{page.name}: unclosed ```python block at line {start}"
    return found


def backend_of(code):
    return "numpyro" if NUMPYRO.search(code) else "pyro"


def sessions():
    """One test per page, backend and whether the blocks read the shared data."""
    out = []
    for page in PAGES:
        kinds = {(backend_of(code), bool(DATA.search(code))) for _, code in blocks(page)}
        out += [pytest.param(page, backend, data, id=f"{page.relative_to(ROOT)}-{backend}{'-data' if data else ''}")
                for backend, data in sorted(kinds)]
    return out


def user_data(backend):
    """The user's data of the snippets (see the introduction of docs/usage.md), 1,024 rows:
    ``X`` ``(N, 2)``, ``y``, ``labels`` (``y > 0``), ``X_test`` ``(100, 2)``, ``Z = X[:16]``,
    ``D``; counts ``counts`` at ``x = X[:, :1]`` in groups ``g`` below ``num_groups``."""
    rng = np.random.default_rng(0)
    N, D, M, num_groups = 1024, 2, 16, 6
    X = rng.uniform(-3, 3, (N, D))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=N)
    g = rng.integers(0, num_groups, N)
    counts = rng.poisson(np.exp(0.3 + np.sin(2 * X[:, 0]) + np.linspace(-0.8, 0.8, num_groups)[g]))
    arrays = dict(X=X, y=y, X_test=rng.uniform(-3, 3, (100, D)), Z=X[:M], x=X[:, :1], labels=(y > 0) * 1.0,
                  g=g, counts=counts * 1.0)
    if backend == "pyro":
        import torch

        def convert(a):  # torch's default dtype, as a user's tensors
            return torch.as_tensor(a, dtype=torch.int64 if a.dtype.kind == "i" else torch.get_default_dtype())
    else:
        import jax.numpy as jnp

        convert = jnp.asarray
    return {"D": D, "num_groups": num_groups, **{k: convert(v) for k, v in arrays.items()}}


def capped(fit, limit):
    """``fit`` running at most ``limit()`` steps."""
    @functools.wraps(fit)
    def wrapper(*args, **kwargs):
        kwargs.pop("num_epochs", None)
        kwargs["num_steps"] = min(kwargs.get("num_steps") or limit(), limit())
        kwargs.setdefault("progress", False)
        return fit(*args, **kwargs)
    return wrapper


def few_draws(export):
    @functools.wraps(export)
    def wrapper(*args, **kwargs):
        kwargs["num_samples"] = min(kwargs.get("num_samples", 1000), MAX_DRAWS)
        return export(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def torch_threads(n):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture
def shrunk(monkeypatch):
    """``fit`` and ``to_inference_data`` of both backends, shortened (see the module docstring);
    ``shrunk["steps"]`` is the number of steps."""
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module("matplotlib").use("Agg")  # az.plot_ppc
    limits = {"steps": MAX_STEPS}
    for name in PACKAGES.values():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:  # the newest-versions tier has no torch
            continue
        monkeypatch.setattr(module, "fit", capped(module.fit, lambda: limits["steps"]))
        monkeypatch.setattr(module, "to_inference_data", few_draws(module.to_inference_data))
    yield limits
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module("matplotlib.pyplot").close("all")


@pytest.mark.parametrize("page, backend, data", sessions())
def test_python_blocks_run(page, backend, data, shrunk, monkeypatch):
    pytest.importorskip(PACKAGES[backend])
    if data:
        if not SHARED.is_dir():
            pytest.skip(f"{SHARED} is absent")
        monkeypatch.setenv("SPARSEGP_DATA", str(SHARED))
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
        pyro.set_rng_seed(0)
    namespace = {"__name__": "__doc__", **user_data(backend)}
    # small torch ops wait on a second thread that a busy machine deschedules (as conftest sets for
    # xdist workers)
    with torch_threads(1) if backend == "pyro" else contextlib.nullcontext():
        for line, code in blocks(page):
            if backend_of(code) != backend or bool(DATA.search(code)) != data:
                continue
            where = f"{page.relative_to(ROOT).as_posix()}:{line}"
            known = [v for (name, text), v in KNOWN_FAILURES.items() if where.startswith(name + ":") and text in code]
            shrunk["steps"] = max([MAX_STEPS] + [n for text, n in MORE_STEPS.items() if text in code])
            program = compile("\n" * (line - 1) + code, str(page), "exec")  # tracebacks point into the page
            try:
                exec(program, namespace)
            except Exception as error:
                if known and isinstance(error, known[0][0]):
                    continue
                if data and isinstance(error, FileNotFoundError):
                    pytest.skip(f"{where}: {error}")  # a data set missing from the shared data
                raise AssertionError(f"{where}: the block raised {type(error).__name__}: {error}") from error
            assert not known, f"{where}: runs now, so {known[0][1]!r} is fixed: remove it from KNOWN_FAILURES"
            for text, check in CHECKS.items():
                if text in code:
                    try:
                        check(namespace)
                    except AssertionError as error:
                        raise AssertionError(f"{where}: not so: {check.__doc__}") from error


def test_every_fence_names_its_language():
    """Python outside a ```python fence would escape the test above; shell commands and output
    are fenced with their own language."""
    for page in PAGES:
        inside = False
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                if not inside:
                    where = f"{page.relative_to(ROOT)}:{i}"
                    assert line != "```", f"{where}: a fence without a language"
                    assert line.split()[0] not in ("```py", "```python3", "```pycon", "```ipython"), f"{where}: write ```python"
                inside = not inside
