"""Random Fourier features with counter-based frequencies: the same draws in NumPy, torch and JAX
(without jax_enable_x64 too), their distribution, slices of one basis, and the kernel they
approximate (squared exponential and Matern)."""
import numpy as np
import pytest
import torch
from scipy import stats

import pyro_sparsegp as psg
from sparsegp_common.features.random_fourier import RandomFourierBasis, counter_normal, counter_uniform


def test_draws_are_the_same_in_every_backend():
    """One stream or several at once (as columns), NumPy, torch and JAX in float32 draw the same."""
    import jax
    import jax.numpy as jnp

    index = np.array([0, 1, 2, 7, 2**31 - 1, 123456789])
    expected = counter_normal(3, index, 5, np.float64)
    np.testing.assert_array_equal(counter_normal(3, torch.tensor(index), 5, torch.float64).numpy(), expected)
    with jax.enable_x64(False):
        got = counter_normal(3, jnp.asarray(index, jnp.int32), 5, jnp.float32)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(counter_normal(4, index, 5, np.float64), expected)  # another seed
    assert not np.allclose(counter_normal(3, index, 6, np.float64), expected)  # another stream
    several = counter_normal(3, torch.tensor(index), range(4, 7), torch.float64).numpy()  # streams as columns
    np.testing.assert_array_equal(several[:, 1], expected)
    np.testing.assert_array_equal(several[:, 2], counter_normal(3, index, 6, np.float64))
    with jax.enable_x64(False):
        uniforms = counter_uniform(3, jnp.asarray(index, jnp.int32), [0, 9], jnp.float32)
    np.testing.assert_array_equal(np.asarray(uniforms[:, 1]), counter_uniform(3, index, 9, np.float32))


def test_draws_are_uniform_and_normal():
    index = np.arange(200_000)
    u = counter_uniform(0, index, 0, np.float64)
    assert 0 < u.min() and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    z = counter_normal(0, index, 1, np.float64)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(np.corrcoef(z, counter_normal(0, index, 2, np.float64))[0, 1]) < 0.01  # streams independent
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.01  # neighbouring indices independent


@pytest.mark.parametrize("kernel", ["RBF", "Matern12", "Matern32", "Matern52"])
def test_features_approximate_the_kernel(kernel):
    """``Phi S^-1 Phi^T`` with m = 40,000 features is within 0.03 of ``K`` (ARD, D = 2); a slice
    of the basis is the same columns of the whole."""
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.uniform(-2, 2, (30, 2)))
    k = getattr(psg, kernel)(lengthscale=torch.tensor([0.7, 1.3], dtype=torch.float64), variance=torch.tensor(1.5, dtype=torch.float64))
    m = 40_000
    basis = RandomFourierBasis(k, m, 2, seed=1)
    Phi = basis.features(X, torch.arange(m))
    approx = Phi @ (Phi / basis.prior_diagonal(torch.arange(m))).T
    assert (approx - k.K(X)).abs().max() < 0.03 * 1.5
    I = torch.tensor([5, 39_999, 5, 17])
    # the same frequencies; the products' last bits may differ with the matrix's size and the
    # threads the BLAS takes (seen under load: 1.7e-18 apart)
    torch.testing.assert_close(basis.features(X, I), Phi[:, I], rtol=1e-13, atol=1e-16)


def test_lengthscale_and_variance_get_gradients():
    k = psg.RBF(lengthscale=torch.tensor([1.0], dtype=torch.float64))
    basis = RandomFourierBasis(k, 100, 1)
    X = torch.linspace(-1, 1, 5, dtype=torch.float64)[:, None]
    I = torch.arange(10)
    value = basis.features(X, I).sum() + basis.prior_diagonal(I).sum()
    grads = torch.autograd.grad(value, [k.lengthscale_unconstrained, k.variance_unconstrained])
    assert all(g.abs().sum() > 0 for g in grads)


def test_bad_arguments():
    with pytest.raises(TypeError, match="squared exponential or Matern"):
        RandomFourierBasis(psg.RBF() + psg.RBF(), 10, 1)
    basis = RandomFourierBasis(psg.RBF(), 10, 2)
    with pytest.raises(ValueError, match="input_dim=2"):
        basis.features(torch.zeros(3, 1), torch.arange(2))
