"""The C heap while ``fit``'s steps run on a CPU, on Linux with glibc (elsewhere nothing changes).

torch takes a CPU tensor's memory from ``malloc``. glibc gives memory back to the kernel as soon as
more than its trim threshold is free at the top of the heap; a step frees its intermediates at its
end, so the next step touches the same memory anew, and every page of it costs a page fault and
zeroing by the kernel. An SVGP step at M = 2048 (kin40k, batch 1024, float32, 2 threads)
faulted 34,000-47,000 times and took 0.79-0.83 s, and with the memory kept faulted 1,600-3,700
times and took 0.70-0.76 s, at a peak of resident memory 8-12 % higher; HVGP 8 x 512 faulted
20,000-90,000 times (0.66-0.84 s) against at most 3,300 (0.61-0.65 s in four runs of five), at
the same median peak (2.5 GB) (``benchmarks/RESULTS.md``, "heap: the page faults of large CPU
steps").

:func:`kept` keeps freed memory in the process while the steps run (``M_TRIM_THRESHOLD``
unbounded) and serves blocks up to 32 MiB from the heap (``M_MMAP_THRESHOLD``: the value glibc's
own adjustment reaches once such a block has been freed). Larger blocks still come from fresh
``mmap`` regions: serving them from the heap too (``M_MMAP_MAX = 0``) took
the SVGP step at M = 4096 from 4.9 to 3.5 s but tripled its peak resident memory (1.5 to 4.5 GB,
the heap fragmented by the 64 MiB blocks). When the last :func:`kept` ends, ``malloc_trim`` gives
back what is free (after a ``fit`` of HVGP 8 x 512, 370-390 MB stayed resident against
1.9-2.2 GB without it) and the trim threshold becomes 64 MiB, as glibc's adjustment sets it beside that
``mmap`` threshold (setting either ends glibc's adjustment). NumPyro's steps are not helped by
it: XLA:CPU takes one block for all of a step's temporaries in its own thread, whose glibc arena
maps any block over 64 MiB afresh whatever this module sets (a quadruply stochastic step at the
paper's sizes: 223 MB, 54,000 page faults and 0.14-0.16 s per step against 0.08-0.10 s with the
environment docs/usage.md gives under "Training", which puts every thread on glibc's main heap).
"""
import contextlib
import ctypes
import ctypes.util
import os
import platform
import threading

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # the most glibc's own adjustment sets
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc's own adjustment sets it beside the above
UNBOUNDED = 2**31 - 1  # mallopt takes an int

_lock = threading.Lock()
_holders = 0


def _glibc():
    """The C library when it is glibc with ``mallopt`` and ``malloc_trim``, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_libc = _glibc()


def _started_with(name):
    """The threshold ``name`` (``"mmap_threshold"``, ``"trim_threshold"``) that this process was
    started with (``GLIBC_TUNABLES``' ``glibc.malloc.<name>``, else ``MALLOC_<NAME>_``), in bytes
    and at most what ``mallopt`` takes; None when the environment does not set it."""
    tunables = dict(item.partition("=")[::2] for item in os.environ.get("GLIBC_TUNABLES", "").split(":") if "=" in item)
    value = tunables.get(f"glibc.malloc.{name}", os.environ.get(f"MALLOC_{name.upper()}_"))
    try:
        return None if value is None else min(int(value, 0), UNBOUNDED)
    except ValueError:
        return None


# what the user's environment asks for (docs/usage.md): kept() never leaves glibc below it
_USER_MMAP, _USER_TRIM = _started_with("mmap_threshold"), _started_with("trim_threshold")


def active():
    """Whether freed memory is being kept (a :func:`kept` is open)."""
    return _holders > 0


@contextlib.contextmanager
def kept(enabled=True):
    """A context manager that keeps the memory freed inside it in the process, for the steps of a
    training loop on a CPU (see the module's docstring). Nests, also across threads: the last one
    to end gives the free memory back. ``enabled=False``, or a C library other than glibc: nothing
    changes. Wrap your own ``pyro.infer.SVI`` loop in it where its steps are large (hundreds of
    milliseconds); Pyro's ``fit`` on a CPU does it for its steps. Thresholds the process was
    started with (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``)
    stay in force: the mmap threshold is never lowered below the environment's, and with a trim
    threshold there the memory is not given back at the end either."""
    global _holders
    if not enabled or _libc is None:
        yield
        return
    with _lock:
        _holders += 1
        if _holders == 1:
            _libc.mallopt(M_MMAP_THRESHOLD, max(MMAP_THRESHOLD, _USER_MMAP or 0))
            _libc.mallopt(M_TRIM_THRESHOLD, UNBOUNDED)
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _USER_TRIM is None:
                    _libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                    _libc.malloc_trim(0)
                else:  # the user's environment keeps freed memory: so do we
                    _libc.mallopt(M_TRIM_THRESHOLD, _USER_TRIM)
