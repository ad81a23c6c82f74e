"""The kernel functions at inducing inputs, rotated so that the weights' prior is ``N(0, I)``:
``phi(x) = L^-1 k(Z, x)`` with ``L L^T = K(Z, Z) + jitter I``. The prior of ``f = phi(x)^T w`` is
that of :class:`~sparsegp_common.features.kernel_basis.InducingPointBasis` with its dense ``S``
(``f = k(x, Z) L^-T w``); Evans and Nair (2020, Sec. 2) note that any basis can be rotated to a
diagonal ``S`` at ``O(m^3)``. What changes is the curvature of the ELBO in the mean: ``K / noise +
I`` here, against ``K (K + noise I) / noise`` on the kernel functions themselves, whose spread is
the square of ``K``'s. At ``Z``'s own rows ``phi(z_l) = L[l]``, a row of the factor, which is read
from host memory (``O(1)`` per entry, as a step needs): there ``k`` carries the nugget that
``K(Z, Z) + jitter I`` has (``phi(z_l) = L^-1 (k(Z, z_l) + jitter e_l)``, so that ``f(Z) = L w``
has the prior ``N(0, K(Z, Z) + jitter I)``, as an SVGP's whitened ``u`` has); at other inputs
``phi`` costs a triangular solve, ``O(m^2)`` each (prediction).
"""
import copy

import numpy as np

from sparsegp_common.features.kernel_basis import InducingPointBasis
from sparsegp_common.ops import backend, device, namespace

__all__ = ["HostFactor", "WhitenedInducingBasis"]


class HostFactor:
    """``L`` ``(m, m)`` (NumPy, in host memory) with a lookup of ``Z``'s rows, and the kernel at
    held values (NumPy) for inputs that are not among them.

    Args:
        L: the lower Cholesky factor of ``K(Z, Z) + jitter I``.
        Z: ``(m, D)`` NumPy inputs.
        kernel: ``(A, B) -> K(A, B)`` on NumPy arrays.
    """

    def __init__(self, L, Z, kernel):
        self.L, self.Z, self.kernel = L, Z, kernel
        keys = _keys(Z)
        self._order = np.argsort(keys, kind="stable")  # repeated inputs read their first row
        self._sorted = keys[self._order]

    def rows(self, X):
        """The row of ``Z`` equal to each row of ``X`` ``(N, D)``, or -1: ``O(N D log m)``."""
        keys = _keys(np.asarray(X, dtype=self.Z.dtype))
        at = np.minimum(np.searchsorted(self._sorted, keys), len(self._sorted) - 1)
        return np.where(self._sorted[at] == keys, self._order[at], -1)

    def features(self, X, I):
        """``phi(X)[:, I]`` ``(N, len(I))``: rows of ``L`` where ``X``'s rows are ``Z``'s, a
        triangular solve for the others."""
        rows, I = self.rows(X), np.asarray(I)
        out = np.empty((len(rows), len(I)), dtype=self.L.dtype)
        found = rows >= 0
        if len(I) == self.L.shape[1] and np.array_equal(I, np.arange(len(I))):
            out[found] = self.L[rows[found]]  # whole rows (a full pass, a prediction): copies, not gathers
        else:
            out[found] = self.L[rows[found][:, None], I[None, :]]
        if not found.all():
            out[~found] = self.solve(np.asarray(X)[~found])[:, I]
        return out

    def solve(self, X):
        """``phi(X) = (L^-1 K(Z, X))^T`` ``(N, m)``: ``O(N m^2)``."""
        import scipy.linalg

        cross = self.kernel(self.Z, np.asarray(X, dtype=self.Z.dtype)).astype(self.L.dtype)
        return scipy.linalg.solve_triangular(self.L, cross, lower=True, check_finite=False).T


def _keys(X):
    """Each row of ``X`` as one comparable value (its bytes; ``-0.0`` read as ``0.0``)."""
    X = np.ascontiguousarray(X + 0.0)
    return X.view(np.dtype((np.void, X.dtype.itemsize * X.shape[1]))).ravel()


class WhitenedInducingBasis(InducingPointBasis):
    """``m`` functions ``phi(x) = L^-1 k(Z, x)`` with the prior precision ``S = I``, ``L`` the
    factor of ``K(Z, Z) + jitter I`` held in host memory (:class:`HostFactor`).

    Args:
        kernel: the stationary kernel (for ``k(x, Z)`` and ``k(x, x)``, as
            :class:`~sparsegp_common.features.kernel_basis.InducingPointBasis`).
        Z: ``(m, D)`` the inputs.
        jitter: added to ``K(Z, Z)``'s diagonal before factorising.
        factor: the :class:`HostFactor` of ``K(Z, Z) + jitter I``.
    """

    features_are_kernel = False

    def __init__(self, kernel, Z, jitter, factor):
        super().__init__(kernel, Z, jitter, 0.0)
        self.diagonal_prior, self.factor, self._solved = True, factor, None

    def features(self, X, I):
        """``phi(X)[:, I]``, ``(n, len(I))``: ``L[l, I]`` at ``Z``'s own rows ``l`` (in host
        memory), a solve elsewhere (or the features :meth:`at` computed for ``X``)."""
        self._check_columns(X)
        if self._solved is not None:
            return namespace(self._solved).take(self._solved, I, axis=1)
        return backend(X).on_host(self.factor.features, (X.shape[0], I.shape[0]), X, X, I)

    def at(self, X):
        """The same basis with ``phi(X)`` ``(N, m)`` computed once, for reading ``X``'s features in
        blocks of functions (one solve, not one per block)."""
        basis = copy.copy(self)
        xp, m = namespace(X), self.num_features
        every = xp.arange(m, device=device(X))
        basis._solved = backend(X).on_host(self.factor.features, (X.shape[0], m), X, X, every)
        return basis

    def prior_cross(self, X, I):
        """``K(X, Z[I])``, ``(n, len(I))``: the kernel functions themselves (Proposition 4's
        augmentation reads their norms)."""
        return self._K(X, self._rows(I))

    def prior_diagonal(self, I):
        """``S_ii = 1``."""
        xp = namespace(self.Z)
        return xp.ones(I.shape, dtype=self.Z.dtype, device=device(self.Z))
