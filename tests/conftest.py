import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: oversubscribed torch threads spin
    # in the environment too, for the tutorials and benchmarks the tests run as subprocesses
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ModuleNotFoundError:  # the newest-versions tier runs NumPyro alone
        pass

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

from backends import BACKENDS  # noqa: E402


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """Each test taking ``backend`` runs once per backend (``pyro`` and ``numpyro``)."""
    b = BACKENDS[request.param]()
    b.reset()
    return b


@pytest.fixture
def rng():
    return np.random.default_rng(0)
