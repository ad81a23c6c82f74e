"""Tutorial: quadruply stochastic GPs (Evans & Nair, 2020), Pyro or NumPyro.

A regression with more basis functions than data: 20,000 noisy points of a wiggly 1-D function
and a QSGP on m = 50,000 random Fourier features of a squared exponential, with a chevron q
(4 dense columns). Each step of ``QuadruplyStochasticELBO`` reads 500 rows and two sets of 400
basis functions, so its arithmetic does not grow with m; AdaGrad moves the q tables, Adam the
lengthscale, variance and noise. It prints the seconds per step beside the loss that treats the
basis exactly (``Trace_ELBO``: ``O(B m k)`` per step), the test RMSE against the noiseless
function and the 95 % interval's coverage, and plots the predictive mean and interval. (The
quick run uses 5,000 points and m = 2,000.)

    python tutorials/qsgp_regression.py [--backend pyro|numpyro] [--quick] [--output outputs/qsgp_regression.png]
"""
import argparse
import pathlib
import time

import numpy as np

from qsgp_backend import setup  # beside this script


def truth(x):
    return np.sin(3 * x) + 0.5 * np.sin(11 * x)


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    return X, truth(X[:, 0]) + 0.2 * rng.normal(size=n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer points, features and steps (CI)")
    parser.add_argument("--output", default="outputs/qsgp_regression.png")
    args = parser.parse_args()
    n, m, steps = (5_000, 2_000, 400) if args.quick else (20_000, 50_000, 3000)
    lib, array, adagrad, numpy = setup(args.backend)
    X, y = data(n)
    X_test = np.linspace(-3, 3, 400)[:, None]

    def build():
        kernel = lib.RBF(lengthscale=array([0.2]), variance=array(1.0))
        return lib.GPModel(lib.QSGP(kernel, m, 1, num_dense=4), lib.Gaussian(variance=array(0.1)), num_data=n)

    def fit(model, loss, num_steps):
        groups = None if loss is None else [{"params": "gp.q_*", "lr": 0.1, **adagrad}]
        start = time.perf_counter()
        result = lib.fit(model.model, model.guide, (array(X), array(y)), num_steps=num_steps, batch_size=500,
                         lr=0.01, loss=loss, param_groups=groups, progress=False)
        return result, (time.perf_counter() - start) / num_steps

    model = build()
    loss = lib.QuadruplyStochasticELBO(num_basis=400)
    result, seconds = fit(model, loss, steps)
    _, exact_seconds = fit(build(), None, 20)  # a few steps of the exact-in-m loss, for the time only
    prediction = model.predict_y(array(X_test))
    mean, var = numpy(model.predict_f(array(X_test))[0]), numpy(prediction.variance)
    f = truth(X_test[:, 0])
    rmse = float(np.sqrt(np.mean((mean - f) ** 2)))
    y_test = f + 0.2 * np.random.default_rng(1).normal(size=len(f))
    coverage = float(np.mean(np.abs(y_test - mean) < 1.96 * np.sqrt(var)))
    print(f"{args.backend}: n = {n}, m = {m} random Fourier features, chevron q with 4 dense columns")
    print(f"seconds per step: quadruply stochastic {seconds:.4f}, exact in m {exact_seconds:.4f}")
    print(f"test RMSE {rmse:.4f} (noise sd 0.2), 95% interval coverage {coverage:.3f}, "
          f"noise variance {float(numpy(result.params['likelihood.variance'])):.4f} (true 0.04)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    shown = np.random.default_rng(2).choice(n, 600, replace=False)
    ax.plot(X[shown, 0], y[shown], ".", ms=2, color="0.6", label="data (600 of them)")
    ax.plot(X_test[:, 0], f, "k--", lw=1, label="truth")
    ax.plot(X_test[:, 0], mean, "C0", label="QSGP mean")
    ax.fill_between(X_test[:, 0], mean - 1.96 * np.sqrt(var), mean + 1.96 * np.sqrt(var), color="C0", alpha=0.2,
                    label="95% predictive")
    ax.set_title(f"QSGP, m = {m} features, {steps} steps of 500 rows and 2 x 400 basis functions")
    ax.legend(loc="lower left", fontsize=8)
    path = pathlib.Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
