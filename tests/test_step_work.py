"""The work of one SVI step, counted: a whitened SVGP factorises ``Kuu`` once per step (in the
guide; the model scores ``u`` under ``N(0, I)`` and needs no factor), in a user's model as in
``GPModel``; unwhitened, the model's prior and KL need it too. Building a whitened SVGP computes
no ``Kuu`` (NumPyro traces its shape)."""
import numpy as np
import pytest

from sparsegp_common.ops import backend as operations


@pytest.fixture
def factorisations(backend, monkeypatch):
    """The number of Cholesky factorisations of the library's ``linalg.cholesky`` so far."""
    ops = operations(backend.array(np.zeros(1)))
    calls = []
    original = ops.cholesky

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(ops, "cholesky", counted)
    return calls


def loss_call(backend, model, guide, args):
    """A call without arguments of ``model``/``guide``'s ``Trace_ELBO`` loss (Pyro: eager;
    NumPyro: traced), its parameters created."""
    if backend.name == "pyro":
        import pyro

        def loss():
            return pyro.infer.Trace_ELBO().differentiable_loss(model, guide, *args)

        loss()
        return loss
    import jax
    import numpyro

    elbo = numpyro.infer.Trace_ELBO()
    svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.01), elbo)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), *args))
    # traced, as SVI's compiled step runs it (eager calls run the formulas as cached programs)
    return lambda: jax.make_jaxpr(lambda params: elbo.loss(jax.random.PRNGKey(1), params, model, guide, *args))(params)


@pytest.mark.parametrize("whiten, expected", [(True, 1), (False, 2)])
def test_a_step_factorises_kuu_once_when_whitened(backend, factorisations, whiten, expected):
    """One loss (model and guide): the user's model factorises as often as ``expected``;
    ``GPModel``, which reads the prior once for both, once either way."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(-2, 2, (30, 1)), rng.standard_normal(30)
    args = backend.array(X), backend.array(y)
    backend.reset()
    gp = backend.svgp(X[:6].copy(), whiten=whiten)
    gp_model = backend.lib.GPModel(gp, backend.lib.Gaussian(variance=0.1))
    for (model, guide), count in ((backend.user_model(gp, 0.1), expected), ((gp_model.model, gp_model.guide), 1)):
        loss = loss_call(backend, model, guide, args)
        factorisations.clear()
        loss()
        assert len(factorisations) == count


def _products(backend, loss, M, N):
    """The ``(M x M x M, M x M x N)`` matrix products of a loss and its gradient, by their
    operands' last two axes (Pyro: aten ``mm`` / ``bmm`` calls seen by the profiler; NumPyro:
    ``dot_general`` equations of the gradient's jaxpr)."""
    if backend.name == "pyro":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss().backward()
        shapes = [e.input_shapes[:2] for e in prof.events()
                  if e.name in ("aten::mm", "aten::bmm") and len(e.input_shapes) >= 2]
    else:
        shapes = [[v.aval.shape for v in eqn.invars] for eqn in _equations(loss().jaxpr)
                  if eqn.primitive.name == "dot_general"]
    dims = [sorted(list(a[-2:]) + list(b[-2:])) for a, b in shapes if len(a) >= 2 and len(b) >= 2]
    return dims.count([M] * 4), dims.count([M, M, M, N]) + dims.count([M, M, N, N])


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _equations(getattr(inner, "jaxpr", inner))


@pytest.mark.parametrize("N, cubic, by_N", [(10, 0, 4), (30, None, 2)])
def test_the_products_of_a_whitened_step(backend, N, cubic, by_N):
    """``GPModel``'s whitened loss and gradient at ``M = 7``: with few points (``N < 1.5 M``) the
    gradient of ``Kuu`` comes from ``cholesky_and_solve`` without the ``L^T L_bar`` product of
    differentiating the factorisation and the solve one after the other (no ``M x M x M``
    product; one was there before), and q(f) takes four ``M x M x N`` products; with more
    points, ``whitened_moments`` takes two, and three of ``M x M x M``."""
    M = 7
    rng = np.random.default_rng(0)
    X, y = rng.uniform(-2, 2, (N, 1)), rng.standard_normal(N)
    args = backend.array(X), backend.array(y)
    backend.reset()
    gp_model = backend.lib.GPModel(backend.svgp(X[:M].copy()), backend.lib.Gaussian(variance=0.1))
    if backend.name == "pyro":
        import pyro

        def loss():
            return pyro.infer.Trace_ELBO().differentiable_loss(gp_model.model, gp_model.guide, *args)

        loss()
    else:
        import jax
        import numpyro

        elbo = numpyro.infer.Trace_ELBO()
        svi = numpyro.infer.SVI(gp_model.model, gp_model.guide, numpyro.optim.Adam(0.01), elbo)
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), *args))

        def loss():
            return jax.make_jaxpr(jax.grad(lambda p: elbo.loss(jax.random.PRNGKey(1), p, gp_model.model,
                                                                gp_model.guide, *args)))(params)

    found_cubic, found_by_N = _products(backend, loss, M, N)
    assert found_by_N == by_N
    assert found_cubic == (cubic if cubic is not None else 3)


def test_building_a_whitened_svgp_computes_no_kuu(backend, monkeypatch):
    """A whitened SVGP's construction needs only ``Kuu``'s batch shape: NumPyro traces it (no
    kernel matrix computed, so nothing compiled before the first step), and a batch shape that
    does not fit q(u) is still refused there."""
    lib, calls = backend.lib, []
    kernel = backend.kernel("rbf", [0.8], 1.3)
    K_at = type(kernel).K_at

    def spied(self, X, *args):
        K = K_at(self, X, *args)
        calls.append(operations(K).is_concrete(K))
        return K

    monkeypatch.setattr(type(kernel), "K_at", spied)
    lib.SVGP(kernel, backend.array(np.linspace(-1, 1, 5)[:, None]))
    assert calls and all(calls) == (backend.name == "pyro")  # NumPyro: traced only
    batched = backend.kernel("rbf", [0.8], 1.3)
    backend.set(batched, variance=np.ones(3))
    with pytest.raises(ValueError, match="Kuu has batch shape"):
        lib.SVGP(batched, backend.array(np.linspace(-1, 1, 5)[:, None]), num_latent=2)


def test_numpyro_eager_formulas_compile_once_committed_or_not(caplog):
    """An eager call of the library's formulas runs as one cached compiled program; arrays
    committed to their device or not (rows drawn with a committed key in ``SVI.init``, with an
    uncommitted one later) share it."""
    import logging

    import jax
    import jax.numpy as jnp

    from numpyro_sparsegp.compiled import compiled

    def cross(a, b):
        return a @ b.T + 1.0

    free = jnp.ones((3, 2)) * 2.0
    committed = jax.device_put(free, jax.devices()[0])
    assert committed.committed and not free.committed
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        values = [compiled(cross, a, b) for a, b in ((free, free), (committed, committed), (free, committed))]
    assert sum(r.getMessage().startswith("Compiling jit(<lambda>)") for r in caplog.records) == 1
    for value in values:
        np.testing.assert_allclose(np.asarray(value), 9.0)


def test_numpyro_eager_formulas_that_read_values_run_eagerly():
    """A user's kernel that reads a value to decide (a Python ``if`` on an array) cannot be
    compiled: the component's eager formulas then run eagerly, as before, with the same result."""
    import jax.numpy as jnp
    from numpyro import handlers

    import numpyro_sparsegp as nsg

    class Checked(nsg.RBF):
        def K(self, X, Z=None):
            if float(self.variance) <= 0:  # concrete values only
                raise ValueError("variance")
            return super().K(X, Z)

    X, Z = jnp.linspace(-2.0, 2.0, 12)[:, None], jnp.linspace(-2.0, 2.0, 4)[:, None]
    draws = [handlers.seed(nsg.SVGP(kernel, Z).guide, 0)(X) for kernel in (Checked(), nsg.RBF())]
    np.testing.assert_allclose(np.asarray(draws[0]), np.asarray(draws[1]), rtol=1e-6)


@pytest.mark.parametrize("diagonal", [False, True])
def test_initial_q_is_built_on_the_host(backend, diagonal, caplog):
    """q(u)'s initial tables at the prior are built in NumPy and converted once: eager JAX would
    compile a program per operation (about 0.3 s of an SVGP component's construction). The
    values, dtype and (torch) ownership are those of the prior."""
    import logging

    from sparsegp_common.ops import namespace
    from sparsegp_common.variational import CholeskyGaussian, DiagonalGaussian

    family = DiagonalGaussian if diagonal else CholeskyGaussian
    like = backend.array(np.ones(2))
    namespace(like)  # array_api_compat's own first look at JAX compiles once per process
    if backend.name == "numpyro":
        import jax

        with jax.log_compiles(), caplog.at_level(logging.WARNING):
            q_mu, q_sqrt = family.initial(37, (3,), like)
        assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling")] == []
    else:
        q_mu, q_sqrt = family.initial(37, (3,), like)
        assert not q_sqrt.requires_grad and q_sqrt.untyped_storage().data_ptr() != q_mu.untyped_storage().data_ptr()
    assert q_mu.dtype == like.dtype == q_sqrt.dtype
    np.testing.assert_array_equal(backend.numpy(q_mu), np.zeros((3, 37)))
    np.testing.assert_array_equal(backend.numpy(q_sqrt), np.ones((3, 37)) if diagonal else np.broadcast_to(np.eye(37), (3, 37, 37)))
