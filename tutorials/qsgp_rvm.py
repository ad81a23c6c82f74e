"""Tutorial: a quadruply stochastic relevance vector machine (Evans & Nair, 2020, App. I.3), Pyro or NumPyro.

The paper's sinc experiment: 500 noisy points of ``sinc(x)`` and a weight-space model on the
kernel functions at every one of them, ``f(x) = sum_j k(x, x_j) w_j`` with ``w_j ~ N(0, 1 / s_j)``
and one precision ``s_j`` per function learnt by empirical Bayes (Tipping's relevance vector
machine): ``QSGP(kernel, inducing_points=X, relevance=True)`` with a chevron q of 10 dense
columns. Each step of ``QuadruplyStochasticELBO`` reads 100 rows and two sets of 250 of the 500
functions, with the control variates for the mean and every dense column on 250 support rows;
C's diagonal starts at its optimum for the initial values (``set_optimal_diagonal``, the paper's
Proposition 1); AdaGrad moves the q tables and the log precisions (all read by rows), Adam the
noise; the kernel is held, as in Tipping's RVM. Functions whose precision grows large have weights pinned at zero: those with ``s < 10^4``
are the relevance vectors (the paper found 13). It prints the seconds per step, the test RMSE
against ``sinc``, the precisions' spread and how many stay below each threshold, and plots the
fit with the most relevant inputs marked. (The quick run takes fewer steps.)

    python tutorials/qsgp_rvm.py [--backend pyro|numpyro] [--quick] [--output outputs/qsgp_rvm.png]
"""
import argparse
import pathlib
import time

import numpy as np

from qsgp_backend import setup  # beside this script


def data(n=500, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-10, 10, size=(n, 1))  # in random order: the dense columns of C are the first 10 functions
    return X, np.sinc(X[:, 0] / np.pi) + 0.1 * rng.normal(size=n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--output", default="outputs/qsgp_rvm.png")
    args = parser.parse_args()
    steps = 500 if args.quick else 10_000
    lib, array, adagrad, numpy = setup(args.backend)
    X, y = data()
    n = len(X)
    X_test = np.linspace(-10, 10, 400)[:, None]

    kernel = lib.RBF(lengthscale=array([1.5]), variance=array(1.0))
    prior = lib.QSGP(kernel, inducing_points=array(X), relevance=True, num_dense=10)
    prior.set_optimal_diagonal(array(X), 0.01)  # C's diagonal columns at their optimum for these values (Prop. 1)
    model = lib.GPModel(prior, lib.Gaussian(variance=array(0.01)), num_data=n)
    support = np.random.default_rng(1).choice(n, 250, replace=False)
    loss = lib.QuadruplyStochasticELBO(num_basis=250, control_variates=array(X[support]))
    groups = [{"params": "gp.log_precision", "lr": 1.0, **adagrad},
              {"params": "gp.q_log_diag", "lr": 0.1, **adagrad},
              {"params": "gp.q_dense", "lr": 0.01, **adagrad}, {"params": "gp.q_*", "lr": 0.1, **adagrad},
              {"params": "gp.kernel.*", "lr_schedule": lambda t: 0.0}]  # the kernel's width held, as Tipping's
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (array(X), array(y)), num_steps=steps, batch_size=100, lr=0.01,
                     loss=loss, param_groups=groups, progress=False)
    seconds = (time.perf_counter() - start) / steps

    precision = np.exp(numpy(result.params["gp.log_precision"]))
    mean = numpy(model.predict_f(array(X_test))[0])
    var = numpy(model.predict_y(array(X_test)).variance)
    rmse = float(np.sqrt(np.mean((mean - np.sinc(X_test[:, 0] / np.pi)) ** 2)))
    print(f"{args.backend}: n = m = {n} kernel functions, chevron q with 10 dense columns, {steps} steps, "
          f"{seconds:.4f} s per step")
    print(f"test RMSE {rmse:.4f} (noise sd 0.1), noise variance {float(numpy(result.params['likelihood.variance'])):.4f} "
          f"(true 0.01), lengthscale {float(numpy(result.params['gp.kernel.lengthscale'])[0]):.3f}")
    print("precisions s: min {:.3g}, median {:.3g}, max {:.3g}".format(*np.quantile(precision, [0, 0.5, 1])))
    print("functions with s below " + ", ".join(f"{t:g}: {int(np.sum(precision < t))}" for t in (10, 100, 1e3, 1e4))
          + " (relevance vectors: s < 10^4; the paper found 13)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    relevant = np.argsort(precision)[:13]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(X[:, 0], y, ".", ms=2, color="0.6", label="data")
    ax.plot(X_test[:, 0], np.sinc(X_test[:, 0] / np.pi), "k--", lw=1, label="sinc")
    ax.plot(X_test[:, 0], mean, "C0", label="QSRVM mean")
    ax.fill_between(X_test[:, 0], mean - 1.96 * np.sqrt(var), mean + 1.96 * np.sqrt(var), color="C0", alpha=0.2,
                    label="95% predictive")
    ax.plot(X[relevant, 0], y[relevant], "o", mfc="none", color="C3", label="13 smallest precisions")
    ax.set_title(f"quadruply stochastic RVM, {steps} steps of 100 rows and 2 x 250 of {n} functions")
    ax.legend(loc="upper right", fontsize=8)
    path = pathlib.Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
