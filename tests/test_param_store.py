"""Pyro: library modules own their parameters and Pyro's global param store mirrors them.

Two models with the same name keep their own values, the store's ``save``/``load`` keep a trained
GP (the store follows the module last used under a name), two components with one name in one
model are an error, a user's ``pyro.param`` sites and autoguides train next to a GP prior with
``fit`` and with plain SVI, and ``params=``, ``FitResult.params`` and checkpoints still address
the parameters by name."""
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroSample

import pyro_sparsegp as psg
from pyro_sparsegp.sites import active

OFFSET = 0.7


@pytest.fixture(autouse=True)
def fresh():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)


def truth(X):
    return torch.sin(2 * X[:, 0]) + OFFSET


def data(fn=truth, n=120):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 1, generator=g, dtype=torch.float64) * 6 - 3
    return X, fn(X) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


def regression(lengthscale=1.0, name="gp"):
    Z = torch.linspace(-3, 3, 8, dtype=torch.float64)[:, None]
    kernel = psg.SquaredExponential(lengthscale=torch.tensor([lengthscale], dtype=torch.float64))
    return psg.GPModel(psg.SVGP(kernel, Z, name=name), psg.Gaussian(variance=0.1))


def read(name, *modules):
    """The parameter ``name`` (``gp.kernel.lengthscale``) as a model run reads it: inside the
    context of the module among ``modules`` that the name starts with."""
    root, *path = name.split(".")
    obj = next(m for m in modules if m.name == root)
    with active(obj), torch.no_grad():
        for attribute in path:
            obj = getattr(obj, attribute)
        return obj.clone()


def own_names(names):
    return {n for n in names if n.startswith(("gp.", "likelihood."))}


def test_two_models_with_one_name_keep_their_own_values():
    first = regression(lengthscale=1.0)
    assert float(read("gp.kernel.lengthscale", first.prior)) == pytest.approx(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no clash to warn about
        second = regression(lengthscale=2.5)
    assert float(read("gp.kernel.lengthscale", second.prior)) == pytest.approx(2.5)
    assert float(read("gp.kernel.lengthscale", first.prior)) == pytest.approx(1.0)
    # the store follows the module last read under each name
    assert float(pyro.param("gp.kernel.lengthscale").detach()) == pytest.approx(1.0)


def test_a_value_set_inside_a_model_run_is_read_again():
    """A parameter assigned during a model run, after the run has read it, is read again: the new
    value, not the one the run read first."""
    gp = regression().prior
    with active(gp), torch.no_grad():
        assert float(gp.kernel.lengthscale) == pytest.approx(1.0)
        gp.kernel.lengthscale = torch.tensor([2.5], dtype=torch.float64)
        assert float(gp.kernel.lengthscale) == pytest.approx(2.5)


def test_the_store_maps_each_tensor_to_its_name_as_modules_take_turns(tmp_path):
    """Pyro's store keeps name -> tensor and tensor -> name: as modules with one name take turns,
    the two agree (no replaced tensor is left behind); after ``load`` the reading module's tensor
    is the entry, both ways (Pyro's ``load`` itself leaves the replaced tensors in the second map)."""
    store, name = pyro.get_param_store(), "gp.kernel.lengthscale"
    first, second = regression(1.0), regression(2.5)
    for model in (first, second, first):
        read(name, model.prior)
        assert {id(t): n for t, n in store._param_to_name.items()} == {id(t): n for n, t in store._params.items()}
    store.save(tmp_path / "store.pt")
    store.load(tmp_path / "store.pt")
    assert float(read(name, second.prior)) == pytest.approx(1.0)  # the loaded value
    own = second.prior.kernel.lengthscale_unconstrained
    assert store._params[name] is own and store._param_to_name[own] == name


def test_models_with_one_name_trained_separately_do_not_interfere():
    X, y = data()
    first = regression()
    trained = psg.fit(first.model, first.guide, (X, y), num_steps=40, lr=0.05, progress=False)
    before = first.predict_f(X[:5])
    second = regression()
    assert float(read("gp.kernel.lengthscale", second.prior)) == pytest.approx(1.0)  # not the trained value
    X2, y2 = data(lambda X: torch.cos(3 * X[:, 0]))
    other = psg.fit(second.model, second.guide, (X2, y2), num_steps=40, lr=0.05, progress=False)
    for a, b in zip(first.predict_f(X[:5]), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name, value in trained.params.items():
        torch.testing.assert_close(read(name, first.prior, first.likelihood), value, msg=name)
        assert not torch.allclose(other.params[name], value), name
    torch.testing.assert_close(first.predict_f(X[:5], params=other.params)[0], second.predict_f(X[:5])[0])


def user_model(gp, batch=40):
    """The GP prior inside a user's model: its own ``pyro.param`` offset and an autoguided noise."""

    def model(X, y):
        offset = pyro.param("offset", torch.tensor(0.0, dtype=torch.float64))
        plate = pyro.plate("data", len(X), subsample_size=batch)
        f = gp.model(X, plate)
        noise = pyro.sample("noise", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
        with plate as idx:
            pyro.sample("y", dist.Normal(f + offset, noise), obs=y[idx])

    autoguide = AutoNormal(poutine.block(model, hide=list(gp.site_names)))

    def guide(X, y):
        gp.guide(X, pyro.plate("data", len(X), subsample_size=batch))
        autoguide(X, y)

    return model, guide


def check_user_training(gp, names, X):
    store = pyro.get_param_store()
    assert {"offset", "AutoNormal.locs.noise", "AutoNormal.scales.noise"} <= set(store.keys())
    own = dict(gp.named_parameters(prefix="gp"))
    for name in ("gp.kernel.lengthscale", "gp.q_mu"):  # the store holds the prior's own tensors
        assert store._params[name] is own[f"{name}_unconstrained"]
    assert {"gp.kernel.lengthscale", "gp.q_mu", "offset", "AutoNormal.locs.noise"} <= set(names)
    assert float(read("gp.kernel.lengthscale", gp)) != pytest.approx(1.0)  # trained in the module
    offset = pyro.param("offset").detach()
    assert float(offset) != 0.0
    fitted = psg.predict_f(gp, X)[0] + offset  # the GP and the user's offset were trained together
    assert float(((fitted - truth(X)) ** 2).mean().sqrt()) < 0.15


def test_user_model_with_params_and_autoguide_trains_with_fit():
    X, y = data()
    gp = regression().prior
    model, guide = user_model(gp)
    result = psg.fit(model, guide, (X, y), num_steps=300, lr=0.05, progress=False)
    assert result.losses[-20:].mean() < result.losses[:20].mean()
    check_user_training(gp, result.params, X)
    torch.testing.assert_close(result.params["gp.kernel.lengthscale"], read("gp.kernel.lengthscale", gp))
    torch.testing.assert_close(result.params["offset"], pyro.param("offset").detach())


def test_user_model_with_params_and_autoguide_trains_with_plain_svi():
    X, y = data()
    gp = regression().prior
    model, guide = user_model(gp)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), pyro.infer.Trace_ELBO())
    losses = np.array([svi.step(X, y) for _ in range(300)])
    assert losses[-20:].mean() < losses[:20].mean()
    with poutine.trace(param_only=True) as params:
        svi.evaluate_loss(X, y)
    check_user_training(gp, params.trace.nodes, X)


def test_params_substitute_into_a_fresh_model_and_checkpoints_round_trip(tmp_path):
    X, y = data()
    model = regression()
    path = str(tmp_path / "ckpt")
    result = psg.fit(model.model, model.guide, (X, y), num_steps=30, lr=0.05, checkpoint=path, progress=False)
    fresh = regression()
    trained = model.predict_y(X[:6])
    torch.testing.assert_close(tuple(fresh.predict_y(X[:6], params=result.params)[:2]), tuple(trained[:2]))
    assert not torch.allclose(fresh.predict_f(X[:6])[0], trained.mean)
    sample = fresh.sample_f(X[:6], 3, params=result.params)
    torch.testing.assert_close(sample, model.sample_f(X[:6], 3))
    # resuming the finished run loads the checkpoint into the fresh model by name, training nothing more
    resumed = psg.fit(fresh.model, fresh.guide, (X, y), num_steps=30, lr=0.05, checkpoint=path, resume=True,
                      progress=False)
    np.testing.assert_array_equal(resumed.losses, result.losses)
    for name, value in result.params.items():
        torch.testing.assert_close(resumed.params[name], value, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(tuple(fresh.predict_y(X[:6])[:2]), tuple(trained[:2]))


def test_a_loaded_store_of_another_shape_is_a_clear_error(tmp_path):
    """The store saved from a GP with 8 inducing inputs, loaded beside one with 6 under the same
    name: its first read names the parameter and both shapes (and keeps its own values)."""
    path = str(tmp_path / "store")
    regression().predict_f(data()[0][:3])  # its parameters enter the store
    pyro.get_param_store().save(path)
    pyro.clear_param_store()
    kernel = psg.SquaredExponential(lengthscale=torch.tensor([1.0], dtype=torch.float64))
    smaller = psg.GPModel(psg.SVGP(kernel, torch.linspace(-3, 3, 6, dtype=torch.float64)[:, None]), psg.Gaussian())
    pyro.get_param_store().load(path)
    with pytest.raises(ValueError, match=r"holds 'gp\.\w+(\.\w+)?' with shape \(8.*shape \(6.*build the component"):
        smaller.predict_f(data()[0][:3])


def additive(first, second):
    """A user's model with two components: ``f = f_1 + f_2``."""
    def model(X, y):
        plate = pyro.plate("data", len(X))
        f = first.model(X, plate) + second.model(X, plate)
        with plate:
            pyro.sample("y", dist.Normal(f, 0.1), obs=y)

    return model


def test_two_components_with_one_name_in_one_model_are_an_error():
    X, y = data()
    first = regression().prior
    with pytest.raises(ValueError, match="two components named 'gp' in one model"):
        poutine.trace(additive(first, regression(lengthscale=2.0).prior)).get_trace(X, y)
    trace = poutine.trace(additive(first, regression(name="gp2").prior)).get_trace(X, y)
    assert {"gp.u", "gp2.u"} <= set(trace.nodes)


def test_a_hyperprior_is_drawn_once_outside_the_data_plate():
    """A ``PyroSample`` lengthscale of a whitened component (whose model reads the kernel only
    inside the plate) is one global draw in the component's model and guide and in ``GPModel``."""
    X, y = data()
    gp = regression().prior
    gp.kernel.lengthscale = PyroSample(dist.LogNormal(0.0, 1.0).expand([1]).to_event(1))

    def model(X, y):
        data = pyro.plate("data", len(X), subsample_size=40)
        f = gp.model(X, data)
        with data as idx:
            pyro.sample("y", dist.Normal(f, 0.1), obs=y[idx])

    def guide(X, y):
        gp.guide(X, pyro.plate("data", len(X), subsample_size=40))

    for fn in (model, guide, psg.GPModel(gp, psg.Gaussian(variance=0.1), num_data=len(X)).model):
        site = poutine.trace(fn).get_trace(X, y).nodes["gp.kernel.lengthscale"]
        assert site["value"].shape == (1,) and not site["cond_indep_stack"]
