"""Dense float64 NumPy reference, shared by the tests of both backends.

Written from the textbook formulas with dense inverses and determinants, independently of the
library's Cholesky/whitening code paths.
"""
import math

import numpy as np
from scipy import integrate, optimize, special, stats

# ---------------------------------------------------------------- kernels


def scaled_sqdist(X, Z, lengthscale):
    ls = np.atleast_1d(lengthscale)
    d = (X[:, None, :] - Z[None, :, :]) / ls
    return (d**2).sum(-1)


def kernel(name, X, Z, lengthscale, variance):
    r = np.sqrt(scaled_sqdist(X, Z, lengthscale))
    if name == "rbf":
        return variance * np.exp(-0.5 * r**2)
    if name == "matern12":
        return variance * np.exp(-r)
    if name == "matern32":
        return variance * (1 + math.sqrt(3) * r) * np.exp(-math.sqrt(3) * r)
    if name == "matern52":
        return variance * (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)
    raise ValueError(name)


def spectral_density(name, omega, lengthscale, variance):
    """Isotropic densities in the convention s = (2 pi)^(D/2) S, kappa(tau) = int S(w) e^(i w tau) dw."""
    D = omega.shape[-1]
    w = np.linalg.norm(omega, axis=-1)
    if name == "rbf":
        S = variance * (lengthscale**2 / (2 * np.pi)) ** (D / 2) * np.exp(-0.5 * lengthscale**2 * w**2)
    else:
        nu = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[name]
        lam = math.sqrt(2 * nu) / lengthscale  # Rasmussen & Williams eq. 4.15
        c = math.gamma(nu + D / 2) / (math.gamma(nu) * math.pi ** (D / 2))
        S = variance * c * lam ** (2 * nu) * (lam**2 + w**2) ** (-(nu + D / 2))
    return (2 * np.pi) ** (D / 2) * S


def bochner_1d(density, tau):
    """``(2 pi)^(-1/2) * integral s(w) cos(w tau) dw`` for a 1-D spectral density."""
    if tau == 0:
        value, _ = integrate.quad(density, 0, np.inf, limit=500)
    else:  # QAWF: Fourier integral on [0, inf)
        value, _ = integrate.quad(density, 0, np.inf, weight="cos", wvar=tau, limlst=200)
    return 2 * value / math.sqrt(2 * math.pi)


def hankel_2d(density_radial, r):
    """The 2-D Bochner integral of an isotropic density: ``integral_0^inf s(rho) J0(rho r) rho d rho``."""
    value, _ = integrate.quad(lambda rho: density_radial(rho) * special.j0(rho * r) * rho, 0, np.inf, limit=2000)
    return value


# ---------------------------------------------------------------- Gaussians


def gaussian_kl(m1, S1, m2, S2):
    """KL[N(m1, S1) || N(m2, S2)] by dense inverse and determinants."""
    k = len(m1)
    S2inv = np.linalg.inv(S2)
    d = m2 - m1
    return 0.5 * (
        np.trace(S2inv @ S1) + d @ S2inv @ d - k + np.linalg.slogdet(S2)[1] - np.linalg.slogdet(S1)[1]
    )


def covariance(q_sqrt):
    """S from a full (M, M) lower factor or a diagonal (M,) one."""
    return np.diag(q_sqrt**2) if q_sqrt.ndim == 1 else q_sqrt @ q_sqrt.T


def chevron_factor(log_diag, dense):
    """The chevron family's lower factor C ``(m, m)``: ``exp(log_diag)`` on the diagonal and, below
    it, the first ``k`` columns of ``dense`` ``(m, k)`` (Evans and Nair's chevron(k))."""
    C = np.diag(np.exp(log_diag))
    for r in range(dense.shape[1]):
        C[r + 1:, r] = dense[r + 1:, r]
    return C


# ---------------------------------------------------------------- SVGP


class SVGPRef:
    """One latent SVGP with dense formulas: ``u = f(Z)``; whitened means ``u = chol(Kuu) v``.
    ``mean``: a mean function ``m(X) -> (N,)`` (``f = m + g``; default zero)."""

    def __init__(self, kern, lengthscale, variance, Z, q_mu, q_sqrt, whiten=True, jitter=0.0, mean=None):
        self.k = lambda A, B: kernel(kern, A, B, lengthscale, variance)
        self.Z, self.q_mu, self.S, self.whiten = Z, q_mu, covariance(q_sqrt), whiten
        self.Kuu = self.k(Z, Z) + jitter * np.eye(len(Z))
        self.mean = mean or (lambda X: np.zeros(len(X)))

    def q_u(self):
        """Mean and covariance of q(u) in the original (unwhitened) coordinates."""
        if not self.whiten:
            return self.q_mu, self.S
        L = np.linalg.cholesky(self.Kuu)
        return L @ self.q_mu, L @ self.S @ L.T

    def kl(self):
        if self.whiten:
            return gaussian_kl(self.q_mu, self.S, np.zeros_like(self.q_mu), np.eye(len(self.q_mu)))
        return gaussian_kl(self.q_mu, self.S, np.zeros_like(self.q_mu), self.Kuu)

    def predict(self, X):
        """Mean (N,) and full covariance (N, N) of q(f(X))."""
        m_u, S_u = self.q_u()
        Kfu = self.k(X, self.Z)
        P = np.linalg.solve(self.Kuu, Kfu.T).T  # Kfu Kuu^-1
        return self.mean(X) + P @ m_u, self.k(X, X) - P @ Kfu.T + P @ S_u @ P.T

    def elbo(self, ell, X, y, num_data=None):
        mean, cov = self.predict(X)
        scale = (num_data or len(X)) / len(X)
        return scale * ell(y, mean, np.diag(cov)).sum() - self.kl()


class CoupledRef:
    """SVGPs ``f_l = F(X) c + g_l`` (``g_l`` the zero-mean GP of ``svgps[l]``) sharing coefficients
    ``c ~ N(prior_loc, diag(prior_scale^2))`` (numbers or ``(P,)``), with ``q`` jointly Gaussian over ``(c, v_1, ..., v_L)``:
    ``c = loc + Lc e``, ``v_l = q_mu_l + W_l e + chol(S_l) eta_l``; ``v_l = u_l``, or ``u_l = chol(Kuu) v_l``
    when whitened. The joint mean and covariance are formed densely and everything is read from them."""

    def __init__(self, svgps, features, loc, Lc, W, prior_loc, prior_scale):
        self.svgps, self.features, self.loc, self.Lc, self.W = svgps, features, loc, Lc, W
        self.prior_loc, self.prior_scale = prior_loc, prior_scale

    def _block(self, l):
        P, M = len(self.loc), len(self.svgps[0].q_mu)
        return slice(P + l * M, P + (l + 1) * M)

    def joint(self):
        P = len(self.loc)
        size = P + sum(len(s.q_mu) for s in self.svgps)
        T = np.zeros((size, size))
        T[:P, :P] = self.Lc
        for l, svgp in enumerate(self.svgps):
            T[self._block(l), :P] = self.W[l]
            T[self._block(l), self._block(l)] = np.linalg.cholesky(svgp.S)
        return np.concatenate([self.loc] + [s.q_mu for s in self.svgps]), T @ T.T

    def kl(self):
        """KL of the joint q against the prior ``N(prior_loc, diag(prior_scale^2)) x prod_l p(v_l)``."""
        P = len(self.loc)
        mean, cov = self.joint()
        prior_cov = np.zeros_like(cov)
        prior_cov[:P, :P] = np.diag(np.broadcast_to(np.square(self.prior_scale), (P,)))
        for l, svgp in enumerate(self.svgps):
            prior_cov[self._block(l), self._block(l)] = np.eye(len(svgp.q_mu)) if svgp.whiten else svgp.Kuu
        prior_mean = np.concatenate([np.broadcast_to(self.prior_loc, (P,)), np.zeros(len(mean) - P)])
        return gaussian_kl(mean, cov, prior_mean, prior_cov)

    def predict(self, X, l=0, part="f"):
        """Mean (N,) and covariance (N, N) of q(f_l(X)), or of its ``"mean"`` or ``"gp"`` part; ``l``
        a tuple of indices: of ``F c + sum_l g_l`` (the components of one function)."""
        P = len(self.loc)
        mean, cov = self.joint()
        G, residual = np.zeros((len(X), len(mean))), 0.0
        if part != "gp":
            G[:, :P] = self.features(X)
        for i in (l if isinstance(l, tuple) else (l,)):
            svgp = self.svgps[i]
            Kfu = svgp.k(X, svgp.Z)
            proj = np.linalg.solve(svgp.Kuu, Kfu.T).T  # Kfu Kuu^-1: E[g | u] = proj u
            if part != "mean":
                G[:, self._block(i)] = proj @ np.linalg.cholesky(svgp.Kuu) if svgp.whiten else proj
                residual = residual + svgp.k(X, X) - proj @ Kfu.T
        return G @ mean, G @ cov @ G.T + residual


# ---------------------------------------------------------------- likelihoods


def gaussian_ell(noise):
    return lambda y, m, v: -0.5 * np.log(2 * np.pi * noise) - ((y - m) ** 2 + v) / (2 * noise)


def poisson_exp_ell(y, m, v):
    return y * m - np.exp(m + v / 2) - special.gammaln(y + 1)


def log_lik(name, **params):
    """Pointwise log p(y | f) of the library's likelihoods (scalar f)."""
    if name == "gaussian":
        return lambda y, f: stats.norm.logpdf(y, f, np.sqrt(params["variance"]))
    if name == "poisson_exp":
        return lambda y, f: stats.poisson.logpmf(y, np.exp(f))
    if name == "poisson_softplus":
        return lambda y, f: stats.poisson.logpmf(y, np.logaddexp(0, f))
    if name == "bernoulli_logit":
        return lambda y, f: -np.logaddexp(0, -(2 * y - 1) * f)
    if name == "bernoulli_probit":
        return lambda y, f: stats.norm.logcdf((2 * y - 1) * f)
    if name == "studentt":
        return lambda y, f: stats.t.logpdf(y, params["df"], f, params["scale"])
    raise ValueError(name)


def expected_log_lik_quad(logp, y, mean, var):
    """E[logp(y, f)], f ~ N(mean, var), by adaptive quadrature, one point at a time."""
    out = []
    for yi, mi, vi in zip(y, mean, var):
        s = math.sqrt(vi)
        value, _ = integrate.quad(lambda f: logp(yi, f) * stats.norm.pdf(f, mi, s), mi - 12 * s, mi + 12 * s, limit=200)
        out.append(value)
    return np.array(out)


# ---------------------------------------------------------------- exact and collapsed GP regression


def exact_lml(K, y, noise):
    return stats.multivariate_normal.logpdf(y, np.zeros(len(y)), K + noise * np.eye(len(y)))


def collapsed_bound(Kff, Kfu, Kuu, y, noise):
    """Titsias (2009): log N(y | 0, Q + noise I) - tr(Kff - Q) / (2 noise), Q = Kfu Kuu^-1 Kuf."""
    Q = Kfu @ np.linalg.solve(Kuu, Kfu.T)
    return exact_lml(Q, y, noise) - np.trace(Kff - Q) / (2 * noise)


def titsias_optimum_whitened(Kfu, Kuu, y, noise):
    """Optimal whitened q(v) = N(q_mu, q_sqrt q_sqrt^T) for a Gaussian likelihood."""
    L = np.linalg.cholesky(Kuu)
    A = np.linalg.solve(L, Kfu.T)  # L^-1 Kuf
    Sigma = np.linalg.inv(np.eye(len(Kuu)) + A @ A.T / noise)
    return Sigma @ A @ y / noise, np.linalg.cholesky(Sigma)


# ---------------------------------------------------------------- predictive distributions of y


def conditional_moments(name, **params):
    """E[y | f] and Var[y | f] of the library's likelihoods (scalar f)."""
    if name == "gaussian":
        return lambda f: (f, params["variance"])
    if name in ("poisson_exp", "poisson_softplus"):
        rate = np.exp if name == "poisson_exp" else (lambda f: np.logaddexp(0, f))
        return lambda f: (rate(f), rate(f))
    if name in ("bernoulli_logit", "bernoulli_probit"):
        prob = special.expit if name == "bernoulli_logit" else stats.norm.cdf
        return lambda f: (prob(f), prob(f) * (1 - prob(f)))
    if name == "studentt":
        return lambda f: (f, params["scale"] ** 2 * params["df"] / (params["df"] - 2))
    raise ValueError(name)


def _normal_expectation(fn, m, v):
    s = math.sqrt(v)
    return integrate.quad(lambda f: fn(f) * stats.norm.pdf(f, m, s), m - 12 * s, m + 12 * s, limit=200)[0]


def predictive_moments(name, mean, var, **params):
    """Mean and variance of p(y) = int p(y | f) N(f | mean, var) df by adaptive quadrature."""
    moments = conditional_moments(name, **params)
    out = []
    for m, v in zip(mean, var):
        first = _normal_expectation(lambda f: moments(f)[0], m, v)
        second = _normal_expectation(lambda f: moments(f)[1] + moments(f)[0] ** 2, m, v)
        out.append((first, second - first**2))
    return np.array(out).T


def predictive_quantile(name, m, v, level, **params):
    """The ``level`` quantile of p(y) at one input, from its CDF by quadrature."""
    cdfs = {
        "gaussian": lambda t, f: stats.norm.cdf(t, f, math.sqrt(params["variance"])),
        "studentt": lambda t, f: stats.t.cdf(t, params["df"], f, params["scale"]),
        "poisson_exp": lambda t, f: stats.poisson.cdf(t, np.exp(f)),
    }
    cdf = lambda t: _normal_expectation(lambda f: cdfs[name](t, f), m, v)  # noqa: E731
    if name == "poisson_exp":
        k = 0
        while cdf(k) < level:
            k += 1
        return float(k)
    s = math.sqrt(v + 10)
    return optimize.brentq(lambda t: cdf(t) - level, m - 50 * s, m + 50 * s, xtol=1e-10)


# ---------------------------------------------------------------- decoupled bases (Cheng & Boots, 2017)


def decoupled_kl_eq9(a, Ka, B, Kb):
    """Paper eq. 9 with ``B^{-1}``: ``a^T Ka a / 2 + log|I + Kb B| / 2 - tr(Kb (B^-1 + Kb)^-1) / 2``."""
    I = np.eye(len(Kb))
    return 0.5 * (a @ Ka @ a + np.linalg.slogdet(I + Kb @ B)[1] - np.trace(Kb @ np.linalg.inv(np.linalg.inv(B) + Kb)))


def decoupled_kl_R(a, Ka, B, Kb):
    """The same with ``R = B (I + Kb B)^{-1}`` (defined for singular ``B``)."""
    R = B @ np.linalg.inv(np.eye(len(Kb)) + Kb @ B)
    return 0.5 * (a @ Ka @ a + np.linalg.slogdet(np.eye(len(Kb)) + Kb @ B)[1] - np.trace(Kb @ R))


def decoupled_predict(Kxa, a, Kxb, B, Kb, Kxx):
    """Mean ``Kxa a`` and covariance ``Kxx - Kxb R Kbx`` of q(f(X)) (paper eq. 8)."""
    R = B @ np.linalg.inv(np.eye(len(Kb)) + Kb @ B)
    return Kxa @ a, Kxx - Kxb @ R @ Kxb.T


def decoupled_dense_weights(Phi_a, a, Phi_b, B):
    """Finite features ``k = phi^T phi`` (rows of Phi are phi(z)^T): the weight-space Gaussian
    ``N(Phi_a^T a, (I + Phi_b^T B Phi_b)^{-1})``, to compare with ``N(0, I)``."""
    d = Phi_a.shape[1]
    return Phi_a.T @ a, np.linalg.inv(np.eye(d) + Phi_b.T @ B @ Phi_b)


def hybrid_dense_weights(Phi_u, q_mu, S, Phi_r, a_r):
    """Finite features, hybrid (spec A.3): ``mu = Phi_u^T K^-1 m + Phi_r^T a_r``,
    ``Sigma = I + Phi_u^T K^-1 (S - K) K^-1 Phi_u`` with ``K = Phi_u Phi_u^T``."""
    K = Phi_u @ Phi_u.T
    P = np.linalg.solve(K, Phi_u).T  # Phi_u^T K^-1
    return P @ q_mu + Phi_r.T @ a_r, np.eye(Phi_u.shape[1]) + P @ (S - K) @ P.T


def hybrid_kl(q_mu, S, K, Kur, Kr, a_r, logdet_coefficient=0.5):
    """Hybrid KL (spec A.3, eq. 14) with the corrected ``-1/2 log|K^-1 S|``; the paper prints
    the coefficient as 1 (``logdet_coefficient=1.0`` reproduces the erratum)."""
    Kinv = np.linalg.inv(K)
    return (0.5 * q_mu @ Kinv @ q_mu + q_mu @ Kinv @ Kur @ a_r + 0.5 * a_r @ Kr @ a_r
            - logdet_coefficient * np.linalg.slogdet(Kinv @ S)[1] + 0.5 * np.trace(S @ Kinv) - 0.5 * len(K))


def decoupled_optimum(Kxa, Ka, Kxb, Kb, y, noise, scale=1.0):
    """Closed-form optimum for a Gaussian likelihood (spec 5.1):
    ``a* = (Kax Kxa + noise Ka)^-1 Kax y`` and ``B* = scale Kb^-1 Kbx Kxb Kb^-1 / noise``."""
    a = np.linalg.solve(Kxa.T @ Kxa + noise * Ka, Kxa.T @ y)
    Kb_inv_Kbx = np.linalg.solve(Kb, Kxb.T)
    return a, scale * Kb_inv_Kbx @ Kb_inv_Kbx.T / noise


def decoupled_elbo(Kxa, a, Kxb, B, Kb, Ka, kxx, y, noise):
    """Full-batch Gaussian ELBO of the decoupled posterior, dense."""
    mean, cov = decoupled_predict(Kxa, a, Kxb, B, Kb, np.diag(kxx))
    return gaussian_ell(noise)(y, mean, np.diag(cov)).sum() - decoupled_kl_R(a, Ka, B, Kb)


# ---------------------------------------------------------------- Cox processes


def cox_intensity_mean(svgp, X, offset):
    """``E_q[exp(f(x) + offset)] = exp(m + v / 2 + offset)`` at the rows of ``X``, from dense moments."""
    mean, cov = svgp.predict(X)
    return np.exp(mean + np.diag(cov) / 2 + offset)


def cox_elbo(svgp, events, bounds, offset=0.0):
    """Continuous Cox-process ELBO with the integral by adaptive quadrature (scipy), in 1-D or 2-D:
    ``sum_i (m(x_i) + offset) - int_W exp(m + v / 2 + offset) - KL``."""
    mean, _ = svgp.predict(events)
    point = lambda *x: cox_intensity_mean(svgp, np.array([x]), offset)[0]  # noqa: E731
    if len(bounds) == 1:
        integral, _ = integrate.quad(point, *bounds[0], epsabs=1e-13, epsrel=1e-12, limit=200)
    else:
        (x0, x1), (y0, y1) = bounds
        integral, _ = integrate.dblquad(lambda y, x: point(x, y), x0, x1, y0, y1, epsabs=1e-11, epsrel=1e-10)
    return (mean + offset).sum() - integral - svgp.kl()


def cox_binned_elbo(svgp, events, low, high, num_bins, offset=0.0):
    """1-D binned ELBO: counts per equal cell ~ Poisson(|cell| exp(f(centre) + offset))."""
    edges = np.linspace(low, high, num_bins + 1)
    counts, _ = np.histogram(events[:, 0], edges)
    centres, cell = (edges[:-1] + edges[1:]) / 2, (high - low) / num_bins
    mean, cov = svgp.predict(centres[:, None])
    rate = cell * np.exp(mean + np.diag(cov) / 2 + offset)
    return (counts * (np.log(cell) + mean + offset) - rate - special.gammaln(counts + 1)).sum() - svgp.kl()


def simulate_poisson_process(log_intensity, low, high, log_bound, rng):
    """Events of a 1-D Poisson process with ``log_intensity(x) <= log_bound`` on ``[low, high]``, by thinning."""
    candidates = rng.uniform(low, high, rng.poisson(np.exp(log_bound) * (high - low)))
    keep = np.log(rng.uniform(size=len(candidates))) < log_intensity(candidates) - log_bound
    return np.sort(candidates[keep])[:, None]


# ---------------------------------------------------------------- variational orthogonal features (spec vof.md)


def hermite_function(m, r, w):
    """The real scaled Hermite function ``psi_m^(r)(w)``, orthonormal in L2(R) (raw H_m, small m)."""
    c = 2 ** (-m / 2) * math.sqrt(r) / (math.pi**0.25 * math.sqrt(math.factorial(m)))
    return c * special.eval_hermite(m, r * w) * np.exp(-(r**2) * w**2 / 2)


def hermite_r(lengthscale, sigma_x):
    """``r`` of the Hermite features with input-density standard deviation ``sigma_x``."""
    return math.sqrt(lengthscale / 2 * math.sqrt(4 * sigma_x**2 + lengthscale**2))


def vof_kuf_quad(sqrt_s, psi, x, low=-np.inf, high=np.inf):
    """``(2 pi)^(-1/4) int sqrt(s(w)) psi(w) cas(w x) dw`` by adaptive quadrature (1-D)."""
    f = lambda w: sqrt_s(w) * psi(w) * (math.cos(w * x) + math.sin(w * x))  # noqa: E731
    return integrate.quad(f, low, high, limit=400)[0] * (2 * math.pi) ** -0.25


def hermite_kuf_paper(m, x, variance, lengthscale, r):
    """The paper's main-text closed form ``sqrt(2 pi) v l c_m R_+^(-1/2) exp(-x^2 / 2R_+) rho^m H_m(z)``."""
    Rp, Rm = r**2 + lengthscale**2 / 2, r**2 - lengthscale**2 / 2
    c = 2 ** ((-m - 0.5) / 2) * math.sqrt(r) / math.sqrt(math.factorial(m) * math.pi * variance * lengthscale) * (Rp / Rm) ** (m / 2)
    z = r * x / math.sqrt(Rm * Rp)
    return math.sqrt(2 * math.pi) * variance * lengthscale * c / math.sqrt(Rp) * np.exp(-(x**2) / (2 * Rp)) * (Rm / Rp) ** m * special.eval_hermite(m, z)


def se_eigenfeature(m, x, variance, lengthscale, sigma_x):
    """``sqrt(lambda_m) phi_m(x)``: eigenvalue and L2(N(0, sigma_x^2))-normalised eigenfunction of the SE kernel."""
    a, b = 1 / (4 * sigma_x**2), 1 / (2 * lengthscale**2)
    c = math.sqrt(a**2 + 2 * a * b)
    A = a + b + c
    lam = variance * math.sqrt(2 * a / A) * (b / A) ** m
    h = special.eval_hermite(m, math.sqrt(2 * c) * x) / math.sqrt(2**m * math.factorial(m))
    return math.sqrt(lam) * (c / a) ** 0.25 * np.exp(-(c - a) * x**2) * h


def band_limited_variance(density, a):
    """``k_a(0) = (2 pi)^(-1/2) int_{-a}^{a} s`` (1-D)."""
    return integrate.quad(density, -a, a, limit=200)[0] / math.sqrt(2 * math.pi)


def vof_titsias(Kuf, y, noise, kff):
    """Optimal ``q(u)`` (``Kuu = I``) and the collapsed bound: ``(m*, S*, bound)``."""
    M = Kuf.shape[0]
    S = np.linalg.inv(np.eye(M) + Kuf @ Kuf.T / noise)
    bound = exact_lml(Kuf.T @ Kuf, y, noise) - (kff - (Kuf**2).sum(0)).sum() / (2 * noise)
    return S @ Kuf @ y / noise, S, bound


def vof_gaussian_elbo(Kuf, q_mu, S, y, noise, kff):
    """Uncollapsed Gaussian ELBO with ``Kuu = I``, dense formulas."""
    mean = Kuf.T @ q_mu
    var = kff + np.einsum("mn,mk,kn->n", Kuf, S - np.eye(len(q_mu)), Kuf)
    return gaussian_ell(noise)(y, mean, var).sum() - gaussian_kl(q_mu, S, np.zeros(len(q_mu)), np.eye(len(q_mu)))


# ---------------------------------------------------------------- deep basis kernels (spec deep-basis-kernel.md)


def dense_gp_predict(K, Ksx, kss, y, noise):
    """GP regression with train covariance ``K + diag(noise)``: latent mean and variance at test
    points with cross-covariance ``Ksx`` (T, N) and prior variances ``kss`` (T,), by dense inverse."""
    Sigma_inv = np.linalg.inv(K + np.diag(np.broadcast_to(noise, len(y))))
    return Ksx @ Sigma_inv @ y, kss - np.einsum("tn,nm,tm->t", Ksx, Sigma_inv, Ksx)


def dbk_elbo(Phi, y, m, S, noise):
    """``E_q log N(y | Phi w, noise I) - KL[N(m, S) || N(0, I)]`` by its dense expansion (eq. 8)."""
    resid = y - Phi @ m
    expected = -0.5 * len(y) * np.log(2 * np.pi * noise) - (resid @ resid + np.trace(Phi @ S @ Phi.T)) / (2 * noise)
    return expected - gaussian_kl(m, S, np.zeros(len(m)), np.eye(len(m)))


def expected_lml(Sigma, f, noise):
    """``E[log N(y | 0, Sigma)]`` under ``y ~ N(f, noise I)`` (spec A.4)."""
    Sigma_inv = np.linalg.inv(Sigma)
    return (-0.5 * len(f) * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(Sigma)[1] - 0.5 * f @ Sigma_inv @ f
            - 0.5 * noise * np.trace(Sigma_inv))


def expected_squared_error(Sigma, f, noise):
    """``E|f - K Sigma^-1 y|^2`` under ``y ~ N(f, noise I)``, ``K = Sigma - noise I`` (spec A.4)."""
    Sigma_inv = np.linalg.inv(Sigma)
    K = Sigma - noise * np.eye(len(f))
    return noise**2 * np.sum((Sigma_inv @ f) ** 2) + noise * np.sum((Sigma_inv @ K) ** 2)


# ---------------------------------------------------------------- harmonic decomposition


def harmonic_weights(order):
    """Real weights from the complex DFT (Sun et al. 2021, Sec. 3.1): ``F[t, s] = exp(-2 pi i t s / T) / T``
    and ``k_t + k_{T-t} = 2 Re k_t`` for the paired frequencies; rows ``0 .. floor(T/2)``."""
    s = np.arange(order)
    F = np.exp(-2j * np.pi * np.outer(s, s) / order) / order
    rows = [F[t] if t == 0 or 2 * t == order else F[t] + F[order - t] for t in range(order // 2 + 1)]
    return np.real(np.array(rows))


def harmonic_covariances(k, elements, W, Z, X):
    """Covariances of ``u_t = sum_s W[t, s] f(G^s Z_t)`` from the joint prior of ``f`` at every orbit
    point: ``K_UU`` ``(T m, T m)`` (dense, off-diagonal blocks included) and ``K_Uf`` ``(T m, N)``.
    ``elements``: the group's maps ``G^s`` as NumPy functions, in the order of W's columns."""
    T, S = W.shape
    m = Z.shape[1]
    P = np.concatenate([G(Z[t]) for t in range(T) for G in elements])  # (T S m, D)
    C = np.zeros((T * m, T * S * m))
    for t in range(T):
        for s in range(S):
            C[t * m:(t + 1) * m, (t * S + s) * m:(t * S + s + 1) * m] = W[t, s] * np.eye(m)
    return C @ k(P, P) @ C.T, C @ k(P, X)


def block_q_predict(KUU, KUf, Kff, q_mu, q_sqrt, jitter, whiten=True):
    """q(f) of an SVGP on inducing variables with prior covariance ``KUU`` (T blocks of m) and
    ``q(u_t) = N(q_mu[t], S_t)`` independent per block (whitened per block by ``chol(K_t)``), with
    dense inverses over the whole ``KUU``: mean ``(N,)``, covariance ``(N, N)`` and the KL."""
    T, m = q_mu.shape
    KUU = KUU + jitter * np.eye(T * m)
    mean_u, S_u, kl = np.zeros(T * m), np.zeros((T * m, T * m)), 0.0
    for t in range(T):
        block = slice(t * m, (t + 1) * m)
        S = covariance(q_sqrt[t])
        L = np.linalg.cholesky(KUU[block, block]) if whiten else np.eye(m)
        mean_u[block], S_u[block, block] = L @ q_mu[t], L @ S @ L.T
        prior = np.eye(m) if whiten else KUU[block, block]
        kl += gaussian_kl(q_mu[t], S, np.zeros(m), prior)
    P = np.linalg.solve(KUU, KUf).T
    return P @ mean_u, Kff - P @ KUf + P @ S_u @ P.T, kl


def harmonic_component_predict(k, elements, W, Z, X, q_mu, q_sqrt, jitter):
    """q(f_t(X)) of each component ``f_t(x) = sum_s W[t, s] f(G^s x)`` (the real projection of the
    harmonic decomposition), from the joint prior of ``f`` at the orbits of ``X`` and of every
    ``Z_t``, conditioned on whitened per-block ``q(u_t)``: means and variances ``(T, N)``."""
    T, S = W.shape
    n, m = len(X), Z.shape[1]
    P = np.concatenate([G(X) for G in elements] + [G(Z[t]) for t in range(T) for G in elements])
    CX, CU = np.zeros((T * n, S * n)), np.zeros((T * m, T * S * m))
    for t in range(T):
        for s in range(S):
            CX[t * n:(t + 1) * n, s * n:(s + 1) * n] = W[t, s] * np.eye(n)
            CU[t * m:(t + 1) * m, (t * S + s) * m:(t * S + s + 1) * m] = W[t, s] * np.eye(m)
    C = np.block([[CX, np.zeros((T * n, CU.shape[1]))], [np.zeros((T * m, CX.shape[1])), CU]])
    K = C @ k(P, P) @ C.T
    KFF, KFU, KUU = K[:T * n, :T * n], K[:T * n, T * n:], K[T * n:, T * n:] + jitter * np.eye(T * m)
    mean_u, S_u = np.zeros(T * m), np.zeros((T * m, T * m))
    for t in range(T):
        block = slice(t * m, (t + 1) * m)
        L = np.linalg.cholesky(KUU[block, block])
        mean_u[block], S_u[block, block] = L @ q_mu[t], L @ covariance(q_sqrt[t]) @ L.T
    P_ = np.linalg.solve(KUU, KFU.T).T
    var = np.diag(KFF - P_ @ KFU.T + P_ @ S_u @ P_.T)
    return (P_ @ mean_u).reshape(T, n), var.reshape(T, n)


def weight_space_negative_elbo(Phi, S, y, noise, mu, C):
    """Evans and Nair (2020) Eq. 2: ``(L_mu + L_Sigma + L_const) / 2`` of the weight-space model
    ``y ~ N(Phi w, noise I)``, ``w ~ N(0, S^-1)``, ``q(w) = N(mu, C C^T)``, written as they print it."""
    n, m = Phi.shape
    L_mu = (-2 * y @ Phi @ mu + np.sum((Phi @ mu) ** 2)) / noise + mu @ S @ mu
    L_sigma = np.sum((Phi @ C) ** 2) / noise + np.trace(S @ C @ C.T) - 2 * np.sum(np.log(np.diag(C)))
    L_const = -np.linalg.slogdet(S)[1] - m + n * np.log(2 * np.pi * noise) + y @ y / noise
    return 0.5 * (L_mu + L_sigma + L_const)


def weight_space_elbo(Phi, S, y, noise, mu, C):
    """The same ELBO as ``E_q log N(y | Phi w, noise I) - KL[q || N(0, S^-1)]``."""
    Sigma = C @ C.T
    ell = -0.5 * len(y) * np.log(2 * np.pi * noise) - 0.5 * (np.sum((y - Phi @ mu) ** 2) + np.trace(Phi @ Sigma @ Phi.T)) / noise
    return ell - gaussian_kl(mu, Sigma, np.zeros(len(mu)), np.linalg.inv(S))
