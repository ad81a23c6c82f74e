"""The minibatch ELBO is an unbiased estimate of the full-batch ELBO; plate scaling is N / B."""
import numpy as np
import pytest

from test_parity import build

# 500 replicates (was 2000; Pyro pays one trace per replicate): the false-failure rate of |z| < 4
# does not depend on R, and the power assert below keeps a 6 % bias detectable (measured at
# 4 sd / sqrt(R): 4.1 % of the ELBO for gaussian, 3.4 % for bernoulli_logit); a plate scale off
# by one batch row (N / (B + 1)) moves the data term by 14 %
R, B = 500, 6


@pytest.mark.parametrize("name", ["gaussian", "bernoulli_logit"])
def test_minibatch_elbo_is_unbiased(backend, name):
    model, X, y = build(backend, name, whiten=True, diagonal=False)
    full = float(backend.numpy(model.elbo(X, y)))
    estimates = -backend.losses(model.model, model.guide, X, y, replicates=R, subsample_size=B)
    assert estimates.std() > 1.0  # the batches really differ
    assert 4 * estimates.std() / np.sqrt(R) < 0.06 * abs(full)  # power: a 6 % bias gives |z| > 4
    z = (estimates.mean() - full) / (estimates.std() / np.sqrt(R))
    assert abs(z) < 4.0, z


def test_external_minibatch_is_scaled(backend):
    """With ``num_data`` a minibatch contributes (N / B) * its expected log-likelihood."""
    model, X, y = build(backend, "gaussian", whiten=True, diagonal=False)
    N = X.shape[0]
    batched = backend.lib.GPModel(model.prior, model.likelihood, num_data=N)
    idx = np.arange(5, 5 + B)
    lik = backend.bound(model.likelihood)
    mean, var = model.predict_f(X[idx])
    ell = float(backend.numpy(lik.expected_log_prob(y[idx], mean, var).sum()))
    kl = float(backend.numpy(backend.bound(model.prior).posterior().kl()))
    expected = N / B * ell - kl
    assert -backend.loss(batched.model, batched.guide, X[idx], y[idx]) == pytest.approx(expected, rel=1e-10)
    assert float(backend.numpy(batched.elbo(X[idx], y[idx]))) == pytest.approx(expected, rel=1e-10)
    with pytest.raises(ValueError, match="num_data"):
        backend.lib.GPModel(model.prior, model.likelihood, num_data=N - 1).model(X, y)
    with pytest.raises(ValueError, match="subsample_size needs the full data set"):
        backend.loss(batched.model, batched.guide, X[idx], y[idx], subsample_size=3)


def test_data_plate_refuses_more_rows_than_num_data(backend):
    """The objectives' shared plate (each objective also checks its own data first, with its names)."""
    from sparsegp_common.objectives import data_plate

    with pytest.raises(ValueError, match="the data have 10 rows, more than num_data=9"):
        with data_plate(backend.lib.sites, "data", 10, num_data=9):
            pass
