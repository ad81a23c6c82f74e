"""Every method follows the device and dtype of its inputs, in both backends: float32 and float64 on
every device at hand (the CPU; a CUDA GPU for torch and a GPU for JAX when present, else skipped).

The rest of the suite runs NumPyro in float64 (``jax_enable_x64``); here float32 inputs must give a
float32 objective close to the float64 one, so the float32 paths of both backends are exercised.
"""
import jax
import numpy as np
import pytest
import torch

from backends import BACKENDS

GPU = {"pyro": torch.cuda.is_available(), "numpyro": any(d.platform == "gpu" for d in jax.devices())}
DEVICES = ["cpu", "gpu"]


def place(backend, x, dtype, device):
    x = np.asarray(x, dtype=dtype)
    if backend.name == "pyro":
        return torch.as_tensor(x, device="cuda" if device == "gpu" else "cpu")
    return jax.device_put(x, jax.devices(device)[0])


def on_device(backend, x, device):
    if backend.name == "pyro":
        return x.device.type == ("cuda" if device == "gpu" else "cpu")
    return {d.platform for d in x.devices()} == {device}


def problem(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(40, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=40)
    return X, y, X[::5].copy()


METHODS = ("bernoulli", "cox", "decoupled", "harmonic", "hermite", "svgp", "svgp-unwhitened-diagonal")


def methods(lib, array):
    """Models with a deterministic ``elbo(X, y)``, built from arrays of one dtype and device."""
    ls, noise = array([0.8, 1.2]), array(0.1)

    def gaussian():
        return lib.Gaussian(variance=noise)

    def svgp(Z, **options):
        return lib.GPModel(lib.SVGP(lib.RBF(lengthscale=ls), Z, **options), gaussian())

    def decoupled(Z):
        return lib.GPModel(lib.DecoupledGP(lib.Matern52(lengthscale=ls), Z, Z[:4]), gaussian())

    def hermite(Z):
        kernel = lib.RBF(lengthscale=ls)
        return lib.GPModel(lib.SVGP(kernel, lib.HermiteFeatures(4, array([1.0, 1.0]), kernel=kernel)), gaussian())

    def harmonic(Z):  # 4 components (sign flips of each axis, under which the ARD kernel is invariant)
        features = lib.HarmonicFeatures(Z, lib.harmonic.Reflections.along_axes([[0], [1]]))
        return lib.GPModel(lib.SVGP(lib.Matern32(lengthscale=ls), features), gaussian())

    def bernoulli(Z):
        return lib.GPModel(lib.SVGP(lib.Matern32(lengthscale=ls), Z), lib.Bernoulli())

    def cox(Z):  # the events are the inputs X, inside the window [-2, 2]^2
        process = lib.CoxProcess(lib.SVGP(lib.Matern52(lengthscale=ls), Z), [[-2.0, 2.0], [-2.0, 2.0]], lib.GaussLegendre(16),
                                 offset=1.0)
        return _Events(process)

    made = {
        "cox": cox,
        "svgp": svgp,
        "svgp-unwhitened-diagonal": lambda Z: svgp(Z, whiten=False, diagonal=True),
        "decoupled": decoupled,
        "hermite": hermite,
        "harmonic": harmonic,
        "bernoulli": bernoulli,
    }
    assert sorted(made) == sorted(METHODS)
    return made


class _Events:
    """A Cox process seen through ``elbo(X, y)``/``predict_f(X)``: the events are ``X``."""

    def __init__(self, process):
        self.process = process

    def elbo(self, X, y):
        return self.process.elbo(X)

    def predict_f(self, X):
        return self.process.prior.predict_f(X)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_objectives_and_predictions_follow_dtype_and_device(name, device, method):
    if device == "gpu" and not GPU[name]:
        pytest.skip(f"no GPU for {name}")
    backend = BACKENDS[name]()
    X, y, Z = problem()
    y = (y > 0).astype(float) if method == "bernoulli" else y
    values = {}
    for dtype in (np.float32, np.float64):
        backend.reset()
        array = lambda x: place(backend, x, dtype, device)  # noqa: E731
        model = methods(backend.lib, array)[method](array(Z))
        elbo = model.elbo(array(X), array(y))
        mean, var = model.predict_f(array(X))
        want = {np.float32: torch.float32, np.float64: torch.float64}[dtype] if name == "pyro" else dtype
        for value in (elbo, mean, var):
            assert value.dtype == want and on_device(backend, value, device)
        values[dtype] = float(backend.numpy(elbo)), backend.numpy(mean)
    assert np.isfinite(values[np.float32][0])
    assert values[np.float32][0] == pytest.approx(values[np.float64][0], rel=1e-3)
    np.testing.assert_allclose(values[np.float32][1], values[np.float64][1], rtol=1e-2, atol=1e-3)
