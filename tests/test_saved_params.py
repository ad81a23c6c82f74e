"""A GP trained inside a user's model by the PPL's own SVI, its parameters saved the PPL's way
(Pyro: ``pyro.get_param_store().save``/``load``; NumPyro: ``svi.get_params(state)``, then
``params=``), predicts in a fresh start, with new objects built the same way, as it did trained."""
import numpy as np
import pytest

N, M, STEPS = 60, 8, 250


def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (N, 1))
    return X, np.sin(2 * X[:, 0]) + 0.05 * rng.standard_normal(N)


def build(backend, num_inducing=M):
    """A user's model with an SVGP component, a noise of its own and a full-data plate."""
    ppl, D, lib = backend.ppl, backend.ppl.distributions, backend.lib
    kernel = lib.SquaredExponential(lengthscale=backend.array([1.0]))
    gp = lib.SVGP(kernel, backend.array(np.linspace(-3, 3, num_inducing)[:, None]))

    def model(X, y):
        noise = ppl.param("noise", backend.array(0.5), constraint=D.constraints.positive)
        data = ppl.plate("data", len(X))
        f = gp.model(X, data)
        with data:
            ppl.sample("y", D.Normal(f, noise), obs=y)

    def guide(X, y):
        gp.guide(X, ppl.plate("data", len(X)))

    return gp, model, guide


def rmse(backend, gp, X, params=None):
    mean = gp.predict_f(backend.array(X), **({} if params is None else {"params": params}))[0]
    return float(np.sqrt(np.mean((backend.numpy(mean) - np.sin(2 * X[:, 0])) ** 2)))


def test_saved_parameters_restore_the_trained_gp(backend, tmp_path):
    X, y = data()
    args = backend.array(X), backend.array(y)
    backend.reset()
    gp, model, guide = build(backend)
    path = str(tmp_path / "params")
    if backend.name == "pyro":
        import pyro

        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), pyro.infer.Trace_ELBO())
        for _ in range(STEPS):
            svi.step(*args)
        trained = backend.numpy(gp.predict_f(args[0])[0])
        pyro.get_param_store().save(path)
        del gp, model, guide, svi
        pyro.clear_param_store()  # a fresh start
        gp, model, guide = build(backend)
        untrained = rmse(backend, gp, X)
        pyro.get_param_store().load(path)
        restored = gp.predict_f(args[0])[0]
        assert float(pyro.param("noise").detach()) < 0.2  # the user's own parameter came back too
        wrong, *_ = build(backend, num_inducing=M + 1)
        pyro.get_param_store().load(path)
        with pytest.raises(ValueError, match=r"gp.q_mu.*shape"):
            wrong.predict_f(args[0])
    else:
        import jax
        import numpyro

        svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.05), numpyro.infer.Trace_ELBO())
        state = svi.init(jax.random.PRNGKey(0), *args)
        update = jax.jit(svi.update)
        for _ in range(STEPS):
            state, _ = update(state, *args)
        params = svi.get_params(state)
        trained = backend.numpy(gp.predict_f(args[0], params=params)[0])
        np.savez(path, **{k: np.asarray(v) for k, v in params.items()})
        gp, model, guide = build(backend)
        untrained = rmse(backend, gp, X)
        with np.load(path + ".npz") as saved:
            params = {k: backend.array(v) for k, v in saved.items()}
        restored = gp.predict_f(args[0], params=params)[0]
        assert float(params["noise"]) < 0.2
    np.testing.assert_allclose(backend.numpy(restored), trained, rtol=1e-10, atol=1e-12)
    assert rmse(backend, gp, X, None if backend.name == "pyro" else params) < 0.05 < untrained
