"""The 1-D step-function data of the deep-basis-kernel paper's section 4.1 (Figures 1 and 3)."""
import numpy as np

from sparsegp_common.checks import positive_int

STEP_NOISE = 0.01  # noise variance of the step-function data (paper section 4.1)


def step_function(x):
    """The ground truth of the paper's section 4.1: a smoothed step (0.3, 0.9, -0.6, 0 on
    ``(-inf, -0.6), (-0.6, 0), (0, 0.4), (0.4, inf)``) plus a small oscillation.

    Args:
        x: inputs of any shape.

    Returns:
        ``f_gt(x)``, same shape.
    """
    x = np.asarray(x, dtype=np.float64)
    s = lambda a: 0.5 * (1 + np.tanh(a / 2))  # noqa: E731  (logistic sigmoid without overflow)
    a, b, c = s(200 * (x + 0.6)), s(200 * x), s(200 * (x - 0.4))
    return 0.3 * (1 - a) + 0.9 * (a - b) - 0.6 * (b - c) + 0.01 * np.sin(50 * np.sin(10 * x))


def step_data(num_data, seed=0, noise=STEP_NOISE):
    """``num_data`` noisy samples of :func:`step_function` at ``x ~ U[-1, 1]``.

    Returns:
        ``(X (num_data, 1), y (num_data,))`` float64.
    """
    num_data = positive_int(num_data, "num_data")
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(num_data, 1))
    return X, step_function(X[:, 0]) + np.sqrt(noise) * rng.normal(size=num_data)
