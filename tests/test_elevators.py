"""SVGP regression on UCI elevators, split 0 (skipped when ../shared/data is absent).

Protocol: inputs and targets standardised with training statistics; SE-ARD kernel
(lengthscales 1, variance 1), M = 128 inducing inputs drawn from the training inputs (seed 0),
Gaussian noise variance 0.1; Adam, learning rate 0.01, minibatches of 1024, 1000 steps, float32.
Stated target: test RMSE < 0.105 and NLPD < -0.85 in the original units of y (which has standard
deviation 0.2526); measured 0.098 and -0.90.
"""
import os
import pathlib

import numpy as np
import pytest

from sparsegp_common.data.datasets import Standardizer, load_uci

DATA = pathlib.Path(os.environ.get("SPARSEGP_DATA", pathlib.Path(__file__).parents[2] / "shared" / "data"))
FOLDER = DATA / "uci_elevators"
STEPS, M, BATCH = 1000, 128, 1024

pytestmark = pytest.mark.skipif(not (FOLDER / "data.csv.gz").exists(), reason=f"{FOLDER} is absent")


@pytest.fixture(scope="module")
def split():
    Xtr, ytr, Xte, yte = load_uci("elevators", 0, data_dir=DATA)
    x_scale, y_scale = Standardizer.fit(Xtr), Standardizer.fit(ytr)
    Xtr, Xte = x_scale.transform(Xtr), x_scale.transform(Xte)
    Z = Xtr[np.random.default_rng(0).choice(len(Xtr), M, replace=False)]
    return Xtr, y_scale.transform(ytr), Xte, yte, Z, y_scale.mean, y_scale.std


def test_elevators_rmse(backend, split):
    Xtr, ytr, Xte, yte, Z, y_mean, y_std = split
    f32 = lambda a: backend.array(a, np.float32)  # noqa: E731
    lib = backend.lib
    gp = lib.SVGP(lib.SquaredExponential(lengthscale=f32(np.ones(Xtr.shape[1]))), f32(Z))
    model = lib.GPModel(gp, lib.Gaussian(variance=0.1))
    _, params = backend.train(model.model, model.guide, (f32(Xtr), f32(ytr)), steps=STEPS, lr=0.01,
                              kwargs={"subsample_size": BATCH})
    mean, var = backend.predict(model, f32(Xte), params)
    noise = float(params["likelihood.variance"])
    mu, v = mean * y_std + y_mean, (var + noise) * y_std**2
    rmse = np.sqrt(np.mean((mu - yte) ** 2))
    nlpd = np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * (yte - mu) ** 2 / v)
    print(f"{backend.name}: elevators split 0 test RMSE {rmse:.4f}, NLPD {nlpd:.4f}")
    assert rmse < 0.105 and nlpd < -0.85
