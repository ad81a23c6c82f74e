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


@pytest.mark.parametrize("batch", [(), (2,)])
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
        return sum((nla.solve_lower(nla.cholesky(A[i]), B[i]) ** 2).sum() for i in range(4))
    step = jax.jit(jax.value_and_grad(loss, (0, 1)))
    for _ in range(50):
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
