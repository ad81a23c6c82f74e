"""``trace_floor`` (written once in ``sparsegp_common.features.nystrom``) in both backends against the
eigenvalues of the dense float64 kernel matrix, and the bound it promises for Nystrom residuals."""
import numpy as np
import pytest
import reference

N, LENGTHSCALE, VARIANCE = 60, [0.7, 1.0, 1.5], 0.8


@pytest.fixture
def problem(backend):
    X = np.random.default_rng(0).normal(size=(N, 3))
    kernel = backend.kernel("rbf", LENGTHSCALE, VARIANCE)
    return backend.lib.diagnostics.trace_floor, kernel, X, reference.kernel("rbf", X, X, LENGTHSCALE, VARIANCE)


def test_trace_floor_is_the_tail_of_the_spectrum(backend, problem):
    trace_floor, kernel, X, K = problem
    eigenvalues = np.linalg.eigvalsh(K)[::-1]
    for rank in (0, 1, 5, 10, 20, N):
        floor = trace_floor(kernel, backend.array(X), rank)
        assert isinstance(floor, float)
        np.testing.assert_allclose(floor, eigenvalues[rank:].sum() / N, rtol=1e-9, atol=1e-14)
    assert trace_floor(kernel, backend.array(X), 0) == pytest.approx(VARIANCE)  # the mean of k(x, x)
    # float32 inputs are widened: the same floor
    assert trace_floor(kernel, backend.array(X, dtype=np.float32), 5) == pytest.approx(eigenvalues[5:].sum() / N, rel=1e-5)


def test_trace_floor_bounds_every_nystrom_residual(backend, problem):
    trace_floor, kernel, X, K = problem
    for rank in (1, 5, 10, 20):
        floor = trace_floor(kernel, backend.array(X), rank)
        for seed in range(5):  # Nystrom on `rank` of the inputs never beats the floor
            Z = np.random.default_rng(seed).choice(N, rank, replace=False)
            residual = np.trace(K - K[:, Z] @ np.linalg.solve(K[np.ix_(Z, Z)] + 1e-12 * np.eye(rank), K[Z])) / N
            assert residual >= floor - 1e-10


@pytest.mark.parametrize("rank", [-1, N + 1, 2.0, True])
def test_trace_floor_rejects_a_bad_rank(backend, problem, rank):
    trace_floor, kernel, X, _ = problem
    with pytest.raises(ValueError, match="rank must be an integer in 0..60"):
        trace_floor(kernel, backend.array(X), rank)
