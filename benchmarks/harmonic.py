"""Suite ``harmonic``: the harmonic decomposition's SVGP (HVGP, Sun et al. 2021) against SVGPs.

Speed: median seconds per SVI step of HVGP T x m (T = 8 components: 3-way reflections, the
input axes dealt to the ways round-robin, so that the SE-ARD kernel of the other runners stays
invariant) beside our SVGP with M = m, 2m and 8m and GPyTorch's SVGP with the same M, all in one
run with alternating timed blocks (:func:`~benchmarks.harness.time_steps`), both backends. kin40k
(split 0, standardised), minibatch 1024, float32, Gaussian likelihood, full Cholesky q blocks,
whitened; every runner's inducing inputs start at training rows (HVGP: the same m rows in every
component). The ratios: HVGP's step over the SVGP-m step (the cost of T blocks of m) and the
SVGP-8m step over HVGP's (the same number of inducing points).
"""
from . import harness, runners

DATASET = "kin40k"
NUM_WAYS = 3  # T = 2^3 = 8 components


def settings(quick):
    if harness.tiny():
        return {"sizes": (16,), "multiples": (1, 8), "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 1}
    if quick:
        return {"sizes": (128,), "multiples": (1, 8), "batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    if harness.DEVICE != "cpu":  # steps of milliseconds: shorter blocks, within a GPU lease
        return {"sizes": (512, 1024), "multiples": (1, 2, 8), "batch": 1024, "repeats": 5, "block_seconds": 0.4,
                "warmup": 3}
    return {"sizes": (256, 512, 1024), "multiples": (1, 2, 8), "batch": 1024, "repeats": 7, "block_seconds": 1.5,
            "warmup": 3}


def _transformation(input_dim):
    from sparsegp_common.features.harmonic import Reflections

    return Reflections.along_axes([range(j, input_dim, NUM_WAYS) for j in range(NUM_WAYS)])


class HarmonicPyro(runners.OursPyro):
    """The Pyro SVGP runner with ``HarmonicFeatures`` (the same ``Z`` rows in every component)."""

    name = "HVGP (Pyro)"
    key = "hvgp_pyro"
    likelihood_name = "hvgp_likelihood"

    def prior(self, kernel, Z):
        import pyro_sparsegp as psg

        return psg.SVGP(kernel, psg.HarmonicFeatures(Z, _transformation(Z.shape[1])), name="hvgp")


class HarmonicNumPyro(runners.OursNumPyro):
    """The NumPyro (jit) SVGP runner with ``HarmonicFeatures``, as :class:`HarmonicPyro`."""

    name = "HVGP (NumPyro, jit)"
    key = "hvgp_numpyro"

    def prior(self, kernel, Z):
        import numpyro_sparsegp as nsg

        return nsg.SVGP(kernel, nsg.HarmonicFeatures(Z, _transformation(Z.shape[1])), name="hvgp")


BASELINES = {"ours_pyro": "SVGP (Pyro)", "ours_numpyro": "SVGP (NumPyro)", "gpytorch": "GPyTorch"}


def title(rows):
    row = rows[0]
    return (
        f"harmonic: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, D = {row['input_dim']}), "
        f"HVGP {row['T']} x m against SVGPs with M = {', '.join(f'{k}m' for k in row['multiples'])}, batch "
        f"{row['batch']}, {row['dtype']}, {row['device']}, {row['threads']} threads, medians of {row['repeats']} blocks"
    )


def tables(rows):
    multiples = rows[0]["multiples"]
    columns = (
        [("m", "m", "{}"), ("HVGP (Pyro)", "seconds_hvgp_pyro", "{:.4f} s"),
         ("HVGP (NumPyro, jit)", "seconds_hvgp_numpyro", "{:.4f} s")]
        + [(f"{name} M={k}m", f"seconds_{key}_{k}", "{:.4f} s") for key, name in BASELINES.items() for k in multiples]
        + [("HVGP / SVGP-m (Pyro)", "hvgp_over_svgp_pyro", "{:.2f}"),
           ("HVGP / SVGP-m (NumPyro)", "hvgp_over_svgp_numpyro", "{:.2f}"),
           (f"SVGP-{multiples[-1]}m / HVGP (Pyro)", "svgp_over_hvgp_pyro", "{:.2f}"),
           (f"SVGP-{multiples[-1]}m / HVGP (NumPyro)", "svgp_over_hvgp_numpyro", "{:.2f}")]
    )
    return [(title(rows), columns, rows)]


def run(quick):
    """One row per m: seconds per step of HVGP T x m in both backends and of each baseline at
    every multiple of m, and the ratios."""
    opts = settings(quick)
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    T = 2**NUM_WAYS
    rows = []
    for m in opts["sizes"]:
        import pyro

        pyro.clear_param_store()  # once, before any Pyro runner of this m is built (see runners.build)
        Z = harness.inducing_inputs(X, m)
        group = {"hvgp_pyro": HarmonicPyro(X, y, Z, opts["batch"], 0.01),
                 "hvgp_numpyro": HarmonicNumPyro(X, y, Z, opts["batch"], 0.01)}
        for k in opts["multiples"]:
            Zk = harness.inducing_inputs(X, k * m)
            group.update({f"{key}_{k}": runners.RUNNERS[key](X, y, Zk, opts["batch"], 0.01) for key in BASELINES})
        blocks = harness.time_steps({key: runner.step for key, runner in group.items()}, opts["repeats"],
                                    opts["block_seconds"], opts["warmup"])
        runners.close(group)
        seconds = {key: harness.median(values) for key, values in blocks.items()}
        row = {
            "suite": "harmonic", "dataset": DATASET, "synthetic": problem["synthetic"], "num_data": len(X),
            "input_dim": X.shape[1], "m": m, "T": T, "multiples": list(opts["multiples"]), "batch": opts["batch"],
            "dtype": "float32", "device": harness.device_name(), "threads": harness.threads(), "repeats": opts["repeats"],
            "load_average": harness.load_average(),
        }
        for key in group:
            row[f"seconds_{key}"], row[f"blocks_{key}"] = seconds[key], blocks[key]
        top = opts["multiples"][-1]
        for backend in ("pyro", "numpyro"):
            row[f"hvgp_over_svgp_{backend}"] = seconds[f"hvgp_{backend}"] / seconds[f"ours_{backend}_1"]
            row[f"svgp_over_hvgp_{backend}"] = seconds[f"ours_{backend}_{top}"] / seconds[f"hvgp_{backend}"]
        rows.append(row)
    return rows
