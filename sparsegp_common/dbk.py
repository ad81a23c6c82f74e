"""Backend-free pieces of the deep basis kernels (Zhu, Yuchi & Xie, 2025): option checks, the
paper's defaults and the 1-D step function of its section 4.1 (Figures 1 and 3)."""
import numbers

import numpy as np

from .checks import positive_int

RANK = 128  # basis functions r (paper: 128 by default)
HIDDEN = 128  # hidden units per layer (paper: 128, tanh)
DEPTH = 2  # hidden layers of the MLP, residual blocks of the ResNet (paper: 2)
NOISE_INIT = 1e-2  # sigma^2 at the start (paper)
NOISE_LOWER_BOUND = 1e-6  # sigma^2 > 1e-6 (paper)
STEP_NOISE = 0.01  # noise variance of the step-function data (paper section 4.1)


def check_network(input_dim, rank, hidden, depth):
    """``(input_dim, rank, hidden, depth)`` as positive ints, or a ValueError/TypeError naming the bad one."""
    return (positive_int(input_dim, "input_dim"), positive_int(rank, "rank"), positive_int(hidden, "hidden"),
            positive_int(depth, "depth"))


def check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_noise(noise, name="noise"):
    """An initial noise variance: a finite number above :data:`NOISE_LOWER_BOUND`."""
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not np.isfinite(noise):
        raise TypeError(f"{name} must be a finite number, got {noise!r}")
    if not noise > NOISE_LOWER_BOUND:
        raise ValueError(f"{name} must exceed the lower bound {NOISE_LOWER_BOUND}, got {noise}")
    return float(noise)


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
