"""Deep basis kernels (Zhu, Yuchi & Xie, 2025): ``k(x, x') = phi(x)^T phi(x')`` with a network
``phi: R^D -> R^r``, i.e. the Bayesian last layer ``f(x) = w^T phi(x)``, ``w ~ N(0, I_r)``.
Here ``phi(x) = sqrt(variance) net(x)``: a learnable kernel variance carries the overall scale
(see :class:`ExactDBK`), and every formula below reads the scaled features.

* :class:`ExactDBK`: exact GP regression with ``w`` integrated out; the log marginal likelihood,
  its gradient (autograd) and the predictive cost O(N r^2) time and O(N r) memory.
* :class:`SVDBK`: a :class:`~pyro_sparsegp.priors.GPPrior` whose global latent ``<name>.u`` is
  ``w`` with ``q(w) = N(q_mu, q_sqrt q_sqrt^T)``; ``GPModel(SVDBK(net), likelihood)`` is the
  paper's weight-space SVI (closed-form minibatch ELBO, any likelihood), ``CoxProcess`` uses it
  for the log-Gaussian Cox process of the paper's A.5, and :meth:`SVDBK.weight_model` is the
  ``Trace_ELBO`` path with ``w`` sampled.

Variance correction (paper section 3.3): the corrected kernel adds a white-noise-like diagonal
``c(x) = max(M, |phi(x)|^2) - |phi(x)|^2`` so that the prior variance is the constant ``M``, the
largest ``|phi(x_j)|^2`` over the training inputs. Training subtracts ``tr(C) / (2 sigma^2)`` (the
bound of eq. 11); prediction adds ``c(x*)`` to the variance (eq. 12 with its D-weighting for
exact DBK). With ``S = diag(s)``, ``s = sigma^2 (+ c)``, every formula goes through the posterior
of ``w`` in ``y = Phi w + e``, ``e ~ N(0, S)``::

    R R^T = Phi^T S^-1 Phi + I,     b = Phi^T S^-1 y,     w_mean = (R R^T)^-1 b,
    log N(y | 0, Phi Phi^T + S) = -1/2 [N log 2 pi + sum log s + 2 sum log diag R
                                        + y^T S^-1 y - |R^-1 b|^2],

the Woodbury identity and the determinant lemma; with ``S = sigma^2 I`` this is eq. 5. Everything
comes from the moments ``Phi^T Phi``, ``Phi^T y`` accumulated in float64 over blocks of rows (one
pass over ``Phi`` forward, one backward), so the step stays linear in N with cache-sized
temporaries. The difference ``y^T S^-1 y - |R^-1 b|^2`` cancels about ``log10(var y / sigma^2)``
digits (spec section 5.2), at most 6 of float64's 16 at the noise bound 1e-6.
"""
import contextlib
import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import pyro_method
from pyro.nn.module import to_pyro_module_
from torch.distributions import constraints

from sparsegp_common import dbk as common
from sparsegp_common.prediction import Prediction

from . import checks, predict, variational
from .linalg import cholesky, solve_lower
from .params import Parameterized
from .priors import GPPrior

__all__ = ["MLP", "ResNet", "ExactDBK", "SVDBK", "SVDBKPosterior", "correction", "lowrank_lml", "trace_penalty",
           "weight_posterior"]


# ---------------------------------------------------------------- networks


@contextlib.contextmanager
def _seeded(seed):
    """Torch's default initialisation, from ``seed`` when given (the global RNG is left as it was)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


class MLP(torch.nn.Module):
    """Basis network ``phi(x) = W_out h_depth + b_out``, ``h_k = tanh(W_k h_{k-1} + b_k)``, ``h_0 = x``.

    Args:
        input_dim: D.
        rank: number of basis functions r (the output size).
        hidden: units per hidden layer.
        depth: hidden layers.
        dtype: parameter dtype (torch's default when None).
        seed: seeds the (torch default) initialisation.

    Maps inputs ``(N, D)`` to features ``(N, r)``.
    """

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        super().__init__()
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        sizes = [self.input_dim] + [hidden] * depth
        with _seeded(seed):
            self.hidden = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=dtype) for a, b in zip(sizes[:-1], sizes[1:]))
            self.head = torch.nn.Linear(hidden, self.rank, dtype=dtype)

    def forward(self, X):
        h = X
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return self.head(h)


class ResNet(torch.nn.Module):
    """Residual basis network: ``h_0 = W_in x + b_in``, ``h_k = h_{k-1} + tanh(W_k h_{k-1} + b_k)``,
    ``phi(x) = W_out h_depth + b_out`` (the spec's reading of the paper's 2-layer ResNet).

    Args: as for :class:`MLP` (``depth`` counts residual blocks).
    """

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        super().__init__()
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        with _seeded(seed):
            self.input = torch.nn.Linear(self.input_dim, hidden, dtype=dtype)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, dtype=dtype) for _ in range(depth))
            self.head = torch.nn.Linear(hidden, self.rank, dtype=dtype)

    def forward(self, X):
        h = self.input(X)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h)


# ---------------------------------------------------------------- formulas


MOMENT_CHUNK = 4096  # rows per block of :class:`_Moments`: its float64 temporaries stay in cache


class _Moments(torch.autograd.Function):
    """``Phi^T Phi``, ``Phi^T y`` (float64) and ``|phi_n|^2`` (dtype of ``Phi``) in one pass over
    blocks of rows, and the gradient in one more: no (N, r) temporary besides the gradient itself
    (at large N, separate elementwise passes over GB-sized arrays dominated the step)."""

    @staticmethod
    def forward(ctx, Phi, y):
        r = Phi.shape[-1]
        gram = Phi.new_zeros((r, r), dtype=torch.float64)
        b = Phi.new_zeros((r,), dtype=torch.float64)
        sq = Phi.new_empty(Phi.shape[:1])
        for rows in _blocks(Phi.shape[0]):
            P = Phi[rows].to(torch.float64)
            gram.addmm_(P.transpose(-1, -2), P)
            b.addmv_(P.transpose(-1, -2), y[rows].to(torch.float64))
            sq[rows] = (P * P).sum(-1)
        ctx.save_for_backward(Phi, y)
        return gram, b, sq

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_gram, grad_b, grad_sq):
        Phi, y = ctx.saved_tensors
        r = Phi.shape[-1]
        sym = Phi.new_zeros((r, r), dtype=torch.float64) if grad_gram is None else grad_gram + grad_gram.transpose(-1, -2)
        grad_b = Phi.new_zeros((r,), dtype=torch.float64) if grad_b is None else grad_b
        grad_Phi = torch.empty_like(Phi) if ctx.needs_input_grad[0] else None
        grad_y = torch.empty_like(y) if ctx.needs_input_grad[1] else None
        for rows in _blocks(Phi.shape[0]):
            P = Phi[rows].to(torch.float64)
            if grad_Phi is not None:
                g = P @ sym + y[rows].to(torch.float64).unsqueeze(-1) * grad_b
                if grad_sq is not None:
                    g += 2 * grad_sq[rows].to(torch.float64).unsqueeze(-1) * P
                grad_Phi[rows] = g
            if grad_y is not None:
                grad_y[rows] = P @ grad_b
        return grad_Phi, grad_y


def _blocks(n):
    return (slice(s, min(s + MOMENT_CHUNK, n)) for s in range(0, n, MOMENT_CHUNK))


def _stats(Phi, y, noise, variance=None):
    """The sufficient statistics of every formula below for the features ``Psi = sqrt(v) Phi``
    (``v = variance``, 1 when None), in float64: ``G = Psi^T S^-1 Psi``, ``b = Psi^T S^-1 y``,
    ``y^T S^-1 y``, ``log|S|``, and ``|psi_n|^2`` ``(N,)`` in the dtype of ``Phi``. The r x r
    products are scaled, not Phi (and with a scalar noise not divided either)."""
    noise = torch.as_tensor(noise, dtype=torch.float64, device=Phi.device)
    v = noise.new_ones(()) if variance is None else variance.to(torch.float64)
    if noise.dim() == 0:
        gram, b, sq = _Moments.apply(Phi, y)
        yy = (y.to(torch.float64) ** 2).sum()
        return gram * (v / noise), b * (v.sqrt() / noise), yy / noise, Phi.shape[0] * torch.log(noise), sq * v.to(sq.dtype)
    s = noise.expand(Phi.shape[:1])
    w = s.rsqrt()
    gram, b, sq = _Moments.apply(Phi * w.to(Phi.dtype).unsqueeze(-1), y * w.to(y.dtype))
    return (gram * v, b * v.sqrt(), ((y.to(torch.float64) * w) ** 2).sum(), torch.log(s).sum(),
            sq * (s * v).to(sq.dtype))


def _posterior64(gram, b):
    """``R = chol(G + I)``, ``c = R^-1 b`` and the weight mean ``R^-T c`` (float64): ``G`` grows
    like N / sigma^2, beyond what a float32 Cholesky can take (spec 5.1)."""
    R = cholesky(gram + torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device), jitter=0.0)
    c = solve_lower(R, b.unsqueeze(-1))
    return solve_lower(R, c, transpose=True).squeeze(-1), R, c.squeeze(-1)


def weight_posterior(Phi, y, noise):
    """Posterior of ``w`` in ``y = Phi w + e``, ``w ~ N(0, I)``, ``e ~ N(0, diag(noise))``.

    Args:
        Phi: features ``(N, r)``.
        y: targets ``(N,)``.
        noise: variances, ``()`` or ``(N,)``.

    Returns:
        ``mean`` ``(r,)`` and ``R`` ``(r, r)``, the lower Cholesky factor of the posterior
        precision ``Phi^T S^-1 Phi + I`` (``>= I``, so no jitter is needed), computed in float64
        and returned in the dtype of ``Phi``.
    """
    mean, R, _ = _posterior64(*_stats(Phi, y, noise)[:2])
    return mean.to(Phi.dtype), R.to(Phi.dtype)


def _lml(gram, b, yy, log_det_S, num_data):
    _, R, c = _posterior64(gram, b)
    quad = yy - (c**2).sum()  # y^T (Phi Phi^T + S)^-1 y by Woodbury
    return -0.5 * (num_data * math.log(2 * math.pi) + log_det_S + 2 * torch.log(R.diagonal()).sum() + quad)


def lowrank_lml(Phi, y, noise):
    """``log N(y | 0, Phi Phi^T + diag(noise))`` in O(N r^2) time and O(N r) memory (eq. 5 for a
    scalar ``noise``; see the module docstring), accumulated in float64 and returned in the dtype
    of ``Phi``. Shapes as for :func:`weight_posterior`; returns a scalar."""
    return _lml(*_stats(Phi, y, noise)[:4], Phi.shape[0]).to(Phi.dtype)


def correction(sq_norms, max_sq_norm=None):
    """The diagonal correction ``c(x) = max(M, |phi(x)|^2) - |phi(x)|^2``.

    Args:
        sq_norms: ``|phi(x_n)|^2``, ``(N,)``.
        max_sq_norm: ``M``, the largest ``|phi(x_j)|^2`` over the training inputs; None takes the
            max over ``sq_norms`` itself (the full data or, in SVI, the minibatch, as in the paper).

    Returns:
        ``c`` ``(N,)``, non-negative.
    """
    M = sq_norms.max() if max_sq_norm is None else max_sq_norm
    return torch.clamp_min(M - sq_norms, 0.0)


def trace_penalty(sq_norms, noise, max_sq_norm=None):
    """``tr(C) / (2 sigma^2) = sum_n c(x_n) / (2 noise)`` (eq. 11), the amount by which the
    corrected objective lies below the uncorrected one. Args as for :func:`correction`."""
    return correction(sq_norms, max_sq_norm).sum() / (2 * noise)


def _sq_norms(Phi):
    return (Phi**2).sum(-1)


def _scaled(net, variance, X):
    return net(X) * variance.sqrt()


def _register(net):
    """Check the network and convert it in place to a PyroModule, so its parameters are Pyro params."""
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
    for attr in ("input_dim", "rank"):
        if not isinstance(getattr(net, attr, None), int):
            raise TypeError(f"net must have an integer attribute `{attr}` (as MLP and ResNet do)")
    to_pyro_module_(net)
    return net


def _batches(X, batch_size):
    batch_size = checks.positive_int(batch_size, "batch_size")
    return X.split(batch_size)


# ---------------------------------------------------------------- exact DBK


class ExactDBK(Parameterized):
    """Exact GP regression with a deep basis kernel: ``y = f + e``, ``f ~ GP(0, phi^T phi)``,
    ``e ~ N(0, noise)``, trained by type-II maximum likelihood.

    ``model``/``guide`` are a collapsed Pyro model (``y`` observed through a
    ``LowRankMultivariateNormal``, plus the factor ``<name>.trace`` = ``-tr(C) / (2 sigma^2)``
    with correction) and an empty guide, so ``fit`` or ``SVI`` maximise :meth:`objective`.
    After training, :meth:`calibrate` conditions on the training data once (O(N r^2)); then
    :meth:`predict_f`/:meth:`predict_y` cost O(r^2) per test point.

    Args:
        net: a ``torch.nn.Module`` ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`); converted in place to a PyroModule, its
            parameters are ``<name>.net.*`` in Pyro's param store.
        noise: initial noise variance ``sigma^2`` (constrained above 1e-6).
        variance: initial kernel variance ``v`` in ``phi(x) = sqrt(v) net(x)`` (positive).
        variance_correction: the paper's correction (trace term in training, eq. 12 in
            prediction); False is the "-c" ablation.
        name: prefix of the parameter and site names.

    The kernel variance carries the scale of ``phi``, which Adam cannot move stably through the
    last layer's weights alone (docs/usage.md); keep ``net`` at its default initialisation.
    """

    def __init__(self, net, noise=common.NOISE_INIT, variance=1.0, variance_correction=True, name="dbk"):
        super().__init__(name)
        self.variance_correction = common.check_flag(variance_correction, "variance_correction")
        self.net = _register(net)
        like = next(net.parameters())
        self._param("noise", torch.tensor(common.check_noise(noise), dtype=like.dtype, device=like.device),
                    constraints.greater_than(common.NOISE_LOWER_BOUND))
        self._param("variance", checks.positive(variance, "variance", like=like), constraints.positive)
        self.cache = None

    @property
    def input_dim(self):
        return self.net.input_dim

    def _features(self, X):
        """``Phi = sqrt(variance) net(X)``: ``(N, r)``."""
        return _scaled(self.net, self.variance, X)

    def _data(self, X, y):
        X = checks.inputs(X, "X", self.input_dim).to(self.noise)
        if y is not None:
            y = checks.same_length(checks.finite(checks.as_tensor(y, "y", like=X), "y"), X.shape[0])
        return X, y

    @pyro_method
    def log_marginal_likelihood(self, X, y):
        """``log p(y)`` of eq. 5 (no correction), differentiable: a scalar."""
        X, y = self._data(X, y)
        return lowrank_lml(self._features(X), y, self.noise)

    @pyro_method
    def objective(self, X, y):
        """The training objective: ``log p(y)``, less ``tr(C) / (2 sigma^2)`` with correction."""
        X, y = self._data(X, y)
        noise = self.noise
        *moments, sq = _stats(self.net(X), y, noise, self.variance)  # Phi is not scaled: the moments are
        lml = _lml(*moments, X.shape[0]).to(noise.dtype)
        return lml - trace_penalty(sq, noise) if self.variance_correction else lml

    @pyro_method
    def model(self, X, y=None):
        """Args: X ``(N, D)`` and y ``(N,)`` (the full data: the likelihood does not factorise).
        Returns ``y`` (sampled from the prior predictive when None)."""
        X, y = self._data(X, y)
        Phi, noise = self._features(X), self.noise
        if self.variance_correction:
            pyro.factor(f"{self.name}.trace", -trace_penalty(_sq_norms(Phi), noise))
        return pyro.sample("y", dist.LowRankMultivariateNormal(Phi.new_zeros(X.shape[0]), Phi, noise.expand(X.shape[:1])),
                           obs=y)

    def guide(self, X, y=None):
        """The empty guide (``w`` is integrated out; everything else is a point estimate)."""

    def calibrate(self, X, y, params=None):
        """Condition on the training data: store the posterior of ``w`` (D-weighted with
        correction) and ``M = max_n |phi(x_n)|^2`` for prediction.

        Args:
            X, y: the training data ``(N, D)``, ``(N,)``.
            params: optional ``{name: value}`` parameter values (default: Pyro's param store).

        Returns:
            self
        """
        X, y = self._data(X, y)
        with predict._evaluating(self, params):
            Phi, noise = self._features(X), self.noise
            sq = _sq_norms(Phi)
            M = sq.max() if self.variance_correction else None
            s = noise + correction(sq, M) if self.variance_correction else noise
            mean, R, _ = _posterior64(*_stats(Phi, y, s)[:2])
            self.cache = {"mean": mean, "R": R, "noise": noise.clone(), "max_sq_norm": M}
        return self

    def predict_f(self, X, batch_size=4096, params=None):
        """Moments of ``f(X)``: mean ``(N,)`` and variance ``(N,)`` (eq. 6; eq. 12 with correction,
        whose ``c(x*)`` belongs to the latent variance). Needs :meth:`calibrate` first, with the
        same ``params``."""
        if self.cache is None:
            raise ValueError("call calibrate(X_train, y_train) before predicting")
        X = checks.inputs(X, "X", self.input_dim).to(self.noise)
        cache, means, variances = self.cache, [], []
        if params is not None:  # only the features': substitute warns about names it does not use
            params = {k: v for k, v in params.items() if k.startswith(f"{self.name}.net.") or k == f"{self.name}.variance"}
        with predict._evaluating(self, params):
            for Xb in _batches(X, batch_size):
                Phi = self._features(Xb)
                Phi64 = Phi.to(torch.float64)  # the cached posterior of w is float64
                means.append((Phi64 @ cache["mean"]).to(Phi.dtype))
                var = (solve_lower(cache["R"], Phi64.transpose(-1, -2)) ** 2).sum(-2).to(Phi.dtype)
                if self.variance_correction:
                    var = var + correction(_sq_norms(Phi), cache["max_sq_norm"])
                variances.append(var)
        return torch.cat(means), torch.cat(variances)

    def predict_y(self, X, quantiles=None, batch_size=4096, params=None):
        """Predictive of ``y*``: variance ``var_f + sigma^2``, Gaussian quantiles ``(Q, N)`` at
        ``quantiles`` (or None); see :meth:`predict_f`.

        Returns:
            Prediction
        """
        levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
        mean, var = self.predict_f(X, batch_size=batch_size, params=params)
        var = var + self.cache["noise"]
        q = None
        if levels is not None:
            q = dist.Normal(mean, var.sqrt()).icdf(torch.as_tensor(levels, dtype=mean.dtype).unsqueeze(-1))
        return Prediction(mean, var, q)


# ---------------------------------------------------------------- weight-space SVI


class SVDBK(GPPrior):
    """Weight-space deep basis kernel prior: ``f(x) = w^T phi(x)``, ``w ~ N(0, I_r)`` with
    ``q(w) = N(q_mu, q_sqrt q_sqrt^T)`` (the site ``<name>.u`` holds ``w``).

    ``posterior().marginals(X)`` is ``q(f(X)) = N(Phi q_mu, |q_sqrt^T phi|^2 + c)``; with the
    correction, ``c`` is the diagonal correction with ``M`` the max over the rows of ``X`` (the
    minibatch, in training: for a Gaussian likelihood the ELBO then is the paper's eq. 9 less its
    minibatch trace term, and for any likelihood it is the bound of eq. 11 with the corrected
    prior ``N(f | Phi w, C)``) until :meth:`calibrate` stores ``M`` over the training set, which
    prediction uses from then on (set ``max_sq_norm = None`` to train again).

    Args:
        net: a ``torch.nn.Module`` ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`); converted in place to a PyroModule, its
            parameters are ``<name>.net.*``; ``q`` follows its dtype and device.
        variance: initial kernel variance ``v`` in ``phi(x) = sqrt(v) net(x)`` (positive; see
            :class:`ExactDBK` for why the scale is a parameter of its own).
        variance_correction: add ``c(x)`` (False: the "-c" ablation).
        diagonal: mean-field ``q_sqrt`` ``(r,)`` instead of a full factor ``(r, r)``.
        name: prefix of the parameter and site names.

    ``q`` starts at the prior (``q_mu = 0``, ``q_sqrt = I``).
    """

    def __init__(self, net, *, variance=1.0, variance_correction=True, diagonal=False, name="gp"):
        super().__init__(name)
        self.variance_correction = common.check_flag(variance_correction, "variance_correction")
        self.net = _register(net)
        like = next(net.parameters())
        self.family = variational.family(common.check_flag(diagonal, "diagonal"))
        q_mu, q_sqrt = self.family.initial(net.rank, (), like)
        self._param("q_mu", q_mu)
        self._param("q_sqrt", q_sqrt, self.family.q_sqrt_constraint)
        self._param("variance", checks.positive(variance, "variance", like=like), constraints.positive)
        self.max_sq_norm = None

    @property
    def input_dim(self):
        return self.net.input_dim

    @property
    def site_names(self):
        return super().site_names + tuple(f"{self.name}.{s}" for s in ("w", "eps"))

    def posterior(self):
        return SVDBKPosterior(self)

    def prior_variance(self, X):
        """The (corrected) prior variance ``|phi(x)|^2 + c(x)``: ``(N,)``."""
        sq = _sq_norms(self.posterior().features(X))
        return sq + correction(sq, self.max_sq_norm) if self.variance_correction else sq

    def calibrate(self, X, params=None, batch_size=4096):
        """Store ``M = max_n |phi(x_n)|^2`` over the training inputs ``X`` ``(N, D)`` (one pass,
        in batches, without gradients) for the corrected predictive; returns ``M`` (a float)."""
        X = checks.inputs(X, "X", self.input_dim)
        with predict._evaluating(self, params):
            features = self.posterior().features
            self.max_sq_norm = max(float(_sq_norms(features(Xb)).max()) for Xb in _batches(X, batch_size))
        return self.max_sq_norm

    @pyro_method
    def weight_model(self, X, plate=None):
        """The model with ``w`` sampled: the site ``<name>.w ~ N(0, I)`` outside the plate and,
        with correction, ``<name>.eps ~ N(0, 1)`` per row inside it; returns
        ``f = Phi w + sqrt(c) eps`` at the rows the plate selects, for the user's likelihood.
        With :meth:`weight_guide`, ``Trace_ELBO`` estimates the same bound as ``GPModel``
        without bias (the ``eps`` terms of model and guide cancel).

        Args: as for :meth:`~pyro_sparsegp.priors.GPPrior.model`.

        Returns:
            ``f`` of shape ``(B,)``.
        """
        X = checks.inputs(X, "X", self.input_dim)
        posterior = self.posterior()
        w = pyro.sample(f"{self.name}.w", posterior.prior_u())
        with self._data(X, plate) as Xb:
            Phi = posterior.features(Xb)
            f = Phi @ w
            if self.variance_correction:
                c = correction(_sq_norms(Phi), self.max_sq_norm)
                eps = pyro.sample(f"{self.name}.eps", dist.Normal(torch.zeros_like(f), 1.0))
                f = f + c.clamp_min(torch.finfo(c.dtype).tiny).sqrt() * eps  # clamped: finite gradient at c = 0
            return f

    @pyro_method
    def weight_guide(self, X, plate=None):
        """The guide of :meth:`weight_model`: ``<name>.w ~ q(w)`` (and ``<name>.eps ~ N(0, 1)``)."""
        X = checks.inputs(X, "X", self.input_dim)
        pyro.sample(f"{self.name}.w", self.posterior().q_u())
        if self.variance_correction:
            with self._data(X, plate) as Xb:
                pyro.sample(f"{self.name}.eps", dist.Normal(Xb.new_zeros(Xb.shape[0]), 1.0))


class SVDBKPosterior:
    """``q(f)`` of an :class:`SVDBK` with its parameters read once."""

    def __init__(self, prior):
        self.net, self.variance, self.q_mu, self.q_sqrt = prior.net, prior.variance, prior.q_mu, prior.q_sqrt
        self.q, self.dist = prior.family(self.q_mu, self.q_sqrt), prior._dist
        self.variance_correction, self.max_sq_norm = prior.variance_correction, prior.max_sq_norm

    def features(self, X):
        """``Phi = phi(X) = sqrt(variance) net(X)``: ``(N, r)``."""
        return _scaled(self.net, self.variance, X.to(self.q_mu))

    def kl(self):
        return self.q.kl()

    def prior_u(self):
        return variational.prior_distribution(self.dist, self.q_mu)

    def q_u(self):
        return self.q.distribution(self.dist)

    def marginals(self, X, full_cov=False):
        Phi = self.features(X)
        mean = Phi @ self.q_mu
        # Not conditional(): its k(x, x) - |A|^2 would cancel exactly for this finite-rank kernel
        # (Kuu = I, Kuf = Phi^T), leaving round-off; |q_sqrt^T phi|^2 is the same quantity, directly.
        PL = self.q.scale_project(Phi.mT).mT
        c = correction(_sq_norms(Phi), self.max_sq_norm) if self.variance_correction else None
        if full_cov:
            cov = PL @ PL.transpose(-1, -2)
            return mean, cov if c is None else cov + torch.diag_embed(c)
        var = (PL**2).sum(-1) + (0.0 if c is None else c)
        return mean, var.clamp_min(torch.finfo(var.dtype).tiny)
