"""``sparsegp_common.inference.heap``: while Pyro's ``fit`` steps on a CPU, the memory a step frees
stays in the process (no page faults to touch it again in the next step), and it goes back to the
kernel when the steps end."""
import resource
import threading

import numpy as np
import pytest

from sparsegp_common.inference import heap

torch = pytest.importorskip("torch")
glibc = pytest.mark.skipif(heap._libc is None, reason="the C library is not glibc")

MIB = 2**20


def blocks(count=16, size=16 * MIB):
    """Allocate ``count`` tensors of ``size`` bytes (below glibc's mmap threshold: from the heap),
    touch every page, free them all; the minor page faults this took."""
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.empty(size // 4, dtype=torch.float32).fill_(1.0) for _ in range(count)]
    del held
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start


def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@glibc
def test_freed_memory_stays_for_the_next_step_and_goes_back_at_the_end():
    pages = 16 * 16 * MIB / resource.getpagesize()
    with heap.kept():
        with heap.kept():
            before = resident()
            blocks()
            held = resident()
            assert held - before > 200 * MIB  # freed, not given back (glibc would trim 256 MiB at once)
            assert blocks() < 0.25 * pages  # the next "step" touches it again, nearly all without faults
        assert heap.active() and resident() - before > 200 * MIB  # the outer one still holds it
    assert not heap.active()
    assert held - resident() > 200 * MIB


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
