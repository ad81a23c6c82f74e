"""Cholesky with jitter escalation, float32/float64, factorising Kuu in float64, devices, gradients."""
import contextlib
import subprocess
import sys

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


@pytest.mark.parametrize("max_tries", [1, 2, 3])
def test_jitter_escalation_takes_max_tries_levels(backend, max_tries):
    """``max_tries`` tenfold escalations after the first jitter: a matrix whose smallest eigenvalue
    is -5e-5 fails at 1e-6 and 1e-5 and factorises at 1e-4, the second escalation."""
    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]
    A = (Q * np.array([1.0, 0.5, -5e-5])) @ Q.T
    if max_tries < 2:
        with pytest.raises(backend.lib.CholeskyError):
            backend.lib.cholesky(backend.array(A), jitter=1e-6, max_tries=max_tries)
        return
    L = backend.numpy(backend.lib.cholesky(backend.array(A), jitter=1e-6, max_tries=max_tries))
    np.testing.assert_allclose(L @ L.T, A + 1e-4 * np.eye(3), atol=1e-12)


def test_a_component_run_eagerly_raises_the_failed_factorisation(backend):
    """Coincident inducing inputs, a large variance and no jitter: every level of the escalation
    fails. Run eagerly (NumPyro: through one compiled program, whose NaN is run again eagerly),
    the error with its advice is raised, not NaN: Pyro's when the component is built (finding its
    shapes runs the factorisation), NumPyro's when the guide runs."""
    X = backend.array(np.linspace(-2, 2, 12)[:, None])
    with pytest.raises(backend.lib.CholeskyError, match="duplicate"):
        gp = backend.lib.SVGP(backend.kernel("rbf", [1.0], 1e6), backend.array(np.zeros((6, 1))), jitter=0.0)
        backend.trace(gp.guide, X)


def test_jitter_escalation_under_jit():
    """Traced: the same escalation through a loop; a final failure gives NaN, not an error; under
    ``vmap`` each matrix keeps the first level that factorises it."""
    import numpyro_sparsegp as nsg

    chol = jax.jit(lambda A: nsg.cholesky(A, jitter=0.0))
    v = np.array([1.0, 2.0, 3.0])
    L = np.asarray(chol(np.outer(v, v)))
    np.testing.assert_allclose(L, np.asarray(nsg.cholesky(np.outer(v, v), jitter=0.0)))
    assert np.isnan(np.asarray(chol(-np.eye(2)))).any()
    both = np.asarray(jax.vmap(chol)(np.stack([np.outer(v, v), np.diag(v)])))
    np.testing.assert_allclose(both[0], L)
    np.testing.assert_allclose(both[1], np.diag(np.sqrt(v)))


def test_vmapped_factorisations_finish():
    """``jit(vmap(cholesky))`` over 400 matrices (a Predictive over sampled lengthscales does
    this): with the retries as nested ``lax.cond``, ``vmap`` ran them as selects, four batched LAPACK
    calls at once, which jaxlib 0.10's CPU thread pool deadlocked on within a few calls. In a child
    process with a time limit, so that a hang fails the test instead of the run."""
    code = (
        "import jax, jax.numpy as jnp, numpy as np; import numpyro_sparsegp as nsg\n"
        "X = np.random.default_rng(0).normal(size=(400, 64, 3))\n"
        "A = jnp.asarray(np.exp(-0.5 * ((X[:, :, None] - X[:, None]) ** 2).sum(-1)) + 1e-3 * np.eye(64), jnp.float32)\n"
        "chol = jax.jit(jax.vmap(nsg.cholesky))\n"
        "for _ in range(20):\n"
        "    L = chol(A).block_until_ready()\n"
        "assert np.allclose(L @ L.mT, A + 1e-6 * np.eye(64), atol=1e-4)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


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


def close_pair_gram():
    """``k(Z, Z)`` (Matern-5/2, lengthscale 2) of 20 inputs on [0, 30] with a pair 0.005 apart, as
    inducing inputs taken from the data often are: condition number about 1e6, within what float32
    factorises but not accurately; and ``b``, ``(20, 3)``."""
    rng = np.random.default_rng(0)
    Z = rng.uniform(0, 30, (20, 1))
    Z[1] = Z[0] + 0.005
    return ref.kernel("matern52", Z, Z, 2.0, 1.0) + 1e-6 * np.eye(20), rng.normal(size=(20, 3))


def x64_cases(backend):
    """NumPyro runs with jax_enable_x64 and without it (a user's float32 program), eager and jitted."""
    if backend.name == "pyro":
        return [(contextlib.nullcontext, lambda f: f)]
    return [(lambda: jax.enable_x64(x64), wrap) for x64 in (True, False) for wrap in (lambda f: f, jax.jit)]


def test_float64_factor_and_its_gradient_inside_float32(backend):
    """``cholesky(A32, dtype="float64")``: the factor and the gradient of ``|L^-1 b|^2`` with
    respect to ``A`` are float64's (to float32 rounding of the inputs), in NumPyro also without
    ``jax_enable_x64``; the float32 factorisation's gradient is over 100 times further off."""
    A, b = close_pair_gram()
    L64 = np.linalg.cholesky(A.astype(np.float32).astype(np.float64))
    x = np.linalg.solve(L64.T, np.linalg.solve(L64, b))
    G64 = -x @ x.T  # d|L^-1 b|^2 / dA = -A^-1 b b^T A^-1
    for context, wrap in x64_cases(backend):
        with context():
            def gradient(dtype):
                if backend.name == "pyro":
                    A32 = torch.tensor(A, dtype=torch.float32, requires_grad=True)
                    L = backend.lib.cholesky(A32, jitter=0.0, dtype=dtype)
                    (torch.linalg.solve_triangular(L, torch.tensor(b, dtype=torch.float32), upper=False) ** 2).sum().backward()
                    return L.detach().numpy(), A32.grad.numpy()

                def f(A32):
                    L = backend.lib.cholesky(A32, jitter=0.0, dtype=dtype)
                    return (jax.scipy.linalg.solve_triangular(L, jax.numpy.asarray(b, np.float32), lower=True) ** 2).sum(), L

                (_, L), g = wrap(jax.value_and_grad(f, has_aux=True))(jax.numpy.asarray(A, np.float32))
                return np.asarray(L), np.asarray(g)

            L, G = gradient("float64")
            assert L.dtype == np.float32 and G.dtype == np.float32
            np.testing.assert_allclose(L, L64.astype(np.float32), rtol=1e-6, atol=1e-7)
            error = np.linalg.norm(G - G64) / np.linalg.norm(G64)
            error32 = np.linalg.norm(gradient(None)[1] - G64) / np.linalg.norm(G64)
            assert error < 1e-4 and error32 > 100 * error, (error, error32)


def test_float32_svgp_factorises_kuu_in_float64_when_asked(backend):
    """``SVGP(cholesky_dtype="float64")``: its factor is the float64 factor of its float32 ``Kuu``,
    10 times closer to it than the default's (the model's dtype)."""
    rng = np.random.default_rng(0)
    Z = rng.uniform(0, 30, (20, 1))
    Z[1] = Z[0] + 0.005
    for context, _ in x64_cases(backend):
        with context():
            factors = {}
            for chol in ("float64", None):
                kwargs = {"cholesky_dtype": chol} if chol else {}
                gp = backend.bound(backend.lib.SVGP(backend.lib.Matern52(lengthscale=backend.array(2.0, np.float32)),
                                                    backend.array(Z, np.float32), **kwargs))
                factors[chol] = backend.numpy(gp.posterior_factor())
                K = backend.numpy(gp.kernel.K(gp.features.Z)).astype(np.float64)
            expected = np.linalg.cholesky(K + 1e-6 * np.eye(20))
            assert factors["float64"].dtype == factors[None].dtype == np.float32
            np.testing.assert_allclose(factors["float64"], expected, rtol=1e-5, atol=1e-6)
            assert np.abs(factors[None] - expected).max() > 10 * np.abs(factors["float64"] - expected).max()


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


@pytest.mark.parametrize("scale", [1.0, 30.0, 3e4])
def test_jax_cos_and_sin_in_float32_on_a_cpu(scale):
    """JAX's backend evaluates float32 ``cos`` and ``sin`` on a CPU by its own polynomials (XLA's
    are scalar library calls, several times slower): within a few ulps of the float64 values,
    eager and jitted, with exact derivatives of every order; other dtypes take JAX's own."""
    import jax.numpy as jnp

    from sparsegp_common.ops import _jax as ops

    x = (np.random.default_rng(0).normal(size=20000) * scale).astype(np.float32)
    x[:6] = [0.0, -0.0, np.pi / 2, -np.pi, 2 * np.pi, 1e-30]
    xs = jnp.asarray(x)
    for fn, exact, derivative in ((ops.cos, np.cos, lambda v: -np.sin(v)), (ops.sin, np.sin, np.cos)):
        for version in (fn, jax.jit(fn)):
            value = version(xs)
            assert value.dtype == jnp.float32
            np.testing.assert_allclose(np.asarray(value, np.float64), exact(x.astype(np.float64)), rtol=0, atol=5e-7)
        assert not np.array_equal(np.asarray(fn(xs)), np.asarray(getattr(jnp, fn.__name__)(xs)))  # the polynomial ran
        slope = jax.jit(jax.vmap(jax.grad(fn)))(xs)
        np.testing.assert_allclose(np.asarray(slope, np.float64), derivative(x.astype(np.float64)), rtol=0, atol=5e-7)
        curvature = jax.vmap(jax.grad(jax.grad(fn)))(xs)
        np.testing.assert_allclose(np.asarray(curvature, np.float64), -exact(x.astype(np.float64)), rtol=0, atol=5e-7)
        assert np.isnan(np.asarray(fn(jnp.asarray([np.inf, np.nan], dtype=jnp.float32)))).all()
        wide = jnp.asarray(x, dtype=jnp.float64)
        np.testing.assert_array_equal(np.asarray(fn(wide)), np.asarray(getattr(jnp, fn.__name__)(wide)))
