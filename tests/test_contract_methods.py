"""The backend contract, method by method: the same model built in both backends has the same
parameter names, shapes and initial values, the same loss and gradients at the same parameters
(to 1e-10), takes the same ``fit`` steps (to a tolerance measured from how much round-off the
trajectory amplifies, see ``trajectories.py``: Adam amplifies rounding where a gradient is near
0, by an amount that depends on the BLAS and the CPU), and predicts after ``fit`` with the
trained values, as with ``params=result.params``."""
import numpy as np
import pytest

from backends import BACKENDS
from trajectories import assert_same_loss_and_gradients, assert_same_trajectory, loss_and_gradients, spread

N, STEPS = 24, 4


def data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(N, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=N)
    return X, y, X[::4].copy()


def build(lib, array, method):
    """``(model, guide, data, predict)`` of one method, built from float64 arrays."""
    X, y, Z = data()
    X, Z, ls = array(X), array(Z), array([0.8, 1.2])
    gaussian = lib.Gaussian(variance=array(0.1))
    if method == "cox":  # the inputs are the events, inside the window [-2, 2]^2; a fixed rule
        process = lib.CoxProcess(lib.SVGP(lib.Matern52(lengthscale=ls), Z), [[-2.0, 2.0], [-2.0, 2.0]],
                                 integration=lib.GaussLegendre(6), offset=1.0)
        return process.model, process.guide, (X,), process.prior.predict_f
    priors = {
        "svgp": lambda: lib.SVGP(lib.RBF(lengthscale=ls), Z),
        "svgp-unwhitened-diagonal": lambda: lib.SVGP(lib.RBF(lengthscale=ls), Z, whiten=False, diagonal=True),
        "decoupled": lambda: lib.DecoupledGP(lib.Matern52(lengthscale=ls), Z, Z[:4]),
        "hermite": lambda: lib.SVGP(lib.RBF(lengthscale=ls), lib.HermiteFeatures(4, array([1.0, 1.0]), kernel=lib.RBF(lengthscale=ls))),
        "bernoulli": lambda: lib.SVGP(lib.Matern32(lengthscale=ls), Z),
        "harmonic": lambda: lib.SVGP(lib.RBF(lengthscale=ls), lib.HarmonicFeatures(Z, lib.harmonic.Reflections.along_axes([[0], [1]]))),
        "qsgp": lambda: lib.QSGP(lib.Matern52(lengthscale=ls), 16, 2, num_dense=3),
        "qsgp-inducing": lambda: lib.QSGP(lib.Matern52(lengthscale=ls), inducing_points=X[::2], num_dense=3,
                                          augment_noise=0.1),
        "qsgp-relevance": lambda: lib.QSGP(lib.RBF(lengthscale=ls), inducing_points=X[::2], num_dense=2, relevance=True),
        "qsgp-whitened": lambda: lib.QSGP(lib.Matern52(lengthscale=ls), inducing_points=X[::2], num_dense=3,
                                          augment_noise=0.1, whiten=True),
    }
    likelihood = lib.Bernoulli() if method == "bernoulli" else gaussian
    model = lib.GPModel(priors[method](), likelihood, num_data=N)
    target = array((data()[1] > 0).astype(float)) if method == "bernoulli" else array(y)
    return model.model, model.guide, (X, target), model.predict_f


METHODS = ["svgp", "svgp-unwhitened-diagonal", "decoupled", "hermite", "bernoulli", "cox", "harmonic", "qsgp",
           "qsgp-inducing", "qsgp-relevance", "qsgp-whitened"]


@pytest.mark.parametrize("method", METHODS)
def test_same_parameters_same_loss_and_gradients(method):
    """At the initial values and at values moved off them (where no gradient is 0 by symmetry),
    the loss and its gradient with respect to every unconstrained parameter agree to 1e-10."""
    out = []
    for name in ("pyro", "numpyro"):
        backend = BACKENDS[name]()
        backend.reset()
        out.append(loss_and_gradients(backend, *build(backend.lib, backend.array, method)[:3], moves=(0.0, 0.1)))
    for pyro, numpyro in zip(*out):
        assert_same_loss_and_gradients(pyro, numpyro)


def fitted(name, method, optimizer=None):
    """``{key: array}`` of a ``fit`` of ``STEPS`` steps: each step's loss, the trained values and
    the predictions at new inputs after ``fit`` (``optimizer``: a torch optimiser class, Pyro only)."""
    backend = BACKENDS[name]()
    backend.reset()
    X = backend.array(data(1)[0])
    model, guide, args, predict_f = build(backend.lib, backend.array, method)
    options = {} if optimizer is None else {"optimizer": optimizer}
    result = backend.lib.fit(model, guide, args, num_steps=STEPS, lr=0.05, progress=False, loss_every=1, **options)
    after = [backend.numpy(v) for v in predict_f(X)]
    given = [backend.numpy(v) for v in predict_f(X, params=result.params)]
    for a, b in zip(after, given):  # the trained values, without params=
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    return {**{f"loss {i}": v for i, v in enumerate(result.losses)},
            **{k: backend.numpy(v) for k, v in result.params.items()}, "mean": after[0], "var": after[1]}


@pytest.mark.parametrize("method", METHODS)
def test_same_parameters_same_steps_and_predictions_after_fit(method):
    pyro, numpyro = fitted("pyro", method), fitted("numpyro", method)
    assert {k: np.shape(v) for k, v in pyro.items()} == {k: np.shape(v) for k, v in numpyro.items()}
    assert not np.allclose(pyro["loss 0"], pyro[f"loss {STEPS - 1}"])  # it trained
    # losses, trained values and predictions to what round-off of the gradients can move them
    assert_same_trajectory(pyro, numpyro, spread(lambda optimizer: fitted("pyro", method, optimizer), pyro))
