"""The support-point control variates of the quadruply stochastic estimator (Evans and Nair,
2020, Eq. 3, Proposition 3, App. F.1): zero mean and zero-mean gradient by enumeration of the
basis draws (with repeated indices), exact cancellation when the support is every row, the
incremental state under sparse updates (and its failure under dense ones), and the variance cut
on a smooth random-Fourier problem."""
import itertools

import numpy as np
import pytest
import torch

from sparsegp_common.objectives.control_variates import Support, advance, initial_state, occurrences, pair
from test_qsgp import TableBasis


def problem(n=6, m=5, p=2, seed=0):
    rng = np.random.default_rng(seed)
    basis = TableBasis(torch.tensor(rng.normal(size=(n, m))), None, True)
    v = torch.tensor(rng.normal(size=(m, p)), requires_grad=True)
    return basis, v


def every(m, size):
    return [torch.tensor(t) for t in itertools.product(range(m), repeat=size)]


def test_occurrences_count_each_distinct_index_once():
    weights, size = occurrences(torch.tensor([3, 1, 3, 1, 0, 3]), torch.float64)
    assert float(size) == 3.0
    np.testing.assert_allclose(weights.numpy(), [1 / 3, 1 / 2, 1 / 3, 1 / 2, 1, 1 / 3])


@pytest.mark.parametrize("size", [1, 2])
def test_pair_and_its_gradient_have_zero_mean(size):
    """Over every (I, J) with replacement (so with repeats when size = 2): the pair averages to 0
    and so does its gradient w.r.t. v (the F.1-scaled sparse gradient of |a|^2 included) and
    w.r.t. the noise (which the F.1 factor must not scale); with the m / |U| factor left out the
    gradient's mean is not 0."""
    basis, v = problem()
    noise = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    support = Support(torch.arange(4), basis)  # rows 0..3 of the table
    a = initial_state(support, v.detach())
    values, grads, noise_grads = [], [], []
    for I in every(5, size):
        for J in every(5, size):
            value = pair(support, a, v[I], v[J], I, J, len(v), num_data=6, noise=noise)
            values.append(value.item())
            g_v, g_noise = torch.autograd.grad(value, (v, noise))
            grads.append(g_v)
            noise_grads.append(g_noise.item())
    assert abs(np.mean(values)) < 1e-12 * np.abs(values).max() and np.std(values) > 1e-3
    mean_grad = torch.stack(grads).mean(0)
    assert mean_grad.abs().max() < 1e-12 * max(g.abs().max() for g in grads)
    assert abs(np.mean(noise_grads)) < 1e-12 * np.abs(noise_grads).max() and np.std(noise_grads) > 1e-3


def test_pair_cancels_the_basis_noise_when_the_support_is_every_row():
    """Support = all n rows and no data subsampling: the sampled data quadratic plus the pair is
    the exact |Phi v|^2 / noise for every draw of I and J."""
    basis, v = problem()
    support = Support(torch.arange(6), basis)
    a = initial_state(support, v.detach())
    exact = float((basis.Phi @ v.detach()).pow(2).sum() / 0.3)
    for I, J in [(torch.tensor([0, 4]), torch.tensor([2, 2])), (torch.tensor([1, 3]), torch.tensor([4, 0]))]:
        sampled = (5 / 2) ** 2 * ((basis.Phi[:, J] @ v[J]) * (basis.Phi[:, I] @ v[I])).sum() / 0.3
        assert (sampled + pair(support, a, v[I], v[J], I, J, len(v), num_data=6, noise=0.3)).item() == pytest.approx(exact, rel=1e-12)
        assert sampled.item() != pytest.approx(exact, rel=1e-3)


def test_state_follows_sparse_updates_and_not_dense_ones():
    """After 50 steps that change v only at the drawn rows (repeats included), ``advance`` keeps
    a = Phi_p v to round-off; a step that also moves other rows (as Adam's moments do) breaks it."""
    basis, v = problem(n=8, m=20, p=3)
    v = v.detach().clone()
    support = Support(torch.arange(8), basis)
    a = initial_state(support, v)
    rng = np.random.default_rng(1)
    for _ in range(50):
        I, J = (torch.tensor(rng.integers(0, 20, 4)) for _ in range(2))
        idx = torch.cat([I, J])
        before = v[idx].clone()
        step = torch.zeros_like(v)
        step[idx] = torch.tensor(rng.normal(size=(8, 3)))  # repeated rows: the last write wins, one value per row
        v = v + step
        a = advance(support, a, idx, v[idx] - before)
    torch.testing.assert_close(a, initial_state(support, v), rtol=1e-10, atol=1e-12)
    v_dense = v + 1e-3  # every row moved
    a = advance(support, a, idx, v_dense[idx] - v[idx])
    assert (a - initial_state(support, v_dense)).abs().max() > 1e-4


def test_pair_reduces_the_variance_on_a_smooth_problem():
    """Random Fourier features of a squared exponential (m = 400), n = 2,000 rows, 64 rows and 40
    basis functions per draw: with 500 support rows the data quadratic's estimate has less than
    half the variance it has without, and the same mean (within 4 standard errors)."""
    import pyro_sparsegp as psg
    from sparsegp_common.features.random_fourier import RandomFourierBasis

    rng = np.random.default_rng(0)
    n, m = 2000, 400
    X = torch.tensor(rng.uniform(-2, 2, (n, 2)))
    basis = RandomFourierBasis(psg.RBF(lengthscale=torch.tensor([1.0], dtype=torch.float64)), m, 2)
    v = torch.tensor(rng.normal(size=(m, 1))) / np.sqrt(m)
    with torch.no_grad():
        exact = float((basis.features(X, torch.arange(m)) @ v).pow(2).sum())
        support = Support(X[torch.tensor(rng.choice(n, 500, replace=False))], basis)
        a = initial_state(support, v)
        plain, controlled = [], []
        for _ in range(300):
            rows, I, J = (torch.tensor(rng.integers(0, size, count)) for size, count in ((n, 64), (m, 40), (m, 40)))
            Phi_I, Phi_J = basis.features(X[rows], I), basis.features(X[rows], J)
            sampled = (n / 64) * (m / 40) ** 2 * ((Phi_J @ v[J]) * (Phi_I @ v[I])).sum()
            plain.append(float(sampled))
            controlled.append(float(sampled + pair(support, a, v[I], v[J], I, J, len(v), num_data=n, noise=1.0)))
    plain, controlled = np.array(plain), np.array(controlled)
    assert controlled.var() < 0.5 * plain.var(), (controlled.var(), plain.var())
    for values in (plain, controlled):
        assert abs(values.mean() - exact) < 4 * values.std() / np.sqrt(len(values))
