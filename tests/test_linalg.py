"""Triangular solves and the Cholesky factor, with their gradients, against NumPy references
(values), JAX's differentiation rules applied to the plain calls, and finite differences."""
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.scipy.linalg import solve_triangular
from numpyro.distributions.transforms import biject_to

import numpyro_sparsegp.linalg as nla
import pyro_sparsegp.linalg as pla
from numpyro_sparsegp.params import CONSTRAINTS
from sparsegp_common.variational import CholeskyGaussian


def spd(rng, M, batch=()):
    G = rng.normal(size=batch + (M, M))
    return G @ np.swapaxes(G, -1, -2) / M + np.eye(M)


@pytest.mark.parametrize("batch_L,batch_B", [((), ()), ((3,), (3,)), ((), (2,)), ((2,), ())])
@pytest.mark.parametrize("transpose", [False, True])
def test_solve_lower_values_both_backends(rng, batch_L, batch_B, transpose):
    L = np.linalg.cholesky(spd(rng, 5, batch_L))
    B = rng.normal(size=batch_B + (5, 4))
    Lt = np.swapaxes(L, -1, -2) if transpose else L
    expected = np.linalg.solve(Lt, np.broadcast_to(B, np.broadcast_shapes(Lt.shape[:-2], B.shape[:-2]) + B.shape[-2:]))
    got_n = nla.solve_lower(jnp.asarray(L), jnp.asarray(B), transpose=transpose)
    got_p = pla.solve_lower(torch.as_tensor(L), torch.as_tensor(B), transpose=transpose)
    np.testing.assert_allclose(np.asarray(got_n), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_p.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_torch_solves_keep_row_major_layout(rng, batch, transpose):
    """A row-major right-hand side gives a row-major solution, forward and backward: a column-major
    ``L^{-1} Kuf`` made every elementwise operation of a step that mixes it with row-major arrays
    stride across memory (about 20x slower per operation at 256 x 1024 on CPU)."""
    L = torch.as_tensor(np.linalg.cholesky(spd(rng, 6, batch))).requires_grad_()
    B = torch.as_tensor(rng.normal(size=batch + (6, 9))).requires_grad_()
    A = pla.solve_lower(L, B, transpose=transpose)
    A.backward(torch.ones_like(A))
    assert A.is_contiguous() and B.grad.is_contiguous()


@pytest.mark.parametrize("batch", [(), (2,), (3, 7)])  # (3, 7): more matrices than are written out one by one
@pytest.mark.parametrize("transpose", [False, True])
def test_solve_lower_gradient_matches_jax_rule(rng, batch, transpose):
    L = jnp.asarray(np.linalg.cholesky(spd(rng, 6, batch)))
    B = jnp.asarray(rng.normal(size=batch + (6, 3)))
    W = jnp.asarray(rng.normal(size=batch + (6, 3)))

    def ours(L, B):
        return (jnp.sin(nla.solve_lower(L, B, transpose=transpose)) * W).sum()

    def reference(L, B):
        return (jnp.sin(solve_triangular(L, B, lower=True, trans=1 if transpose else 0)) * W).sum()

    for g, r in zip(jax.grad(ours, (0, 1))(L, B), jax.grad(reference, (0, 1))(L, B)):
        # only the lower triangle of L is an input (JAX's rule also returns zeros above it)
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-9, atol=1e-12)


INDEPENDENT_BATCHED_SOLVES = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import numpyro_sparsegp.linalg as nla
    rng = np.random.default_rng(0)
    G = rng.normal(size=(4, 8, 32, 32))
    A = jnp.asarray(G @ np.swapaxes(G, -1, -2) / 32 + np.eye(32), dtype=jnp.float32)
    B = jnp.asarray(rng.normal(size=(4, 8, 32, 256)), dtype=jnp.float32)
    def loss(A, B):
        return sum((nla.solve_lower(nla.cholesky(A[i]), B[i]) ** 2).sum() for i in range(len(A)))
    step = jax.jit(jax.value_and_grad(loss, (0, 1)))
    for _ in range(50):
        jax.block_until_ready(step(A, B))
    # batches of 20 (a loop over the matrices rather than written out): fewer steps, as long each
    A, B = (jnp.repeat(x[:2], 3, axis=1)[:, :20] for x in (A, B))
    for _ in range(10):
        jax.block_until_ready(step(A, B))
""")


def test_independent_batched_solves_do_not_deadlock():
    # jaxlib 0.10-0.11.0 deadlock when independent batched LAPACK calls run at once on XLA's CPU
    # pool (8 harmonic blocks under fit hung after a few steps); the old code hangs here every time
    try:
        subprocess.run([sys.executable, "-c", INDEPENDENT_BATCHED_SOLVES], check=True, timeout=120,
                       cwd=pathlib.Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        pytest.fail("independent batched Cholesky factorisations and solves deadlocked under jax.jit")


def test_solve_lower_gradient_with_broadcast_factor(rng):
    L = jnp.asarray(np.linalg.cholesky(spd(rng, 4)))
    B = jnp.asarray(rng.normal(size=(3, 4, 2)))
    g = jax.grad(lambda L: (nla.solve_lower(L, B) ** 2).sum())(L)
    r = jax.grad(lambda L: sum((solve_triangular(L, b, lower=True) ** 2).sum() for b in B))(L)
    assert g.shape == L.shape
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_cholesky_gradient_matches_jax_rule(rng, batch):
    A = jnp.asarray(spd(rng, 7, batch))
    W = jnp.asarray(np.tril(rng.normal(size=batch + (7, 7))))

    def loss(chol):
        return lambda A: (jnp.cos(chol(A)) * W).sum()

    ours = jax.grad(loss(lambda A: nla.cholesky(A, jitter=0.0)))(A)
    reference = jax.grad(loss(jnp.linalg.cholesky))(A)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours), np.swapaxes(np.asarray(ours), -1, -2), atol=1e-12)
    # the same under jit, where the jitter retries are traced conditionals
    jitted = jax.jit(jax.grad(loss(lambda A: nla.cholesky(A, jitter=0.0))))(A)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(reference), rtol=1e-9, atol=1e-12)


def test_forward_mode_matches_jax_rules(rng):
    A = jnp.asarray(spd(rng, 5))
    B = jnp.asarray(rng.normal(size=(5, 2)))

    def ours(A):
        return nla.solve_lower(nla.cholesky(A, jitter=0.0), B, transpose=True)

    def reference(A):
        return solve_triangular(jnp.linalg.cholesky(A), B, lower=True, trans=1)

    np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(A)), np.asarray(jax.jacfwd(reference)(A)), rtol=1e-9, atol=1e-12)
    hess = jax.hessian(lambda A: (ours(A) ** 2).sum())(A)
    np.testing.assert_allclose(np.asarray(hess), np.asarray(jax.hessian(lambda A: (reference(A) ** 2).sum())(A)), rtol=1e-8, atol=1e-10)


def _factor_and_solve(lib, fused, K, B):
    if fused:
        return lib.cholesky_and_solve(K, B, jitter=0.0)
    L = lib.cholesky(K, jitter=0.0)
    return L, lib.solve_lower(L, B)


@pytest.mark.parametrize("batch_K,batch_B", [((), ()), ((), (2,)), ((2,), ()), ((2,), (2,)), ((1,), (3,))])
@pytest.mark.parametrize("use_L", [False, True])
def test_cholesky_and_solve_is_the_two_steps_with_their_gradient(rng, batch_K, batch_B, use_L):
    """``cholesky_and_solve`` (one node, its own reverse mode) gives the values and gradients of
    ``cholesky`` then ``solve_lower`` in both backends (JAX eager and jitted), float64, with the
    factor unused or used elsewhere too, and batch axes broadcast either way."""
    K, B = spd(rng, 6, batch_K), rng.normal(size=batch_B + (6, 4))
    batch = np.broadcast_shapes(batch_K, batch_B)
    WA, WL = rng.normal(size=batch + (6, 4)), rng.normal(size=batch_K + (6, 6))

    def loss(lib, sin, fused):
        def value(K, B):
            L, A = _factor_and_solve(lib, fused, K, B)
            return (sin(A) * WA_).sum() + ((L * WL_).sum() if use_L else 0.0)
        return value

    results = {}
    for fused in (True, False):
        Kt, Bt = (torch.tensor(a, requires_grad=True) for a in (K, B))
        WA_, WL_ = torch.as_tensor(WA), torch.as_tensor(WL)
        value = loss(pla, torch.sin, fused)(Kt, Bt)
        value.backward()
        results["torch", fused] = (value.item(), Kt.grad.numpy(), Bt.grad.numpy())
        WA_, WL_ = jnp.asarray(WA), jnp.asarray(WL)
        for jit in (False, True):
            fn = jax.value_and_grad(loss(nla, jnp.sin, fused), argnums=(0, 1))
            value, (gK, gB) = (jax.jit(fn) if jit else fn)(jnp.asarray(K), jnp.asarray(B))
            results["jax", fused, jit] = (float(value), np.asarray(gK), np.asarray(gB))
    reference = results["torch", False]
    for key, (value, gK, gB) in results.items():
        assert value == pytest.approx(reference[0], rel=1e-12), key
        np.testing.assert_allclose(gK, reference[1], rtol=1e-9, atol=1e-12, err_msg=str(key))
        np.testing.assert_allclose(gB, reference[2], rtol=1e-9, atol=1e-12, err_msg=str(key))
        np.testing.assert_allclose(gK, np.swapaxes(gK, -1, -2), atol=1e-12, err_msg=str(key))


def test_cholesky_and_solve_forward_mode(rng):
    """JAX's forward mode (``jacfwd``, ``hessian``) goes through the fused step as through the two."""
    K, B = jnp.asarray(spd(rng, 5)), jnp.asarray(rng.normal(size=(5, 3)))

    def f(fused):
        return lambda K: (_factor_and_solve(nla, fused, K, B)[1] ** 2).sum() + _factor_and_solve(nla, fused, K, B)[0].sum()

    np.testing.assert_allclose(np.asarray(jax.jacfwd(f(True))(K)), np.asarray(jax.jacfwd(f(False))(K)), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.hessian(f(True))(K)), np.asarray(jax.hessian(f(False))(K)), rtol=1e-8,
                               atol=1e-10)


def test_cholesky_and_solve_float32(rng):
    """float32 values and gradients of a kernel-like matrix (jitter 1e-4) near the float64 ones."""
    Z = rng.uniform(-2, 2, (40, 1))
    K = np.exp(-0.5 * (Z - Z.T) ** 2) + 1e-4 * np.eye(40)
    B, W = rng.normal(size=(40, 7)), rng.normal(size=(40, 7))

    def grads(lib, array, grad):
        return grad(lambda K, B: (lib.cholesky_and_solve(K, B, jitter=0.0)[1] * array(W)).sum(), array(K), array(B))

    def torch_grad(fn, K, B):
        K, B = K.requires_grad_(), B.requires_grad_()
        fn(K, B).backward()
        return K.grad.double().numpy(), B.grad.double().numpy()

    def jax_grad(fn, K, B):
        return tuple(np.asarray(g, dtype=np.float64) for g in jax.jit(jax.grad(fn, argnums=(0, 1)))(K, B))

    expected = grads(pla, lambda a: torch.tensor(a, dtype=torch.float64), torch_grad)
    for got in (grads(pla, lambda a: torch.tensor(a, dtype=torch.float32), torch_grad),
                grads(nla, lambda a: jnp.asarray(a, dtype=jnp.float32), jax_grad)):
        for g, e in zip(got, expected):
            assert np.all(np.isfinite(g))
            assert np.abs(g - e).max() <= 2e-2 * np.abs(e).max()


def test_cholesky_gradient_matches_finite_differences(rng):
    A = spd(rng, 4)
    W = rng.normal(size=(4, 4))
    f = lambda A: float((np.linalg.cholesky(A) * W).sum())  # noqa: E731
    g = np.asarray(jax.grad(lambda A: (nla.cholesky(A, jitter=0.0) * W).sum())(jnp.asarray(A)))
    eps = 1e-6
    for i, j in [(0, 0), (2, 1), (3, 3), (1, 3)]:
        E = np.zeros((4, 4))
        E[i, j] = E[j, i] = eps  # symmetric perturbation: d f = <g, E> with g symmetric
        fd = (f(A + E) - f(A - E)) / (2 * eps)
        assert (g * E).sum() / eps == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_lower_cholesky_transform_masks_a_square_matrix(rng):
    _, q_sqrt = CholeskyGaussian.initial(4, (), jnp.zeros(1))
    transform = biject_to(CONSTRAINTS[CholeskyGaussian.q_sqrt_constraint])
    L = jnp.asarray(np.linalg.cholesky(spd(rng, 4)))
    x = transform.inv(L)
    assert x.shape == (4, 4)
    np.testing.assert_allclose(np.asarray(transform(x)), np.asarray(L), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(transform.inv(q_sqrt)), np.zeros((4, 4)), atol=0)
    # the strictly upper triangle is ignored, like torch's lower_cholesky transform
    g = jax.grad(lambda x: (transform(x) ** 2).sum())(x + jnp.triu(jnp.ones((4, 4)), 1))
    assert np.all(np.asarray(jnp.triu(g, 1)) == 0)
    torch_transform = torch.distributions.transform_to(torch.distributions.constraints.lower_cholesky)
    y = x + jnp.triu(jnp.ones((4, 4)), 1)
    np.testing.assert_allclose(np.asarray(transform(y)), torch_transform(torch.tensor(np.array(y))).numpy(), rtol=1e-12)
    # log|det J| over the free entries (the lower triangle), as a transformed density needs it
    rows, cols = np.tril_indices(4)

    def lower(v):
        return transform(jnp.zeros((4, 4)).at[rows, cols].set(v))[rows, cols]

    expected = np.linalg.slogdet(np.asarray(jax.jacfwd(lower)(x[rows, cols])))[1]
    assert float(transform.log_abs_det_jacobian(x, transform(x))) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("jit", [False, True])
def test_cholesky_gradient_after_a_retry_is_the_kept_factors(rng, jit):
    # B is indefinite by 3e-5: jitter 1e-6 and 1e-5 fail, 1e-4 succeeds. The failed attempt must not
    # reach the gradient (it made the hyperparameter gradients NaN in float32 NumPyro fits).
    Q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    B = jnp.asarray(Q @ np.diag([-3e-5, 0.5, 1.0, 2.0, 3.0]) @ Q.T)
    W = jnp.asarray(rng.normal(size=(5, 5)))

    def loss(theta):
        return (nla.cholesky(theta * B, jitter=1e-6) * W).sum()

    grad = (jax.jit(jax.grad(loss)) if jit else jax.grad(loss))(1.0)
    kept = jax.grad(lambda theta: (jnp.linalg.cholesky(theta * B + 1e-4 * jnp.eye(5)) * W).sum())(1.0)
    assert np.isfinite(float(grad))
    assert float(grad) == pytest.approx(float(kept), rel=1e-9)


def test_large_host_factorisations_run_on_one_blas_thread(monkeypatch):
    """OpenBLAS's threaded dpotrf crashed the process on large orders (sparsegp_common/ops/_numpy.py):
    from ``ONE_THREAD_FROM`` on, the host factorisation (QSGP's log|K(Z, Z)|) limits BLAS to one
    thread, and gives the threads back after."""
    from threadpoolctl import threadpool_info

    from sparsegp_common.ops import _numpy

    def blas_threads():
        return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]

    seen, factorise = [], np.linalg.cholesky

    def spy(a):
        seen.append(blas_threads())
        return factorise(a)

    monkeypatch.setattr(np.linalg, "cholesky", spy)
    monkeypatch.setattr(_numpy, "ONE_THREAD_FROM", 64)  # the same path at a small order
    before = blas_threads()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS library under NumPy here")
    A = np.cov(np.random.default_rng(0).normal(size=(64, 200)))
    for n in (32, 64):
        L = _numpy.cholesky(A[:n, :n], [0.0], "not positive definite", np.float64)
        np.testing.assert_allclose(L @ L.T, A[:n, :n], atol=1e-10)
    assert seen == [before, [1] * len(before)]
    assert blas_threads() == before
