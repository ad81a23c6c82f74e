"""Cox-process likelihoods against the dense float64 reference with exact integration: the ELBO
(1-D and 2-D, every window form), unbiasedness of the randomised integral, convergence of the
binned form, recovery of a known intensity, intensity bands, simulation, ArviZ export, parity
and bad input."""
import itertools
import math

import jax
import numpy as np
import pytest
import reference as ref
from arviz_versions import loo
from backends import NumPyroBackend, PyroBackend
from scipy import stats

from sparsegp_common.objectives import windows

KERN = ("rbf", [2.0], 1.2)
LOW, HIGH, OFFSET = 0.0, 10.0, math.log(3.0)


def problem(rng, M=7, n=25):
    Z = np.linspace(LOW, HIGH, M)[:, None]
    q_mu = rng.normal(size=M) * 0.5
    q_sqrt = np.tril(rng.normal(size=(M, M)) * 0.1, -1) + np.diag(rng.uniform(0.3, 0.8, M))
    events = np.sort(rng.uniform(LOW, HIGH, (n, 1)), axis=0)
    return Z, q_mu, q_sqrt, events


def cox(backend, rng, integration=None, window=(LOW, HIGH), whiten=True, **options):
    """A Cox process on the problem, with ``integration`` or Gauss-Legendre (64 nodes: the
    reference's exact integral to 1e-9)."""
    integration = backend.lib.GaussLegendre(64) if integration is None else integration
    Z, q_mu, q_sqrt, events = problem(rng)
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=whiten)
    model = backend.lib.CoxProcess(gp, windows.Interval(*window), integration=integration, offset=OFFSET, **options)
    svgp_ref = ref.SVGPRef(KERN[0], KERN[1], KERN[2], Z, q_mu, q_sqrt, whiten, jitter=1e-6)
    return model, backend.array(events), svgp_ref, events


def elbo(backend, model, events, seed=0):
    if backend.name == "numpyro":
        return float(model.elbo(events, key=jax.random.PRNGKey(seed)))
    import torch

    torch.manual_seed(seed)
    return float(model.elbo(events))


@pytest.mark.parametrize("whiten", [True, False])
def test_elbo_matches_exact_integration(backend, rng, whiten):
    model, events, svgp_ref, events_np = cox(backend, rng, whiten=whiten)
    expected = ref.cox_elbo(svgp_ref, events_np, [(LOW, HIGH)], OFFSET)
    assert elbo(backend, model, events) == pytest.approx(expected, rel=1e-9)
    assert -backend.loss(model.model, model.guide, events) == pytest.approx(expected, rel=1e-9)
    assert -backend.loss(model.model, model.guide, events, mean_field=True) == pytest.approx(expected, rel=1e-9)


def test_elbo_2d_rectangle_and_user_rule(backend):
    rng = np.random.default_rng(3)
    Z, events = rng.uniform(0, 1, (6, 2)), rng.uniform(0, 1, (15, 2)) * [1, 2] + [0, -1]
    q_mu, q_sqrt = rng.normal(size=6) * 0.5, np.diag(rng.uniform(0.3, 0.8, 6))
    kern = ("rbf", [0.5, 0.7], 1.0)
    gp = backend.svgp(Z, kern, q_mu, q_sqrt)
    bounds = [(0.0, 1.0), (-1.0, 1.0)]
    expected = ref.cox_elbo(ref.SVGPRef("rbf", kern[1], 1.0, Z, q_mu, q_sqrt, jitter=1e-6), events, bounds, 1.5)
    model = backend.lib.CoxProcess(gp, bounds, integration=backend.lib.GaussLegendre((24, 32)), offset=1.5)
    assert elbo(backend, model, backend.array(events)) == pytest.approx(expected, rel=1e-9)
    layout = windows.GaussLegendre(32).layout(windows.Rectangle(bounds))
    user = windows.UserRule(layout.points, layout.weights)
    model = backend.lib.CoxProcess(gp, user, offset=1.5)
    assert elbo(backend, model, backend.array(events)) == pytest.approx(expected, rel=1e-9)


def test_callable_offset(backend, rng):
    """A covariate offset(X) enters the events' terms and the integrand."""
    model, events, svgp_ref, events_np = cox(backend, rng)
    model.offset = lambda X: 0.1 * X[:, 0]
    mean, _ = svgp_ref.predict(events_np)
    nodes, weights = np.polynomial.legendre.leggauss(200)
    x = (nodes + 1) * 5.0
    integral = 5.0 * weights @ ref.cox_intensity_mean(svgp_ref, x[:, None], 0.1 * x)
    expected = (mean + 0.1 * events_np[:, 0]).sum() - integral - svgp_ref.kl()
    assert elbo(backend, model, events) == pytest.approx(expected, rel=1e-9)


def test_stratified_monte_carlo_is_unbiased(backend, rng):
    """z-test over independent seeds: the randomised integral (few cells, so the noise is visible),
    with integration points and events subsampled, averages to the exact ELBO."""
    model, events, svgp_ref, events_np = cox(backend, rng, backend.lib.StratifiedMC(6), integration_batch=4)
    exact = ref.cox_elbo(svgp_ref, events_np, [(LOW, HIGH)], OFFSET)
    losses = backend.losses(model.model, model.guide, events, replicates=300, subsample_size=10)
    se = losses.std(ddof=1) / math.sqrt(len(losses))
    assert losses.std() > 0.05  # the estimator is random ...
    assert abs(-losses.mean() - exact) < 4 * se  # ... and unbiased
    # without the event subsampling and point subsampling, the plain stratified estimate
    model.integration_batch = None
    draws = np.array([elbo(backend, model, events, seed=s) for s in range(200)])
    assert abs(draws.mean() - exact) < 4 * draws.std(ddof=1) / math.sqrt(len(draws))


def test_binned_matches_reference_and_converges(backend, rng):
    model, events, svgp_ref, events_np = cox(backend, rng)
    continuous = elbo(backend, model, events)
    gaps = []
    for bins in (10, 40, 160, 640):
        binned = backend.lib.CoxProcess(model.prior, windows.Interval(LOW, HIGH), backend.lib.Binned(bins), offset=OFFSET)
        value = elbo(backend, binned, events)
        assert value == pytest.approx(ref.cox_binned_elbo(svgp_ref, events_np, LOW, HIGH, bins, OFFSET), rel=1e-9)
        cell = (HIGH - LOW) / bins
        gaps.append(abs(value - len(events_np) * math.log(cell) - continuous))  # counts vs density of locations
    assert all(a > b for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[-1] < 0.01 * gaps[0] and gaps[-1] < 0.02


def test_binned_cells_subsampled_are_unbiased(backend, rng):
    """3 of 10 cells a step (``integration_batch``): over 300 seeds the binned ELBO averages to the
    one over every cell (z-test)."""
    model, events, svgp_ref, events_np = cox(backend, rng)
    binned = backend.lib.CoxProcess(model.prior, windows.Interval(LOW, HIGH), backend.lib.Binned(10), offset=OFFSET,
                                    integration_batch=3)
    exact = ref.cox_binned_elbo(svgp_ref, events_np, LOW, HIGH, 10, OFFSET)
    draws = np.array([elbo(backend, binned, events, seed=s) for s in range(300)])
    assert draws.std() > 0.05 * abs(exact)  # the cells drawn matter ...
    assert abs(draws.mean() - exact) < 4 * draws.std(ddof=1) / math.sqrt(len(draws))  # ... and the mean is exact


def true_log_intensity(x):
    return 1.0 + 1.2 * np.sin(x / 1.6)


@pytest.mark.slow
@pytest.mark.parametrize("integration", ["quadrature", "stratified"])
def test_recovers_a_known_intensity(backend, integration):
    """Events simulated from a known intensity (37 on [0, 10]); the posterior mean intensity is
    within 20% of the truth in integrated absolute error."""
    rng = np.random.default_rng(7)
    events_np = ref.simulate_poisson_process(true_log_intensity, LOW, HIGH, 2.2, rng)
    gp = backend.svgp(np.linspace(LOW, HIGH, 12)[:, None], ("rbf", [1.5], 1.0))
    rule = backend.lib.GaussLegendre(64) if integration == "quadrature" else backend.lib.StratifiedMC(64)
    offset = math.log(len(events_np) / (HIGH - LOW))
    model = backend.lib.CoxProcess(gp, [[LOW, HIGH]], integration=rule, offset=offset)
    result = backend.lib.fit(model.model, model.guide, (backend.array(events_np),), num_steps=600, lr=0.03, progress=False)
    nodes, weights = np.polynomial.legendre.leggauss(200)
    x = (nodes + 1) * (HIGH - LOW) / 2 + LOW
    mean = backend.numpy(model.intensity(backend.array(x[:, None]), params=result.params).mean)
    truth = np.exp(true_log_intensity(x))
    error = (HIGH - LOW) / 2 * weights @ np.abs(mean - truth) / ((HIGH - LOW) / 2 * weights @ truth)
    assert error < 0.2, error


def test_intensity_bands_and_simulation(backend, rng):
    model, _, svgp_ref, _ = cox(backend, rng)
    X = np.linspace(LOW, HIGH, 9)[:, None]
    pred = model.intensity(backend.array(X), quantiles=(0.05, 0.5, 0.95))
    mean, cov = svgp_ref.predict(X)
    m, s = mean + OFFSET, np.sqrt(np.diag(cov))
    np.testing.assert_allclose(backend.numpy(pred.mean), np.exp(m + s**2 / 2), rtol=1e-9)
    np.testing.assert_allclose(backend.numpy(pred.variance), stats.lognorm.var(s, scale=np.exp(m)), rtol=1e-8)
    expected_q = [stats.lognorm.ppf(q, s, scale=np.exp(m)) for q in (0.05, 0.5, 0.95)]
    np.testing.assert_allclose(backend.numpy(pred.quantiles), expected_q, rtol=1e-8)

    # simulated patterns: inside the window, their mean count is int E_q[lambda] (z-test)
    patterns = [backend.numpy(p) for p in model.simulate(num_samples=150, seed=1)]
    counts = np.array([len(p) for p in patterns])
    assert all(((p >= LOW) & (p <= HIGH)).all() for p in patterns)
    expected = ref.cox_elbo(svgp_ref, np.zeros((0, 1)), [(LOW, HIGH)], OFFSET) + svgp_ref.kl()
    assert abs(counts.mean() + expected) < 4 * counts.std(ddof=1) / math.sqrt(len(counts))


@pytest.mark.parametrize("binned", [False, True])
def test_arviz_export_and_loo(backend, binned):
    rng = np.random.default_rng(5)
    model, events, _, events_np = cox(backend, rng, backend.lib.Binned(20) if binned else None)
    result = backend.lib.fit(model.model, model.guide, (events,), num_steps=100, lr=0.03, progress=False)
    idata = backend.lib.to_inference_data(model, data=(events,), num_samples=200, result=result)
    n = len(events_np)
    if binned:
        assert idata.log_likelihood["events.counts"].shape == (4, 50, 20)
        assert idata.observed_data["events.counts"].values.sum() == n
        assert loo(idata)[0] == 20
        return
    log_lik = idata.log_likelihood["events.x"]
    assert log_lik.dims == ("chain", "draw", "events")
    np.testing.assert_array_equal(idata.observed_data["events.x"].values, events_np)
    # per event: f(x_i) + offset - Lambda / n, with Lambda = sum_j w_j exp(f(p_j) + offset)
    f = idata.posterior["gp.f"].values
    layout = model.layout
    integral = np.exp(f[..., n:] + OFFSET) @ layout.weights
    np.testing.assert_allclose(log_lik.values, f[..., :n] + OFFSET - integral[..., None] / n, rtol=1e-10)
    draws = idata.posterior_predictive["events.x"].values
    assert draws.shape == (4, 50, n, 1) and ((draws >= LOW) & (draws <= HIGH)).all()
    count, elpd = loo(idata)
    assert np.isfinite(elpd) and count == n


def test_sampled_model_integrates_at_the_cells_midpoints(backend):
    """The export's sampled model takes a random rule's cells at their midpoints: with ``f`` the
    linear mean up to a kernel variance of 1e-10, ``f`` at its integration sites is that mean there."""
    lib = backend.lib
    gp = lib.SVGP(backend.kernel("rbf", [2.0], 1e-10), backend.array(np.linspace(LOW, HIGH, 5)[:, None]),
                  mean_function=lib.Linear(backend.array([0.3]), bias=-1.0))
    model = lib.CoxProcess(gp, windows.Interval(LOW, HIGH), integration=lib.StratifiedMC(8))
    idata = lib.to_inference_data(model, data=(backend.array([[1.0], [4.0], [7.5]]),),
                                  num_samples=4, num_chains=2)
    f = idata.posterior["gp.f"].values  # (chain, draw, 3 events + 8 cells)
    midpoints = LOW + (np.arange(8) + 0.5) * (HIGH - LOW) / 8
    np.testing.assert_allclose(f[..., 3:], np.broadcast_to(-1.0 + 0.3 * midpoints, f[..., 3:].shape), atol=1e-4)


RULES = {
    "gauss_legendre": lambda lib: lib.GaussLegendre(40),
    "binned": lambda lib: lib.Binned(30),
    "default": lambda lib: None,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_parity(rule):
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        model, events, *_ = cox(backend, np.random.default_rng(11), RULES[rule](backend.lib))
        pred = model.intensity(backend.array(np.linspace(LOW, HIGH, 7)[:, None]))
        values = [elbo(backend, model, events), -backend.loss(model.model, model.guide, events)]
        results.append(values + [backend.numpy(a) for a in pred])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)


def test_minibatched_events_are_scaled(backend, rng):
    """External minibatches with num_events: the loss of a batch, averaged over a partition of the
    events, equals the full-batch loss."""
    model, events, _, events_np = cox(backend, rng)
    full = elbo(backend, model, events)
    model.num_events = len(events_np)
    parts = [-backend.loss(model.model, model.guide, backend.array(events_np[i::5])) for i in range(5)]
    assert np.mean(parts) == pytest.approx(full, rel=1e-10)


def test_bad_input(backend, rng):
    model, events, _, events_np = cox(backend, rng)
    lib, Interval = backend.lib, windows.Interval
    with pytest.raises(ValueError, match="outside the window"):
        model.elbo(backend.array(np.vstack([events_np, [[11.0]]])))
    with pytest.raises(ValueError, match="events is empty"):
        model.elbo(backend.array(np.zeros((0, 1))))
    with pytest.raises(ValueError, match="events contains NaN or inf"):
        model.elbo(backend.array(np.vstack([events_np, [[np.nan]]])))
    with pytest.raises(ValueError, match="events has 2 input dimensions"):
        model.elbo(backend.array(np.zeros((3, 2))))
    with pytest.raises(ValueError, match="zero size"):
        Interval(1.0, 1.0)
    with pytest.raises(ValueError, match="zero size"):
        windows.Rectangle([[0, 1], [2, 2]])
    with pytest.raises(ValueError, match="zero size"):
        windows.UserRule([[0.0], [1.0]], [0.0, 0.0])
    with pytest.raises(ValueError, match="NaN or inf"):
        windows.Rectangle([[0, np.inf]])
    with pytest.raises(ValueError, match="shape"):
        windows.Rectangle([[0, 1, 2]])
    with pytest.raises(ValueError, match="num_points must be a positive integer"):
        lib.GaussLegendre(0)
    with pytest.raises(ValueError, match="one count per dimension"):
        lib.CoxProcess(model.prior, [[0, 1]], integration=lib.StratifiedMC((4, 4)))
    gp = model.prior
    with pytest.raises(ValueError, match="window is 2-D"):
        lib.CoxProcess(gp, [[0, 1], [0, 1]])
    with pytest.raises(TypeError, match="prior must be a GPPrior"):
        lib.CoxProcess("gp", [[0, 1]])
    with pytest.raises(TypeError, match="integration must be"):
        lib.CoxProcess(gp, [[0, 1]], integration="gauss")
    with pytest.raises(ValueError, match="its own integration rule"):
        lib.CoxProcess(gp, windows.UserRule([[0.5]], [1.0]), integration=lib.GaussLegendre(4))
    with pytest.raises(TypeError, match="needs a Rectangle"):
        lib.GaussLegendre(4).layout(windows.UserRule([[0.5]], [1.0]))
    with pytest.raises(TypeError, match="offset"):
        lib.CoxProcess(gp, [[0, 1]], offset="log")
    with pytest.raises(ValueError, match="integration_batch"):
        lib.CoxProcess(gp, [[0, 1]], integration=lib.GaussLegendre(8), integration_batch=9)
    with pytest.raises(ValueError, match="num_events"):
        lib.CoxProcess(gp, [[0, 10]], num_events=3).elbo(events)
    binned = lib.CoxProcess(gp, [[0, 10]], integration=lib.Binned(10))
    with pytest.raises(ValueError, match="subsample_size must be None"):
        backend.loss(binned.model, binned.guide, events, subsample_size=5)
    with pytest.raises(ValueError, match="num_latent"):
        lib.CoxProcess(backend.svgp(np.zeros((3, 1)), num_latent=2), [[0, 1]])
    if backend.name == "numpyro":
        with pytest.raises(ValueError, match="key"):
            lib.CoxProcess(gp, [[0, 10]], integration=lib.StratifiedMC(8)).elbo(events)


class DecoupledRef:
    """Dense moments and KL of a decoupled posterior, in the interface ``ref.cox_elbo`` reads."""

    def __init__(self, Za, Zb, a, L):
        self.k = lambda A, B: ref.kernel(KERN[0], A, B, KERN[1], KERN[2])  # noqa: E731
        self.Za, self.Zb, self.a, self.B = Za, Zb, a, L @ L.T

    def predict(self, X):
        k = self.k
        return ref.decoupled_predict(k(X, self.Za), self.a, k(X, self.Zb), self.B, k(self.Zb, self.Zb), k(X, X))

    def kl(self):
        return ref.decoupled_kl_R(self.a, self.k(self.Za, self.Za), self.B, self.k(self.Zb, self.Zb))


@pytest.mark.parametrize("integration", ["quadrature", "binned"])
def test_works_with_decoupled_prior(backend, rng, integration):
    """The same likelihood with a second prior (decoupled bases): ELBO against the dense reference."""
    Za, Zb = np.linspace(LOW, HIGH, 12)[:, None], np.linspace(LOW, HIGH, 4)[:, None]
    a = rng.normal(size=12) * 0.3
    L = np.tril(rng.normal(size=(4, 4)) * 0.1, -1) + np.diag(rng.uniform(0.3, 0.8, 4))
    events = np.sort(rng.uniform(LOW, HIGH, (25, 1)), axis=0)
    gp = backend.lib.DecoupledGP(backend.kernel(*KERN), backend.array(Za), backend.array(Zb), parametrization="direct")
    gp = backend.set(gp, a=a, L=L)
    rule = windows.Binned(64) if integration == "binned" else windows.GaussLegendre(64)
    model = backend.lib.CoxProcess(gp, windows.Interval(LOW, HIGH), integration=rule, offset=OFFSET)
    dense = DecoupledRef(Za, Zb, a, L)
    if integration == "binned":
        expected = ref.cox_binned_elbo(dense, events, LOW, HIGH, 64, OFFSET)
    else:
        expected = ref.cox_elbo(dense, events, [(LOW, HIGH)], OFFSET)
    assert elbo(backend, model, backend.array(events)) == pytest.approx(expected, rel=1e-9)
    assert -backend.loss(model.model, model.guide, backend.array(events)) == pytest.approx(expected, rel=1e-9)


def short_lengthscale_process(backend, integration=None, lengthscale=0.05):
    """A posterior with narrow bumps (lengthscale 0.05, 40 inducing points on [0, 10]): finer
    than the 64-node rules' spacing of 0.16-0.25."""
    rng = np.random.default_rng(11)
    Z = np.linspace(LOW, HIGH, 40)[:, None]
    q_mu, q_sqrt = rng.normal(size=40) * 1.5, np.diag(rng.uniform(0.1, 0.3, 40))
    kern = ("rbf", [lengthscale], 1.0)
    gp = backend.svgp(Z, kern, q_mu, q_sqrt)
    model = backend.lib.CoxProcess(gp, windows.Interval(LOW, HIGH), integration=integration, offset=OFFSET)
    events = np.sort(rng.uniform(LOW, HIGH, (25, 1)), axis=0)
    return model, events, ref.SVGPRef(*kern, Z, q_mu, q_sqrt, jitter=1e-6)


def exact_elbo_by_panels(svgp_ref, events, panels=400, nodes=16):
    """The ELBO with the integral by composite Gauss-Legendre (400 panels of 16 nodes)."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    edges = np.linspace(LOW, HIGH, panels + 1)
    half = np.diff(edges)[:, None] / 2
    points = (edges[:-1, None] + half * (x + 1)).ravel()
    integral = (half * w).ravel() @ ref.cox_intensity_mean(svgp_ref, points[:, None], OFFSET)
    return (svgp_ref.predict(events)[0] + OFFSET).sum() - integral - svgp_ref.kl()


def test_default_rule_is_randomised_and_unbiased_below_the_node_spacing(backend):
    """The default rule draws fresh stratified nodes at every evaluation: a z-test over 300
    seeds against the exact ELBO, for bumps narrower than fixed nodes could resolve; the
    64-node Gauss-Legendre rule on the same posterior is off by many standard errors."""
    model, events, svgp_ref = short_lengthscale_process(backend)
    assert isinstance(model.rule, windows.StratifiedMC) and model.rule.num_points == 64
    exact = exact_elbo_by_panels(svgp_ref, events)
    draws = np.array([elbo(backend, model, backend.array(events), seed=s) for s in range(300)])
    se = draws.std(ddof=1) / math.sqrt(len(draws))
    z = (draws.mean() - exact) / se
    assert abs(z) < 4, z
    fixed = backend.lib.CoxProcess(model.prior, windows.Interval(LOW, HIGH), backend.lib.GaussLegendre(64), offset=OFFSET)
    assert abs(elbo(backend, fixed, backend.array(events)) - exact) > 10 * se


def test_fixed_rule_warns_once_when_a_lengthscale_falls_below_its_spacing(backend):
    import warnings

    model, events, _ = short_lengthscale_process(backend, backend.lib.GaussLegendre(64))
    events = backend.array(events)
    with pytest.warns(UserWarning, match=r"lengthscale of the kernel \(\[0.05\]\) fell below the spacing"):
        backend.loss(model.model, model.guide, events)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.loss(model.model, model.guide, events)  # once per process
        default, _, _ = short_lengthscale_process(backend)
        backend.loss(default.model, default.guide, events)  # randomised: nothing to warn about
        coarse_ok, _, _ = short_lengthscale_process(backend, backend.lib.GaussLegendre(64), lengthscale=1.0)
        backend.loss(coarse_ok.model, coarse_ok.guide, events)
