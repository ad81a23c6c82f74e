"""``fit``'s compiled path: Pyro's captured step (:mod:`pyro_sparsegp.captured`) takes the steps of
the traced path, method by method, in float64 to 1e-8; it is chosen by default for the library's
own objectives over long runs; a replay that is not finite runs traced. NumPyro's step is always
compiled (``compiled=False`` is refused with advice)."""
import numpy as np
import pytest
import torch

from backends import BACKENDS
from test_contract_methods import METHODS, N, build

pyro = pytest.importorskip("pyro")
psg = pytest.importorskip("pyro_sparsegp")
captured = pytest.importorskip("pyro_sparsegp.captured")

STEPS, BATCH = 5, 10  # 24 rows in batches of 10 (fit skips an epoch's last 4): one graph
# the whitened QSGP reads its factor on the host, which no graph can record: it runs traced
# (tests/test_qsgp_whitened.py)
CAPTURED = [method for method in METHODS if method != "qsgp-whitened"]


@pytest.fixture
def replays(monkeypatch):
    """The outcomes of the captured step's calls: True (replayed), False (not finite: traced)."""
    seen = []
    call = captured.CapturedStep.__call__

    def counted(self, batch):
        out = call(self, batch)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(captured.CapturedStep, "__call__", counted)
    return seen


def pyro_fit(build_model, compiled, **options):
    backend = BACKENDS["pyro"]()
    backend.reset()
    model, guide, args = build_model(backend)
    result = psg.fit(model, guide, args, num_steps=STEPS, lr=0.05, progress=False, loss_every=1, seed=3,
                     compiled=compiled, **options)
    return result.losses, {k: backend.numpy(v) for k, v in result.params.items()}


def assert_same_fit(a, b, rtol=1e-8):
    np.testing.assert_allclose(a[0], b[0], rtol=rtol)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        np.testing.assert_allclose(a[1][name], b[1][name], rtol=rtol, atol=1e-10, err_msg=name)


def exact_dbk(backend):
    from test_contract_methods import data

    X, y, _ = data()
    prior = psg.dbk.ExactDBK(psg.dbk.MLP(2, rank=3))
    return prior.model, prior.guide, (backend.array(X), backend.array(y))


def user_model(backend):
    """A user's model around an SVGP component, its plate subsampling 10 of the 24 rows: draws of
    ``f`` and of the rows in every step."""
    from test_contract_methods import data

    X, y, Z = (backend.array(a) for a in data())
    return (*backend.user_model(psg.SVGP(psg.RBF(lengthscale=backend.array([0.8, 1.2])), Z), 0.1), (X, y))


@pytest.mark.parametrize("method", CAPTURED + ["exact-dbk", "user"])
def test_captured_steps_are_the_traced_steps(method, replays):
    """Minibatches, the loss and every parameter after each step: as traced (the same draws
    where the steps draw)."""
    def model(backend):
        if method in ("exact-dbk", "user"):
            return (exact_dbk if method == "exact-dbk" else user_model)(backend)
        return build(backend.lib, backend.array, method)[:3]

    batch = {} if method in ("exact-dbk", "user") else {"batch_size": BATCH}  # all rows: the user's plate subsamples
    traced = pyro_fit(model, False, **batch)
    assert replays == []
    assert_same_fit(pyro_fit(model, True, **batch), traced)
    assert replays == [True] * STEPS


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def launches(monkeypatch):
    """The number of CUDA graph launches so far (a list, one entry per launch)."""
    seen = []
    launch = captured.CudaGraph.__call__
    monkeypatch.setattr(captured.CudaGraph, "__call__", lambda self, *t: seen.append(1) or launch(self, *t))
    return seen


def on_cuda(method):
    def model(backend):
        return build(backend.lib, lambda a: backend.array(a).cuda(), method)[:3]

    return model


@cuda
@pytest.mark.parametrize("method", CAPTURED)
def test_cuda_graph_steps_are_the_traced_steps(method, replays, launches):
    """On a CUDA device every captured step is one CUDA graph launch, with the traced steps' draws
    and values."""
    traced = pyro_fit(on_cuda(method), False, batch_size=BATCH)
    assert_same_fit(pyro_fit(on_cuda(method), True, batch_size=BATCH), traced)
    assert replays == [True] * STEPS and len(launches) == STEPS


def reading_back(backend):
    """An SVGP whose guide also factorises a matrix with ``torch.linalg.cholesky``, which reads its
    error code back to the host: a step that cannot be one CUDA graph."""
    model, guide, args = on_cuda("svgp")(backend)

    def checked_guide(*a):
        torch.linalg.cholesky(torch.eye(2, dtype=torch.float64, device="cuda"))
        return guide(*a)

    return model, checked_guide, args


@cuda
def test_a_step_reading_back_to_the_host_replays_kernel_by_kernel(replays, launches):
    traced = pyro_fit(reading_back, False, batch_size=BATCH)
    with pytest.warns(RuntimeWarning, match="could not be captured as a CUDA graph"):
        assert_same_fit(pyro_fit(reading_back, True, batch_size=BATCH), traced)
    assert replays == [True] * STEPS and launches == []


@cuda
def test_a_failed_capture_leaves_the_generator_working(replays, launches, monkeypatch):
    """Past the warm-up's check (switched off here) the read-back fails while capturing; the
    steps are replayed kernel by kernel and later random draws work as before."""
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    traced = pyro_fit(reading_back, False, batch_size=BATCH)
    with pytest.warns(RuntimeWarning, match="could not be captured as a CUDA graph"):
        assert_same_fit(pyro_fit(reading_back, True, batch_size=BATCH), traced)
    assert replays == [True] * STEPS and launches == []
    assert_same_fit(pyro_fit(on_cuda("svgp"), True, batch_size=BATCH), pyro_fit(on_cuda("svgp"), False, batch_size=BATCH))


def test_captured_steps_in_float32(replays):
    """What users run on GPUs: a float32 SVGP's captured steps are its traced steps."""
    from test_contract_methods import data

    def model(backend):
        X, y, Z = (torch.as_tensor(a, dtype=torch.float32) for a in data())
        gp = psg.GPModel(psg.SVGP(psg.RBF(lengthscale=torch.ones(2)), Z), psg.Gaussian(variance=0.1), num_data=len(X))
        return gp.model, gp.guide, (X, y)

    traced = pyro_fit(model, False, batch_size=BATCH)
    captured_fit = pyro_fit(model, True, batch_size=BATCH)
    assert captured_fit[1]["gp.q_mu"].dtype == np.float32
    assert_same_fit(captured_fit, traced, rtol=1e-6)
    assert replays == [True] * STEPS


@pytest.mark.parametrize("method", ["bernoulli", "harmonic"])
def test_recorded_constants_are_converted_once(method, replays):
    """In float32 the quadrature nodes and the harmonic components' weights are NumPy float64
    arrays made into float32 tensors every step, recorded as a constant and a conversion; the
    replay converts each once (on a GPU the conversion is also the copy to the device, which
    would synchronise every step), and its steps stay the traced ones."""
    def model(backend):
        return build(backend.lib, lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32), method)[:3]

    backend = BACKENDS["pyro"]()
    backend.reset()
    model_, guide, args = model(backend)
    with pyro.poutine.trace(param_only=True) as params:
        pyro.infer.Trace_ELBO().differentiable_loss(model_, guide, *args)
    values = [params.trace.nodes[n]["value"].unconstrained() for n in sorted(params.trace.nodes)]
    graph = captured.CapturedStep(model_, guide, values, {})._record(args)[0].graph

    def source(node):  # what a conversion converts, through the recording's copies
        while node.op == "call_function" and node.target in captured._FRESH:
            node = node.args[0]
        return node

    conversions = [n for n in graph.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert any(n.op == "get_attr" for n in graph.graph.nodes)
    assert not [n for n in conversions if source(n.args[0]).op == "get_attr"]

    traced = pyro_fit(model, False, batch_size=BATCH)
    assert_same_fit(pyro_fit(model, True, batch_size=BATCH), traced, rtol=1e-6)
    assert replays == [True] * STEPS


@pytest.mark.parametrize("which", ["bernoulli", "user"])
def test_captured_loss_and_gradients_are_trace_elbos(which, replays):
    """At parameters moved off their initial values, the replayed loss and gradients are those of
    ``Trace_ELBO`` (same draws: same seed), to 1e-10: a GPModel, and a user's model whose
    likelihood reads the guide's draw of ``f`` (the model replays the guide's sites)."""
    backend = BACKENDS["pyro"]()
    backend.reset()
    model, guide, (X, y) = build(backend.lib, backend.array, "bernoulli")[:3]
    if which == "user":
        gp = psg.SVGP(psg.RBF(lengthscale=backend.array([0.8, 1.2])), X[:5].clone())
        model, guide = backend.user_model(gp, 0.1, subsample_size=None)
    with pyro.poutine.trace(param_only=True) as params:
        pyro.infer.Trace_ELBO().differentiable_loss(model, guide, X, y)
    values = [params.trace.nodes[n]["value"].unconstrained() for n in sorted(params.trace.nodes)]
    with torch.no_grad():
        for i, v in enumerate(values):
            v.add_(0.05 * (i + 1))
    step = captured.CapturedStep(model, guide, values, {})
    for seed, rows in ((0, N), (1, N), (2, 10), (3, N)):  # a graph for each shape of the batch
        pyro.set_rng_seed(seed)
        loss, grads = step((X[:rows], y[:rows]))
        pyro.set_rng_seed(seed)
        expected = pyro.infer.Trace_ELBO().differentiable_loss(model, guide, X[:rows], y[:rows])
        expected_grads = torch.autograd.grad(expected, values, allow_unused=True)
        assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-10)
        for g, e in zip(grads, expected_grads):
            assert (g is None) == (e is None)
            if g is not None:
                np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)


def test_a_factorisation_needing_more_jitter_runs_traced(replays):
    """Inducing inputs that coincide: the recorded Cholesky (no escalation) fails, the step runs
    traced (which escalates the jitter), and the fit is the traced one. (Round-off in their
    gradients moves the inputs apart, so later steps may factorise without jitter and replay.)"""
    def model(backend):
        X, y = np.linspace(-2, 2, 24)[:, None], np.sin(np.linspace(-2, 2, 24))
        Z = np.zeros((6, 1))  # Kuu = variance * ones: only the escalated jitter factorises it
        gp = psg.GPModel(psg.SVGP(psg.RBF(), backend.array(Z), jitter=0.0), psg.Gaussian(), num_data=24)
        return gp.model, gp.guide, (backend.array(X), backend.array(y))

    traced = pyro_fit(model, False)
    assert_same_fit(pyro_fit(model, True), traced)
    assert replays and not replays[0]


def test_the_default_captures_library_objectives_over_long_runs(replays, monkeypatch):
    monkeypatch.setattr(captured, "MIN_STEPS", 8)  # the test's runs short, the rule the same
    backend = BACKENDS["pyro"]()
    backend.reset()
    model, guide, args = build(backend.lib, backend.array, "svgp")[:3]
    psg.fit(model, guide, args, num_steps=captured.MIN_STEPS, batch_size=BATCH, progress=False)
    assert len(replays) == captured.MIN_STEPS and all(replays)
    replays.clear()
    psg.fit(model, guide, args, num_steps=3, progress=False)  # a short run: recording would not pay
    psg.fit(model, guide, args, num_steps=captured.MIN_STEPS, progress=False, loss=pyro.infer.TraceMeanField_ELBO())
    psg.fit(lambda *a: model(*a), guide, args, num_steps=captured.MIN_STEPS, progress=False)  # a user's model
    assert replays == []
    for method in METHODS:  # every objective's pair is captured by default
        assert captured.automatic(*build(backend.lib, backend.array, method)[:2], None), method
    assert captured.automatic(*exact_dbk(backend)[:2], None)


def test_explicit_requests():
    backend = BACKENDS["pyro"]()
    backend.reset()
    model, guide, args = build(backend.lib, backend.array, "svgp")[:3]
    with pytest.raises(ValueError, match="compiled=True.*Trace_ELBO"):
        psg.fit(model, guide, args, num_steps=2, progress=False, compiled=True, loss=pyro.infer.TraceMeanField_ELBO())

    def guide_with_a_discrete_site(*a):
        guide(*a)
        pyro.sample("k", pyro.distributions.Categorical(logits=torch.zeros(3, dtype=torch.float64)))

    def model_with_it(*a):
        model(*a)
        pyro.sample("k", pyro.distributions.Categorical(logits=torch.zeros(3, dtype=torch.float64)))

    with pytest.warns(RuntimeWarning, match="could not be captured.*not reparameterised"):
        result = psg.fit(model_with_it, guide_with_a_discrete_site, args, num_steps=2, progress=False, compiled=True)
    assert np.isfinite(result.losses).all()


def test_numpyro_always_compiles():
    backend = BACKENDS["numpyro"]()
    backend.reset()
    model, guide, args = build(backend.lib, backend.array, "svgp")[:3]
    with pytest.raises(ValueError, match="compiled=False.*jax.disable_jit"):
        backend.lib.fit(model, guide, args, num_steps=1, progress=False, compiled=False)
