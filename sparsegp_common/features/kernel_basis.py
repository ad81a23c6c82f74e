"""Kernel functions at fixed inputs as a weight-space basis: ``phi_j(x) = k(x, z_j)`` with the
prior precision ``S = K(Z, Z) + jitter I`` of the weights, so that ``f = Phi w`` with
``w ~ N(0, S^-1)`` has the prior ``N(0, K(X, Z) S^-1 K(Z, X))``: the GP itself at the inputs
``Z`` (Evans and Nair, 2020, App. I.2: with ``Z`` every training input, ``Phi = S = K`` and the
model recovers the exact GP's posterior mean); or with a learnt diagonal ``S = diag(s)``, one
precision per function: the relevance vector machine (Tipping, 2001; their QSRVM). The basis of
:class:`~sparsegp_common.priors.qsgp.QSGP` with ``inducing_points``, read by index like
:class:`~sparsegp_common.features.random_fourier.RandomFourierBasis`.
"""
import copy

from sparsegp_common.features.weight_basis import WeightBasis
from sparsegp_common.kernels import Stationary
from sparsegp_common.ops import backend, device, namespace

__all__ = ["InducingPointBasis"]


class InducingPointBasis(WeightBasis):
    """``m`` kernel functions ``k(., z_j)`` of a stationary ``kernel`` at the inputs ``Z``, with the
    dense prior precision ``S = K(Z, Z) + jitter I``, or the diagonal ``S = diag(exp(log_precision))``.

    Args:
        kernel: a stationary kernel (its lengthscale and variance are read at every call unless
            held: :meth:`fixed`).
        Z: ``(m, D)`` the inputs.
        jitter: added to the dense ``S``'s diagonal.
        log_det: ``log|S|`` of the dense ``S`` (its ``O(m^3)`` factorisation done once by the
            owner; the loss adds it as a constant).
        log_precision: None (the dense ``S``), or ``(m,)`` the log precisions (or their rows at
            ``index``: :meth:`gathered`).
    """

    #: ``phi_j = k(., z_j)``, so ``|phi(x)|^2 = |k(x, Z)|^2`` (Proposition 4's augmentation)
    features_are_kernel = True

    def __init__(self, kernel, Z, jitter, log_det, log_precision=None):
        if not isinstance(kernel, Stationary):
            raise TypeError(f"inducing points need a stationary kernel, got {type(kernel).__name__}")
        self.kernel, self.Z, self.jitter, self.log_det = kernel, Z, float(jitter), log_det
        self.log_precision, self.index = log_precision, None
        self.diagonal_prior = log_precision is not None

    def gathered(self, index, log_precision):
        """The same basis reading the log precisions from their rows ``index`` only (sorted;
        ``log_precision`` ``(len(index),)``): a step that holds only those rows."""
        basis = copy.copy(self)
        basis.index, basis.log_precision = index, log_precision
        return basis

    @property
    def num_features(self):
        return self.Z.shape[0]

    @property
    def input_dim(self):
        return self.Z.shape[1]

    def _K(self, A, B):
        return self.kernel.K_at(A, B, *self._lengthscale_and_variance())

    def _rows(self, I):
        return namespace(self.Z).take(self.Z, I, axis=0)

    def _check_columns(self, X):
        if X.shape[-1] != self.input_dim:
            raise ValueError(f"X has {X.shape[-1]} columns but the basis has input_dim={self.input_dim}")

    def features(self, X, I):
        """``Phi[:, I] = K(X, Z[I])``, ``(n, len(I))``."""
        self._check_columns(X)
        return self._K(X, self._rows(I))

    def prior_cross(self, X, I):
        """``K(X, Z[I])``, ``(n, len(I))``: the kernel between other inputs and the ``Z`` that
        ``S`` is built on (for the Nystrom control variate, App. F.2)."""
        return self.features(X, I)

    def gram(self, X):
        """``K(X, X)``, ``(n, n)``."""
        return self._K(X, X)

    def prior_block(self, J, I):
        """``S[J, I]``, ``(len(J), len(I))``: the kernel, plus ``jitter`` where ``j = i``."""
        xp = namespace(self.Z)
        block = self._K(self._rows(J), self._rows(I))
        return block + self.jitter * xp.astype(J[:, None] == I[None, :], block.dtype)

    def prior_diagonal(self, I):
        """``S_ii``: ``k(z_i, z_i) + jitter``, or the learnt precision."""
        if self.log_precision is None:
            return self.kernel_diagonal(self._rows(I)) + self.jitter
        xp = namespace(self.log_precision)
        at = I if self.index is None else xp.searchsorted(self.index, I, side="left")
        return xp.exp(xp.take(self.log_precision, at, axis=0))

    def kernel_diagonal(self, X):
        """``k(x, x)``, ``(N,)``."""
        variance = self._lengthscale_and_variance()[1]
        return namespace(X).ones(X.shape[:1], dtype=X.dtype, device=device(X)) * variance

    def prior_log_det(self):
        """``log|S|`` (computed once, when the basis was made)."""
        return self.log_det

    def prior_quadratic(self, V, block):
        """``diag(V^T S V)``, ``(p,)``, for ``V`` ``(m, p)``, over blocks of ``block`` rows of ``S``
        (memory ``O(block m)``): ``O(m^2 p)``."""
        xp = namespace(V)
        every = xp.arange(self.num_features, device=device(V))

        def rows(I, weights):
            V_I = xp.take(V, I, axis=0)
            part = V_I * (self.prior_block(I, every) @ V)
            return xp.sum(part if weights is None else part * weights[:, None], axis=0)

        return backend(V).blockwise_sum(rows, self.num_features, min(block, self.num_features), V)
