"""``sparsegp_common.inference.heap``: while Pyro's ``fit`` steps on a CPU, the memory a step frees
stays in the process (no page faults to touch it again in the next step), and it goes back to the
kernel when the steps end."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from sparsegp_common.inference import heap

torch = pytest.importorskip("torch")
glibc = pytest.mark.skipif(heap._libc is None, reason="the C library is not glibc")

MIB = 2**20


# in a fresh process, whose heap has no free holes that the blocks could reuse unseen
FRESH = """
import json, resource, torch
from sparsegp_common.inference import heap

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def blocks():  # 16 MiB each: below glibc's mmap threshold, from the heap; every page touched
    held = [torch.empty(4 * 2**20, dtype=torch.float32).fill_(1.0) for _ in range(16)]
    del held

with heap.kept():
    with heap.kept():
        before = resident()
        blocks()
        held = resident()
    outer = (heap.active(), resident())
print(json.dumps({"before": before, "held": held, "outer": outer, "after": (heap.active(), resident())}))
"""


@glibc
def test_freed_memory_stays_while_kept_and_goes_back_at_the_end():
    """What is freed inside stays resident (the next step reuses it: ``python -m benchmarks heap``
    counts the page faults this saves); the last holder to end gives it back."""
    out = subprocess.run([sys.executable, "-c", FRESH], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["held"] - r["before"] > 240 * MIB  # freed, but kept: glibc would trim 256 MiB at the top at once
    assert r["outer"][0] and r["outer"][1] - r["before"] > 240 * MIB  # the outer holder still keeps it
    assert not r["after"][0] and r["held"] - r["after"][1] > 240 * MIB  # the last one gave it back


# after a kept(), a block over 32 MiB: mapped afresh (and unmapped when freed) unless the
# thresholds of the environment still hold
AFTER = """
import ctypes, ctypes.util, json, resource
from sparsegp_common.inference import heap

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

with heap.kept():
    pass
before = resident()
libc = ctypes.CDLL(ctypes.util.find_library("c"))  # malloc itself: the block ends at the top of the heap, which a trim would give back
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
block = libc.malloc(128 * 2**20)
ctypes.memset(block, 1, 128 * 2**20)
libc.free(block)
print(json.dumps({"before": before, "after": resident()}))
"""


@glibc
@pytest.mark.parametrize("environment", ["MALLOC_", "GLIBC_TUNABLES", None])
def test_thresholds_from_the_environment_stay_in_force(environment, monkeypatch):
    """docs/usage.md has NumPyro users start Python with glibc's thresholds raised; Pyro's
    ``fit`` (and so ``kept``) in the same process must not lower them for what runs after it."""
    mmap, trim = 2**30, 2**34
    for name in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    if environment == "MALLOC_":
        monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(mmap))
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(trim))
    elif environment == "GLIBC_TUNABLES":
        monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.malloc.mmap_threshold={mmap}:glibc.malloc.trim_threshold={hex(trim)}")
    out = subprocess.run([sys.executable, "-c", AFTER], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    kept_after = r["after"] - r["before"] > 120 * MIB
    assert kept_after == (environment is not None)  # without the environment glibc maps and unmaps it


def test_glibc_is_found_where_it_is_the_c_library():
    """Found by its own version function, not by ``heap``'s test: the tests above skip without it."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or None) if sys.platform.startswith("linux") else None
    assert (heap._libc is not None) == hasattr(libc, "gnu_get_libc_version")


def test_holders_in_other_threads_and_disabled_ones():
    opened, release = threading.Event(), threading.Event()

    def hold():
        with heap.kept():
            opened.set()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    opened.wait(10)
    with heap.kept():
        pass
    assert heap.active() == (heap._libc is not None)  # the worker's still holds
    release.set()
    worker.join()
    assert not heap.active()
    with heap.kept(enabled=False):
        assert not heap.active()


def test_pyro_fit_keeps_memory_while_its_cpu_steps_run():
    psg = pytest.importorskip("pyro_sparsegp")
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.normal(size=(20, 1)))
    y = torch.sin(X[:, 0])
    model = psg.GPModel(psg.SVGP(psg.RBF(lengthscale=1.0), X[:4].clone()), psg.Gaussian(variance=1.0), num_data=20)
    seen = []
    psg.fit(model.model, model.guide, (X, y), num_steps=3, progress=False, callbacks=[lambda s: seen.append(heap.active())])
    assert seen == [heap._libc is not None] * 3
    assert not heap.active()
