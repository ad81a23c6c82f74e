"""Suite ``steps``: seconds per SVI step of our SVGP through ``fit`` and through the plain SVI
path of a user's model (an ``SVGP`` component, ``pyro.infer.SVI`` / ``numpyro.infer.SVI``), in
both backends, beside GPyTorch's SVGP and the floor, all in one run.

The problem and the peers are those of the ``peers`` suite (kin40k split 0, minibatch 1024,
float32, 2 threads, SE-ARD, whitened full-covariance ``q(u)``; :mod:`benchmarks.runners`). The
floor is the arithmetic no SVGP step avoids: the Cholesky factor of ``Kuu`` and one triangular
solve with ``Kuf`` (``M x batch``), forward and backward, in torch at the same sizes; "floor, one
node" is the same arithmetic differentiated as one step (``cholesky_and_solve``, 2 M^3 fewer flops
backward), as the whitened SVGP does it. Timed blocks
alternate (:func:`~benchmarks.harness.time_steps`); figures are medians over blocks. The Python
function calls per step (``cProfile``, 5 steps) count the overhead whatever the machine's load.

NumPyro's plain SVI path is timed in a second group, beside GPyTorch again (its ratio is to that
GPyTorch), each in a process of its own (:class:`~benchmarks.runners.Apart`), as a user runs
them: while NumPyro's ``fit`` runs it may hold the BLAS library at one thread, a process-wide
setting (:mod:`sparsegp_common.inference.threads`) that a user's own loop does not have, and
beside torch in one process the JAX step took 15-40 % longer (benchmarks/RESULTS.md).
"""
import numpy as np

from . import harness, runners

DATASET = "kin40k"
ORDER = ("ours_pyro", "ours_pyro_svi", "ours_numpyro", "ours_numpyro_svi", "gpytorch")
OURS = tuple(key for key in ORDER if key != "gpytorch")
APART = ("ours_numpyro_svi",)  # timed in the second group (see above)


def settings(quick):
    if harness.tiny():
        return {"sizes": (64,), "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 2}
    if quick:
        return {"sizes": (256,), "batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    return {"sizes": (256, 4096), "batch": 1024, "repeats": 7, "block_seconds": 1.0, "warmup": 2}


COLUMNS = (
    [("M", "M", "{}")]
    + [(runners.RUNNERS[key].name, f"seconds_{key}", "{:.4f} s") for key in ORDER]
    + [("GPyTorch, second group", "seconds_gpytorch_apart", "{:.4f} s")]
    + [("floor", "seconds_floor", "{:.4f} s"), ("floor, one node", "seconds_floor_fused", "{:.4f} s")]
    + [(f"GPyTorch / {runners.RUNNERS[key].name}", f"ratio_{key}", "{:.2f}") for key in OURS]
    + [(f"{runners.RUNNERS[key].name} / floor", f"floor_ratio_{key}", "{:.2f}") for key in OURS]
    + [(f"Python calls, {runners.RUNNERS[key].name}", f"calls_{key}", "{:.0f}") for key in ORDER]
)


def title(rows):
    row = rows[0]
    return (
        f"steps: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, D = {row['input_dim']}), "
        f"batch {row['batch']}, {row['dtype']}, {row['device']}, {row['threads']} threads, medians of {row['repeats']} blocks"
    )


class Floor:
    """``L = chol(Kuu)``, ``A = L^-1 Kuf`` and ``sum(A^2) + sum(log diag L)``, forward and backward
    with respect to ``Kuu`` and ``Kuf`` (torch, float32): what any SVGP step computes at least.
    ``fused``: ``(L, A)`` by ``cholesky_and_solve`` and ``sum(A^2)`` (a whitened SVGP uses ``L``
    for nothing else)."""

    def __init__(self, X, Z, batch_size, device="cpu", fused=False):
        import torch

        self.fused = fused
        def se(A, B):  # unit lengthscales and variance, as the runners start
            return np.exp(-0.5 * np.maximum((A**2).sum(-1)[:, None] + (B**2).sum(-1)[None, :] - 2 * A @ B.T, 0.0))

        Kuu = se(Z, Z) + 1e-3 * np.eye(len(Z))  # jitter: float32 must factorise it
        self.Kuu = torch.tensor(Kuu, dtype=torch.float32, device=device, requires_grad=True)
        self.Kuf = torch.tensor(se(Z, X[:batch_size]), dtype=torch.float32, device=device, requires_grad=True)

    def step(self):
        import torch

        if self.fused:
            from pyro_sparsegp.linalg import cholesky_and_solve

            loss = cholesky_and_solve(self.Kuu, self.Kuf, jitter=0.0)[1].square().sum()
        else:
            L, _ = torch.linalg.cholesky_ex(self.Kuu)
            A = torch.linalg.solve_triangular(L, self.Kuf, upper=False)
            loss = A.square().sum() + L.diagonal().log().sum()
        loss.backward()
        self.Kuu.grad = self.Kuf.grad = None
        return float(loss.detach())


def run(quick):
    """One row per M: each implementation's median seconds per step, the floor's, and the ratios."""
    def calls(group, steps):
        return {f"calls_{key}": group[key].python_calls() if isinstance(group.get(key), runners.Apart)
                else harness.python_calls(step) for key, step in steps.items()}

    rows = runners.timed_rows(
        "steps", DATASET, tuple(key for key in ORDER if key not in APART), settings(quick),
        extra=lambda X, Z, batch: {"floor": Floor(X, Z, batch).step, "floor_fused": Floor(X, Z, batch, fused=True).step},
        measure=calls)
    apart = runners.timed_rows("steps", DATASET, APART + ("gpytorch",), settings(quick), measure=calls, apart=True)
    for row, other in zip(rows, apart):
        row.update({f"{field}_{key}": other[f"{field}_{key}"] for key in APART for field in ("seconds", "blocks", "calls")})
        row["seconds_gpytorch_apart"], row["blocks_gpytorch_apart"] = other["seconds_gpytorch"], other["blocks_gpytorch"]
        for key in OURS:
            row[f"ratio_{key}"] = row["seconds_gpytorch_apart" if key in APART else "seconds_gpytorch"] / row[f"seconds_{key}"]
            row[f"floor_ratio_{key}"] = row[f"seconds_{key}"] / row["seconds_floor"]
    return rows
