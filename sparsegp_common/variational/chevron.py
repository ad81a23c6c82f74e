"""The chevron family of weight-space posteriors (Challis and Barber, 2013; used by Evans and Nair,
2020, "Quadruply stochastic Gaussian processes", Sec. 2.2): ``q(w) = N(q_mu, C C^T)`` over ``m``
weights with a lower-triangular ``C`` whose first ``k`` columns are dense below the diagonal and
whose other columns hold only their diagonal. ``k = 0`` is mean-field, ``k = m`` a full Cholesky
factor; about ``(k + 2) m`` numbers in all.

Every read is of gathered rows (``mean(I)``, ``column_block(I, R)``, ``log_diagonal(I)``), so an
estimator that touches ``m~`` of the ``m`` weights costs ``O(m~ k)``, not ``O(m)``.
"""
from sparsegp_common.ops import device, namespace

__all__ = ["Chevron", "GatheredChevron"]


class Chevron:
    """``q(w)`` from its tables.

    Args:
        q_mu: ``(m,)`` mean.
        log_diagonal: ``(m,)`` ``log C_rr`` (the diagonal kept positive).
        dense: ``(m, k)``: ``C_ir`` for ``i > r`` of the first ``k`` columns (entries on and above
            the diagonal are ignored).
    """

    def __init__(self, q_mu, log_diagonal, dense):
        if q_mu.ndim != 1 or log_diagonal.shape != q_mu.shape:
            raise ValueError(f"q_mu and log_diagonal must both be (m,), got {tuple(q_mu.shape)} and "
                             f"{tuple(log_diagonal.shape)}")
        if dense.ndim != 2 or dense.shape[0] != q_mu.shape[0] or dense.shape[1] > q_mu.shape[0]:
            raise ValueError(f"dense must be (m, k) with k <= m = {q_mu.shape[0]}, got {tuple(dense.shape)}")
        self.q_mu, self.log_diag, self.dense = q_mu, log_diagonal, dense

    @property
    def num_weights(self):
        return self.q_mu.shape[0]

    @property
    def num_dense(self):
        return self.dense.shape[1]

    def _at(self, I):
        """Where the rows ``I`` are in the tables held (all ``m`` rows here)."""
        return I

    def mean(self, I):
        """``q_mu[I]``, ``(len(I),)``."""
        return namespace(self.q_mu).take(self.q_mu, self._at(I), axis=0)

    def log_diagonal(self, I):
        """``log C_ii`` for ``i`` in ``I``."""
        return namespace(self.log_diag).take(self.log_diag, self._at(I), axis=0)

    def column_block(self, I, R):
        """``C[I, R]``, ``(len(I), len(R))``, for dense columns ``R`` (each ``< k``): the dense
        entry below the diagonal, ``C_rr`` on it, zero above it (:meth:`entries`)."""
        return self.entries(I, R)

    def entries(self, I, R):
        """``C[I, R]``, ``(len(I), len(R))``, for any columns ``R`` (dense or diagonal)."""
        xp = namespace(self.dense)
        k = self.num_dense
        rows, cols = I[:, None], R[None, :]
        if k:
            below = xp.take(xp.take(self.dense, self._at(I), axis=0), xp.clip(R, 0, k - 1), axis=1)
            below = xp.where((cols < k) & (rows > cols), below, xp.zeros_like(below))
        else:
            below = xp.zeros((I.shape[0], R.shape[0]), dtype=self.dense.dtype, device=device(self.dense))
        diagonal = xp.exp(self.log_diagonal(I))[:, None]
        return below + xp.where(rows == cols, diagonal, xp.zeros_like(below))

    def covariance(self):
        """The dense ``C C^T``, ``(m, m)``: for small ``m`` (references, diagnostics)."""
        C = self.dense_factor()
        return C @ C.mT

    def dense_factor(self):
        """The dense ``C``, ``(m, m)``: for small ``m``."""
        xp = namespace(self.dense)
        m, k = self.num_weights, self.num_dense
        rows = xp.arange(m)
        return self.column_block(rows, xp.arange(k)) if k == m else xp.concat(
            [self.column_block(rows, xp.arange(k)),
             xp.eye(m, dtype=self.dense.dtype)[:, k:] * xp.exp(self.log_diag)[:, None]], axis=1)


class GatheredChevron(Chevron):
    """``q(w)`` from the rows ``index`` of its tables only (gathered by the caller: a step that
    reads ``m~`` rows then holds, differentiates and updates ``O(m~ k)`` numbers, not ``O(m k)``).
    Its reads take any rows among ``index`` (``mean(I)``, ``column_block(I, R)``, ...); a repeated
    row is read from its first copy, so the other copies get no gradient.

    Args:
        index: ``(r,)`` the rows held, sorted (repeats allowed).
        q_mu, log_diagonal: ``(r,)``; dense: ``(r, k)``: the tables at ``index``.
        num_weights: ``m``.
    """

    def __init__(self, index, q_mu, log_diagonal, dense, num_weights):
        self.index, self.q_mu, self.log_diag, self.dense, self._num_weights = index, q_mu, log_diagonal, dense, num_weights

    @property
    def num_weights(self):
        return self._num_weights

    def _at(self, I):
        return namespace(self.index).searchsorted(self.index, I, side="left")

    def dense_factor(self):
        raise TypeError("a GatheredChevron holds only some rows of C: build the dense factor from the whole tables")
