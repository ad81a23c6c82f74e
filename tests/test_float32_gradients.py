"""float32 gradients at coincident and near-coincident points, eager and under ``jax.jit``.

Inducing inputs start at data points; there the stationary kernels' distance ``r`` is at
round-off level and ``dr/dr2 = 1 / (2 r)`` used to turn that round-off into gradients of 1e6 to
1e12 times too large in compiled float32 code with 1-D inputs (XLA fuses the outer product of the
distance expansion), :func:`sparsegp_common.kernels.distance`. Every gradient is
compared with the same computation in float64, with ``Z`` at the data points and moved off them
by 1e-7 ... 1e-2 (in input units; the lengthscale is ``2 sqrt(D)``).

Matérn-1/2 is not differentiable at ``r = 0``: a float64 gradient there is ``+-variance / l``
along a direction that float32 inputs at ``|x| ~ 10`` cannot resolve below about ``1e-3``, so for
it the test asks only that float32 stays within twice the float64 gradient's norm; the smooth
kernels agree to 10 % of it (float32 round-off of the distance expansion at inputs ``|x| ~ 10``
accounts for a few per cent in 8 dimensions, where neighbours are few).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import solve_triangular
from numpyro import handlers

from backends import KERNELS, NumPyroBackend, PyroBackend, xla_optimisations

DELTAS = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
DIMS = (1, 2, 8)
SMOOTH_RTOL, KINK_FACTOR = 0.1, 2.0
Z_SITE = "gp.features.Z"


def problem(D, N=120, M=12, seed=0):
    """Data on [0, 30]^D, inducing inputs at the first M data points moved by ``delta`` along
    random unit directions: ``(X, v, Zs)`` with ``Zs`` ``(len(DELTAS), M, D)``. The first M points
    are at least a lengthscale apart, so that ``Kuu`` is well conditioned in float32 and what is
    measured is the coincidence with the data, not the conditioning."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 30, (N, D))
    spread = [0]
    for i in range(1, N):
        if len(spread) < M and np.linalg.norm(X[spread] - X[i], axis=1).min() > lengthscale(D)[0]:
            spread.append(i)
    X = np.concatenate([X[spread], np.delete(X, spread, axis=0)])
    u = rng.normal(size=(M, D))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return X, rng.normal(size=N), np.stack([X[:M] + d * u for d in DELTAS])


def lengthscale(D):
    return np.full(D, 2.0 * np.sqrt(D))


def assert_close(g32, g64, name, label, deltas=DELTAS):
    """The float32 gradients (one per delta) against float64, in norm, relative to the largest
    float64 gradient of the sweep: at ``delta = 0`` the float64 gradient w.r.t. ``Z`` can vanish
    (coincident pairs contribute zero), and float32 round-off is relative to the gradient's scale."""
    g32, g64 = [np.asarray(a, np.float64) for a in g32], [np.asarray(b, np.float64) for b in g64]
    scale = max(np.linalg.norm(b) for b in g64)
    assert scale > 0, f"{label}: every float64 gradient is zero (is the parameter used?)"
    bound = (KINK_FACTOR if name.startswith("matern12") else SMOOTH_RTOL) * scale
    for delta, a, b in zip(deltas, g32, g64, strict=True):
        err = np.linalg.norm(a - b)
        assert np.isfinite(a).all() and err <= bound, f"{label}, delta={delta}: |g32 - g64| = {err:.3g}, scale {scale:.3g}"


def jax_chain(name, X, v, Zs, log_l):
    """Gradients w.r.t. ``Z`` (one per delta) and ``log l`` of ``sum(Luu^-1 Kuf v) + sum(Kuf v)``,
    the chain of the whitened SVGP mean and of a plain kernel product."""
    kernel = getattr(NumPyroBackend().lib, KERNELS[name])

    def f(Z, log_l):
        k = kernel(lengthscale=jnp.exp(log_l), variance=jnp.asarray(1.3, X.dtype))
        L = jnp.linalg.cholesky(k.K(Z) + 1e-4 * jnp.eye(Z.shape[0], dtype=X.dtype))
        Kuf = k.K(Z, X)
        return jnp.sum(solve_triangular(L, Kuf, lower=True) @ v) + jnp.sum(Kuf @ v)

    return jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(0, None))(Zs, log_l)


def numpyro_sweep(grads, data, compiled=True):
    """``grads(name, *data[D])`` for every kernel and dimension, in one compiled call (XLA fuses
    each kernel's graph as it would alone; one compilation instead of one per case)."""
    def run(data):
        return {f"{name} D={D}": grads(name, *data[D]) for name in sorted(KERNELS) for D in DIMS}

    return (jax.jit(run) if compiled else run)(data)


def cast(tree, dtype):
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), tree)


def test_kernel_gradients_numpyro():
    data = {D: problem(D)[:3] + (np.log(lengthscale(D)),) for D in DIMS}
    with xla_optimisations(False):  # the float64 reference compiles faster
        ref = numpyro_sweep(jax_chain, cast(data, jnp.float64))
    for label, compiled in (("eager", False), ("jit", True)):
        out = numpyro_sweep(jax_chain, cast(data, jnp.float32), compiled)
        for case, grads in out.items():
            for i, what in enumerate(("Z", "log lengthscale")):
                assert_close(grads[i], ref[case][i], case, f"numpyro {label} {case} d/d{what}")


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_gradients_pyro(name, D):
    torch = pytest.importorskip("torch")
    lib = PyroBackend().lib
    X, v, Zs = problem(D)
    grads = {}
    for dtype in (torch.float32, torch.float64):
        Xt, vt = torch.as_tensor(X, dtype=dtype), torch.as_tensor(v, dtype=dtype)
        out = []
        for Z in Zs:
            Z = torch.as_tensor(Z, dtype=dtype).requires_grad_()
            k = getattr(lib, KERNELS[name])(lengthscale=torch.as_tensor(lengthscale(D), dtype=dtype),
                                             variance=torch.tensor(1.3, dtype=dtype))
            L = torch.linalg.cholesky(k.K(Z) + 1e-4 * torch.eye(Z.shape[0], dtype=dtype))
            Kuf = k.K(Z, Xt)
            value = (torch.linalg.solve_triangular(L, Kuf, upper=False) @ vt).sum() + (Kuf @ vt).sum()
            out.append([g.cpu().numpy() for g in torch.autograd.grad(value, [Z, k.lengthscale_unconstrained])])
        grads[dtype] = list(zip(*out))
    for i, what in enumerate(("Z", "log lengthscale")):
        assert_close(grads[torch.float32][i], grads[torch.float64][i], name, f"pyro d/d{what}")


def svgp_problem(D, seed=1):
    """A Gaussian-likelihood SVGP with Z at data points (and moved off them): data, Zs and q."""
    X, _, Zs = problem(D)
    M = Zs.shape[1]
    rng = np.random.default_rng(seed)
    y = np.sin(X.sum(-1) / 3) + 0.1 * rng.normal(size=len(X))
    q_mu = rng.normal(size=(M,))
    q_sqrt = np.tril(0.3 * rng.normal(size=(M, M)), -1) + np.diag(rng.uniform(0.3, 0.8, M))
    return X, y, Zs, q_mu, q_sqrt


def numpyro_loss_gradients(model, X, y, Zs, q_mu, q_sqrt):
    """Gradients of a NumPyro ``GPModel``'s loss (GP named "gp") w.r.t. ``Z``, one per ``Z`` in
    ``Zs`` (vmapped), and w.r.t. its other parameters: ``(dZ, {name: g})``."""
    params = {k: s["value"] for k, s in handlers.trace(model.elbo).get_trace(X, y).items() if s["type"] == "param"}
    params.pop(Z_SITE)  # a KeyError if renamed: substituting a name no site has would leave Zs unused
    params.update({"gp.q_mu": q_mu, "gp.q_sqrt": q_sqrt})

    def loss(Z, p):
        return -handlers.substitute(model.elbo, data={**p, Z_SITE: Z})(X, y)

    return jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None))(Zs, params)


def test_svgp_loss_gradients_numpyro():
    lib = NumPyroBackend().lib
    problems = {D: svgp_problem(D) for D in DIMS}

    def models(dtype):
        return {(name, D): lib.GPModel(lib.SVGP(getattr(lib, KERNELS[name])(lengthscale=jnp.asarray(lengthscale(D), dtype)),
                                                jnp.asarray(problems[D][2][0], dtype)),
                                       lib.Gaussian(variance=jnp.asarray(0.1, dtype)))
                for name in KERNELS for D in DIMS}

    def sweep(dtype):
        built = models(dtype)

        def grads(name, *data):
            return numpyro_loss_gradients(built[name, data[0].shape[-1]], *data)

        return numpyro_sweep(grads, cast(problems, dtype))

    with xla_optimisations(False):  # the float64 reference compiles faster
        ref = sweep(jnp.float64)
    out = sweep(jnp.float32)  # eager float32: the kernel test
    for case, (gZ, gp) in out.items():
        assert_close(gZ, ref[case][0], case, f"numpyro jit {case} SVGP loss d/dZ")
        for key in gp:
            assert_close(gp[key], ref[case][1][key], case, f"numpyro jit {case} SVGP loss d/d{key}")


def pyro_loss_gradients(name, X, y, Zs, q_mu, q_sqrt):
    """Gradients of the Pyro SVGP loss w.r.t. the GP's parameters and the noise, ``[{name: g}]``
    (one per ``Z`` in ``Zs``), in float32 and in float64."""
    import torch

    lib = PyroBackend().lib
    grads = []
    for dtype in (torch.float32, torch.float64):
        out = []
        for Z in Zs:
            kernel = getattr(lib, KERNELS[name])(lengthscale=torch.as_tensor(lengthscale(X.shape[-1]), dtype=dtype))
            gp = lib.SVGP(kernel, torch.as_tensor(Z, dtype=dtype))
            gp.q_mu, gp.q_sqrt = torch.as_tensor(q_mu, dtype=dtype), torch.as_tensor(q_sqrt, dtype=dtype)
            model = lib.GPModel(gp, lib.Gaussian(variance=torch.tensor(0.1, dtype=dtype)))
            named = dict(list(gp.named_parameters()) + [("noise", p) for p in model.likelihood.parameters()])
            loss = -model.elbo(torch.as_tensor(X, dtype=dtype), torch.as_tensor(y, dtype=dtype))
            out.append(dict(zip(named, (g.cpu().numpy() for g in torch.autograd.grad(loss, list(named.values()))))))
        grads.append(out)
    return grads


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_svgp_loss_gradients_pyro(name, D):
    pytest.importorskip("torch")
    g32, g64 = pyro_loss_gradients(name, *svgp_problem(D))
    for key in g64[0]:
        assert_close([g[key] for g in g32], [g[key] for g in g64], name, f"pyro SVGP loss d/d{key}")


#: lengthscales between two inducing inputs (the pair that makes ``Kuu`` nearly singular)
PAIR_DELTAS = (1e-4, 1e-3, 1e-2)
SMOOTH = ("matern52", "rbf")


def close_pair_problem(D, seed=3):
    """The SVGP problem with inducing inputs at spread data points, the second moved to within
    ``delta`` lengthscales of the first: ``Kuu``'s smallest eigenvalue is then the jitter's size
    (1e-6), below the float32 round-off of the distance expansion at ``|x| ~ 7`` lengthscales."""
    X, y, Zs, q_mu, q_sqrt = svgp_problem(D)
    u = np.random.default_rng(seed).normal(size=D)
    u /= np.linalg.norm(u)
    Zs = np.stack([Zs[0]] * len(PAIR_DELTAS))
    Zs[:, 1] = Zs[:, 0] + np.asarray(PAIR_DELTAS)[:, None] * lengthscale(D)[0] * u
    return X, y, Zs, q_mu, q_sqrt


def test_close_inducing_pair_gradients_numpyro():
    """Two inducing inputs 1e-4 ... 1e-2 lengthscales apart (training moves them there): the float32
    SVGP loss gradients, eager and under ``jax.jit``, agree with float64's. The distance expansion
    in ``Kuu`` made them 100 times the true ones under ``jax.jit`` (tutorials/arviz_diagnostics.py,
    JAX 0.12); :func:`sparsegp_common.kernels.pairwise_sqdist`. Without ``jax_enable_x64`` (as
    users run NumPyro) and with it: the two ways that function has."""
    lib = NumPyroBackend().lib
    problems = {D: close_pair_problem(D) for D in DIMS}

    def sweep(dtype, compiled=True):
        def grads(name, X, y, Zs, q_mu, q_sqrt):
            kernel = getattr(lib, KERNELS[name])(lengthscale=jnp.asarray(lengthscale(X.shape[-1]), dtype))
            model = lib.GPModel(lib.SVGP(kernel, Zs[0]), lib.Gaussian(variance=jnp.asarray(0.1, dtype)))
            return numpyro_loss_gradients(model, X, y, Zs, q_mu, q_sqrt)

        def run(data):
            return {f"{name} D={D}": grads(name, *data[D]) for name in SMOOTH for D in data}

        return (jax.jit(run) if compiled else run)(cast(problems if compiled else {8: problems[8]}, dtype))

    with xla_optimisations(False):
        ref = sweep(jnp.float64)
    # a user's float32 program (no float64: each nearest pair measured again) and one with x64;
    # eagerly in 8-D alone (each operation compiles; the old expansion failed there, 29 % off)
    for label, compiled, x64 in (("eager", False, False), ("jit", True, False), ("jit x64", True, True)):
        with jax.enable_x64(x64):
            out = sweep(jnp.float32, compiled)
        for case, (gZ, gp) in out.items():
            assert_close(gZ, ref[case][0], case, f"numpyro {label} {case} d/dZ", PAIR_DELTAS)
            for key in gp:
                assert_close(gp[key], ref[case][1][key], case, f"numpyro {label} {case} d/d{key}", PAIR_DELTAS)


@pytest.mark.parametrize("name", SMOOTH)
def test_close_inducing_pair_gradients_pyro(name):
    pytest.importorskip("torch")
    for D in DIMS:
        g32, g64 = pyro_loss_gradients(name, *close_pair_problem(D))
        for key in g64[0]:
            assert_close([g[key] for g in g32], [g[key] for g in g64], name, f"pyro D={D} d/d{key}", PAIR_DELTAS)


def test_lengthscale_length_must_match_the_inputs(backend):
    """An ARD lengthscale of the wrong length names ``lengthscale`` and the input dimension."""
    kernel = backend.lib.Matern52(lengthscale=backend.array([1.0, 2.0, 3.0]))
    X = backend.array(np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"lengthscale has 3 entries but the inputs have 2 dimensions"):
        kernel.K(X)
    with pytest.raises(ValueError, match=r"lengthscale has 3"):
        backend.lib.SVGP(kernel, X)


def spiky_model(backend):
    """A parameter pulled towards 1, plus a term whose value is always zero but whose gradient is
    ``x`` at the minibatch's row: a gradient spike that the loss does not show."""
    ppl = backend.ppl
    if backend.name == "pyro":
        import torch

        detach, zeros = (lambda t: t.detach()), (lambda: torch.tensor(0.0))
    else:
        detach, zeros = jax.lax.stop_gradient, (lambda: jnp.zeros(()))

    def model(x):
        theta = ppl.param("theta", zeros())
        ppl.factor("pull", -((theta - 1.0) ** 2))
        ppl.factor("spike", (x.sum() * (theta - detach(theta))))

    return model, lambda x: None


@pytest.mark.parametrize("spike", [0.0, 1e8])
def test_fit_stops_at_a_gradient_spike(backend, spike):
    """A gradient 1e8 times the usual size (the loss unchanged) would leave Adam frozen: ``fit``
    stops and says so; without it, ``FitResult.grad_norms`` holds each step's gradient norm."""
    backend.reset()
    x = np.zeros(30)
    x[7] = spike
    model, guide = spiky_model(backend)
    run = lambda: backend.lib.fit(model, guide, (backend.array(x, np.float32),), num_epochs=3, batch_size=1,  # noqa: E731
                                  lr=0.01, progress=False)
    if spike:
        with pytest.raises(FloatingPointError, match=r"gradient norm jumped to 1e\+08 .* Adam"):
            run()
    else:
        result = run()
        assert result.grad_norms.shape == (90,) and np.all(result.grad_norms > 0)
        np.testing.assert_allclose(result.grad_norms[0], 2.0, rtol=1e-6)  # |d/dtheta (theta - 1)^2| at 0


def test_loss_history_checks_the_gradient_norms():
    from sparsegp_common.inference.training import LossHistory

    history = LossHistory([], to_floats=lambda pairs: pairs)
    for i in range(20):
        history.append((1.0, 1.0 + 0.1 * i))
    assert len(history.read()) == 20 and len(history.grad_norms) == 20
    history.append((1.0, 9e3))  # large, below the spike factor of the median
    history.read()
    history.append((1.0, float("nan")))
    with pytest.raises(FloatingPointError, match="gradient became nan at step 22"):
        history.read()
    history = LossHistory([], to_floats=lambda pairs: pairs)
    for i in range(5):  # too few steps to judge a spike
        history.append((1.0, 1e9 if i == 4 else 1.0))
    history.read()


def test_loss_history_finds_a_runaway_within_one_read():
    """Losses read back together (``loss_every > 1``): a loss that runs away from the best of the
    same read is caught there (the best so far includes the read's earlier losses)."""
    from sparsegp_common.inference.training import LossHistory

    history = LossHistory([], to_floats=lambda pairs: pairs)
    for value in (10.0, 1.0, 5.0):
        history.append((value, 1.0))
    assert history.read() == [10.0, 1.0, 5.0]
    for value in (2.0, 0.5, 2e4):
        history.append((value, 1.0))
    with pytest.raises(FloatingPointError, match="ran away"):
        history.read()
    history = LossHistory([], to_floats=lambda pairs: pairs)
    for value in (10.0, 1.0, 2e4):  # the first read of a run
        history.append((value, 1.0))
    with pytest.raises(FloatingPointError, match="ran away"):
        history.read()


def test_the_likelihood_follows_the_priors_dtype(backend):
    """A likelihood built with its default (float64) noise takes the float32 prior's dtype in
    ``GPModel``: its parameter (what ``fit`` returns and checkpoints) and the ELBO are float32."""
    lib, rng = backend.lib, np.random.default_rng(0)
    if backend.name == "pyro":
        import torch

        as32 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    else:
        as32 = lambda a: jnp.asarray(np.asarray(a), dtype=jnp.float32)  # noqa: E731
    X, y = rng.normal(size=(5, 1)), rng.normal(size=5)
    gp = lib.SVGP(lib.SquaredExponential(lengthscale=as32([1.0])), as32(X[:3]))
    likelihood = lib.Gaussian()
    elbo = lib.GPModel(gp, likelihood).elbo(as32(X), as32(y))
    assert str(elbo.dtype).endswith("float32")
    assert str(backend.bound(likelihood).variance.dtype).endswith("float32")
