"""The backend contract, method by method: the same model built in both backends has the same
parameter names and shapes, takes the same ``fit`` steps (losses to 1e-8 in float64; trained
values and predictions to 1e-7, as Adam amplifies rounding where a gradient is near zero), and
predicts after ``fit`` with the trained values, as with ``params=result.params``."""
import numpy as np
import pytest

from backends import BACKENDS

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
    }
    likelihood = lib.Bernoulli() if method == "bernoulli" else gaussian
    model = lib.GPModel(priors[method](), likelihood, num_data=N)
    target = array((data()[1] > 0).astype(float)) if method == "bernoulli" else array(y)
    return model.model, model.guide, (X, target), model.predict_f


METHODS = ["svgp", "svgp-unwhitened-diagonal", "decoupled", "hermite", "bernoulli", "cox"]


@pytest.mark.parametrize("method", METHODS)
def test_same_parameters_same_steps_and_predictions_after_fit(method):
    X = data(1)[0]
    out = {}
    for name in ("pyro", "numpyro"):
        backend = BACKENDS[name]()
        backend.reset()
        model, guide, args, predict_f = build(backend.lib, backend.array, method)
        result = backend.lib.fit(model, guide, args, num_steps=STEPS, lr=0.05, progress=False, loss_every=1)
        after = [backend.numpy(v) for v in predict_f(backend.array(X))]
        given = [backend.numpy(v) for v in predict_f(backend.array(X), params=result.params)]
        for a, b in zip(after, given):  # the trained values, without params=
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        out[name] = result.losses, {k: backend.numpy(v) for k, v in result.params.items()}, after
    (loss_p, params_p, pred_p), (loss_n, params_n, pred_n) = out["pyro"], out["numpyro"]
    assert {k: v.shape for k, v in params_p.items()} == {k: v.shape for k, v in params_n.items()}
    assert len(loss_p) == STEPS and not np.allclose(loss_p[0], loss_p[-1])  # it trained
    np.testing.assert_allclose(loss_p, loss_n, rtol=1e-8)
    for k in params_p:  # Adam divides by sqrt(v): entries with gradients near 0 amplify 1e-16 differences
        np.testing.assert_allclose(params_p[k], params_n[k], rtol=1e-7, atol=1e-8, err_msg=k)
    for a, b in zip(pred_p, pred_n):  # from those trained values
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-8)
