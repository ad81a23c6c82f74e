"""SVI on the model/guide pairs updates every parameter: kernel, inducing inputs, q(u), likelihood."""
import numpy as np
import pytest

from test_parity import build


@pytest.mark.parametrize("name", ["gaussian", "studentt"])
@pytest.mark.parametrize("mean_field", [False, True])
def test_svi_trains_every_parameter(backend, name, mean_field):
    model, X, y = build(backend, name, whiten=True, diagonal=False)
    before = backend.numpy(model.elbo(X, y))
    losses, params = backend.train(model.model, model.guide, (X, y), steps=60, lr=0.02, mean_field=mean_field,
                                   kwargs={"subsample_size": 10})
    expected = {"gp.q_mu", "gp.q_sqrt", "gp.features.Z", "gp.kernel.lengthscale", "gp.kernel.variance"}
    expected |= {"likelihood.variance"} if name == "gaussian" else {"likelihood.df", "likelihood.scale"}
    assert set(params) == expected
    initial = {"likelihood.variance": 0.2, "likelihood.df": 3.0, "likelihood.scale": 0.5, "gp.kernel.variance": 1.3}
    for key, value in initial.items():
        if key in params:
            assert not np.allclose(params[key], value), key
    assert np.mean(losses[-10:]) < -before
