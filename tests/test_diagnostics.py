"""ArviZ export: groups, named dims, pointwise log-likelihoods against an independent computation,
posterior draws against the predictive moments, and ``az.loo``/``az.waic``/``az.summary`` on it."""
import arviz as az
import numpy as np
import pytest
from scipy import stats

N, M, NOISE = 80, 8, 0.1


@pytest.fixture
def unfitted(backend):
    rng = np.random.default_rng(2)
    X = rng.uniform(-2, 2, (N, 1))
    y = np.sin(2 * X[:, 0]) + np.sqrt(NOISE) * rng.standard_normal(N)
    gp = backend.svgp(X[:M].copy())
    model = backend.lib.GPModel(gp, backend.set(backend.lib.Gaussian(), variance=NOISE))
    return model, backend.array(X), backend.array(y)


@pytest.fixture
def fitted(backend, unfitted):
    model, X, y = unfitted
    result = backend.lib.fit(model.model, model.guide, (X, y), num_steps=200, lr=0.05, progress=False)
    return model, X, y, result


def test_gp_model_export(backend, fitted):
    model, X, y, result = fitted
    idata = backend.lib.to_inference_data(model, data=(X, y), num_samples=400, result=result)
    assert {"posterior", "posterior_predictive", "log_likelihood", "observed_data", "sample_stats"} <= set(idata.groups())
    assert idata.posterior["gp.u"].dims == ("chain", "draw", "gp.u_dim_0")
    assert idata.posterior["gp.f"].dims == ("chain", "draw", "data")
    assert idata.log_likelihood["y"].shape == (4, 100, N)
    np.testing.assert_array_equal(idata.observed_data["y"].values, backend.numpy(y))
    np.testing.assert_allclose(idata.sample_stats["elbo"].values, -result.losses)

    # log p(y_n | f_n) of each draw, recomputed here from the exported f draws
    f = idata.posterior["gp.f"].values
    noise = float(backend.numpy(result.params["likelihood.variance"]))
    expected = stats.norm.logpdf(backend.numpy(y), f, np.sqrt(noise))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-10)

    # the f draws are draws of q(f_n); y draws add the noise
    mean, var = (backend.numpy(a) for a in model.predict_f(X, params=result.params))
    S = 400
    z = (f.reshape(S, N).mean(0) - mean) / np.sqrt(var / S)
    assert np.mean(np.abs(z) < 3.3) > 0.97
    y_draws = idata.posterior_predictive["y"].values.reshape(S, N)
    ratio = y_draws.var(0).mean() / (var + noise).mean()
    assert 0.9 < ratio < 1.1

    loo, waic = az.loo(idata), az.waic(idata)
    assert np.isfinite(loo.elpd_loo) and np.isfinite(waic.elpd_waic)
    assert loo.n_data_points == N
    summary = az.summary(idata, var_names=["gp.u"])
    assert len(summary) == M and summary["r_hat"].between(0.95, 1.05).all()


def test_user_model_export(backend, fitted):
    model, X, y, result = fitted
    user_model, user_guide = backend.user_model(model.prior, NOISE, subsample_size=None)
    idata = backend.lib.to_inference_data(user_model, user_guide, (X, y), num_samples=40, num_chains=2, seed=1, result=result)
    assert set(idata.posterior.data_vars) == {"gp.u", "gp.f"}
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    expected = stats.norm.logpdf(backend.numpy(y), idata.posterior["gp.f"].values, np.sqrt(NOISE))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-10)
    again = backend.lib.to_inference_data(user_model, user_guide, (X, y), num_samples=40, num_chains=2, seed=1, result=result)
    np.testing.assert_array_equal(again.posterior["gp.f"].values, idata.posterior["gp.f"].values)


def test_export_arguments(backend, unfitted):
    """The arguments are checked before anything is drawn: no fit needed."""
    model, X, y = unfitted
    export = backend.lib.to_inference_data
    with pytest.raises(ValueError, match="guide=None"):
        export(model, model.guide, (X, y))
    with pytest.raises(ValueError, match="guide is required"):
        export(model.model, None, (X, y))
    with pytest.raises(ValueError, match="multiple of num_chains"):
        export(model, data=(X, y), num_samples=10, num_chains=4)
    with pytest.raises(ValueError, match="num_samples"):
        export(model, data=(X, y), num_samples=0)
