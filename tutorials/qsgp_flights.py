"""Tutorial: a million basis functions on a million flights (Evans & Nair, 2020), Pyro or NumPyro.

Departure delays of US flights (``flights_3m``, from the data directory: ``--data-dir`` or
``$SPARSEGP_DATA``; see ``load_flights``) against eight features (hour, weekday, day of year,
distance, origin and destination coordinates), standardised. A QSGP on ``m`` random Fourier
features of an ARD squared exponential, mean-field q, trained by ``QuadruplyStochasticELBO`` with
AdaGrad on the q tables: each step reads 500 rows and three sets of ``num_basis`` basis functions
and updates only those rows (``fit`` steps by rows), so its time does not grow with ``m``. It
prints the seconds per step for ``m`` from 10^3 to 10^6 side by side, then trains the largest for
a few thousand steps and prints its test RMSE and NLPD beside the constant predictor's, and plots
the step time against ``m``. (The quick run: 30,000 flights, ``m`` of 10^3 and 10^5, fewer steps, 2,000 test
flights.)

    python tutorials/qsgp_flights.py [--backend pyro|numpyro] [--quick] [--data-dir DIR] [--output outputs/qsgp_flights.png]
"""
import argparse
import pathlib
import time

import numpy as np

from sparsegp_common.data.datasets import load_flights

from qsgp_backend import setup  # beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer flights, basis functions and steps (CI)")
    parser.add_argument("--data-dir", default=None, help="the data directory (default: $SPARSEGP_DATA)")
    parser.add_argument("--output", default="outputs/qsgp_flights.png")
    args = parser.parse_args()
    n, n_test, ms, steps, num_basis, timed = ((30_000, 2_000, (1_000, 100_000), 200, 300, 10) if args.quick
                                              else (1_000_000, 10_000, (1_000, 10_000, 100_000, 1_000_000), 5000,
                                                    1000, 50))
    lib, array, adagrad, numpy = setup(args.backend)

    X, y = load_flights(num_rows=n + n_test, seed=0, data_dir=args.data_dir)
    keep = np.abs(y) < 600  # a few delays of -1000 minutes and less are recording errors
    X, y = X[keep], y[keep]
    test = np.random.default_rng(1).permutation(len(X))[:n_test]
    train = np.setdiff1d(np.arange(len(X)), test)
    shift, scale = X[train].mean(0), X[train].std(0)
    X = (X - shift) / scale
    y_mean, y_scale = y[train].mean(), y[train].std()
    y = (y - y_mean) / y_scale
    Xtr, ytr, Xte, yte = array(X[train]), array(y[train]), X[test], y[test]

    def build(m):
        kernel = lib.RBF(lengthscale=array(np.ones(X.shape[1])), variance=array(1.0))
        return lib.GPModel(lib.QSGP(kernel, m, X.shape[1]), lib.Gaussian(variance=array(0.5)), num_data=len(train))

    def fit(model, num_steps):
        return lib.fit(model.model, model.guide, (Xtr, ytr), num_steps=num_steps, batch_size=500, lr=0.01,
                       loss=lib.QuadruplyStochasticELBO(num_basis=num_basis),
                       param_groups=[{"params": "gp.q_*", "lr": 0.1, **adagrad}], progress=False)

    seconds = []
    for m in ms:
        model = build(m)
        fit(model, 5)  # the first steps compile
        start = time.perf_counter()
        fit(model, timed)
        seconds.append((time.perf_counter() - start) / timed)
        print(f"m = {m:>9,}: {seconds[-1]:.4f} s per step")
    print(f"{args.backend}: {len(train):,} flights, num_basis {num_basis}, batch 500: the step at m = {ms[-1]:,} takes "
          f"{seconds[-1] / seconds[0]:.2f} x the step at m = {ms[0]:,}")

    model = build(ms[-1])
    start = time.perf_counter()
    fit(model, steps)
    prediction = model.predict_y(array(Xte), batch_size=2000)
    mean, var = numpy(prediction.mean), numpy(prediction.variance)
    rmse = float(np.sqrt(np.mean((mean - yte) ** 2)))
    nlpd = float(0.5 * np.mean(np.log(2 * np.pi * var) + (yte - mean) ** 2 / var))
    constant = float(0.5 * np.log(2 * np.pi * np.var(yte)) + 0.5)
    print(f"m = {ms[-1]:,}, {steps} steps ({time.perf_counter() - start:.0f} s): test RMSE {rmse:.4f} "
          f"(constant predictor {np.std(yte):.4f}), NLPD {nlpd:.4f} (constant {constant:.4f}); standardised delays")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ms, seconds, "o-", label=f"QSGP, num_basis {num_basis}")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.5 * max(seconds))
    ax.set_xlabel("m (random Fourier features)")
    ax.set_ylabel("seconds per step")
    ax.set_title(f"flights: a step does not grow with m ({args.backend})")
    ax.legend(fontsize=8)
    path = pathlib.Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
