"""What a new user hit (issue 31, section 2), in both backends: inputs of another dtype than the
model follow the model; ``y`` of shape ``(N, 1)`` and bad labels anywhere in ``y`` give a
ValueError naming ``y``, the labels caught by ``fit`` before its first step."""
import jax
import numpy as np
import pytest
from numpyro import handlers

from sparsegp_common.inference.training import make_plan

N, B = 24, 8


@pytest.fixture
def data(rng):
    X = rng.normal(size=(N, 2))
    return X, (X[:, 0] > 0).astype(float)


def model(backend, X, likelihood=None, dtype=np.float64, num_latent=None):
    lib = backend.lib
    Z = backend.array(X[:4], dtype)
    prior = lib.SVGP(lib.RBF(lengthscale=backend.array([1.0, 1.0], dtype)), Z, num_latent=num_latent)
    return lib.GPModel(prior, likelihood or lib.Bernoulli(), num_data=N)


def dtype_name(x):
    return str(x.dtype).rsplit(".", 1)[-1]


def call(backend, fn, *args):
    """``fn(*args)``; NumPyro compiles it whole (eagerly each small operation compiles on its own)."""
    return jax.jit(handlers.seed(fn, 0))(*args) if backend.name == "numpyro" else fn(*args)


def test_inputs_follow_the_dtype_of_the_model(backend, data):
    """float64 ``X`` into a float32 model is converted to float32, in ``elbo`` (the model/guide
    pair reads it the same way), ``predict_f`` and an embedded prior component."""
    X, y = data
    m = model(backend, X, backend.lib.Gaussian(), dtype=np.float32)
    X32, y32, X64, y64 = (backend.array(a, dt) for dt in (np.float32, np.float64) for a in (X, y))

    def run(X32, y32, X64, y64):
        return m.elbo(X32, y32), m.elbo(X64, y64), m.prior.guide(X64)

    same, mixed, f = call(backend, run, X32, y32, X64, y64)
    assert dtype_name(mixed) == "float32"
    assert float(backend.numpy(mixed)) == pytest.approx(float(backend.numpy(same)), rel=1e-6)
    assert f.shape == (N,) and np.all(np.isfinite(backend.numpy(f)))
    assert dtype_name(m.predict_f(X64)[0]) == "float32"


def test_y_of_shape_n_by_1_is_refused(backend, data):
    X, y = data
    m = model(backend, X)
    Xa, column = backend.array(X), backend.array(y[:, None])
    message = r"y must have shape \(N,\), one value per row of X, got \(24, 1\)"
    with pytest.raises(ValueError, match=message):
        backend.trace(m.model, Xa, column, subsample_size=B)  # what an SVI step runs
    with pytest.raises(ValueError, match=message):
        backend.lib.fit(m.model, m.guide, (Xa, column), num_steps=1, batch_size=B, progress=False)
    with pytest.raises(ValueError, match=message):
        m.elbo(Xa, column)


def unused_row():
    """A row that ``fit``'s first step (batch ``B``, seed 0) does not use."""
    return int(np.setdiff1d(np.arange(N), make_plan((np.zeros(N),), B, 1, None, seed=0).indices(0))[-1])


BAD_LABELS = [
    ("Bernoulli", {}, 2.0, "binary labels 0 or 1"),
    ("Bernoulli", {}, -1.0, "binary labels 0 or 1"),
    ("Bernoulli", {}, 0.5, "binary labels 0 or 1"),
    ("Poisson", {}, -1.0, "non-negative counts"),
    ("Poisson", {}, 2.5, "integers"),
    ("Softmax", {"num_classes": 3}, 3.0, r"class labels in 0\.\.2"),
]


@pytest.mark.parametrize("likelihood, options, value, message", BAD_LABELS)
def test_fit_checks_every_label_before_its_first_step(backend, data, likelihood, options, value, message):
    X, y = data
    lik = getattr(backend.lib, likelihood)(**options)
    m = model(backend, X, lik, num_latent=options.get("num_classes"))
    row = unused_row()
    bad = y.copy()
    bad[row] = value
    steps = []
    with pytest.raises(ValueError, match=rf"y must hold {message}: y\[{row}\] = {value}"):
        backend.lib.fit(m.model, m.guide, (backend.array(X), backend.array(bad)), num_steps=1, batch_size=B,
                        callbacks=steps.append, progress=False)
    assert not steps


def test_fit_checks_every_input_before_its_first_step(backend, data):
    X, y = data
    m = model(backend, X)
    row = unused_row()
    bad = X.copy()
    bad[row, 1] = np.nan
    with pytest.raises(ValueError, match=rf"X contains NaN or inf: X\[{row}, 1\] = nan"):
        backend.lib.fit(m.model, m.guide, (backend.array(bad), backend.array(y)), num_steps=1, batch_size=B,
                        progress=False)
