"""Bad input gets a ValueError/TypeError that names the argument, in both backends."""
import numpy as np
import pytest


@pytest.fixture
def data(rng):
    return rng.normal(size=(20, 2)), rng.normal(size=20), rng.normal(size=(5, 2))


def gp_model(backend, Z, likelihood=None, **kwargs):
    lib = backend.lib
    return lib.GPModel(backend.svgp(Z, ("rbf", [1.0], 1.0), **kwargs), likelihood or lib.Gaussian(), )


def elbo(backend, model, X, y):
    return model.elbo(backend.array(X) if isinstance(X, np.ndarray) else X, y if y is None else backend.array(y))


def test_non_finite_inputs(backend, data):
    X, y, Z = data
    model = gp_model(backend, Z)
    for bad_X, name in ((np.where(np.eye(20, 2, dtype=bool), np.nan, X), "X"), (X, "y")):
        bad_y = np.where(np.arange(20) == 3, np.inf, y) if name == "y" else y
        with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
            elbo(backend, model, bad_X, bad_y)
    with pytest.raises(ValueError, match="Z contains NaN"):
        backend.svgp(np.full((3, 2), np.nan))
    with pytest.raises(ValueError, match="X contains NaN"):
        model.predict_f(backend.array(np.full((2, 2), np.inf)))


def test_shape_and_length_mismatches(backend, data):
    X, y, Z = data
    model = gp_model(backend, Z)
    with pytest.raises(ValueError, match="X has 3 input dimensions but the model expects 2"):
        elbo(backend, model, np.ones((20, 3)), y)
    with pytest.raises(ValueError, match="y has length 19 but X has 20 rows"):
        elbo(backend, model, X, y[:19])
    with pytest.raises(ValueError, match=r"X must have shape \(N, D\)"):
        elbo(backend, model, np.ones((2, 3, 4)), None)
    with pytest.raises(ValueError, match="Z must have shape"):
        backend.svgp(np.ones((2, 2, 2)))
    with pytest.raises(TypeError, match="X must be"):
        model.predict_f("not an array")


def test_labels_and_counts(backend, data):
    X, _, Z = data
    lib = backend.lib
    cases = [
        (lib.Bernoulli(), np.r_[np.zeros(19), 2.0], "binary labels"),
        (lib.Poisson(), np.r_[np.zeros(19), -1.0], "non-negative counts"),
        (lib.Poisson(), np.r_[np.zeros(19), 0.5], "integers"),
    ]
    for likelihood, y, message in cases:
        with pytest.raises(ValueError, match=message):
            elbo(backend, gp_model(backend, Z, likelihood), X, y)
    softmax = lib.GPModel(backend.svgp(Z, num_latent=3), lib.Softmax(num_classes=3))
    with pytest.raises(ValueError, match=r"class labels in 0..2"):
        elbo(backend, softmax, X, np.r_[np.zeros(19), 3.0])


def test_bad_hyperparameters_and_options(backend, data):
    X, y, Z = data
    lib = backend.lib
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        lib.Matern52(lengthscale=[1.0, 0.0])
    with pytest.raises(ValueError, match="variance must be positive"):
        lib.Gaussian(variance=0.0)
    with pytest.raises(ValueError, match="scale must be positive"):
        lib.StudentT(scale=-2.0)
    with pytest.raises(ValueError, match="jitter"):
        backend.svgp(Z, jitter=-1e-6)
    with pytest.raises(ValueError, match="num_latent"):
        backend.svgp(Z, num_latent=0)
    with pytest.raises(ValueError, match="num_latent"):
        lib.GPModel(backend.svgp(Z), lib.Softmax(num_classes=3))
    with pytest.raises(ValueError, match="num_data"):
        lib.GPModel(backend.svgp(Z), lib.Gaussian(), num_data=0)
    with pytest.raises(ValueError, match="num_data=10"):
        elbo(backend, lib.GPModel(backend.svgp(Z), lib.Gaussian(), num_data=10), X, y)
    with pytest.raises(TypeError, match="prior"):
        lib.GPModel("gp", lib.Gaussian())


def test_bad_data_is_caught_when_training_starts(backend, data):
    """Through the model/guide pair too, not only through ``elbo``."""
    X, y, Z = data
    model = gp_model(backend, Z, backend.lib.Bernoulli())
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        backend.loss(model.model, model.guide, backend.array(bad), backend.array(y > 0))
    with pytest.raises(ValueError, match="binary labels"):
        backend.loss(model.model, model.guide, backend.array(X), backend.array(y))
