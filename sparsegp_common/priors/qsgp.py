"""Quadruply stochastic GPs (Evans and Nair, 2020, "Quadruply stochastic Gaussian processes"): a
weight-space prior component ``f(x) = phi(x)^T w`` over ``m`` random Fourier features, or the
kernel functions at inducing points (with the dense prior precision ``S = K``, or the relevance
vector machine's learnt diagonal one), with the chevron family ``q(w) = N(q_mu, C C^T)`` (Sec.
2.2), and the loss that trains it in ``O(n~ m~ (1 + k))`` per step, whatever ``n`` and ``m``.

:class:`QSGP` is an ordinary prior component: ``GPModel(QSGP(...), likelihood)``, ``predict_f``,
``predict_y`` and ``model``/``guide`` in a user's model work as for every other prior, with the
exact-in-``m`` data term (``O(n~ m k)`` per step), or (``num_basis``) the subsampled one. :func:`quadruply_stochastic_loss` is the
paper's estimator for the Gaussian likelihood (Theorems 1-2, Propositions 1-2;
:mod:`sparsegp_common.objectives.quadruply_stochastic`), used through the backends'
``QuadruplyStochasticELBO`` loss with ``fit`` or SVI.
"""
import contextlib
import warnings

import numpy as np

from sparsegp_common import checks
from sparsegp_common.features.kernel_basis import InducingPointBasis
from sparsegp_common.features.random_fourier import RandomFourierBasis
from sparsegp_common.features.whitened_basis import HostFactor, WhitenedInducingBasis
from sparsegp_common.linalg import CholeskyError, cholesky
from sparsegp_common.likelihoods import Gaussian
from sparsegp_common.objectives import control_variates, quadruply_stochastic, snapshot
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors import GPPrior
from sparsegp_common.variational.chevron import Chevron, GatheredChevron

__all__ = ["ChevronPosterior", "QSGP", "QuadruplyStochasticELBO", "draw_for", "quadruply_stochastic_loss", "rows_for"]

#: Basis functions per block when ``q(f)`` is evaluated at many inputs (memory ``O(N BLOCK)``).
BLOCK = 2048


class QSGP(GPPrior):
    """A weight-space GP prior component ``f(x) = phi(x)^T w`` with a chevron ``q(w)``, on ``m``
    random Fourier features or on the kernel functions at ``inducing_points``.

    Random Fourier features (the default): ``phi_i(x) = sqrt(2 variance / m) cos(omega_i^T x + b_i)``,
    ``w ~ N(0, I)`` (so that ``E[phi(x)^T phi(z)] = k(x, z)``;
    :class:`~sparsegp_common.features.random_fourier.RandomFourierBasis`); the kernel's
    hyperparameters are learnt with the rest (empirical Bayes).

    Inducing points (``inducing_points=Z``, e.g. every training input as in Evans and Nair, 2020,
    App. I.2): ``phi_j(x) = k(x, z_j)`` and ``w ~ N(0, S^-1)`` with the dense ``S = K(Z, Z) +
    jitter I`` (:class:`~sparsegp_common.features.kernel_basis.InducingPointBasis`), so that the
    prior of ``f`` at ``Z`` is the GP's. The kernel's hyperparameters and ``Z`` are held at their
    values (no gradient): ``log|S|`` has no ``O(1)`` estimate, so it is computed once here
    (``O(m^3)`` time and ``O(m^2)`` float64 memory on the host; where ``K(Z, Z) + jitter I`` does
    not factorise, ``jitter`` is raised tenfold, up to three times, with a warning) and the
    ELBO's hyperparameter gradient would miss it. With a small noise ``q_mu`` converges slowly
    on this basis (its curvature ``K (K + noise I) / noise`` squares ``K``'s spread; docs/usage.md,
    "Inducing points at every training input").

    Whitened (``inducing_points=Z, whiten=True``): the same prior on the rotated functions
    ``phi(x) = L^-1 k(Z, x)``, ``L L^T = K(Z, Z) + jitter I``, with ``w ~ N(0, I)``
    (:class:`~sparsegp_common.features.whitened_basis.WhitenedInducingBasis`; at ``Z`` itself
    ``f = L w``, the SVGP's whitening). The mean's curvature is then ``K / noise + I`` instead of
    ``K (K + noise I) / noise``, whose spread is the square of ``K``'s, so that first-order steps
    converge far faster (benchmarks/RESULTS.md, "the whitened basis"). ``L`` (``O(m^3)`` once, on the host in float64) is kept in host memory in
    ``Z``'s dtype (``m^2`` numbers); a step reads its entries at the minibatch's rows, which must
    be rows of ``Z`` to cost ``O(1)`` each (others cost a triangular solve: prediction). The
    kernel's hyperparameters and ``Z`` are held, as with the dense ``S``.

    The relevance vector machine (``inducing_points=Z, relevance=True``; Tipping, 2001; Evans and
    Nair's QSRVM, App. I.3): the same basis with a diagonal ``S = diag(s)``, one precision per
    function in ``<name>.log_precision`` (``log s``, starting at 0), learnt by empirical Bayes with
    the kernel's hyperparameters; functions whose ``s`` grows large (the paper: ``s >= 10^4``)
    are pruned, the others are the relevance vectors.

    ``q(w) = N(q_mu, C C^T)`` with a lower-triangular ``C`` whose first ``num_dense`` columns
    are dense and the others diagonal (Sec. 2.2).

    Args:
        kernel: a squared exponential or Matern kernel (any stationary kernel with
            ``inducing_points``).
        num_features: ``m``, the number of basis functions (random Fourier: the frequencies are
            recomputed from ``seed`` and their index, never stored); with ``inducing_points``
            their number (None: taken from them).
        input_dim: ``D`` (None with ``inducing_points``: their columns).
        inducing_points: None, or ``(m, D)`` inputs ``Z`` of the kernel basis.
        num_dense: ``k``, the dense columns of ``C``: 0 (the default) is mean-field, ``m`` a
            full Cholesky factor; ``(k + 2) m`` numbers in all.
        seed: an integer naming the frequencies.
        relevance: with ``inducing_points``, learn a diagonal ``S`` (the relevance vector machine).
        whiten: with ``inducing_points``, the rotated functions with ``S = I`` (see above).
        jitter: added to ``S``'s diagonal (inducing points).
        num_basis: None, or ``m~``: in a user's model (``gp.model``/``gp.guide``), each step draws
            ``m~`` basis indices and ``w = q_mu + C eps`` (sites ``<name>.basis_draw`` and
            ``<name>.eps``, masked) and takes ``f = (m / m~) Phi[:, I] w_I``, unbiased for
            ``Phi w``, with the KL estimated from the same rows (the reparameterised subsampled
            bound: a lower bound in expectation for a log-concave likelihood, by a gap that
            shrinks as ``m~`` grows), ``O(B m~ k)`` per step; None: ``f`` from ``q(f)``'s exact
            marginals, ``O(B m k)``. Needs a diagonal ``S``.
        augment_noise: None, or the Gaussian likelihood's noise variance ``sigma^2`` (inducing
            points): ``q(f(x))`` then adds Evans and Nair's Proposition 4 (App. G), the basis
            function ``k(., x)`` at its optimal variance, uncorrelated with the others:
            ``k(x, x)^2 / (|k(x, Z)|^2 / sigma^2 + k(x, x))``, which brings the variance back to
            the prior's away from ``Z`` (a latent variance: ``predict_y`` adds the noise).
        mean_function: as for every prior (None: zero).
        name: prefix of the parameters ``<name>.q_mu`` ``(m,)``, ``<name>.q_log_diag`` ``(m,)``
            (``log C_ii``) and ``<name>.q_dense`` ``(m, k)`` (``C_ir``, ``i > r``) (and
            ``<name>.Z``, held, with inducing points; ``<name>.log_precision`` ``(m,)`` with
            ``relevance``) and of the sites.

    ``q`` starts at the prior's mean and at ``C_ii = S_ii^(-1/2)`` (the prior itself when
    ``S = I``: ``KL = 0``).
    """

    def __init__(self, kernel, num_features=None, input_dim=None, *, inducing_points=None, num_dense=0, seed=0,
                 relevance=False, whiten=False, jitter=1e-6, num_basis=None, augment_noise=None, mean_function=None,
                 name="gp"):
        super().__init__(name)
        self.kernel = kernel
        like = kernel.first_parameter()
        self.jitter = checks.nonnegative_float(jitter, "jitter")
        self.augment_noise = None if augment_noise is None else checks.positive_float(augment_noise, "augment_noise")
        if not isinstance(relevance, bool):
            raise TypeError(f"relevance must be True or False, got {relevance!r}")
        if not isinstance(whiten, bool):
            raise TypeError(f"whiten must be True or False, got {whiten!r}")
        self._log_det, self._factor, self.relevance = None, None, relevance
        if relevance and (inducing_points is None or augment_noise is not None):
            raise ValueError("relevance=True takes inducing_points and no augment_noise (App. G's added function "
                             "has the dense prior's precision)")
        if whiten and (inducing_points is None or relevance):
            raise ValueError("whiten=True takes inducing_points, without relevance")
        if inducing_points is None:
            if num_features is None or input_dim is None:
                raise TypeError("QSGP needs num_features and input_dim (random Fourier features), or inducing_points")
            if augment_noise is not None:
                raise ValueError("augment_noise is for inducing_points (App. G adds the basis function k(., x))")
            m = checks.positive_int(num_features, "num_features")
            self._input_dim = checks.positive_int(input_dim, "input_dim")
        else:
            Z = self._checks.inputs(inducing_points, "inducing_points", input_dim, like=like)
            m, self._input_dim = Z.shape
            if num_features is not None and checks.positive_int(num_features, "num_features") != m:
                raise ValueError(f"num_features={num_features} but inducing_points has {m} rows")
            self._param("Z", namespace(Z).asarray(Z, copy=True))
            InducingPointBasis(kernel, Z, self.jitter, None)  # refuses kernels that are not stationary
            if relevance:
                self._param("log_precision", namespace(Z).zeros((m,), dtype=Z.dtype, device=device(Z)))
            else:
                L, self.jitter, host_Z = _factor(kernel, Z, self.jitter, self._checks.host)
                if whiten:
                    self._factor = HostFactor(L.astype(host_Z.dtype), host_Z, _host_kernel(kernel, self._checks.host))
                else:
                    self._log_det = float(2 * np.sum(np.log(np.diagonal(L))))
        self.num_dense = checks.nonnegative_int(num_dense, "num_dense")
        if self.num_dense > m:
            raise ValueError(f"num_dense must be at most num_features = {m}, got {num_dense}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        self.num_features, self.seed = m, seed
        self.num_basis = None if num_basis is None else checks.positive_int(num_basis, "num_basis")
        if self.num_basis is not None and self._log_det is not None:
            raise ValueError("num_basis (the subsampled pair) needs a diagonal prior precision: random Fourier "
                             "features, whiten=True or relevance=True")
        self.basis  # refuses kernels without a random Fourier basis
        xp = namespace(like)
        # C_ii = S_ii^(-1/2): the prior's scale (with S = I, the prior itself)
        S = backend(like).stop_gradient(self.basis.prior_diagonal(xp.arange(m, device=device(like))))
        self._param("q_mu", xp.zeros((m,), dtype=like.dtype, device=device(like)))  # three arrays, not views of one
        self._param("q_log_diag", -0.5 * xp.log(S))
        self._param("q_dense", xp.zeros((m, self.num_dense), dtype=like.dtype, device=device(like)))
        self._set_mean_function(mean_function, like)

    @property
    def input_dim(self):
        return self._input_dim

    @property
    def basis(self):
        """The basis of the (bound) kernel: random Fourier features, or the kernel functions at
        ``Z`` (held) with the learnt diagonal ``S`` or with the dense one and the hyperparameters held."""
        if self.relevance:
            return InducingPointBasis(self.kernel, backend(self.Z).stop_gradient(self.Z), self.jitter, None,
                                      self.log_precision)
        if self._log_det is None and self._factor is None:
            return RandomFourierBasis(self.kernel, self.num_features, self.input_dim, self.seed)
        hold = backend(self.Z).stop_gradient
        if self._factor is not None:
            basis = WhitenedInducingBasis(self.kernel, hold(self.Z), self.jitter, self._factor)
        else:
            basis = InducingPointBasis(self.kernel, hold(self.Z), self.jitter, self._log_det)
        return basis.fixed(hold(self.kernel.lengthscale), hold(self.kernel.variance))

    def set_optimal_diagonal(self, X, noise):
        """Set ``log C_rr`` of the diagonal columns (``r >= num_dense``) to Evans and Nair's
        Proposition 1 optimum for the training inputs ``X`` ``(n, D)`` (all of them) and the
        Gaussian noise variance ``noise``: ``C_rr^2 = 1 / (|phi_r(X)|^2 / noise + S_rr)``, exact at
        the current hyperparameters whatever ``q_mu`` and the dense columns (the ELBO separates
        by columns), so that only they are left to the stochastic steps while the
        hyperparameters are held. ``O(n m)`` once, over blocks of :data:`BLOCK` functions; the
        dense columns are left as they are."""
        X = self._checks.inputs(X, "X", self.input_dim, like=self.first_parameter())
        noise = checks.positive_float(float(noise), "noise")
        xp, ops, basis = namespace(X), backend(X), self.basis.held()
        m, k = self.num_features, self.num_dense
        parts = []
        for start in range(0, m, BLOCK):
            I = xp.arange(start, min(start + BLOCK, m), device=device(X))
            norms = sum(xp.sum(basis.features(X[r:r + BLOCK], I) ** 2, axis=0) for r in range(0, X.shape[0], BLOCK))
            parts.append(-0.5 * xp.log(norms / noise + basis.prior_diagonal(I)))
        optimum = ops.stop_gradient(xp.concat(parts))
        current = ops.stop_gradient(self.q_log_diag)
        keep = xp.arange(m, device=device(X)) < k
        setattr(self, "q_log_diag", xp.where(keep, current, xp.astype(optimum, current.dtype)))

    @property
    def site_names(self):
        names = super().site_names
        return names + ((f"{self.name}.basis_draw", f"{self.name}.eps") if self.num_basis else ())

    def model(self, X, plate=None):
        return super().model(X, plate) if self.num_basis is None else self._subsampled(X, plate, guide=False)

    def guide(self, X, plate=None):
        return super().guide(X, plate) if self.num_basis is None else self._subsampled(X, plate, guide=True)

    model.__doc__, guide.__doc__ = GPPrior.model.__doc__, GPPrior.guide.__doc__

    def _subsampled(self, X, plate, guide):
        """The sites of the subsampled pair (``num_basis``): the draw, in the model the KL
        estimate's factor, and ``f`` (the guide's a masked point mass at ``f_hat``)."""
        mean_function = getattr(self, "mean_function", None)
        if mean_function is not None and mean_function.coefficient_prior is not None:
            raise ValueError("num_basis takes mean functions without a coefficient prior")
        X = self._checks.inputs(X, "X", self.input_dim, values=False, like=self.first_parameter())
        with self._sites.bound(self, hyperpriors=True) as (prior,):
            drawn, q, basis = prior._draw_sites(), prior.chevron(), prior.basis
            if not guide:
                self._sites.factor(f"{self.name}.kl", -quadruply_stochastic.kl_estimate(basis, q, drawn.I))
            with prior._data(X, plate) as Xb:
                if guide:
                    f = prior.plus_mean_function(quadruply_stochastic.subsampled_f(basis, q, Xb, drawn), Xb)
                    return self._sites.sample(f"{self.name}.f", self._dist.Delta(f).mask(False))
                var = prior.prior_variance(Xb)
                return self._sites.sample(f"{self.name}.f", prior._f_dist(namespace(var).zeros_like(var), var))

    def _draw_sites(self):
        """A :class:`~sparsegp_common.objectives.quadruply_stochastic.BoundDraw` from two masked
        sites (the model replays the guide's): ``num_basis`` uniform indices in ``[0, m)`` and
        ``num_dense + num_basis`` standard normals."""
        like = self.first_parameter()
        xp, m, k, size = namespace(like), self.num_features, self.num_dense, self.num_basis

        def site(name, dist, shape):
            zeros = xp.zeros(shape, dtype=like.dtype, device=device(like))
            return self._sites.sample(f"{self.name}.{name}", dist(zeros, zeros + 1).to_event(1).mask(False))

        u = site("basis_draw", self._dist.Uniform, (size,))
        eps = site("eps", self._dist.Normal, (k + size,))
        I = xp.clip(xp.astype(xp.floor(u * m), xp.int64 if m >= 2**31 else xp.int32), 0, m - 1)
        return quadruply_stochastic.BoundDraw(I, eps[:k], eps[k:])

    def chevron(self):
        """``q(w)`` as a :class:`~sparsegp_common.variational.chevron.Chevron` (read by gathered rows)."""
        return Chevron(self.q_mu, self.q_log_diag, self.q_dense)

    def _posterior(self):
        return ChevronPosterior(self.basis, self.chevron(), self.augment_noise)

    def prior_variance(self, X):
        return self.kernel.K_diag(X)


def _factor(kernel, Z, jitter, host):
    """``(L, jitter, Z)``: the factor of ``K(Z, Z) + jitter I`` by one factorisation on the host
    in float64 (the kernel matrix too: float32 round-off alone makes a large one indefinite), at
    the kernel's current values, and ``Z`` on the host in its dtype; where it fails, ``jitter`` is
    raised tenfold up to three times, with a warning."""
    host_Z = np.asarray(host(Z))
    K = _host_kernel(kernel, host)(host_Z, host_Z)
    variance = float(np.asarray(host(kernel.variance)))
    levels = [jitter] + [max(jitter, 1e-8 * float(variance)) * 10.0**i for i in range(1, 4)]
    for level in levels:
        try:
            L = cholesky(K, level, max_tries=0)
        except CholeskyError:
            if level == levels[-1]:
                raise
            continue
        if level != jitter:
            warnings.warn(f"QSGP: K(Z, Z) + {jitter:g} I is not numerically positive definite; "
                          f"S = K(Z, Z) + {level:g} I instead (give jitter={level:g} to say so)", stacklevel=3)
        return L, level, host_Z


def _host_kernel(kernel, host):
    """``(A, B) -> K(A, B)`` in float64 NumPy at the kernel's current values."""
    lengthscale, variance = (np.asarray(host(a), dtype=np.float64) for a in (kernel.lengthscale, kernel.variance))
    return lambda A, B: kernel.K_at(np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64), lengthscale,
                                    variance)


class ChevronPosterior:
    """``q(f(X))`` of a weight-space model ``f = Phi w`` with ``q(w)`` a chevron and the prior
    ``w ~ N(0, S^-1)``: the posterior interface of :mod:`sparsegp_common.priors` (``kl``,
    ``marginals``; no global site ``u``, as ``w`` is integrated out). ``augment_noise``: see
    :class:`QSGP` (a basis of kernel functions only)."""

    def __init__(self, basis, q, augment_noise=None):
        self.basis, self.q, self.augment_noise = basis, q, augment_noise

    def prior_u(self):
        return None

    q_u = prior_u

    def kl(self):
        """``KL[q(w) || N(0, S^-1)]`` in closed form: ``O(m k)`` for a diagonal ``S``, ``O(m^2 k)``
        (over blocks of :data:`BLOCK` rows of ``S``) for a dense one."""
        q, basis = self.q, self.basis
        xp = namespace(q.q_mu)
        m, k = q.num_weights, q.num_dense
        rows = xp.arange(m, device=device(q.q_mu))
        S = basis.prior_diagonal(rows)
        if basis.diagonal_prior:
            below = xp.astype(rows[:, None] > xp.arange(k, device=device(q.q_mu))[None, :], q.dense.dtype)
            row_squares = xp.sum((q.dense * below) ** 2, axis=1) + xp.exp(2 * q.log_diag)  # rows of C C^T's diagonal
            return 0.5 * (xp.sum(S * (row_squares + q.q_mu**2)) - m - xp.sum(xp.log(S)) - 2 * xp.sum(q.log_diag))
        # mu^T S mu and c_r^T S c_r for the dense columns; S_rr C_rr^2 for the diagonal ones
        dense = xp.sum(basis.prior_quadratic(_columns(q, rows), BLOCK))
        diagonal = xp.sum(xp.where(rows >= k, S * xp.exp(2 * q.log_diag), 0.0))
        return 0.5 * (dense + diagonal - m - basis.prior_log_det() - 2 * xp.sum(q.log_diag))

    def marginals(self, X, full_cov=False):
        """Mean ``Phi q_mu`` ``(N,)`` and variance ``|C^T phi(x)|^2`` ``(N,)`` (``(N, N)`` covariance
        when ``full_cov``; with ``augment_noise`` Proposition 4's term on the diagonal), over
        blocks of :data:`BLOCK` basis functions (one compiled block in JAX, however large
        ``m``): ``O(N m k)``."""
        q = self.q
        xp = namespace(X, q.q_mu)
        N, k = X.shape[0], q.num_dense
        columns = xp.arange(k, device=device(q.q_mu))
        # hyperparameters read once: a block recomputed in the backward pass reads no parameter
        basis = self.basis.held().at(X)
        augment = self.augment_noise is not None

        def block(I, weights):
            """``[Phi q_mu, Phi C[:, :k], the diagonal columns' part (, |Phi|^2)]`` of the rows ``I``."""
            Phi = basis.features(X, I)
            if weights is not None:  # padding rows count zero
                Phi = Phi * weights
            scaled = Phi * (xp.exp(q.log_diagonal(I)) * xp.astype(I >= k, X.dtype))
            rest = scaled @ scaled.mT if full_cov else xp.sum(scaled**2, axis=-1)[:, None]
            if augment:  # |k(x, Z)|^2, of the unweighted functions
                cross = Phi if basis.features_are_kernel else basis.prior_cross(X, I)
                if weights is not None and not basis.features_are_kernel:
                    cross = cross * weights
            norms = [xp.sum(cross**2, axis=-1)[:, None]] if augment else []
            return xp.concat([(Phi @ q.mean(I))[:, None], Phi @ q.column_block(I, columns), rest] + norms, axis=1)

        total = backend(X).blockwise_sum(block, q.num_weights, min(BLOCK, q.num_weights), X)
        mean, projected = total[:, 0], total[:, 1:1 + k]
        rest = total[:, 1 + k:1 + k + (N if full_cov else 1)]
        added = _augmentation(basis, X, total[:, -1], self.augment_noise) if augment else 0.0
        if full_cov:
            eye = xp.eye(N, dtype=X.dtype, device=device(X))
            return mean, rest + projected @ projected.mT + eye * added
        return mean, rest[:, 0] + xp.sum(projected**2, axis=-1) + added


def _augmentation(basis, X, norms, noise):
    """Evans and Nair's Proposition 4: the variance of the added basis function ``k(., x)`` at its
    optimal (Proposition 1) scale, ``k(x, x)^2 / (|k(x, Z)|^2 / noise + k(x, x))``, ``(N,)``;
    ``norms``: ``|k(x, Z)|^2``."""
    prior = basis.kernel_diagonal(X)
    return prior**2 / (norms / noise + prior)


def _columns(q, I):
    """``v[I]``, ``(len(I), 1 + k)``: the mean and the dense columns of ``C`` at the rows ``I``,
    the vectors whose data quadratics the control variates cancel."""
    mean = q.mean(I)[:, None]
    if not q.num_dense:
        return mean
    xp = namespace(mean)
    return xp.concat([mean, q.column_block(I, xp.arange(q.num_dense, device=device(I)))], axis=1)


def _support_product(support, q):
    """``Phi_p v`` exactly, ``(n_bar, 1 + k)``, over blocks of :data:`BLOCK` rows of ``v``: ``O(n_bar m k)``.
    A constant: read from the tables held out of the gradient, so that no backward pass is
    prepared over its ``m / BLOCK`` blocks (in torch, GBs at ``m = 10^7``)."""
    ops = backend(q.q_mu)
    q = Chevron(*(ops.stop_gradient(table) for table in (q.q_mu, q.log_diag, q.dense)))

    def block(I, weights):
        v = _columns(q, I)
        return support.features(I) @ (v if weights is None else v * weights[:, None])

    return ops.blockwise_sum(block, q.num_weights, min(BLOCK, q.num_weights), q.q_mu)


@contextlib.contextmanager
def _bound(owner, X, y):
    """Yields ``(prior, likelihood, X, y)``: the prior and likelihood bound (readable inside the
    block), the checked rows, ``y`` less the mean function."""
    prior, likelihood = owner.prior, owner.likelihood
    if not isinstance(prior, QSGP) or prior.num_latent is not None:
        raise TypeError(f"the quadruply stochastic loss needs a GPModel with a QSGP prior, got {type(prior).__name__}")
    mean_function = getattr(prior, "mean_function", None)
    if mean_function is not None and mean_function.coefficient_prior is not None:
        raise ValueError("the quadruply stochastic loss takes mean functions without a coefficient prior")
    X, y = owner._data(X, y)
    with owner._sites.bound(prior, likelihood) as (prior, likelihood):
        if mean_function is not None:
            y = y - prior.plus_mean_function(namespace(y).zeros_like(y), X)
        yield prior, likelihood, X, y


def quadruply_stochastic_loss(owner, X, y, key, num_basis, num_columns=None, replacement=True, control=None,
                              drawn=None, gathered=None, paper_literal=False):
    """The quadruply stochastic estimate of the negative ELBO of ``owner`` (a ``GPModel`` with a
    :class:`QSGP` prior) on the rows ``X``, ``y`` (a minibatch of the ``num_data`` rows, or all of
    them), over ``num_basis`` basis indices per set and ``num_columns`` of the dense columns (None:
    all), drawn from ``key`` (the backend's): unbiased for the ``Gaussian`` likelihood (Theorems
    1-2); for other likelihoods the reparameterised subsampled bound
    (:func:`~sparsegp_common.objectives.quadruply_stochastic.subsampled_bound`), whose mean is at
    least the exact negative ELBO when ``log p(y | f)`` is concave in ``f`` (Bernoulli, Poisson).

    ``control``: None, or ``(state, refresh_every)`` for the support-point control
    variates (Proposition 3 for the mean and every dense column; ``num_columns`` must be None):
    then returns ``(loss, new_state)``. The state (:class:`~sparsegp_common.objectives.control_variates.State`)
    follows ``v`` from the rows the previous step read, and is recomputed exactly every
    ``refresh_every`` steps, ``Phi_p`` then taking the hyperparameters' current values.

    ``drawn``: the draw to use instead of one from ``key`` (:func:`draw_for`); ``gathered``: None,
    or ``(index, (q_mu, q_log_diag, q_dense))``, the q tables at the sorted rows ``index`` that the
    estimate reads (:func:`rows_for`), which it then reads instead of the whole tables: the strict
    ``O(1)`` step differentiates and updates only these (an exact refresh of the control
    variates still reads the whole tables).

    ``paper_literal``: Theorem 3 exactly as printed, for any likelihood
    (:func:`~sparsegp_common.objectives.quadruply_stochastic.literal_bound`: not a bound on the
    ELBO; for reproducing the paper only)."""
    with _bound(owner, X, y) as (prior, likelihood, X, y):
        if drawn is None:
            drawn = _draw(owner, prior, likelihood, X, key, num_basis, num_columns, replacement, paper_literal)
        return _loss(owner, prior, likelihood, X, y, drawn, control, gathered)


def draw_for(owner, X, y, key, num_basis, num_columns=None, replacement=True, paper_literal=False):
    """The random indices (and normal draws) of one :func:`quadruply_stochastic_loss` of ``owner``."""
    with _bound(owner, X, y) as (prior, likelihood, X, _):
        return _draw(owner, prior, likelihood, X, key, num_basis, num_columns, replacement, paper_literal)


def rows_for(drawn, state=None):
    """The sorted rows of the q tables that the loss reads with ``drawn`` and the control
    variates' ``state`` (None without them): ``O(num_basis + k)`` of them."""
    more = (state.rows,) if isinstance(state, control_variates.State) else ()
    return quadruply_stochastic.rows_read(drawn, *more)


def _draw(owner, prior, likelihood, X, key, num_basis, num_columns, replacement, paper_literal):
    key, q = owner._sites.key(key), prior.chevron()
    if paper_literal:
        return quadruply_stochastic.literal_draw(key, X, q, num_basis, replacement)
    if isinstance(likelihood, Gaussian):
        return quadruply_stochastic.draw(key, X, q, num_basis, num_columns, replacement)
    return quadruply_stochastic.bound_draw(key, X, q, num_basis, replacement)


def _loss(owner, prior, likelihood, X, y, drawn, control, gathered):
    full, ops, basis = prior.chevron(), backend(X), prior.basis
    q = full if gathered is None else GatheredChevron(gathered[0], *gathered[1][:3], full.num_weights)
    if gathered is not None and len(gathered[1]) > 3:  # the relevance vector machine's precisions
        basis = basis.gathered(gathered[0], gathered[1][3])
    num_data = X.shape[0] if owner.num_data is None else owner.num_data
    if isinstance(drawn, quadruply_stochastic.LiteralDraw):
        return quadruply_stochastic.literal_bound(basis, q, X, y, likelihood.expected_log_prob, num_data, drawn)
    if not isinstance(likelihood, Gaussian):
        if control is not None:
            raise ValueError("control_variates are for the Gaussian likelihood's estimator")
        return quadruply_stochastic.subsampled_bound(basis, q, X, y, likelihood.log_prob, num_data, drawn)
    if control is not None and isinstance(control[0], snapshot.Snapshot):
        features = (basis.features(X, drawn.I), basis.features(X, drawn.J))
        loss = quadruply_stochastic.gaussian_loss(basis, q, X, y, likelihood.variance, num_data, drawn, features)
        return _with_snapshot(prior, full, q, X, y, drawn, features, loss, *control, likelihood.variance, num_data)
    loss = quadruply_stochastic.gaussian_loss(basis, q, X, y, likelihood.variance, num_data, drawn)
    if control is None:
        return loss
    state, refresh_every = control
    xp = namespace(loss)

    def refresh():  # Phi_p at the current hyperparameters, and a from scratch
        fixed = tuple(ops.stop_gradient(h) for h in (prior.kernel.lengthscale, prior.kernel.variance))
        support = control_variates.support(state.X, prior.basis.fixed(*fixed))
        return (_support_product(support, full), support.nystrom) + fixed

    def follow():
        support = control_variates.support(state.X, prior.basis.fixed(state.lengthscale, state.variance))
        a = control_variates.catch_up(support, state, lambda rows: _columns(q, rows))
        return a, support.nystrom, state.lengthscale, state.variance

    # the branch's support comes out as arrays (its Nystrom factor: one O(n_bar^3) per step)
    a, nystrom, lengthscale, variance = ops.when_any((state.step % refresh_every == 0) & (state.step > 0),
                                                     refresh, follow)
    support = control_variates.Support(state.X, prior.basis.fixed(lengthscale, variance), nystrom)
    I, J = drawn.I, drawn.J
    loss = loss + 0.5 * control_variates.pair(support, a, _columns(q, I), _columns(q, J), I, J, q.num_weights,
                                              num_data, likelihood.variance)
    # every row a sparse step may change: the two sets, and the dense columns' diagonal entries
    rows = xp.astype(xp.concat([I, J, xp.arange(q.num_dense, device=device(I))]), state.rows.dtype)
    return loss, state._replace(a=a, rows=rows, values=ops.stop_gradient(_columns(q, rows)), lengthscale=lengthscale,
                                variance=variance, step=state.step + 1)


def _with_snapshot(prior, full, q, X, y, drawn, features, loss, state, every, noise, num_data):
    """``loss`` with the snapshot control variate's pair, and the state after the step: a full pass
    at the current values every ``every`` steps (:mod:`~sparsegp_common.objectives.snapshot`)."""
    ops, xp = backend(X), namespace(X)
    current = tuple(ops.stop_gradient(h) for h in (prior.kernel.lengthscale, prior.kernel.variance, noise))

    def take():
        s = ops.stop_gradient(full.q_mu)
        h, c = snapshot.exact(prior.basis.fixed(*current[:2]), state.X, state.y, s, current[2], BLOCK)
        return (s, h, c) + current

    def keep():
        return state.s, state.h, state.c, state.lengthscale, state.variance, state.noise

    s, h, c, lengthscale, variance, held_noise = ops.when_any(state.step % every == 0, take, keep)
    state = state._replace(s=s, h=h, c=c, lengthscale=lengthscale, variance=variance, noise=held_noise,
                           step=state.step + 1)
    fixed = prior.basis.fixed(lengthscale, variance)
    moved = xp.any(lengthscale != current[0]) | xp.any(variance != current[1])
    # the pair's features at the snapshot's hyperparameters: the estimate's own while they are held
    features = ops.when_any(moved, lambda: (fixed.features(X, drawn.I), fixed.features(X, drawn.J)),
                            lambda: tuple(ops.stop_gradient(f) for f in features))
    pair = snapshot.pair(fixed, state, features, X, y, drawn, q.mean(drawn.I), q.mean(drawn.J), num_data)
    return loss + 0.5 * pair, state


def initial_snapshot_state(owner, X, y):
    """The snapshot control variate's first state for ``owner``, over all its training rows
    ``X`` ``(n, D)``, ``y`` ``(n,)`` (the first step takes the snapshot)."""
    with _bound(owner, X, y) as (prior, likelihood, X, y):
        if not isinstance(likelihood, Gaussian):
            raise ValueError("snapshot is for the Gaussian likelihood's estimator, got "
                             f"{type(likelihood).__name__}")
        if getattr(prior, "mean_function", None) is not None:
            raise ValueError("snapshot needs the targets fixed between snapshots: give the QSGP no mean_function "
                             "(subtract a fitted mean from y instead)")
        if owner.num_data is not None and owner.num_data != X.shape[0]:
            raise ValueError(f"snapshot takes all num_data={owner.num_data} training rows, got {X.shape[0]}")
        ops, xp, m = backend(X), namespace(X), prior.chevron().num_weights
        # distinct arrays (copies of the data too): NumPyro's by-rows step donates the state's buffers
        X, y = X + 0.0, y + 0.0
        s, h, c = (xp.zeros(shape, dtype=X.dtype, device=device(X)) for shape in ((m,), (m,), ()))
        hyper = tuple(ops.stop_gradient(h) + 0 for h in (prior.kernel.lengthscale, prior.kernel.variance,
                                                         likelihood.variance))
        return snapshot.Snapshot(X, y, s, h, c, *hyper, xp.asarray(0, dtype=xp.int32, device=device(X)))


def initial_control_state(owner, X, y, support_X, num_basis):
    """The control variates' first state for ``owner`` at its current values (see
    :func:`quadruply_stochastic_loss`): ``a = Phi_p v`` exactly, the kernel's lengthscale and
    variance kept for ``Phi_p``; ``support_X`` ``(n_bar, D)``."""
    with _bound(owner, X, y) as (prior, likelihood, X, _):
        if not isinstance(likelihood, Gaussian):
            raise ValueError("control_variates are for the Gaussian likelihood's estimator, got "
                             f"{type(likelihood).__name__}")
        return _first_state(owner, prior, X, support_X, num_basis)


def _first_state(owner, prior, X, support_X, num_basis):
    support_X = owner._checks.inputs(support_X, "control_variates", prior.input_dim, like=X)
    # one program in JAX, not one per eager operation before the first step
    return owner._sites.compiled(_state_at, prior, support_X, num_basis)


def _state_at(prior, support_X, num_basis):
    ops, xp, q, where = backend(support_X), namespace(support_X), prior.chevron(), device(support_X)
    lengthscale, variance = (ops.stop_gradient(a) for a in (prior.kernel.lengthscale, prior.kernel.variance))
    a = _support_product(control_variates.support(support_X, prior.basis.fixed(lengthscale, variance)), q)
    rows = xp.zeros((2 * num_basis + q.num_dense,), dtype=xp.int32, device=where)
    return control_variates.State(support_X, a, rows, ops.stop_gradient(_columns(q, rows)), lengthscale, variance,
                                  xp.asarray(0, dtype=xp.int32, device=where))


class QuadruplyStochasticELBO:
    """The quadruply stochastic loss (Evans and Nair, 2020) of a ``GPModel(QSGP(...), likelihood)``:
    ``loss(model, guide, X, y)`` for ``model``, ``guide`` the methods of that ``GPModel``
    (``fit(gp_model.model, gp_model.guide, (X, y), batch_size=..., loss=QuadruplyStochasticELBO())``).

    For the ``Gaussian`` likelihood each call draws two independent sets of ``num_basis`` basis
    indices (the two sides of every quadratic form), ``num_basis`` diagonal columns of ``C`` and
    ``num_columns`` of its dense ones (None: all ``k``), uniformly with replacement
    (``O(num_basis)`` per draw) or without (``replacement=False``: a permutation, ``O(m)``), and
    returns an unbiased estimate of the negative ELBO with an unbiased gradient (Theorems 1-2);
    the minibatch (``batch_size`` in ``fit``) is the draw of rows. A step then costs
    ``O(B num_basis (1 + k))``, not ``O(B m k)``. For other likelihoods it draws one basis set and
    ``w = q_mu + C eps``, and returns the reparameterised subsampled bound: its mean is at least
    the exact negative ELBO for log-concave likelihoods (Bernoulli, Poisson), with a gap that
    shrinks as ``num_basis`` grows (the paper's Theorem 3 scales its noise by the variance where
    the standard deviation belongs, and bounds the wrong quantity; this is the corrected form).

    With ``control_variates`` (support rows ``X_p``, ``(n_bar, D)``: e.g. 500 training inputs
    drawn at random) the loss adds the zero-mean pairs of Proposition 3 for the mean and every
    dense column (App. F.1's gradient scaling included), which cancel most of the basis draws'
    noise in the data quadratics at ``O(n_bar num_basis (1 + k))`` per step. Their state
    (``Phi_p v`` with ``Phi_p`` the basis at the hyperparameters of the last refresh, F.3) follows ``v`` from
    the rows each step reads, which is exact only if the optimiser of the q tables changes just the
    entries with a gradient: AdaGrad or plain SGD, not Adam, momentum or weight decay (``fit``
    refuses those; NumPyro's ``Adagrad`` needs ``momentum=0.0``, its default being 0.9); it is
    recomputed exactly every ``refresh_every`` steps (``O(n_bar m k)``), ``Phi_p`` then taking the
    current hyperparameters (the pair is zero-mean whatever they are, but cancels less noise the
    further they have moved).
    ``fit`` carries the state from step to step and into checkpoints.

    With ``snapshot`` (all the training rows ``(X, y)``) the loss adds instead a snapshot
    control variate for the mean (:mod:`~sparsegp_common.objectives.snapshot`, the variance
    reduction of SVRG): every ``snapshot_every`` steps a full pass over the ``n`` rows takes the
    exact gradient of the mean's part at the current ``q_mu`` (``O(n m)``), and each step's
    gradient in ``q_mu`` is the estimate's change since then plus that gradient, whose noise
    fades as ``q_mu`` settles (rows and basis functions alike). It suits sizes where a pass over
    ``n m`` feature entries every few steps is affordable, such as a whitened basis of inducing
    points at the training inputs (``QSGP(kernel, inducing_points=X, whiten=True)``), and needs
    no mean function; any optimiser may train the tables.

    With AdaGrad (NumPyro's with ``momentum=0.0``) or plain SGD on the q tables, ``fit`` steps by
    rows: it draws the indices first (:meth:`draw`), gathers the rows of the tables they read
    (:meth:`rows`, :meth:`tables`), differentiates the loss with respect to those rows only and
    updates them in place, so that neither a step's time nor its working memory grows with ``m``.

    Args:
        num_basis: ``m~``, the basis indices per set (at most ``m`` without replacement).
        num_columns: dense columns of ``C`` per step (None: all; must be None with control variates).
        replacement: draw with replacement (the default).
        control_variates: None, or the support rows ``(n_bar, D)``.
        refresh_every: steps between exact recomputations of the control variates' state.
        snapshot: None, or ``(X, y)``: all ``n`` training rows, for the snapshot control variate.
        snapshot_every: steps between snapshots.
        paper_literal: for reproducing the paper only: its Theorem 3 as printed, for any
            likelihood (each row's ``E_z log g(a + z s)`` with ``s`` an unbiased estimate of the
            latent variance where the standard deviation belongs: not a bound on the ELBO).
    """

    #: optimiser classes (by name) that change only the entries with a nonzero gradient
    SPARSE_OPTIMISERS = ("Adagrad", "SGD")

    def __init__(self, num_basis=1000, num_columns=None, replacement=True, control_variates=None, refresh_every=1000,
                 paper_literal=False, snapshot=None, snapshot_every=20):
        self.num_basis = checks.positive_int(num_basis, "num_basis")
        self.num_columns = None if num_columns is None else checks.positive_int(num_columns, "num_columns")
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement must be True or False, got {replacement!r}")
        if control_variates is not None and num_columns is not None:
            raise ValueError("control_variates cover every dense column: leave num_columns=None")
        if not isinstance(paper_literal, bool):
            raise TypeError(f"paper_literal must be True or False, got {paper_literal!r}")
        if paper_literal and (control_variates is not None or num_columns is not None):
            raise ValueError("paper_literal draws its own columns of C and takes no control_variates")
        if snapshot is not None and (control_variates is not None or paper_literal):
            raise ValueError("snapshot replaces the support-point control_variates and takes no paper_literal")
        if snapshot is not None and (not isinstance(snapshot, (tuple, list)) or len(snapshot) != 2):
            raise TypeError("snapshot must be None or the training data (X, y)")
        self.paper_literal = paper_literal
        self.replacement, self.control_variates, self.snapshot = replacement, control_variates, snapshot
        self.refresh_every = checks.positive_int(refresh_every, "refresh_every")
        self.snapshot_every = checks.positive_int(snapshot_every, "snapshot_every")

    @property
    def stateful(self):
        """Whether the loss carries a state from step to step (control variates or a snapshot)."""
        return self.control_variates is not None or self.snapshot is not None

    def state_type(self):
        """The class of the state between steps."""
        return snapshot.Snapshot if self.snapshot is not None else control_variates.State

    @staticmethod
    def _owner(model, kwargs):
        owner = getattr(model, "__self__", None)
        if owner is None or not hasattr(owner, "prior") or not hasattr(owner, "likelihood"):
            raise TypeError("QuadruplyStochasticELBO needs model=gp_model.model for a GPModel(QSGP(...), likelihood)")
        if kwargs:
            raise ValueError(f"QuadruplyStochasticELBO takes external minibatches only, got {sorted(kwargs)}")
        return owner

    def negative_elbo(self, model, X, y, key=None, state=None, drawn=None, gathered=None, **kwargs):
        """The estimate for the ``GPModel`` whose ``model`` method is given, drawn from ``key``
        (or ``drawn``: :meth:`draw`), reading the whole q tables or only ``gathered`` rows (see
        :func:`quadruply_stochastic_loss`); with control variates ``(estimate, new state)`` from ``state``."""
        every = self.snapshot_every if self.snapshot is not None else self.refresh_every
        control = (state, every) if self.stateful else None
        return quadruply_stochastic_loss(self._owner(model, kwargs), X, y, key, self.num_basis, self.num_columns,
                                         self.replacement, control, drawn, gathered, self.paper_literal)

    def draw(self, model, X, y, key=None):
        """The random indices of one estimate (for :meth:`rows` and ``negative_elbo(drawn=...)``)."""
        return draw_for(self._owner(model, {}), X, y, key, self.num_basis, self.num_columns, self.replacement,
                        self.paper_literal)

    @staticmethod
    def rows(drawn, state=None):
        """The sorted rows of the q tables that an estimate from ``drawn`` (and ``state``) reads."""
        return rows_for(drawn, state)

    def tables(self, model):
        """The names of the tables a step reads by rows: the q tables ``(q_mu, q_log_diag,
        q_dense)``, and the relevance vector machine's ``log_precision``."""
        prior = self._owner(model, {}).prior
        names = ("q_mu", "q_log_diag", "q_dense") + (("log_precision",) if prior.relevance else ())
        return tuple(f"{prior.name}.{table}" for table in names)

    def initial_state(self, model, X, y):
        """The state of the control variates (or the snapshot) before the first step (None
        without them)."""
        if self.snapshot is not None:
            return initial_snapshot_state(self._owner(model, {}), *self.snapshot)
        if self.control_variates is None:
            return None
        return initial_control_state(self._owner(model, {}), X, y, self.control_variates, self.num_basis)

    def check_optimiser(self, name, optimiser, options):
        """Refuse, for the q table ``name``, an optimiser class (with its ``options``) that moves
        entries without a gradient: their control-variate state would go wrong (see above)."""
        if self.control_variates is None or not name.split(".")[-1].startswith("q_"):
            return
        label = getattr(optimiser, "__name__", repr(optimiser))
        # NumPyro's Adagrad (JAX's) has momentum 0.9 unless told otherwise
        momentum = 0.9 if label == "Adagrad" and getattr(optimiser, "__module__", "").startswith("numpyro") else 0.0
        moving = [key for key, default in (("momentum", momentum), ("weight_decay", 0.0)) if options.get(key, default)]
        if label not in self.SPARSE_OPTIMISERS or moving:
            raise ValueError(
                f"the control variates of QuadruplyStochasticELBO need an optimiser that changes only the entries "
                f"with a gradient for {name}, got {label}{' with ' + ', '.join(moving) if moving else ''}: give the "
                "q tables their own group, e.g. param_groups=[{'params': 'gp.q_*', 'optimizer': Adagrad, 'lr': 0.1}] "
                "(with numpyro.optim.Adagrad also 'momentum': 0.0)")
