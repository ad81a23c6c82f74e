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


def trace_error(kernel, features, X, jitter=1e-6):
    """The Nystrom trace error of inducing ``features`` on the inputs ``X (N, D)``:
    ``sum_n [k(x_n, x_n) - sum_t q_t(x_n, x_n)]``, ``q_t = k_t(x, Z_t) K_t^{-1} k_t(Z_t, x)``, over
    the components of features that declare them (Sun et al., 2021, Eq. 24: the diagnostic that
    compares transformations of a harmonic decomposition before training), one term otherwise.
    Its mean over N is what :func:`trace_floor` bounds from below for ``M`` features.

    Args:
        kernel, features: a kernel and features of either backend (current values; no gradient).
        X: inputs ``(N, D)``.
        jitter: added to the diagonal of ``Kuu``.

    Returns:
        The error, a float (non-negative up to round-off).
    """
    from sparsegp_common.features import Kuf, Kuu
    from sparsegp_common.linalg import cholesky, solve_lower
    from sparsegp_common.variational.conditionals import prior_covariance

    ops, xp = backend(X), namespace(X)
    K, A = Kuu(features, kernel), Kuf(features, kernel, X)
    if K is not None:
        A = solve_lower(cholesky(K, jitter), A)
    Kff = prior_covariance(kernel, X, tuple(features.component_shape), ())
    return float(ops.stop_gradient(xp.sum(Kff) - xp.sum(A**2)))
