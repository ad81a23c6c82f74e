"""Suite ``heap``: large Pyro steps on a CPU with the memory they free kept in the process
(``sparsegp_common.inference.heap.kept``, which Pyro's ``fit`` holds on a CPU) and without it.

Each measurement runs in a fresh process (the C heap as a user's script starts with it), the two
settings alternating: seconds per step (median), minor page faults per step, the peak of resident
memory, and what stays resident once the run has ended. Cases: an SVGP through ``fit`` and through a
user's ``pyro.infer.SVI`` loop (wrapped in ``kept()`` for the kept rows), and HVGP 8 x m through
``fit``; kin40k, batch 1024, float32.
"""
import contextlib
import gc
import json
import resource
import subprocess
import sys
import time

import numpy as np

from . import harness

COLUMNS = [
    ("case", "case", "{}"), ("freed memory", "setting", "{}"), ("s per step", "seconds", "{:.3f}"),
    ("page faults per step", "faults", "{:.0f}"), ("peak resident", "peak_mb", "{:.0f} MB"),
    ("resident after", "after_mb", "{:.0f} MB"), ("processes", "repeats", "{}"),
]
CASES = ("SVGP, fit", "SVGP, pyro.infer.SVI", "HVGP 8 x m, fit")
SETTINGS = ("kept", "given back (glibc's default)")


def title(rows):
    return (f"heap: Pyro steps on a CPU with freed memory kept and not, kin40k, batch 1024, "
            f"{rows[0]['threads']} threads, medians over fresh processes (M = {rows[0]['M']}, m = {rows[-1]['M']})")


def _resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(case, kept, M, steps):
    """One fresh process's figures for ``CASES[case]`` with the freed memory ``kept`` or not."""
    from sparsegp_common.inference import heap

    from . import harmonic, runners

    if not kept:
        heap._libc = None  # fit's own setting off too
    problem = harness.regression_problem("kin40k")
    X, y = problem["X_train"], problem["y_train"]
    Z = harness.inducing_inputs(X, M)
    build = (runners.OursPyro, runners.OursPyroSVI, harmonic.HarmonicPyro)[case]
    runner = build(X, y, Z, 1024, 0.01)
    with heap.kept() if kept else contextlib.nullcontext():
        for _ in range(2):
            runner.step()
        start, times = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
        for _ in range(steps):
            t = time.perf_counter()
            runner.step()
            times.append(time.perf_counter() - t)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / steps
        runner.close()
    runner = None
    gc.collect()
    return {"seconds": float(np.median(times)), "faults": faults, "after_mb": _resident_mb(),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run(quick):
    if harness.tiny():  # the test suite's run: every case in one process per setting
        sizes, steps, repeats = (32, 16), 2, 1
    else:
        sizes, steps, repeats = ((512, 128), 3, 1) if quick else ((2048, 512), 5, 2)
    groups = [tuple(range(len(CASES)))] if harness.tiny() else [(case,) for case in range(len(CASES))]
    runs = {(case, setting): [] for case in range(len(CASES)) for setting in SETTINGS}
    for group in groups:
        for _ in range(repeats):
            for kept, setting in zip((True, False), SETTINGS):
                args = json.dumps([[(case, kept, sizes[case == 2], steps) for case in group]])
                code = (f"import json; from benchmarks import harness; harness.pin_threads({harness.threads()}); "
                        f"from benchmarks.heap import measure; "
                        f"print(json.dumps([measure(*a) for a in json.loads({args!r})[0]]))")
                out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                     cwd=harness.REPO).stdout
                for case, figures in zip(group, json.loads(out.strip().splitlines()[-1])):
                    runs[case, setting].append(figures)
    return [{"suite": "heap", "case": CASES[case], "setting": setting, "M": sizes[case == 2], "steps": steps,
             "repeats": repeats, "threads": harness.threads(), "runs": runs[case, setting],
             **{key: float(np.median([r[key] for r in runs[case, setting]]))
                for key in ("seconds", "faults", "peak_mb", "after_mb")}}
            for case in range(len(CASES)) for setting in SETTINGS]
