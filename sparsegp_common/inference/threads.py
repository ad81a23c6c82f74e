"""The BLAS threads of ``fit``'s steps on CPU, chosen by timing the first steps (NumPyro's
``fit`` holds it; torch's CPU linear algebra has no OpenBLAS team of its own to compete with).

JAX's CPU programs run their factorisations and triangular solves through the BLAS/LAPACK library
SciPy ships (OpenBLAS), whose worker threads compete for the cores with XLA's own threads, which
run the rest of the program concurrently: on two cores a whitened SVGP step at M = 256, batch 1024
took 15 ms with OpenBLAS's default threads and 10 ms with one (``benchmarks/RESULTS.md``, "steps:
one BLAS thread"), while at M = 4096, where one solve is most of the step, one thread took 25 %
longer. So ``fit`` times a few steps each way and keeps the faster setting until it returns; the
library's own setting is restored then (also when a ``fit.steps`` generator is closed early).
"""
import statistics
import time

TRIALS = 3  # steps timed per setting
SETTLE = 0.25  # seconds of steps untimed after a change: idle OpenBLAS threads spin for about 0.1 s
GAP = 0.05  # seconds between steps after which they settle again (other work ran in between)
LONG = 1.0  # seconds of a step timed whatever ran before it (a spin of 0.1 s is lost in it)
GIVE_UP = 200  # steps after which the threads go back as they were if the timing is not done


class BlasThreads:
    """A context manager around ``fit``'s steps: after the compiling step, :meth:`run` times
    ``TRIALS`` steps with the BLAS library limited to one thread, then ``TRIALS`` with its threads
    as they were, and keeps whichever gave the smaller median step time. Only steps run back to
    back count, ``SETTLE`` seconds after the setting changed or other work ran between steps
    (other libraries' threads, also spinning, would slow the first ones), unless a step takes
    ``LONG`` seconds or more; with fewer than that by step ``GIVE_UP``, the threads stay as they were.

    Args:
        enabled: whether to choose (the steps run on a CPU); otherwise nothing changes.
        wait: ``wait(out)`` returns ``out`` once its computation is done (``jax.block_until_ready``).
        controller: a ``threadpoolctl.ThreadpoolController`` (None: a new one, made when the timing
            starts, after JAX has loaded its BLAS).
    """

    def __init__(self, enabled, wait, controller=None):
        self.enabled, self.wait, self.controller = enabled, wait, controller
        self.calls, self.times, self.limiter, self.choice = 0, ([], []), None, None
        self.since = self.last = None  # when the steps started running back to back; the last one ended

    def run(self, step):
        """``step()``'s result, waited for while the choice is open; ``choice`` is then 1 (one
        thread) or 0 (as they were)."""
        self.calls += 1
        if not self.enabled or self.choice is not None or self.calls == 1:
            return step()
        if self.since is None:
            if not self._limit():  # no BLAS found, or one thread already
                self.choice = 0
                return step()
            self.since = time.perf_counter()
        start = time.perf_counter()
        if self.last is not None and start - self.last > GAP:
            self.since = start
        out = self.wait(step())
        end = self.last = time.perf_counter()
        one, default = self.times
        timing = one if len(one) < TRIALS else default
        if start - self.since >= SETTLE or end - start >= LONG:
            timing.append(end - start)
        if self.calls > GIVE_UP and len(default) < TRIALS:
            self.choice = 0
            self._restore()
            return out
        if timing is one and len(one) == TRIALS:
            self._restore()
            self.since = end
        elif len(default) == TRIALS:
            self.choice = int(statistics.median(one) < statistics.median(default))
            if self.choice:
                self._limit()
        return out

    def _limit(self):
        if self.controller is None:
            from threadpoolctl import ThreadpoolController

            self.controller = ThreadpoolController()
        blas = self.controller.select(user_api="blas")
        if not any(info["num_threads"] > 1 for info in blas.info()):
            return False
        self.limiter = blas.limit(limits=1)
        return True

    def _restore(self):
        if self.limiter is not None:
            self.limiter.restore_original_limits()
            self.limiter = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._restore()
