"""Deep basis kernels (Zhu, Yuchi & Xie, 2025): ``k(x, x') = phi(x)^T phi(x')`` with a network
``phi: R^D -> R^r``, i.e. the Bayesian last layer ``f(x) = w^T phi(x)``, ``w ~ N(0, I_r)``.
Here ``phi(x) = sqrt(variance) net(x)``: a learnable kernel variance carries the overall scale
(see :class:`ExactDBK`), and every formula below reads the scaled features.

* :class:`ExactDBK`: exact GP regression with ``w`` integrated out; the log marginal likelihood,
  its gradient (autodiff) and the predictive cost O(N r^2) time and O(N r) memory.
* :class:`SVDBK`: a :class:`~numpyro_sparsegp.priors.GPPrior` whose global latent ``<name>.u`` is
  ``w`` with ``q(w) = N(q_mu, q_sqrt q_sqrt^T)``; ``GPModel(SVDBK(net), likelihood)`` is the
  paper's weight-space SVI (closed-form minibatch ELBO, any likelihood), ``CoxProcess`` uses it
  for the log-Gaussian Cox process of the paper's A.5, and :meth:`SVDBK.weight_model` is the
  ``Trace_ELBO`` path with ``w`` sampled.

The networks are equinox modules, registered with ``numpyro.contrib.module.eqx_module`` as the
parameter ``<name>.net$params`` (a pytree) when the component is bound.

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
comes from the moments ``Phi^T Phi``, ``Phi^T y`` in float64 (with ``jax_enable_x64``; without it
the r x r algebra is float32 and fragile at large N / sigma^2). The difference
``y^T S^-1 y - |R^-1 b|^2`` cancels about ``log10(var y / sigma^2)`` digits (spec section 5.2), at
most 6 of float64's 16 at the noise bound 1e-6.
"""
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.stats import norm
from numpyro import handlers
from numpyro.contrib.module import eqx_module
from numpyro.distributions import constraints
from numpyro.primitives import _PYRO_STACK

from sparsegp_common import dbk as common
from sparsegp_common.prediction import Prediction

from . import checks, predict, variational
from .linalg import cholesky, solve_lower
from .params import Parameterized
from .priors import GPPrior

__all__ = ["MLP", "ResNet", "ExactDBK", "SVDBK", "SVDBKPosterior", "correction", "lowrank_lml", "trace_penalty",
           "weight_posterior"]


# ---------------------------------------------------------------- networks


def _linear(a, b, key, dtype):
    return eqx.nn.Linear(a, b, key=key, dtype=dtype)


def _rows(fn, X):
    """Apply a per-example equinox function to ``(N, D)`` rows (or one ``(D,)`` row)."""
    return jax.vmap(fn)(X) if X.ndim == 2 else fn(X)


class MLP(eqx.Module):
    """Basis network ``phi(x) = W_out h_depth + b_out``, ``h_k = tanh(W_k h_{k-1} + b_k)``, ``h_0 = x``.

    Args:
        input_dim: D.
        rank: number of basis functions r (the output size).
        hidden: units per hidden layer.
        depth: hidden layers.
        dtype: parameter dtype (JAX's default float when None).
        seed: seeds equinox's default initialisation (None: 0).

    Maps inputs ``(N, D)`` to features ``(N, r)`` (a single ``(D,)`` row to ``(r,)``).
    """

    hidden: list
    head: eqx.nn.Linear
    input_dim: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        keys = jax.random.split(jax.random.PRNGKey(0 if seed is None else seed), depth + 1)
        sizes = [self.input_dim] + [hidden] * depth
        self.hidden = [_linear(a, b, k, dtype) for a, b, k in zip(sizes[:-1], sizes[1:], keys[:-1])]
        self.head = _linear(hidden, self.rank, keys[-1], dtype)

    def _one(self, x):
        h = x
        for layer in self.hidden:
            h = jnp.tanh(layer(h))
        return self.head(h)

    def __call__(self, X):
        return _rows(self._one, X)


class ResNet(eqx.Module):
    """Residual basis network: ``h_0 = W_in x + b_in``, ``h_k = h_{k-1} + tanh(W_k h_{k-1} + b_k)``,
    ``phi(x) = W_out h_depth + b_out`` (the spec's reading of the paper's 2-layer ResNet).

    Args: as for :class:`MLP` (``depth`` counts residual blocks).
    """

    input: eqx.nn.Linear
    blocks: list
    head: eqx.nn.Linear
    input_dim: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)

    def __init__(self, input_dim, rank=common.RANK, hidden=common.HIDDEN, depth=common.DEPTH, *, dtype=None, seed=None):
        self.input_dim, self.rank, hidden, depth = common.check_network(input_dim, rank, hidden, depth)
        keys = jax.random.split(jax.random.PRNGKey(0 if seed is None else seed), depth + 2)
        self.input = _linear(self.input_dim, hidden, keys[0], dtype)
        self.blocks = [_linear(hidden, hidden, k, dtype) for k in keys[1:-1]]
        self.head = _linear(hidden, self.rank, keys[-1], dtype)

    def _one(self, x):
        h = self.input(x)
        for block in self.blocks:
            h = h + jnp.tanh(block(h))
        return self.head(h)

    def __call__(self, X):
        return _rows(self._one, X)


# ---------------------------------------------------------------- formulas


def _wide():
    """float64 when JAX has it enabled (``jax_enable_x64``), else float32."""
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _stats(Phi, y, noise, variance=1.0):
    """The sufficient statistics of every formula below for the features ``Psi = sqrt(v) Phi``
    (``v = variance``), in float64 (with ``jax_enable_x64``): ``G = Psi^T S^-1 Psi``,
    ``b = Psi^T S^-1 y``, ``y^T S^-1 y``, ``log|S|``, and ``|psi_n|^2`` ``(N,)`` in the dtype of
    ``Phi``. The r x r products are scaled, not Phi (and with a scalar noise not divided either)."""
    P, t = Phi.astype(_wide()), y.astype(_wide())
    noise = jnp.asarray(noise, dtype=P.dtype)
    v = jnp.asarray(variance, dtype=P.dtype)
    sq = _sq_norms(Phi) * v.astype(Phi.dtype)
    if noise.ndim == 0:
        return P.T @ P * (v / noise), P.T @ t * (jnp.sqrt(v) / noise), (t**2).sum() / noise, Phi.shape[0] * jnp.log(noise), sq
    s = jnp.broadcast_to(noise, Phi.shape[:1])
    scaled = P / s[:, None]
    return P.T @ scaled * v, scaled.T @ t * jnp.sqrt(v), (t**2 / s).sum(), jnp.log(s).sum(), sq


def _posterior64(gram, b):
    """``R = chol(G + I)``, ``c = R^-1 b`` and the weight mean ``R^-T c`` (float64 with
    ``jax_enable_x64``): ``G`` grows like N / sigma^2, beyond what a float32 Cholesky can take
    (spec 5.1)."""
    R = cholesky(gram + jnp.eye(gram.shape[-1], dtype=gram.dtype), jitter=0.0)
    c = solve_lower(R, b[:, None])
    return solve_lower(R, c, transpose=True)[:, 0], R, c[:, 0]


def weight_posterior(Phi, y, noise):
    """Posterior of ``w`` in ``y = Phi w + e``, ``w ~ N(0, I)``, ``e ~ N(0, diag(noise))``.

    Args:
        Phi: features ``(N, r)``.
        y: targets ``(N,)``.
        noise: variances, ``()`` or ``(N,)``.

    Returns:
        ``mean`` ``(r,)`` and ``R`` ``(r, r)``, the lower Cholesky factor of the posterior
        precision ``Phi^T S^-1 Phi + I`` (``>= I``, so no jitter is needed), computed in float64
        (with ``jax_enable_x64``) and returned in the dtype of ``Phi``.
    """
    mean, R, _ = _posterior64(*_stats(Phi, y, noise)[:2])
    return mean.astype(Phi.dtype), R.astype(Phi.dtype)


def _lml(gram, b, yy, log_det_S, num_data):
    _, R, c = _posterior64(gram, b)
    quad = yy - (c**2).sum()  # y^T (Phi Phi^T + S)^-1 y by Woodbury
    return -0.5 * (num_data * math.log(2 * math.pi) + log_det_S + 2 * jnp.log(jnp.diagonal(R)).sum() + quad)


def lowrank_lml(Phi, y, noise):
    """``log N(y | 0, Phi Phi^T + diag(noise))`` in O(N r^2) time and O(N r) memory (eq. 5 for a
    scalar ``noise``; see the module docstring), accumulated in float64 (with ``jax_enable_x64``)
    and returned in the dtype of ``Phi``. Shapes as for :func:`weight_posterior`; returns a scalar."""
    return _lml(*_stats(Phi, y, noise)[:4], Phi.shape[0]).astype(Phi.dtype)


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
    return jnp.maximum(M - sq_norms, 0.0)


def trace_penalty(sq_norms, noise, max_sq_norm=None):
    """``tr(C) / (2 sigma^2) = sum_n c(x_n) / (2 noise)`` (eq. 11), the amount by which the
    corrected objective lies below the uncorrected one. Args as for :func:`correction`."""
    return correction(sq_norms, max_sq_norm).sum() / (2 * noise)


def _sq_norms(Phi):
    return (Phi**2).sum(-1)


def _scaled(net, variance, X):
    return net(X) * jnp.sqrt(variance)


def _check_net(net):
    if not isinstance(net, eqx.Module):
        raise TypeError(f"net must be an equinox Module, got {type(net).__name__}")
    for attr in ("input_dim", "rank"):
        if not isinstance(getattr(net, attr, None), int):
            raise TypeError(f"net must have an integer attribute `{attr}` (as MLP and ResNet do)")
    return net


def _first_array(net):
    return jax.tree_util.tree_leaves(eqx.filter(net, eqx.is_inexact_array))[0]


def _bind_net(obj, new, prefix):
    """Register the network as the parameter ``<prefix>.net$params`` (its initial weights outside
    any handler, as for every other parameter)."""
    name = f"{obj.name if prefix is None else prefix}.net"
    new.net = eqx_module(name, obj.net) if _PYRO_STACK else obj.net
    return new


def _max_sq_norm(obj, X, params, batch_size):
    """``max_n |phi(x_n)|^2`` over the rows of ``X``, in compiled batches."""

    def sq_norms(Xb, batch, values):
        with handlers.substitute(data=values):
            return _sq_norms(obj.bind().posterior().features(Xb))

    return float(predict._map_batches(sq_norms, X, batch_size, params or {}).max())


# ---------------------------------------------------------------- exact DBK


class ExactDBK(Parameterized):
    """Exact GP regression with a deep basis kernel: ``y = f + e``, ``f ~ GP(0, phi^T phi)``,
    ``e ~ N(0, noise)``, trained by type-II maximum likelihood.

    ``model``/``guide`` are a collapsed NumPyro model (``y`` observed through a
    ``LowRankMultivariateNormal``, plus the factor ``<name>.trace`` = ``-tr(C) / (2 sigma^2)``
    with correction) and an empty guide, so ``fit`` or ``SVI`` maximise :meth:`objective`.
    After training, :meth:`calibrate` conditions on the training data once (O(N r^2)); then
    :meth:`predict_f`/:meth:`predict_y` cost O(r^2) per test point.

    Args:
        net: an equinox module ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`); its parameters are ``<name>.net$params``.
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
        self.net = _check_net(net)
        like = _first_array(net)
        self._param("noise", jnp.asarray(common.check_noise(noise), dtype=like.dtype),
                    constraints.greater_than(common.NOISE_LOWER_BOUND))
        self._param("variance", checks.positive(variance, "variance", like=like), constraints.positive)
        self.cache = None

    @property
    def input_dim(self):
        return self.net.input_dim

    def bind(self, prefix=None):
        if self._bound:
            return self
        return _bind_net(self, super().bind(prefix), prefix)

    def _features(self, X):
        """``Phi = sqrt(variance) net(X)`` of the bound model: ``(N, r)``."""
        return _scaled(self.net, self.variance, X)

    def _data(self, X, y):
        X = checks.inputs(X, "X", self.input_dim).astype(self.first_parameter().dtype)
        if y is not None:
            y = checks.same_length(checks.finite(checks.as_array(y, "y", like=X), "y"), X.shape[0])
        return X, y

    def log_marginal_likelihood(self, X, y):
        """``log p(y)`` of eq. 5 (no correction), differentiable: a scalar."""
        X, y = self._data(X, y)
        bound = self.bind()
        return lowrank_lml(bound._features(X), y, bound.noise)

    def objective(self, X, y):
        """The training objective: ``log p(y)``, less ``tr(C) / (2 sigma^2)`` with correction."""
        X, y = self._data(X, y)
        bound = self.bind()
        noise = bound.noise
        *moments, sq = _stats(bound.net(X), y, noise, bound.variance)  # Phi is not scaled: the moments are
        lml = _lml(*moments, X.shape[0]).astype(noise.dtype)
        return lml - trace_penalty(sq, noise) if self.variance_correction else lml

    def model(self, X, y=None):
        """Args: X ``(N, D)`` and y ``(N,)`` (the full data: the likelihood does not factorise).
        Returns ``y`` (sampled from the prior predictive when None)."""
        X, y = self._data(X, y)
        bound = self.bind()
        Phi, noise = bound._features(X), bound.noise
        if self.variance_correction:
            numpyro.factor(f"{self.name}.trace", -trace_penalty(_sq_norms(Phi), noise))
        return numpyro.sample("y", dist.LowRankMultivariateNormal(jnp.zeros(X.shape[0], Phi.dtype), Phi,
                                                                  jnp.broadcast_to(noise, X.shape[:1])), obs=y)

    def guide(self, X, y=None):
        """The empty guide (``w`` is integrated out; everything else is a point estimate)."""

    def calibrate(self, X, y, params=None):
        """Condition on the training data: store the posterior of ``w`` (D-weighted with
        correction) and ``M = max_n |phi(x_n)|^2`` for prediction.

        Args:
            X, y: the training data ``(N, D)``, ``(N,)``.
            params: optional ``{name: value}`` parameter values (default: the initial values).

        Returns:
            self
        """
        X, y = self._data(X, y)

        def condition(values):
            with handlers.substitute(data=values):
                bound = self.bind()
                Phi, noise = bound._features(X), bound.noise
                sq = _sq_norms(Phi)
                M = sq.max() if self.variance_correction else None
                s = noise + correction(sq, M) if self.variance_correction else noise
                mean, R, _ = _posterior64(*_stats(Phi, y, s)[:2])
                return {"mean": mean, "R": R, "noise": noise, "max_sq_norm": M}

        self.cache = jax.jit(condition)(params or {})
        return self

    def predict_f(self, X, batch_size=4096, params=None):
        """Moments of ``f(X)``: mean ``(N,)`` and variance ``(N,)`` (eq. 6; eq. 12 with correction,
        whose ``c(x*)`` belongs to the latent variance). Needs :meth:`calibrate` first, with the
        same ``params``."""
        if self.cache is None:
            raise ValueError("call calibrate(X_train, y_train) before predicting")
        X = checks.inputs(X, "X", self.input_dim).astype(self.first_parameter().dtype)

        def moments(Xb, batch, values, cache):
            with handlers.substitute(data=values):
                Phi = self.bind()._features(Xb)
            Phi64 = Phi.astype(cache["R"].dtype)  # the cached posterior of w is float64
            var = (solve_lower(cache["R"], Phi64.T) ** 2).sum(-2).astype(Phi.dtype)
            if self.variance_correction:
                var = var + correction(_sq_norms(Phi), cache["max_sq_norm"])
            return (Phi64 @ cache["mean"]).astype(Phi.dtype), var

        return predict._map_batches(moments, X, batch_size, params or {}, self.cache)

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
            q = mean + jnp.sqrt(var) * norm.ppf(jnp.asarray(levels, dtype=mean.dtype))[:, None]
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
        net: an equinox module ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`); its parameters are ``<name>.net$params``;
            ``q`` follows its dtype.
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
        self.net = _check_net(net)
        like = _first_array(net)
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

    def bind(self, prefix=None):
        if self._bound:
            return self
        return _bind_net(self, super().bind(prefix), prefix)

    def posterior(self):
        return SVDBKPosterior(self)

    def prior_variance(self, X):
        """The (corrected) prior variance ``|phi(x)|^2 + c(x)``: ``(N,)``."""
        sq = _sq_norms(self.posterior().features(X))
        return sq + correction(sq, self.max_sq_norm) if self.variance_correction else sq

    def calibrate(self, X, params=None, batch_size=4096):
        """Store ``M = max_n |phi(x_n)|^2`` over the training inputs ``X`` ``(N, D)`` (one pass,
        in compiled batches) for the corrected predictive; returns ``M`` (a float)."""
        X = checks.inputs(X, "X", self.input_dim)
        self.max_sq_norm = _max_sq_norm(self, X, params, batch_size)
        return self.max_sq_norm

    def weight_model(self, X, plate=None):
        """The model with ``w`` sampled: the site ``<name>.w ~ N(0, I)`` outside the plate and,
        with correction, ``<name>.eps ~ N(0, 1)`` per row inside it; returns
        ``f = Phi w + sqrt(c) eps`` at the rows the plate selects, for the user's likelihood.
        With :meth:`weight_guide`, ``Trace_ELBO`` estimates the same bound as ``GPModel``
        without bias (the ``eps`` terms of model and guide cancel).

        Args: as for :meth:`~numpyro_sparsegp.priors.GPPrior.model`.

        Returns:
            ``f`` of shape ``(B,)``.
        """
        prior = self.bind()
        X = checks.inputs(X, "X", self.input_dim)
        posterior = prior.posterior()
        w = numpyro.sample(f"{self.name}.w", posterior.prior_u())
        with prior._data(X, plate) as Xb:
            Phi = posterior.features(Xb)
            f = Phi @ w
            if self.variance_correction:
                c = correction(_sq_norms(Phi), self.max_sq_norm)
                eps = numpyro.sample(f"{self.name}.eps", dist.Normal(jnp.zeros_like(f), 1.0))
                f = f + jnp.sqrt(jnp.maximum(c, jnp.finfo(c.dtype).tiny)) * eps  # clamped: finite gradient at c = 0
            return f

    def weight_guide(self, X, plate=None):
        """The guide of :meth:`weight_model`: ``<name>.w ~ q(w)`` (and ``<name>.eps ~ N(0, 1)``)."""
        prior = self.bind()
        X = checks.inputs(X, "X", self.input_dim)
        numpyro.sample(f"{self.name}.w", prior.posterior().q_u())
        if self.variance_correction:
            with prior._data(X, plate) as Xb:
                numpyro.sample(f"{self.name}.eps", dist.Normal(jnp.zeros(Xb.shape[0], Xb.dtype), 1.0))


class SVDBKPosterior:
    """``q(f)`` of a bound :class:`SVDBK`."""

    def __init__(self, prior):
        self.net, self.variance, self.q_mu, self.q_sqrt = prior.net, prior.variance, prior.q_mu, prior.q_sqrt
        self.q, self.dist = prior.family(self.q_mu, self.q_sqrt), prior._dist
        self.variance_correction, self.max_sq_norm = prior.variance_correction, prior.max_sq_norm

    def features(self, X):
        """``Phi = phi(X) = sqrt(variance) net(X)``: ``(N, r)``."""
        return _scaled(self.net, self.variance, X.astype(self.q_mu.dtype))

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
            cov = PL @ PL.T
            return mean, cov if c is None else cov + jnp.diag(c)
        var = (PL**2).sum(-1) + (0.0 if c is None else c)
        return mean, jnp.maximum(var, jnp.finfo(var.dtype).tiny)
