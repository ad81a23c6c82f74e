import atexit
import os
import shutil
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # One persistent compilation cache for the run (the xdist workers and the tutorials and benchmarks
    # run as subprocesses inherit it): every fit jits a new update function, and identical programs
    # of later tests and processes are read back instead of compiled again. Removed at the end.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="sparsegp-jax-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # eager operations too
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: oversubscribed torch threads spin
    # in the environment too, for the tutorials and benchmarks the tests run as subprocesses
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ModuleNotFoundError:  # the newest-versions tier runs NumPyro alone
        pass

# XLA compiles without most of its optimisations (a third less time to the first step, the same
# arithmetic), here and in the tutorials and benchmarks run as subprocesses; tests about float32
# (by their names) compile as users' programs do (see full_xla_for_float32)
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

from backends import BACKENDS, LEGACY_EMITTERS, legacy_emitters_where_unoptimised, xla_optimisations  # noqa: E402

if legacy_emitters_where_unoptimised():
    # the tutorials and benchmarks run as subprocesses compile everything unoptimised: the same
    # emitters through their environment (this process read XLA_FLAGS in the probe's compilation)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{LEGACY_EMITTERS}=false".strip()


@pytest.fixture(autouse=True)
def full_xla_for_float32(request):
    """float32 round-off is what those tests check: all of XLA's optimisations, as users run."""
    if "float32" not in request.node.nodeid:
        yield
        return
    with xla_optimisations(True):
        yield


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """Each test taking ``backend`` runs once per backend (``pyro`` and ``numpyro``)."""
    b = BACKENDS[request.param]()
    b.reset()
    return b


@pytest.fixture
def rng():
    return np.random.default_rng(0)
