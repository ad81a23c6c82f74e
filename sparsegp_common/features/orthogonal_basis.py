"""Backend-free pieces of variational orthogonal features (Burt, Rasmussen & van der Wilk, 2020):
option checks, the choice of tensor-product multi-indices and Gauss-Legendre nodes on a box.

The features themselves are written once in ``orthogonal.py`` (adapted by
``pyro_sparsegp/vof.py`` and ``numpyro_sparsegp/vof.py``).
"""
import functools
import heapq
import itertools
import math
import numbers

import numpy as np

from sparsegp_common.checks import one_of, positive_int

BASES = ("fourier", "legendre")
DESIGNS = ("grid", "iid")


def check_num_features(num_features, basis, input_dim):
    """``M``; the 1-D Fourier basis has ``M = 2K + 1`` (a constant, K cosines and K sines)."""
    num_features = positive_int(num_features, "num_features")
    if basis == "fourier" and input_dim == 1 and num_features % 2 == 0:
        raise ValueError(
            f"num_features must be odd (2K + 1: a constant, K cosines and K sines) for 1-D Fourier "
            f"features, got {num_features}"
        )
    return num_features


def check_mc_options(basis, num_samples, num_quadrature, design):
    """``(basis, num_samples, num_quadrature, design)`` of Monte Carlo features, validated."""
    one_of(basis, "basis", BASES)
    one_of(design, "design", DESIGNS)
    return basis, positive_int(num_samples, "num_samples"), positive_int(num_quadrature, "num_quadrature"), design


def degree(basis, index):
    """The frequency rank of 1-D basis function ``index``: Fourier pairs cos/sin of the same
    frequency (``ceil(index / 2)``), Legendre and Hermite count the polynomial degree."""
    return (index + 1) // 2 if basis == "fourier" else index


def multi_indices(num_features, weights, basis="hermite"):
    """The ``num_features`` tensor-product multi-indices of smallest cost
    ``sum_d weights[d] * degree(m_d)``, ties broken by the index tuple.

    For Hermite features ``weights[d] = -log rho_d``, so the kept multi-indices are those with
    the largest products of eigenvalues ``prod_d lambda_{m_d}`` (``lambda_m`` proportional to
    ``rho^m``); for Fourier and Legendre features the weights are 1 (smallest total degree).

    Args:
        num_features: M.
        weights: ``(D,)`` positive costs per unit of degree in each dimension.
        basis: ``"hermite"``, ``"fourier"`` or ``"legendre"`` (how an index maps to a degree).

    Returns:
        int64 array ``(M, D)``, sorted by cost (the first row is all zeros).
    """
    weights = tuple(float(w) for w in np.atleast_1d(np.asarray(weights, dtype=np.float64)))
    return _multi_indices(positive_int(num_features, "num_features"), weights, basis).copy()


@functools.lru_cache(maxsize=64)
def _multi_indices(num_features, weights, basis):
    D = len(weights)

    def cost(index):  # rounded so that equal-cost indices tie exactly and fall back to the tuple
        return round(sum(w * degree(basis, m) for w, m in zip(weights, index)), 9)

    start = (0,) * D
    heap, seen, out = [(0.0, start)], {start}, []
    while len(out) < num_features:
        _, index = heapq.heappop(heap)
        out.append(index)
        for d in range(D):
            nxt = index[:d] + (index[d] + 1,) + index[d + 1 :]
            if nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (cost(nxt), nxt))
    return np.array(out, dtype=np.int64).reshape(num_features, D)


@functools.lru_cache(maxsize=16)
def legendre_nodes(num_points, input_dim):
    """Tensor-product Gauss-Legendre rule on ``[-1, 1]^D``: nodes ``(Q^D, D)``, weights ``(Q^D,)``."""
    x, w = np.polynomial.legendre.leggauss(positive_int(num_points, "num_quadrature"))
    nodes = np.array(list(itertools.product(x, repeat=input_dim)), dtype=np.float64).reshape(-1, input_dim)
    weights = np.prod(np.array(list(itertools.product(w, repeat=input_dim)), dtype=np.float64).reshape(-1, input_dim), -1)
    return nodes, weights


def check_input_dim(values, name):
    """Number of input dimensions given by a positive scalar or ``(D,)`` vector of initial values."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a vector (D,), got shape {array.shape}")
    if not np.all(np.isfinite(array)) or not np.all(array > 0):
        raise ValueError(f"{name} must be positive and finite, got {array}")
    return max(array.size, 1)


def fourth_root_two_pi(input_dim):
    """``(2 pi)^(-D/4)``, the normalisation that makes ``Kuu = I``."""
    if not isinstance(input_dim, numbers.Integral):
        raise TypeError("input_dim must be an integer")
    return (2 * math.pi) ** (-input_dim / 4)
