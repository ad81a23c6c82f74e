"""Cholesky with jitter escalation, float32/float64, factorising Kuu in float64, devices, gradients."""
import jax
import numpy as np
import pytest
import torch
from jax.test_util import check_grads
from numpyro import handlers
from numpyro.infer.util import biject_to, transform_fn

import reference as ref
from backends import NumPyroBackend, PyroBackend
from test_parity import build
from test_svgp import KERN, problem


def test_jitter_escalation(backend):
    v = np.array([1.0, 2.0, 3.0])
    A = backend.array(np.outer(v, v))  # rank one: not positive definite without jitter
    L = backend.numpy(backend.lib.cholesky(A, jitter=0.0))
    added = (L @ L.T - np.outer(v, v))[0, 0]
    assert added > 0
    np.testing.assert_allclose(L @ L.T, np.outer(v, v) + added * np.eye(3), atol=1e-12)
    with pytest.raises(backend.lib.CholeskyError, match="float64"):
        backend.lib.cholesky(backend.array(-np.eye(3)))


def test_jitter_escalation_under_jit():
    """Traced: the same escalation through lax.cond; a final failure gives NaN, not an error."""
    import numpyro_sparsegp as nsg

    chol = jax.jit(lambda A: nsg.cholesky(A, jitter=0.0))
    v = np.array([1.0, 2.0, 3.0])
    L = np.asarray(chol(np.outer(v, v)))
    np.testing.assert_allclose(L, np.asarray(nsg.cholesky(np.outer(v, v), jitter=0.0)))
    assert np.isnan(np.asarray(chol(-np.eye(2)))).any()


def test_cholesky_in_float64_inside_float32(backend):
    """An 80-point grid Gram matrix: factorised in float64 and returned in float32 (torch's
    float32 Cholesky fails on it at this jitter, or on some CPUs succeeds with an error of 1e-2)."""
    Z = np.arange(80)[:, None] * 0.05
    K32 = ref.kernel("rbf", Z, Z, 1.0, 1.0).astype(np.float32)
    L = backend.lib.cholesky(backend.array(K32, np.float32), jitter=1e-6, max_tries=0, dtype=backend.array(0.0).dtype)
    assert str(L.dtype).endswith("float32")
    expected = np.linalg.cholesky(K32.astype(np.float64) + 1e-6 * np.eye(80)).astype(np.float32)
    np.testing.assert_allclose(backend.numpy(L), expected, rtol=1e-6, atol=1e-7)
    if backend.name == "pyro":
        try:
            L32 = backend.lib.cholesky(backend.array(K32, np.float32), jitter=1e-6, max_tries=0)
        except backend.lib.CholeskyError:
            return
        assert np.abs(backend.numpy(L32) - expected).max() > 1e3 * np.abs(backend.numpy(L) - expected).max()


@pytest.mark.parametrize("cholesky_dtype", [None, "float64"])
def test_float32_model_matches_float64(backend, rng, cholesky_dtype):
    X, Z, q_mu, q_sqrt = problem(rng)
    y = rng.normal(size=len(X))
    values = {}
    for dtype in (np.float32, np.float64):
        backend.reset()
        kernel = backend.lib.Matern52(lengthscale=backend.array(KERN[1], dtype), variance=KERN[2])
        c64 = backend.array(0.0).dtype if cholesky_dtype else None
        gp = backend.lib.SVGP(kernel, backend.array(Z, dtype), cholesky_dtype=c64)
        for name, value in (("q_mu", q_mu), ("q_sqrt", q_sqrt)):
            setattr(gp, name, backend.array(value, dtype))
        model = backend.lib.GPModel(gp, backend.lib.Gaussian(variance=0.2))
        elbo = model.elbo(backend.array(X, dtype), backend.array(y, dtype))
        mean, var = model.predict_f(backend.array(X, dtype))
        assert str(elbo.dtype).endswith(np.dtype(dtype).name) and str(mean.dtype).endswith(np.dtype(dtype).name)
        values[dtype] = [backend.numpy(a).astype(float) for a in (elbo, mean, var)]
    for a, b in zip(values[np.float32], values[np.float64]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pyro_follows_cuda_inputs(rng):
    backend = PyroBackend()
    X, Z, _, _ = problem(rng)
    gp = backend.lib.SVGP(backend.lib.RBF(lengthscale=1.0), torch.tensor(Z, device="cuda"))
    model = backend.lib.GPModel(gp, backend.lib.Gaussian())
    Xc = torch.tensor(X, device="cuda")
    assert model.elbo(Xc, torch.zeros(len(X), device="cuda", dtype=Xc.dtype)).device.type == "cuda"
    assert model.predict_f(Xc)[0].device.type == "cuda"


@pytest.mark.parametrize("name", ["gaussian", "bernoulli_logit"])
@pytest.mark.parametrize("whiten", [True, False])
def test_pyro_gradients_match_finite_differences(name, whiten):
    backend = PyroBackend()
    backend.reset()
    model, X, y = build(backend, name, whiten=whiten, diagonal=False)
    params = [p for p in list(model.prior.parameters()) + list(model.likelihood.parameters())]
    elbo = model.elbo(X, y)
    grads = torch.autograd.grad(elbo, params)
    eps = 1e-6
    for p, g in zip(params, grads):
        flat = p.data.view(-1)
        for i in range(0, flat.numel(), max(1, flat.numel() // 6)):
            old = flat[i].item()
            flat[i] = old + eps
            up = model.elbo(X, y).item()
            flat[i] = old - eps
            down = model.elbo(X, y).item()
            flat[i] = old
            assert g.view(-1)[i].item() == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ["gaussian", "bernoulli_logit"])
@pytest.mark.parametrize("whiten", [True, False])
def test_numpyro_gradients_match_finite_differences(name, whiten):
    backend = NumPyroBackend()
    model, X, y = build(backend, name, whiten=whiten, diagonal=False)
    sites = {k: v for k, v in handlers.trace(model.elbo).get_trace(X, y).items() if v["type"] == "param"}
    # differentiate w.r.t. the unconstrained values, as SVI does
    transforms = {k: biject_to(site["kwargs"]["constraint"]) for k, site in sites.items()}
    unconstrained = {k: transforms[k].inv(site["value"]) for k, site in sites.items()}
    f = lambda u: handlers.substitute(model.elbo, data=transform_fn(transforms, u))(X, y)  # noqa: E731
    check_grads(f, (unconstrained,), order=1, modes=["rev"], eps=1e-6, atol=1e-5, rtol=1e-5)
