"""Deep basis kernels (Zhu, Yuchi & Xie, 2025): ``k(x, x') = phi(x)^T phi(x')`` with a network
``phi: R^D -> R^r``, i.e. the Bayesian last layer ``f(x) = w^T phi(x)``, ``w ~ N(0, I_r)``.
Here ``phi(x) = sqrt(variance) net(x)``: a learnable kernel variance carries the overall scale
(see :class:`ExactDBK`), and every formula below reads the scaled features.

* :class:`ExactDBK`: exact GP regression with ``w`` integrated out; the log marginal likelihood,
  its gradient (autodiff) and the predictive cost O(N r^2) time and O(N r) memory.
* :class:`SVDBK`: a GP prior component whose global latent ``<name>.u`` is ``w`` with
  ``q(w) = N(q_mu, q_sqrt q_sqrt^T)``; ``GPModel(SVDBK(net), likelihood)`` is the paper's
  weight-space SVI (closed-form minibatch ELBO, any likelihood), ``CoxProcess`` uses it for the
  log-Gaussian Cox process of the paper's A.5, and :meth:`SVDBK.weight_model` is the
  ``Trace_ELBO`` path with ``w`` sampled.

The networks :class:`MLP` and :class:`ResNet` are written here once, on each backend's module class
(``torch.nn`` modules in ``pyro_sparsegp.dbk``, converted to PyroModules by the models; equinox
modules in ``numpyro_sparsegp.dbk``); in both their weights are the parameters
``<name>.net.<path>`` (``gp.net.hidden.0.weight``), with the same names and shapes, so
``FitResult.params`` and checkpoints carry over between the backends.

Neither model holds state outside its parameters: ``calibrate`` returns a new object to predict
from (:class:`ExactDBKPosterior`, :class:`CalibratedSVDBK`).

Variance correction (paper section 3.3): the corrected kernel adds a white-noise-like diagonal
``c(x) = max(M, |phi(x)|^2) - |phi(x)|^2`` so that the prior variance is the constant ``M``, the
largest ``|phi(x_j)|^2`` over the training inputs. Training subtracts ``tr(C) / (2 sigma^2)`` (the
bound of eq. 11); prediction adds ``c(x*)`` to the variance (eq. 12 with its D-weighting for
exact DBK), with ``M`` from ``calibrate``. With ``S = diag(s)``, ``s = sigma^2 (+ c)``, every formula goes through the posterior
of ``w`` in ``y = Phi w + e``, ``e ~ N(0, S)``::

    R R^T = Phi^T S^-1 Phi + I,     b = Phi^T S^-1 y,     w_mean = (R R^T)^-1 b,
    log N(y | 0, Phi Phi^T + S) = -1/2 [N log 2 pi + sum log s + 2 sum log diag R
                                        + y^T S^-1 y - |R^-1 b|^2],

the Woodbury identity and the determinant lemma; with ``S = sigma^2 I`` this is eq. 5. Everything
comes from the moments ``Phi^T Phi``, ``Phi^T y`` in float64 (the op ``dbk_moments`` of
:mod:`sparsegp_common.ops`): torch accumulates them over blocks of rows (one pass over ``Phi``
forward, one backward), so the step stays linear in N with cache-sized temporaries; JAX
multiplies plainly, in float64 with ``jax_enable_x64`` (without it the r x r algebra is float32
and fragile at large N / sigma^2). The difference ``y^T S^-1 y - |R^-1 b|^2`` cancels about
``log10(var y / sigma^2)`` digits, at most 6 of float64's 16 at the noise
bound 1e-6.

Also the option checks and the paper's defaults; the networks are in
:mod:`sparsegp_common.features.networks`, the step-function data of the paper's section 4.1 in
:mod:`sparsegp_common.data.step`.
"""
import math
import numbers

import numpy as np

from sparsegp_common import variational
from sparsegp_common.checks import positive_int, probabilities
from sparsegp_common.features.networks import check_basis_net
from sparsegp_common.inference.prediction import Prediction
from sparsegp_common.linalg import cholesky, solve_lower
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.priors import GPPrior
from sparsegp_common.variational.conditionals import WeightSpace, add_prior

# the names each backend's dbk module exports
NAMES = ["MLP", "ResNet", "ExactDBK", "ExactDBKPosterior", "SVDBK", "CalibratedSVDBK", "SVDBKPosterior", "correction",
         "lowrank_lml", "trace_penalty", "weight_posterior"]

NOISE_INIT = 1e-2  # sigma^2 at the start (paper)
NOISE_LOWER_BOUND = 1e-6  # sigma^2 > 1e-6 (paper)


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


# ---------------------------------------------------------------- formulas


def _stats(Phi, y, noise, variance=None):
    """The sufficient statistics of every formula below for the features ``Psi = sqrt(v) Phi``
    (``v = variance``, 1 when None), in float64 (JAX: with ``jax_enable_x64``): ``G = Psi^T S^-1 Psi``,
    ``b = Psi^T S^-1 y``, ``y^T S^-1 y``, ``log|S|``, and ``|psi_n|^2`` ``(N,)`` in the dtype of
    ``Phi``. The r x r products are scaled, not Phi (and with a scalar noise not divided either)."""
    xp, ops = namespace(Phi), backend(Phi)
    noise = ops.wide(noise, Phi)
    v = ops.wide(1.0 if variance is None else variance, Phi)
    if noise.ndim == 0:
        gram, b, yy, sq = ops.dbk_moments(Phi, y)
        return (gram * (v / noise), b * (xp.sqrt(v) / noise), yy / noise, Phi.shape[0] * xp.log(noise),
                sq * xp.astype(v, sq.dtype))
    s = xp.broadcast_to(noise, tuple(Phi.shape[:1]))
    gram, b, yy, sq = ops.dbk_moments(Phi, y, s)
    return gram * v, b * xp.sqrt(v), yy, xp.sum(xp.log(s)), sq * xp.astype(v, sq.dtype)


def _posterior64(gram, b):
    """``R = chol(G + I)``, ``c = R^-1 b`` and the weight mean ``R^-T c`` (float64; JAX: with
    ``jax_enable_x64``): ``G`` grows like N / sigma^2, beyond what a float32 Cholesky can take."""
    xp = namespace(gram)
    R = cholesky(gram + xp.eye(gram.shape[-1], dtype=gram.dtype, device=device(gram)), jitter=0.0)
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
        (JAX: with ``jax_enable_x64``) and returned in the dtype of ``Phi``.
    """
    xp = namespace(Phi)
    mean, R, _ = _posterior64(*_stats(Phi, y, noise)[:2])
    return xp.astype(mean, Phi.dtype), xp.astype(R, Phi.dtype)


def _lml(gram, b, yy, log_det_S, num_data):
    xp = namespace(gram)
    _, R, c = _posterior64(gram, b)
    quad = yy - xp.sum(c**2)  # y^T (Phi Phi^T + S)^-1 y by Woodbury
    return -0.5 * (num_data * math.log(2 * math.pi) + log_det_S + 2 * xp.sum(xp.log(xp.linalg.diagonal(R))) + quad)


def lowrank_lml(Phi, y, noise):
    """``log N(y | 0, Phi Phi^T + diag(noise))`` in O(N r^2) time and O(N r) memory (eq. 5 for a
    scalar ``noise``; see the module docstring), accumulated in float64 (JAX: with
    ``jax_enable_x64``) and returned in the dtype of ``Phi``. Shapes as for
    :func:`weight_posterior`; returns a scalar."""
    return namespace(Phi).astype(_lml(*_stats(Phi, y, noise)[:4], Phi.shape[0]), Phi.dtype)


def correction(sq_norms, max_sq_norm=None):
    """The diagonal correction ``c(x) = max(M, |phi(x)|^2) - |phi(x)|^2``.

    Args:
        sq_norms: ``|phi(x_n)|^2``, ``(N,)``.
        max_sq_norm: ``M``, the largest ``|phi(x_j)|^2`` over the training inputs; None takes the
            max over ``sq_norms`` itself (the full data or, in SVI, the minibatch, as in the paper).

    Returns:
        ``c`` ``(N,)``, non-negative.
    """
    xp = namespace(sq_norms)
    M = xp.max(sq_norms) if max_sq_norm is None else max_sq_norm
    return xp.clip(M - sq_norms, min=0.0)


def trace_penalty(sq_norms, noise, max_sq_norm=None):
    """``tr(C) / (2 sigma^2) = sum_n c(x_n) / (2 noise)`` (eq. 11), the amount by which the
    corrected objective lies below the uncorrected one. Args as for :func:`correction`."""
    c = correction(sq_norms, max_sq_norm)
    return namespace(c).sum(c) / (2 * noise)


def _sq_norms(Phi):
    return namespace(Phi).sum(Phi**2, axis=-1)


# ---------------------------------------------------------------- models


class _DeepBasis:
    """What both models share: the network ``net``, the kernel variance and the correction flag.

    Each backend supplies the hooks: ``_network`` (the network base class and how to name it in
    an error), ``_register(net)`` (make its weights parameters, where that happens on
    construction), ``_net_like(net)`` (an array of its weights, whose dtype and device the
    parameters follow), ``_parameter_values(params)`` (every parameter value of the object at
    ``params``, a ``{name: value}`` copy), ``_map_rows(fn, X, batch_size, params, *extra)``
    (``fn(obj, Xb, *extra)`` without gradients at ``params``, over row batches ``Xb`` of ``X``
    concatenated, or at once on all of ``X`` when ``batch_size`` is None; NumPyro compiles it
    once per function, object and shape) and ``_as_array`` (the backend's array conversion);
    the list with a line each is ``sparsegp_common.protocol.HOOKS``.
    """

    @property
    def input_dim(self):
        return self.net.input_dim

    @staticmethod
    def _register(net):
        return net

    def _setup(self, net, variance_correction):
        """Check the flag and the network, and register it; returns an array like its weights."""
        self.variance_correction = check_flag(variance_correction, "variance_correction")
        base, described = self._network
        if not isinstance(net, base):
            raise TypeError(f"net must be {described}, got {type(net).__name__}")
        self.net = self._register(check_basis_net(net))
        return self._net_like(net)

    def _features(self, X):
        """``Phi = sqrt(variance) net(X)``: ``(N, r)``."""
        return self.net(X) * namespace(self.variance).sqrt(self.variance)


class ExactDBK(_DeepBasis):
    """Exact GP regression with a deep basis kernel: ``y = f + e``, ``f ~ GP(0, phi^T phi)``,
    ``e ~ N(0, noise)``, trained by type-II maximum likelihood.

    ``model``/``guide`` are a collapsed model (``y`` observed through a
    ``LowRankMultivariateNormal``, plus the factor ``<name>.trace`` = ``-tr(C) / (2 sigma^2)``
    with correction) and an empty guide, so ``fit`` or ``SVI`` maximise :meth:`objective`.
    After training, :meth:`calibrate` conditions on the training data once (O(N r^2)) and
    returns an :class:`ExactDBKPosterior`, whose ``predict_f``/``predict_y`` cost O(r^2) per test
    point. The model itself holds no posterior state.

    Args:
        net: the basis network ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`): in Pyro a ``torch.nn.Module``, converted in
            place to a PyroModule; in NumPyro an equinox module. Its weights are the parameters
            ``<name>.net.<path>`` in both (``<name>.net.hidden.0.weight``).
        noise: initial noise variance ``sigma^2`` (constrained above 1e-6).
        variance: initial kernel variance ``v`` in ``phi(x) = sqrt(v) net(x)`` (positive).
        variance_correction: the paper's correction (trace term in training, eq. 12 in
            prediction); False is the "-c" ablation.
        name: prefix of the parameter and site names.

    The kernel variance carries the scale of ``phi``, which Adam cannot move stably through the
    last layer's weights alone (docs/usage.md); keep ``net`` at its default initialisation.
    """

    def __init__(self, net, noise=NOISE_INIT, variance=1.0, variance_correction=True, name="dbk"):
        super().__init__(name)
        like = self._setup(net, variance_correction)
        xp = namespace(like)
        self._param("noise", xp.asarray(check_noise(noise), dtype=like.dtype, device=device(like)),
                    self._dist.constraints.greater_than(NOISE_LOWER_BOUND))
        self._param("variance", self._checks.positive(variance, "variance", like=like), "positive")

    def _inputs(self, X, like):
        X = self._checks.inputs(X, "X", self.input_dim)
        return backend(X).cast_like(X, like)

    def _data(self, X, y):
        X = self._inputs(X, self.noise)
        if y is not None:
            checks = self._checks
            y = checks.observations(checks.finite(self._as_array(y, "y", like=X), "y"), X.shape[0])
        return X, y

    def log_marginal_likelihood(self, X, y):
        """``log p(y)`` of eq. 5 (no correction), differentiable: a scalar."""
        with self._sites.bound(self) as (m,):
            X, y = m._data(X, y)
            return lowrank_lml(m._features(X), y, m.noise)

    def objective(self, X, y):
        """The training objective: ``log p(y)``, less ``tr(C) / (2 sigma^2)`` with correction."""
        with self._sites.bound(self) as (m,):
            X, y = m._data(X, y)
            noise = m.noise
            *moments, sq = _stats(m.net(X), y, noise, m.variance)  # Phi is not scaled: the moments are
            lml = namespace(noise).astype(_lml(*moments, X.shape[0]), noise.dtype)
            return lml - trace_penalty(sq, noise) if self.variance_correction else lml

    def model(self, X, y=None):
        """Args: X ``(N, D)`` and y ``(N,)`` (the full data: the likelihood does not factorise).
        Returns ``y`` (sampled from the prior predictive when None)."""
        with self._sites.bound(self) as (m,):
            X, y = m._data(X, y)
            Phi, noise = m._features(X), m.noise
            xp = namespace(Phi)
            if self.variance_correction:
                self._sites.factor(f"{self.name}.trace", -trace_penalty(_sq_norms(Phi), noise))
            mvn = self._dist.LowRankMultivariateNormal(xp.zeros(X.shape[0], dtype=Phi.dtype, device=device(Phi)), Phi,
                                                       xp.broadcast_to(noise, tuple(X.shape[:1])))
            return self._sites.sample("y", mvn, obs=y)

    def guide(self, X, y=None):
        """The empty guide (``w`` is integrated out; everything else is a point estimate)."""

    def calibrate(self, X, y, params=None):
        """Condition on the training data: the posterior of ``w`` (D-weighted with correction)
        and ``M = max_n |phi(x_n)|^2``, at the parameter values ``params``.

        Args:
            X, y: the training data ``(N, D)``, ``(N,)``.
            params: optional ``{name: value}`` parameter values (e.g. ``FitResult.params``); by
                default the trained values ``fit`` leaves.

        Returns:
            ExactDBKPosterior: a new object that predicts; the model is left unchanged.
        """
        X, y = self._data(X, y)
        values = self._parameter_values(params)
        return ExactDBKPosterior(self, values, *self._map_rows(_condition, X, None, values, y))

    def predict_f(self, X, batch_size=4096):
        """Predictions come from the posterior :meth:`calibrate` returns; this raises a
        ValueError that says so."""
        raise ValueError("ExactDBK predicts from its posterior: call posterior = model.calibrate(X_train, y_train, "
                         "params) once after training, then posterior.predict_f(X) or posterior.predict_y(X)")

    def predict_y(self, X, quantiles=None, batch_size=4096):
        """See :meth:`predict_f`: use the posterior :meth:`calibrate` returns."""
        return self.predict_f(X, batch_size)


def _condition(model, X, y):
    """``(mean, R, noise, M)`` of the posterior of ``w`` given the training data (float64 ``mean``
    and ``R``; ``M`` None without correction)."""
    Phi, noise = model._features(X), model.noise
    xp = namespace(Phi)
    sq = _sq_norms(Phi)
    M = xp.max(sq) if model.variance_correction else None
    s = noise + correction(sq, M) if model.variance_correction else noise
    mean, R, _ = _posterior64(*_stats(Phi, y, s)[:2])
    return mean, R, noise, M


class ExactDBKPosterior:
    """The posterior of an :class:`ExactDBK` given its training data (:meth:`ExactDBK.calibrate`):
    the posterior of ``w`` (D-weighted with correction), ``M``, the noise and every parameter
    value it was computed at. Predictions read nothing else: training the model further does not
    change them. Predictions cost O(r^2) per test point.

    Attributes:
        model: the :class:`ExactDBK` (its network and options).
        params: ``{name: value}``, the parameter values of ``model`` at calibration.
        mean, R: the posterior of ``w``: mean ``(r,)`` and lower Cholesky factor ``(r, r)`` of
            its precision, float64 (JAX: with ``jax_enable_x64``).
        noise: ``sigma^2``.
        max_sq_norm: ``M``, or None without correction.
    """

    def __init__(self, model, params, mean, R, noise, max_sq_norm):
        self.model, self.params = model, params
        self.mean, self.R, self.noise, self.max_sq_norm = mean, R, noise, max_sq_norm

    def predict_f(self, X, batch_size=4096):
        """Moments of ``f(X)``: mean ``(N,)`` and variance ``(N,)`` (eq. 6; eq. 12 with correction,
        whose ``c(x*)`` belongs to the latent variance), in batches of ``batch_size`` rows."""
        model = self.model
        return model._map_rows(_exact_moments, model._inputs(X, self.noise), positive_int(batch_size, "batch_size"),
                               self.params, self.mean, self.R, self.max_sq_norm)

    def predict_y(self, X, quantiles=None, batch_size=4096):
        """Predictive of ``y*``: variance ``var_f + sigma^2``, Gaussian quantiles ``(Q, N)`` at
        ``quantiles`` (or None); see :meth:`predict_f`.

        Returns:
            Prediction
        """
        levels = None if quantiles is None else probabilities(quantiles, "quantiles")
        mean, var = self.predict_f(X, batch_size=batch_size)
        var = var + self.noise
        q = None
        if levels is not None:
            xp = namespace(mean)
            levels = xp.asarray(levels, dtype=mean.dtype, device=device(mean))
            q = self.model._dist.Normal(mean, xp.sqrt(var)).icdf(levels[:, None])
        return Prediction(mean, var, q)


def _exact_moments(model, X, mean, R, max_sq_norm):
    """Predictive moments of ``f`` at the rows ``X`` from the posterior of ``w``."""
    Phi = model._features(X)
    xp = namespace(Phi)
    Phi64 = xp.astype(Phi, R.dtype, copy=False)  # the posterior of w is float64
    var = xp.astype(xp.sum(solve_lower(R, Phi64.mT) ** 2, axis=-2), Phi.dtype)
    if model.variance_correction:
        var = var + correction(_sq_norms(Phi), max_sq_norm)
    return xp.astype(Phi64 @ mean, Phi.dtype), var


class SVDBK(_DeepBasis, GPPrior):
    """Weight-space deep basis kernel prior: ``f(x) = w^T phi(x)``, ``w ~ N(0, I_r)`` with
    ``q(w) = N(q_mu, q_sqrt q_sqrt^T)`` (the site ``<name>.u`` holds ``w``).

    ``posterior().marginals(X)`` is ``q(f(X)) = N(Phi q_mu, |q_sqrt^T phi|^2 + c)``; with the
    correction, ``c`` is the diagonal correction with ``M`` the max over the rows of ``X`` (the
    minibatch, in training: for a Gaussian likelihood the ELBO then is the paper's eq. 9 less its
    minibatch trace term, and for any likelihood it is the bound of eq. 11 with the corrected
    prior ``N(f | Phi w, C)``). To predict with ``M`` over the training set, pass the
    :class:`CalibratedSVDBK` that :meth:`calibrate` returns to ``predict_f``/``predict_y``/
    ``sample_f`` in place of the prior.

    Args:
        net: the basis network ``(N, D) -> (N, r)`` with integer attributes ``input_dim`` and
            ``rank`` (:class:`MLP`, :class:`ResNet`): in Pyro a ``torch.nn.Module``, converted in
            place to a PyroModule; in NumPyro an equinox module. Its weights are the parameters
            ``<name>.net.<path>`` in both; ``q`` follows its dtype (and device).
        variance: initial kernel variance ``v`` in ``phi(x) = sqrt(v) net(x)`` (positive; see
            :class:`ExactDBK` for why the scale is a parameter of its own).
        variance_correction: add ``c(x)`` (False: the "-c" ablation).
        diagonal: mean-field ``q_sqrt`` ``(r,)`` instead of a full factor ``(r, r)``.
        mean_function: a :class:`~sparsegp_common.priors.mean_functions.MeanFunction` ``m`` (``f = m + g``);
            None: zero.
        name: prefix of the parameter and site names.

    ``q`` starts at the prior (``q_mu = 0``, ``q_sqrt = I``).
    """

    def __init__(self, net, *, variance=1.0, variance_correction=True, diagonal=False, mean_function=None, name="gp"):
        super().__init__(name)
        like = self._setup(net, variance_correction)
        self._set_mean_function(mean_function, like)
        self.family = variational.family(check_flag(diagonal, "diagonal"))
        q_mu, q_sqrt = self.family.initial(net.rank, (), like)
        self._param("q_mu", q_mu)
        self._param("q_sqrt", q_sqrt, self.family.q_sqrt_constraint)
        self._param("variance", self._checks.positive(variance, "variance", like=like), "positive")

    @property
    def site_names(self):
        return super().site_names + tuple(f"{self.name}.{s}" for s in ("w", "eps"))

    def _posterior(self):
        return SVDBKPosterior(self)

    def prior_variance(self, X):
        """The (corrected) prior variance ``|phi(x)|^2 + c(x)``, ``M`` the max over ``X``: ``(N,)``."""
        sq = _sq_norms(self._posterior().features(X))
        return sq + correction(sq) if self.variance_correction else sq

    def calibrate(self, X, params=None, batch_size=4096):
        """``M = max_n |phi(x_n)|^2`` over the training inputs ``X`` ``(N, D)`` (one pass, in
        batches, without gradients) at the parameter values ``params`` (by default the trained
        values ``fit`` leaves), for the corrected predictive.

        Returns:
            CalibratedSVDBK: a new object that ``predict_f``/``predict_y``/``sample_f`` take in
            place of the prior (predict at the same ``params``); the prior is left unchanged.
        """
        X = self._checks.inputs(X, "X", self.input_dim)
        sq = self._map_rows(_svdbk_sq_norms, X, positive_int(batch_size, "batch_size"), params)
        return self._adapted[CalibratedSVDBK](self, namespace(sq).max(sq))

    def weight_model(self, X, plate=None):
        """The model with ``w`` sampled: the site ``<name>.w ~ N(0, I)`` outside the plate and,
        with correction, ``<name>.eps ~ N(0, 1)`` per row inside it; returns
        ``f = Phi w + sqrt(c) eps`` at the rows the plate selects, for the user's likelihood.
        With :meth:`weight_guide`, ``Trace_ELBO`` estimates the same bound as ``GPModel``
        without bias (the ``eps`` terms of model and guide cancel).

        Args: as for ``GPPrior.model``.

        Returns:
            ``f`` of shape ``(B,)``.
        """
        with self._sites.bound(self) as (prior,):
            X = self._checks.inputs(X, "X", self.input_dim)
            posterior = prior.posterior()
            w = self._sites.sample(f"{self.name}.w", posterior.prior_u())
            with prior._data(X, plate) as Xb:
                Phi = posterior.features(Xb)
                f = prior.plus_mean_function(Phi @ w, Xb)
                if self.variance_correction:
                    xp = namespace(f)
                    c = correction(_sq_norms(Phi))
                    eps = self._sites.sample(f"{self.name}.eps", self._dist.Normal(xp.zeros_like(f), 1.0))
                    f = f + xp.sqrt(xp.clip(c, min=xp.finfo(c.dtype).tiny)) * eps  # clamped: finite gradient at c = 0
                return f

    def weight_guide(self, X, plate=None):
        """The guide of :meth:`weight_model`: ``<name>.w ~ q(w)`` (and ``<name>.eps ~ N(0, 1)``)."""
        with self._sites.bound(self) as (prior,):
            X = self._checks.inputs(X, "X", self.input_dim)
            self._sites.sample(f"{self.name}.w", prior.posterior().q_u())
            if self.variance_correction:
                with prior._data(X, plate) as Xb:
                    xp = namespace(Xb)
                    zeros = xp.zeros(Xb.shape[0], dtype=Xb.dtype, device=device(Xb))
                    self._sites.sample(f"{self.name}.eps", self._dist.Normal(zeros, 1.0))


def _svdbk_sq_norms(prior, X):
    return _sq_norms(prior.posterior().features(X))


class CalibratedSVDBK:
    """An :class:`SVDBK` prior with ``M = max_n |phi(x_n)|^2`` over its training inputs
    (:meth:`SVDBK.calibrate`): ``predict_f``, ``predict_y`` and ``sample_f`` take it in place of
    the prior and add the correction ``c(x*)`` with this ``M``. It reads the prior's parameters as
    the prior does (``params=``, by default the trained values); it is not trained.

    Attributes:
        prior: the :class:`SVDBK`.
        max_sq_norm: ``M``, a scalar array.
    """

    def __init__(self, prior, max_sq_norm):
        self.prior, self.max_sq_norm = prior, max_sq_norm

    @property
    def name(self):
        return self.prior.name

    @property
    def input_dim(self):
        return self.prior.input_dim

    def first_parameter(self):
        return self.prior.first_parameter()

    def posterior(self, part="f"):
        return self.prior._with_mean(SVDBKPosterior(self.prior, self.max_sq_norm), part)


class SVDBKPosterior:
    """``q(f)`` of an :class:`SVDBK` with its parameters read once; ``max_sq_norm`` is ``M`` of
    the correction (None: the max over the rows ``marginals`` is given)."""

    def __init__(self, prior, max_sq_norm=None):
        self.net, self.variance, self.q_mu, self.q_sqrt = prior.net, prior.variance, prior.q_mu, prior.q_sqrt
        self.q, self.dist = prior.family(self.q_mu, self.q_sqrt), prior._dist
        self.variance_correction, self.max_sq_norm = prior.variance_correction, max_sq_norm

    def features(self, X):
        """``Phi = phi(X) = sqrt(variance) net(X)``: ``(N, r)``."""
        return self.net(backend(X).cast_like(X, self.q_mu)) * namespace(self.variance).sqrt(self.variance)

    def kl(self):
        return self.q.kl()

    def prior_u(self):
        return variational.prior_distribution(self.dist, self.q_mu)

    def q_u(self):
        return self.q.distribution(self.dist)

    def marginals(self, X, full_cov=False):
        Phi = self.features(X)
        xp = namespace(Phi)
        mean, change = WeightSpace().update(Phi.mT, None, self.q, full_cov)
        # the prior's residual k - Phi Phi^T: the correction c(x) on the diagonal, or nothing
        c = correction(_sq_norms(Phi), self.max_sq_norm) if self.variance_correction else xp.zeros_like(mean)
        residual = c[:, None] * xp.eye(c.shape[0], dtype=c.dtype, device=device(c)) if full_cov else c
        return mean, add_prior(residual, change, full_cov)
