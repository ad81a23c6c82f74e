import math

import numpy as np
import pytest

import reference as ref
from sparsegp_common.ops import namespace

from backends import KERNELS


def make(backend, name, lengthscale, variance):
    return backend.kernel(name, lengthscale, variance)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("lengthscale", [[0.7], [0.5, 2.0, 1.3]])
def test_K_matches_reference(backend, rng, name, lengthscale):
    X, Z = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    k = make(backend, name, lengthscale, 1.7)
    K = backend.numpy(k.K(backend.array(X), backend.array(Z)))
    np.testing.assert_allclose(K, ref.kernel(name, X, Z, lengthscale, 1.7), rtol=1e-10, atol=1e-12)
    Kxx = backend.numpy(k.K(backend.array(X)))
    np.testing.assert_allclose(np.diag(Kxx), 1.7, rtol=1e-10)
    np.testing.assert_allclose(backend.numpy(k.K_diag(backend.array(X))), np.full(7, 1.7))


def test_batched_kernel_and_combinations(backend, rng):
    X = rng.normal(size=(6, 2))
    lib = backend.lib
    batch = lib.Matern32(lengthscale=backend.array([[0.5, 1.0], [2.0, 0.3]]), variance=[1.0, 3.0])
    K = backend.numpy(batch.K(backend.array(X)))
    assert K.shape == (2, 6, 6)
    np.testing.assert_allclose(K[1], ref.kernel("matern32", X, X, [2.0, 0.3], 3.0), rtol=1e-10)
    k1, k2 = make(backend, "rbf", 0.8, 2.0), make(backend, "matern12", 1.5, 0.5)
    expected_sum = ref.kernel("rbf", X, X, 0.8, 2.0) + ref.kernel("matern12", X, X, 1.5, 0.5)
    expected_prod = ref.kernel("rbf", X, X, 0.8, 2.0) * ref.kernel("matern12", X, X, 1.5, 0.5)
    np.testing.assert_allclose(backend.numpy((k1 + k2).K(backend.array(X))), expected_sum, rtol=1e-10)
    np.testing.assert_allclose(backend.numpy((k1 * k2).K(backend.array(X))), expected_prod, rtol=1e-10)
    np.testing.assert_allclose(backend.numpy((k1 * k2).K_diag(backend.array(X))), np.full(6, 1.0))
    with pytest.raises(NotImplementedError, match="spectral density"):
        (k1 * k2).spectral_density(backend.array(np.zeros((3, 2))))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_spectral_density_reproduces_kernel_1d(backend, name):
    """(2 pi)^(-1/2) int s(w) cos(w tau) dw = k(tau): the convention of specs/vof.md."""
    ls, var = 0.6, 1.7
    k = make(backend, name, ls, var)
    density = lambda w: float(backend.numpy(k.spectral_density(backend.array([[w]])))[0])  # noqa: E731
    for tau in [0.0, 0.3, 1.1]:
        expected = ref.kernel(name, np.array([[0.0]]), np.array([[tau]]), ls, var)[0, 0]
        assert ref.bochner_1d(density, tau) == pytest.approx(expected, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("name", ["rbf", "matern32", "matern52"])  # Matérn-1/2's tail makes this integral crawl
def test_spectral_density_reproduces_kernel_2d(backend, name):
    """The D-dependent constants, through the 2-D (Hankel) form of Bochner's theorem."""
    ls, var = 0.8, 1.3
    k = make(backend, name, ls, var)
    density = lambda rho: float(backend.numpy(k.spectral_density(backend.array([[rho, 0.0]])))[0])  # noqa: E731
    for r in [0.0, 0.5, 1.2]:
        expected = ref.kernel(name, np.zeros((1, 2)), np.array([[r, 0.0]]), ls, var)[0, 0]
        assert ref.hankel_2d(density, r) == pytest.approx(expected, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_spectral_density_matches_closed_form(backend, rng, name, dim):
    omega = rng.normal(size=(6, dim)) * 2
    k = make(backend, name, 0.7, 1.3)
    np.testing.assert_allclose(
        backend.numpy(k.spectral_density(backend.array(omega))), ref.spectral_density(name, omega, 0.7, 1.3), rtol=1e-10
    )


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_spectral_density_ard_scaling(backend, rng, name):
    """s_ARD(w) = prod(l) s_(l=1)(w * l)."""
    ls = np.array([0.5, 2.0])
    omega = rng.normal(size=(4, 2))
    ard = backend.numpy(make(backend, name, ls, 1.3).spectral_density(backend.array(omega)))
    unit = backend.numpy(make(backend, name, [1.0], 1.3).spectral_density(backend.array(omega * ls)))
    np.testing.assert_allclose(ard, ls.prod() * unit, rtol=1e-10)


def test_spectral_density_of_sum(backend, rng):
    k1, k2 = make(backend, "rbf", 0.8, 1.0), make(backend, "matern52", 1.5, 0.5)
    omega = backend.array(rng.normal(size=(5, 1)))
    total = backend.numpy((k1 + k2).spectral_density(omega))
    np.testing.assert_allclose(total, backend.numpy(k1.spectral_density(omega)) + backend.numpy(k2.spectral_density(omega)))


def test_se_density_closed_form(backend):
    k = make(backend, "rbf", [0.5, 2.0], 1.5)
    w = np.array([[0.3, -1.0]])
    expected = 1.5 * 1.0 * math.exp(-0.5 * ((0.3 * 0.5) ** 2 + (1.0 * 2.0) ** 2))
    assert float(backend.numpy(k.spectral_density(backend.array(w)))[0]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), [1.0, -0.5]])
def test_non_positive_hyperparameters_rejected(backend, bad):
    with pytest.raises(ValueError, match="lengthscale"):
        backend.lib.RBF(lengthscale=bad)
    with pytest.raises(ValueError, match="variance"):
        backend.lib.Matern32(variance=bad if np.isscalar(bad) else -1.0)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("batched", [False, True])
def test_K_matvec_equals_K_times_v(backend, rng, name, batched):
    X, Z = rng.normal(size=(7, 3)), rng.normal(size=(9, 3))
    ls, var = ([[0.5, 2.0, 1.3], [0.9, 0.4, 1.1]], [1.7, 0.6]) if batched else ([0.8], 1.7)
    k = backend.lib.__dict__[KERNELS[name]](lengthscale=backend.array(ls), variance=backend.array(var))
    v = rng.normal(size=((2,) if batched else ()) + (9, 2))
    got = backend.numpy(k.K_matvec(backend.array(X), backend.array(Z), backend.array(v)))
    expected = [ref.kernel(name, X, Z, ls[i], var[i]) @ v[i] for i in range(2)] if batched else ref.kernel(name, X, Z, ls, var) @ v
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lengthscale", [[0.7], [0.5, 2.0, 1.3], [[0.5, 2.0, 1.3], [0.9, 0.4, 1.1]]])
def test_squared_exponential_matvec_gradient(rng, lengthscale):
    """The fused Pyro node's hand-written backward pass, by finite differences (float64), for
    isotropic, ARD and batched hyperparameters; then against autograd through ``K`` with both
    inputs sharing rows (as in the decoupled KL blocks)."""
    import torch

    import pyro_sparsegp as psg
    from sparsegp_common.ops._torch import _SEMatvec

    ls = torch.tensor(lengthscale, dtype=torch.float64)
    inputs = [torch.tensor(rng.normal(size=(6, 3))), torch.tensor(rng.normal(size=(5, 3))), ls,
              torch.full(ls.shape[:-1], 1.3, dtype=torch.float64), torch.tensor(rng.normal(size=ls.shape[:-1] + (5, 2)))]
    for _ in range(5):  # directional derivatives (the backward pass runs once per forward pass)
        w, directions = torch.tensor(rng.normal(size=ls.shape[:-1] + (6, 2))), [torch.randn_like(t) for t in inputs]
        leaves = [t.clone().requires_grad_() for t in inputs]
        grads = torch.autograd.grad((_SEMatvec.apply(*leaves) * w).sum(), leaves)
        eps = 1e-6
        plus = (_SEMatvec.apply(*(t + eps * d for t, d in zip(inputs, directions))) * w).sum()
        minus = (_SEMatvec.apply(*(t - eps * d for t, d in zip(inputs, directions))) * w).sum()
        fd = (plus - minus) / (2 * eps)
        assert float(sum((gr * d).sum() for gr, d in zip(grads, directions))) == pytest.approx(float(fd), rel=1e-7, abs=1e-9)
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = _SEMatvec.apply(*leaves).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        out.backward()

    kernel = psg.RBF(lengthscale=ls, variance=inputs[3])
    X = inputs[0].clone().requires_grad_()
    inputs = [X] + list(kernel.parameters())
    w = torch.tensor(rng.normal(size=ls.shape[:-1] + (6, 2)))
    weights = torch.tensor(rng.normal(size=ls.shape[:-1] + (3, 2)))
    ours = torch.autograd.grad((kernel.K_matvec(X[:3], X, w) * weights).sum(), inputs)
    plain = torch.autograd.grad(((kernel.K(X[:3], X) @ w) * weights).sum(), inputs)
    for a, b in zip(ours, plain):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["matern12", "matern32", "matern52"])
def test_matern_gradients_match_the_reference(backend, rng, name):
    """The Matern kernels' derivative, one elementwise node with its slope in closed form, against
    central differences of the float64 NumPy reference, with respect to both inputs (the
    hyperparameters reach the kernel through the same scaled distances), with an inducing input
    on a data point (the kink of Matern-1/2 there: slope zero, as the central difference)."""
    X, Z, W = rng.normal(size=(6, 3)), rng.normal(size=(5, 3)), rng.normal(size=(6, 5))
    Z[0] = X[2]
    lengthscale, variance = [0.7, 1.6, 1.1], 1.4
    kernel = make(backend, name, lengthscale, variance)
    grads = backend.grad(lambda X, Z: (kernel.K(X, Z) * backend.array(W)).sum(), X, Z)
    eps = 1e-6
    for which, (arg, grad) in enumerate(zip((X, Z), grads)):
        fd = np.zeros(arg.shape)
        for index in np.ndindex(arg.shape):
            step = np.zeros(arg.shape)
            step[index] = eps
            values = [(ref.kernel(name, *[a + s * step if i == which else a for i, a in enumerate((X, Z))], lengthscale,
                                  variance) * W).sum() for s in (1, -1)]
            fd[index] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", ["matern12", "matern32", "matern52"])
def test_matern_slope_is_zero_where_the_distance_is_round_off(backend, name):
    """Below ``r = sqrt(eps)`` (float32: 3.5e-4) a scaled distance is round-off, so its derivative
    is not followed (the true one tends to zero there): the gradient with respect to an inducing
    input 1e-5 from a data point is exactly zero in float32, and the value is the reference's to
    float32 precision. (Without the floor an ill-conditioned ``Kuu`` turned the round-off into
    gradient spikes of 1e7: tutorials/arviz_diagnostics.py under JAX 0.12.)"""
    X = np.array([[3.0, -2.0]])
    kernel = backend.lib.__dict__[KERNELS[name]](lengthscale=backend.array([1.0], np.float32),
                                                 variance=backend.array(1.5, np.float32))
    Z = np.array([[3.0 + 1e-5, -2.0]], dtype=np.float32)

    def total(Z):  # the gradient's computation in float32
        xp = namespace(Z)
        return kernel.K(backend.array(X, np.float32), xp.astype(Z, xp.float32)).sum()

    (grad,) = backend.grad(total, Z)
    assert (grad == 0).all(), grad
    value = backend.numpy(kernel.K(backend.array(X, np.float32), backend.array(Z, np.float32)))
    np.testing.assert_allclose(value, ref.kernel(name, X, Z.astype(np.float64), [1.0], 1.5), rtol=1e-5)


def test_pairwise_distances_of_close_pairs_are_exact(backend, rng):
    """``K(Z)`` in float32 with close pairs far from the centre (``|z| ~ 10`` lengthscales): each
    input's squared distance to its nearest neighbour matches float64 to float32's relative
    precision (the expansion ``|x|^2 + |z|^2 - 2 x.z`` alone is off by about ``eps |z|^2 = 1e-5``,
    more than the pair's own 1e-8 to 1e-4), the rest to the expansion's round-off, with float64 at
    hand and without (NumPyro without ``jax_enable_x64``); batched
    lengthscales give one such matrix per batch entry. Inputs 6, 7, 8 are a chain (8's nearest
    neighbour is 7, whose own is 6): the pair (7, 8) is exact only through input 8's row."""
    from sparsegp_common.kernels import pairwise_sqdist

    Z = rng.uniform(-10, 10, (9, 3))
    for i, gap in zip((1, 4, 7), (1e-4, 1e-3, 1e-2)):  # pairs (0, 1), (3, 4), (6, 7)
        Z[i] = Z[i - 1] + gap * rng.normal(size=3) / np.sqrt(3)
    Z[8] = Z[7] + 3 * (Z[7] - Z[6])
    Z = np.stack([Z, 2 * Z]).astype(np.float32).astype(np.float64)  # a batch of two, as float32 holds it
    expected = ((Z[:, :, None] - Z[:, None]) ** 2).sum(-1)
    pairs = np.array([[0, 1], [3, 4], [6, 7], [7, 8]])
    assert (np.argmin(expected[0] + np.diag(np.full(9, np.inf)), axis=1)[6:] == [7, 6, 7]).all()
    for x64 in (False, True):  # NumPyro: float64 exists only with jax_enable_x64 (the tests' default)
        with backend.x64(x64):
            r2 = backend.numpy(pairwise_sqdist(backend.array(Z, np.float32))).astype(np.float64)
        for b in range(2):
            for i, j in np.concatenate([pairs, pairs[:, ::-1]]):
                assert abs(r2[b, i, j] - expected[b, i, j]) <= 1e-6 * expected[b, i, j], (x64, b, i, j)
        np.testing.assert_array_equal(r2[:, np.arange(9), np.arange(9)], 0.0)
        np.testing.assert_allclose(r2, expected, atol=1e-6 * (Z**2).sum(-1).max())
