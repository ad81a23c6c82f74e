"""The whitened SVGP's q(f) marginals from ``Kuu`` as one differentiated step
(``sparsegp_common.variational.whitened_moments``): the values and gradients of the step taken
operation by operation (``cholesky_and_solve``, then ``update``), in both backends, eager and
jitted, with batch axes, the factor used elsewhere or not, JAX's forward mode, and float32; and
the SVGP takes it only where it saves flops."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from sparsegp_common.linalg import _escalation, cholesky_and_solve
from sparsegp_common.variational import CholeskyGaussian
from sparsegp_common.variational.conditionals import update
from sparsegp_common.variational.whitened_moments import whitened_moments, whitened_update, worth_fusing


def spd(rng, M, batch=()):
    G = rng.normal(size=batch + (M, M))
    return G @ np.swapaxes(G, -1, -2) / M + np.eye(M)


def inputs(rng, M, N, batch_K=(), batch_B=(), batch_q=()):
    q_sqrt = np.tril(0.3 * rng.normal(size=batch_q + (M, M)), -1) + np.eye(M) * rng.uniform(0.5, 1.5, batch_q + (M, 1))
    return spd(rng, M, batch_K), rng.normal(size=batch_B + (M, N)), rng.normal(size=batch_q + (M,)), q_sqrt


def fused(K, Kuf, q_mu, q_sqrt):
    _, levels, message = _escalation(K, 0.0, 3, None)
    return whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message)


def stepwise(K, Kuf, q_mu, q_sqrt):
    L, A = cholesky_and_solve(K, Kuf, jitter=0.0)
    return (L,) + update(A, None, CholeskyGaussian(q_mu, q_sqrt))


def weights(rng, shapes):
    return [rng.normal(size=shape) for shape in shapes]


@pytest.mark.parametrize("batch_K,batch_B,batch_q", [((), (), ()), ((2,), (), ()), ((), (1,), (3,)), ((3, 1), (), (2,))])
@pytest.mark.parametrize("use_L", [False, True])
def test_one_step_is_the_steps_with_their_gradient(rng, batch_K, batch_B, batch_q, use_L):
    """Values and the gradients of ``(Kuu, Kuf, q_mu, q_sqrt)``, float64, torch and JAX (eager,
    jitted): the fused step against the step taken operation by operation in torch."""
    args = inputs(rng, 5, 11, batch_K, batch_B, batch_q)
    batch = np.broadcast_shapes(batch_K, batch_B, batch_q)
    W = weights(rng, [batch_K + (5, 5), batch + (11,), batch + (11,)])

    def loss(fn, sin):
        def value(*args):
            L, mean, change = fn(*args)
            return (L * w[0]).sum() * use_L + (sin(mean) * w[1]).sum() + (sin(change) * w[2]).sum()
        return value

    results = {}
    for name, fn in (("fused", fused), ("steps", stepwise)):
        tensors = [torch.tensor(a, requires_grad=True) for a in args]
        w = [torch.as_tensor(a) for a in W]
        value = loss(fn, torch.sin)(*tensors)
        value.backward()
        results["torch", name] = (value.item(), [t.grad.numpy() for t in tensors])
        w = [jnp.asarray(a) for a in W]
        for jit in (False, True):
            grad = jax.value_and_grad(loss(fn, jnp.sin), argnums=(0, 1, 2, 3))
            value, grads = (jax.jit(grad) if jit else grad)(*map(jnp.asarray, args))
            results["jax", name, jit] = (float(value), [np.asarray(g) for g in grads])
    expected = results["torch", "steps"]
    for key, (value, grads) in results.items():
        assert value == pytest.approx(expected[0], rel=1e-12), key
        for got, want, what in zip(grads, expected[1], ("Kuu", "Kuf", "q_mu", "q_sqrt")):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=f"{key} {what}")


def test_jax_forward_mode(rng):
    """``jacfwd`` and ``hessian`` through the fused step (its JVP is the rule JAX transposes)."""
    K, Kuf, q_mu, q_sqrt = map(jnp.asarray, inputs(rng, 4, 9))

    def f(fn):
        return lambda K, q_sqrt: sum(jnp.sum(out**2) for out in fn(K, Kuf, q_mu, q_sqrt)[1:])

    for argnums in (0, 1):
        np.testing.assert_allclose(np.asarray(jax.jacfwd(f(fused), argnums)(K, q_sqrt)),
                                   np.asarray(jax.jacfwd(f(stepwise), argnums)(K, q_sqrt)), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(np.asarray(jax.hessian(f(fused))(K, q_sqrt)), np.asarray(jax.hessian(f(stepwise))(K, q_sqrt)),
                               rtol=1e-8, atol=1e-10)


def test_float32_near_float64(rng):
    """A kernel matrix (jitter 1e-4) at M = 40, N = 100, float32, eager torch and jitted JAX:
    the values and gradients near the float64 ones."""
    Z, X = rng.uniform(-2, 2, (40, 1)), rng.uniform(-2, 2, (100, 1))
    K = np.exp(-0.5 * (Z - Z.T) ** 2) + 1e-4 * np.eye(40)
    Kuf = np.exp(-0.5 * (Z - X.T) ** 2)
    q_mu, q_sqrt = rng.normal(size=40), np.tril(0.1 * rng.normal(size=(40, 40)), -1) + 0.8 * np.eye(40)
    W = weights(rng, [(100,), (100,)])

    def value(K, Kuf, q_mu, q_sqrt, w):
        _, mean, change = fused(K, Kuf, q_mu, q_sqrt)
        return (mean * w[0]).sum() + (change * w[1]).sum()

    def torch_grads(dtype):
        tensors = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (K, Kuf, q_mu, q_sqrt)]
        value(*tensors, [torch.tensor(a, dtype=dtype) for a in W]).backward()
        return [t.grad.double().numpy() for t in tensors]

    grad = jax.jit(jax.grad(value, argnums=(0, 1, 2, 3)))
    jax32 = [np.asarray(g, np.float64) for g in grad(*(jnp.asarray(a, jnp.float32) for a in (K, Kuf, q_mu, q_sqrt)),
                                                     [jnp.asarray(a, jnp.float32) for a in W])]
    expected = torch_grads(torch.float64)
    for got in (torch_grads(torch.float32), jax32):
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=0, atol=2e-3 * np.abs(e).max())


def test_the_svgp_fuses_only_where_it_saves_flops(rng, monkeypatch):
    """``whitened_update`` fuses for a full-covariance q, variances only, ``N >= 1.5 M`` and a
    factor in the inputs' dtype; otherwise it takes the steps (both give the same moments)."""
    from sparsegp_common.variational import whitened_moments as module

    calls = []
    original = module.whitened_moments
    monkeypatch.setattr(module, "whitened_moments", lambda *a: calls.append(1) or original(*a))
    K, Kuf, q_mu, q_sqrt = (torch.as_tensor(a) for a in inputs(rng, 6, 12))
    q = CholeskyGaussian(q_mu, q_sqrt)
    expected = stepwise(K, Kuf, q_mu, q_sqrt)
    for case, kwargs, fuses in (("fused", {}, True), ("few points", {"Kuf": Kuf[:, :8]}, False),
                                ("full_cov", {"full_cov": True}, False), ("float32 factor", {"dtype": "float32"}, False),
                                ("diagonal q", {"q": type("Diagonal", (CholeskyGaussian,), {})(q_mu, q_sqrt)}, False)):
        calls.clear()
        given = {"Kuf": Kuf, "q": q, **kwargs}
        L, moments = whitened_update(K, given.pop("Kuf"), given.pop("q"), 0.0, **given)
        assert bool(calls) == fuses, case
        if case in ("fused", "float32 factor"):
            np.testing.assert_allclose(moments[1].double().numpy(), expected[2].numpy(), rtol=1e-5, atol=1e-6)
    assert worth_fusing(256, 1024) and worth_fusing(512, 1024) and not worth_fusing(1024, 1024)
