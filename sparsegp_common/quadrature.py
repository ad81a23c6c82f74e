"""Gauss-Hermite nodes and weights for expectations under a standard normal."""
import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def standard_normal_nodes(num_points):
    """Nodes z and weights w with sum(w * g(z)) ~= E[g(Z)], Z ~ N(0, 1); exact for polynomials
    of degree < 2 * num_points."""
    if int(num_points) != num_points or num_points < 1:
        raise ValueError(f"num_gauss_hermite must be a positive integer, got {num_points}")
    x, w = np.polynomial.hermite.hermgauss(int(num_points))
    return x * np.sqrt(2.0), w / np.sqrt(np.pi)
