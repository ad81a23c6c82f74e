"""What any set of inducing features can reach: the Nystrom trace floor of a kernel on given inputs."""
import numbers

from sparsegp_common.ops import backend, namespace


def trace_floor(kernel, X, rank):
    """The least mean trace term ``mean_n [k(x_n, x_n) - q(x_n, x_n)]`` that any ``rank`` inducing
    features (points, smoothed points, any linear functionals) can reach on the inputs ``X (N, D)``:
    the sum of the eigenvalues of ``K_XX`` beyond the ``rank`` largest, over N, in float64 (JAX:
    with ``jax_enable_x64``).

    Every sparse posterior whose covariance rests on ``rank`` features (an SVGP with ``rank``
    inducing points, the covariance basis of a decoupled GP) pays at least ``N floor / (2 noise)``
    in its ELBO's variance term, so a floor near the noise forces the kernel variance down and the
    noise up. On a random subsample of the training inputs it is an estimate that is low, if
    anything: it grows with the subsample.

    Args:
        kernel: a kernel of either backend (its current values are used; no gradient flows).
        X: inputs ``(N, D)``.
        rank: number of features, in ``0..N``.

    Returns:
        The floor, a float.
    """
    xp = namespace(X)
    n = X.shape[0]
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank <= n:
        raise ValueError(f"rank must be an integer in 0..{n} (the rows of X), got {rank!r}")
    K = backend(X).stop_gradient(kernel.K(xp.astype(X, xp.float64)))
    eigenvalues = xp.linalg.eigvalsh(xp.astype(K, xp.float64))  # ascending
    return float(xp.sum(eigenvalues[: n - int(rank)])) / n
