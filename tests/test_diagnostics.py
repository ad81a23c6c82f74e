"""ArviZ export: groups, named dims, pointwise log-likelihoods against an independent computation,
posterior draws against the predictive moments, and ``az.loo``/``az.waic``/``az.summary`` on it,
under ArviZ 0.x and 1.x."""
import arviz as az
import numpy as np
import pytest
from scipy import stats

from arviz_versions import ARVIZ_1, groups, loo

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
    assert {"posterior", "posterior_predictive", "log_likelihood", "observed_data", "sample_stats"} <= groups(idata)
    assert idata.posterior["gp.u"].dims == ("chain", "draw", "gp.u_dim_0")
    assert idata.posterior["gp.f"].dims == ("chain", "draw", "data")
    assert idata.log_likelihood["y"].shape == (4, 100, N)
    np.testing.assert_array_equal(idata.observed_data["y"].values, backend.numpy(y))
    np.testing.assert_allclose(idata.sample_stats["elbo"].values, -result.losses)
    np.testing.assert_array_equal(idata.sample_stats["step"].values, np.arange(1, len(result.losses) + 1))

    # log p(y_n | f_n) of each draw, recomputed here from the exported f draws
    f = idata.posterior["gp.f"].values
    noise = float(backend.numpy(result.params["likelihood.variance"]))
    expected = stats.norm.logpdf(backend.numpy(y), f, np.sqrt(noise))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-10, atol=1e-14)

    # the f draws are draws of q(f_n); y draws add the noise
    mean, var = (backend.numpy(a) for a in model.predict_f(X, params=result.params))
    S = 400
    z = (f.reshape(S, N).mean(0) - mean) / np.sqrt(var / S)
    assert np.mean(np.abs(z) < 3.3) > 0.97
    y_draws = idata.posterior_predictive["y"].values.reshape(S, N)
    ratio = y_draws.var(0).mean() / (var + noise).mean()
    assert 0.9 < ratio < 1.1

    n, elpd = loo(idata)
    assert n == N and np.isfinite(elpd)
    if not ARVIZ_1:  # ArviZ 1.x has no WAIC
        assert np.isfinite(az.waic(idata).elpd_waic)
    summary = az.summary(idata, var_names=["gp.u"])
    assert len(summary) == M and summary["r_hat"].between(0.95, 1.05).all()


def test_user_model_export(backend, fitted):
    model, X, y, result = fitted
    user_model, user_guide = backend.user_model(model.prior, NOISE, subsample_size=None)
    idata = backend.lib.to_inference_data(user_model, user_guide, (X, y), num_samples=40, num_chains=2, seed=1, result=result)
    assert set(idata.posterior.data_vars) == {"gp.u", "gp.f"}
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    expected = stats.norm.logpdf(backend.numpy(y), idata.posterior["gp.f"].values, np.sqrt(NOISE))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-10, atol=1e-14)
    again = backend.lib.to_inference_data(user_model, user_guide, (X, y), num_samples=40, num_chains=2, seed=1, result=result)
    np.testing.assert_array_equal(again.posterior["gp.f"].values, idata.posterior["gp.f"].values)
    other = backend.lib.to_inference_data(user_model, user_guide, (X, y), num_samples=40, num_chains=2, seed=2, result=result)
    assert not np.any(other.posterior["gp.f"].values == idata.posterior["gp.f"].values)


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
    with pytest.raises(ValueError, match="no observed sites"):
        export(model, data=(X, None), num_samples=4)


GROUPS, ROWS, BATCH = 5, 70, 16  # 70 rows in batches of 16: the last batch wraps round


@pytest.fixture
def hierarchical(backend):
    """A user's hierarchical Bernoulli model with a subsampling plate, briefly trained."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (ROWS, 1))
    g = rng.integers(0, GROUPS, ROWS)
    y = (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-np.sin(2 * X[:, 0]) - 0.5 * (g - 2)))).astype(float)
    data = (backend.array(X), backend.array(g, dtype=np.int64), backend.array(y))

    def build(vectorised=True):
        gp = backend.svgp(X[:M].copy())
        return backend.hierarchical_model(gp, GROUPS, BATCH, vectorised=vectorised)

    model, guide = build()
    result = backend.lib.fit(model, guide, data, num_steps=30, lr=0.05, progress=False)
    return build, model, guide, data, (g, y), result


def _recomputed_log_lik(idata, g, y):
    """log p(y_n | f_n, effect_g(n)) of each draw, from the exported draws."""
    logits = idata.posterior["gp.f"].values + idata.posterior["effect"].values[..., g]
    return stats.bernoulli.logpmf(y, 1 / (1 + np.exp(-logits)))


def test_export_walks_the_full_data_of_a_subsampling_plate(backend, hierarchical):
    _, model, guide, data, (g, y), result = hierarchical
    idata = backend.lib.to_inference_data(model, guide, data, num_samples=40, num_chains=2, seed=1, result=result)
    assert idata.log_likelihood["y"].shape == (2, 20, ROWS)
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, _recomputed_log_lik(idata, g, y), rtol=1e-10)
    # the posterior: the model's latent sites, constrained, without the autoguide's internals
    assert {k: v.dims for k, v in idata.posterior.data_vars.items()} == {
        "scale": ("chain", "draw"), "effect": ("chain", "draw", "groups"),
        "gp.u": ("chain", "draw", "gp.u_dim_0"), "gp.f": ("chain", "draw", "data"),
    }
    assert (idata.posterior["scale"].values > 0).all()
    # independent draws (the recomputation above holds only if every batch saw the same effects)
    assert np.unique(idata.posterior["scale"].values).size == 40
    # each batch draws its rows afresh: q(f_n)'s draws at rows n and n + BATCH are uncorrelated
    f = idata.posterior["gp.f"].values.reshape(40, ROWS)
    corr = [np.corrcoef(f[:, n], f[:, n + BATCH])[0, 1] for n in range(BATCH)]
    assert np.max(np.abs(corr)) < 0.9
    assert idata.posterior_predictive["y"].shape == (2, 20, ROWS)
    n, elpd = loo(idata)
    assert n == ROWS and np.isfinite(elpd)


def test_export_draws_one_at_a_time_where_the_model_does_not_vectorise(backend, hierarchical):
    build, _, _, data, (g, y), result = hierarchical
    model, guide = build(vectorised=False)
    if backend.name == "pyro":
        with pytest.warns(UserWarning, match="could not be run for all draws at once"):
            idata = backend.lib.to_inference_data(model, guide, data, num_samples=8, num_chains=2, result=result)
    else:
        idata = backend.lib.to_inference_data(model, guide, data, num_samples=8, num_chains=2, result=result)
    serial = backend.lib.to_inference_data(model, guide, data, num_samples=8, num_chains=2, result=result, parallel=False)
    for exported in (idata, serial):
        assert exported.log_likelihood["y"].shape == (2, 4, ROWS)
        np.testing.assert_allclose(exported.log_likelihood["y"].values, _recomputed_log_lik(exported, g, y), rtol=1e-10)
    assert set(serial.posterior.data_vars) == set(idata.posterior.data_vars)
    for exported in (idata, serial):  # drawn from the likelihood, not the observations copied
        drawn = exported.posterior_predictive["y"].values
        assert set(np.unique(drawn)) <= {0.0, 1.0} and 0.05 < np.mean(drawn != y) < 0.95


def test_export_takes_numbers_among_the_data(backend):
    """A model argument that is a number (here the plate's subsample size and the group count)
    stays a number: NumPyro compiles its draws with the arrays as inputs, the rest as given."""
    ppl, D = backend.ppl, backend.ppl.distributions
    rng = np.random.default_rng(4)
    X = rng.uniform(-2, 2, (ROWS, 1))
    g, y = rng.integers(0, GROUPS, ROWS), rng.standard_normal(ROWS)
    gp = backend.svgp(X[:M].copy())

    def model(X, g, y, num_groups, batch):
        with ppl.plate("groups", num_groups):
            effect = ppl.sample("effect", D.Normal(0.0, 1.0))
        data = ppl.plate("data", len(X), subsample_size=batch)
        f = gp.model(X, data)
        with data as idx:
            ppl.sample("y", D.Normal(f + effect[..., g[idx]], 0.5), obs=y[idx])

    def guide(X, g, y, num_groups, batch):
        gp.guide(X, ppl.plate("data", len(X), subsample_size=batch))
        with ppl.plate("groups", num_groups):
            ppl.sample("effect", D.Normal(backend.array(np.zeros(num_groups)), 0.1))

    data = (backend.array(X), backend.array(g, dtype=np.int64), backend.array(y), GROUPS, BATCH)
    idata = backend.lib.to_inference_data(model, guide, data, num_samples=6, num_chains=2)
    assert idata.posterior["effect"].shape == (2, 3, GROUPS)
    assert idata.log_likelihood["y"].shape == (2, 3, ROWS)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)


def test_a_second_export_sees_further_training(backend, hierarchical):
    """Without ``result``, the export reads the values the objects hold: after more training, the
    next export of the same model and guide (NumPyro: the same compiled programs) draws from them."""
    _, model, guide, data, _, result = hierarchical
    first = backend.lib.to_inference_data(model, guide, data, num_samples=40, seed=1)
    backend.lib.fit(model, guide, data, num_steps=60, lr=0.1, progress=False)
    second = backend.lib.to_inference_data(model, guide, data, num_samples=40, seed=1)
    assert not np.allclose(first.posterior["gp.u"].values, second.posterior["gp.u"].values)
    again = backend.lib.to_inference_data(model, guide, data, num_samples=40, seed=1)
    np.testing.assert_allclose(again.posterior["gp.u"].values, second.posterior["gp.u"].values)


def test_numpyro_export_runs_a_set_up_guide_only_compiled():
    """NumPyro traces the model and guide for their sites and then runs them compiled: a guide
    whose autoguide is set up (by ``fit``) never runs op by op (each operation compiled on its
    own), one that is not yet set up runs once eagerly first (its set-up needs values)."""
    import jax
    from backends import NumPyroBackend

    backend = NumPyroBackend()
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (ROWS, 1))
    data = (backend.array(X), backend.array(rng.integers(0, GROUPS, ROWS), dtype=np.int64),
            backend.array(rng.integers(0, 2, ROWS)))
    for fitted in (True, False):
        model, guide = backend.hierarchical_model(backend.svgp(X[:M].copy()), GROUPS, BATCH)
        calls = []

        def counted(X, g, y):
            calls.append(not isinstance(X, jax.core.Tracer))  # True: run eagerly
            guide(X, g, y)

        result = backend.lib.fit(model, counted, data, num_steps=2, progress=False) if fitted else None
        calls.clear()
        idata = backend.lib.to_inference_data(model, counted, data, num_samples=4, num_chains=2, result=result)
        assert idata.log_likelihood["y"].shape == (2, 2, ROWS)
        assert calls.count(True) == (0 if fitted else 1) and calls.count(False) >= 2


def test_both_backends_export_the_same_variables_and_dims():
    from backends import NumPyroBackend, PyroBackend

    layouts = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        rng = np.random.default_rng(3)
        X = rng.uniform(-2, 2, (ROWS, 1))
        data = (backend.array(X), backend.array(rng.integers(0, GROUPS, ROWS), dtype=np.int64),
                backend.array(rng.integers(0, 2, ROWS)))
        model, guide = backend.hierarchical_model(backend.svgp(X[:M].copy()), GROUPS, BATCH)
        idata = backend.lib.to_inference_data(model, guide, data, num_samples=4, num_chains=2)
        layouts.append({group: {k: v.dims for k, v in idata[group].data_vars.items()}
                        for group in ("posterior", "posterior_predictive", "log_likelihood", "observed_data")})
    assert layouts[0] == layouts[1]


def test_more_than_one_subsampling_plate_is_refused():
    from sparsegp_common.inference.diagnostics import full_data_chunks, subsampling_plate

    assert subsampling_plate({("data", 10, None), ("groups", 3, 3)}) is None
    assert subsampling_plate({("data", 10, 4), ("groups", 3, None)}) == ("data", 10, 4)
    with pytest.raises(ValueError, match="'a', 'b' all subsample.*subsample_size=None"):
        subsampling_plate({("a", 10, 4), ("b", 8, 2)})
    np.testing.assert_array_equal(full_data_chunks(5, 2), [[0, 1], [2, 3], [4, 0]])


def test_site_dims_name_each_plate_at_its_own_axis():
    """A value ``(3, 4, 5)`` with one event dimension inside plates at dims -2 and -1: the plates
    name the two batch axes in order; a plate beyond the value's batch axes names none."""
    from sparsegp_common.inference.diagnostics import plate_axis, site_dims

    assert site_dims("s", (3, 4, 5), 1, [("outer", -2), ("inner", -1)]) == ["outer", "inner", "s_dim_2"]
    assert site_dims("s", (4, 5), 1, [("outer", -2), ("inner", -1)]) == ["inner", "s_dim_1"]
    assert [plate_axis((3, 4, 5), 1, dim) for dim in (-1, -2, -3, None)] == [1, 0, None, None]
