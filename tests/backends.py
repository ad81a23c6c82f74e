"""The same test code drives both backends through these small adapters (NumPy in, NumPy out)."""
KERNELS = {"rbf": "SquaredExponential", "matern12": "Matern12", "matern32": "Matern32", "matern52": "Matern52"}


class Backend:
    def kernel(self, name, lengthscale, variance):
        """A kernel with float64 hyperparameters (Pyro's defaults follow torch's default dtype)."""
        return getattr(self.lib, KERNELS[name])(lengthscale=self.array(lengthscale), variance=variance)

    def set(self, obj, **values):
        """Set (constrained) parameter values of a module: only parameters it has (a misspelt or
        renamed one would otherwise become a new attribute, and the test would run at the defaults)."""
        for name, value in values.items():
            assert self.has_parameter(obj, name), f"{type(obj).__name__} has no parameter {name!r}"
            setattr(obj, name, self.array(value))
        return obj

    def svgp(self, Z, kernel=("rbf", [0.8], 1.3), q_mu=None, q_sqrt=None, name="gp", **options):
        """An SVGP on ``Z`` with the given (constrained) variational parameters."""
        gp = self.lib.SVGP(self.kernel(*kernel), self.array(Z), name=name, **options)
        values = {k: v for k, v in (("q_mu", q_mu), ("q_sqrt", q_sqrt)) if v is not None}
        return self.set(gp, **values)

    def hierarchical_model(self, gp, num_groups, subsample_size, vectorised=True):
        """A user's hierarchical Bernoulli model, as ``docs/usage.md`` writes one: group effects
        (an ``AutoNormal`` for them and their scale) and an SVGP term, the data plate subsampling.
        ``vectorised=False`` indexes the effects as ``effect[g]``, which breaks Pyro's batch of
        draws (``jax.vmap`` vectorises either)."""
        ppl, D = self.ppl, self.ppl.distributions

        def model(X, g, y):
            scale = ppl.sample("scale", D.HalfNormal(1.0))
            with ppl.plate("groups", num_groups):
                effect = ppl.sample("effect", D.Normal(0.0, scale))
            data = ppl.plate("data", len(X), subsample_size=subsample_size)
            f = gp.model(X, data)
            with data as idx:
                group = effect[..., g[idx]] if vectorised else effect[g[idx]]
                ppl.sample("y", D.Bernoulli(logits=f + group), obs=y[idx])

        autoguide = ppl.infer.autoguide.AutoNormal(self.handlers.block(model, hide=list(gp.site_names)))

        def guide(X, g, y):
            gp.guide(X, ppl.plate("data", len(X), subsample_size=subsample_size))
            autoguide(X, g, y)

        return model, guide


import contextlib

import jax
import numpy as np
import numpyro
import numpyro.infer.autoguide
import pytest
from numpyro import handlers

try:
    import pyro
    import pyro.infer.autoguide
    import torch
except ModuleNotFoundError:  # the newest-versions tier (.ci/newest) installs the NumPyro extras only
    pyro = torch = None


LEGACY_EMITTERS = "xla_cpu_use_fusion_emitters"


def legacy_emitters_where_unoptimised():
    """Wherever most of XLA's optimisations are off (the suite's default), XLA:CPU's older
    elemental emitters too: about a third less compilation (``tests/test_qsgp_rows.py`` 96 to 70 s
    alone), the same HLO. The float32 tests keep compiling as users' programs do. Newer jaxlibs lack
    the option (0.12: "No such compile option"); nothing changes there. Returns whether it applies."""
    from jax._src import compiler

    if legacy_emitters_where_unoptimised.applied:
        return True
    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options={LEGACY_EMITTERS: False})
    except Exception:  # noqa: BLE001 (XLA's error type moves between versions)
        return False
    original = compiler.get_compile_options

    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        if jax.config.values["jax_disable_most_optimizations"]:
            env_options_overrides = {LEGACY_EMITTERS: False, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=env_options_overrides, **kwargs)

    compiler.get_compile_options = get_compile_options
    legacy_emitters_where_unoptimised.applied = True
    return True


legacy_emitters_where_unoptimised.applied = False


@contextlib.contextmanager
def xla_optimisations(enabled):
    """JAX programs compiled inside with all of XLA's optimisations (``enabled``: as users run, for
    float32 round-off) or most of them off (the suite's default: float64 references and the rest)."""
    old = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", not enabled)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", old)


class PyroBackend(Backend):
    name, ppl, handlers = "pyro", pyro, getattr(pyro, "poutine", None)

    def __init__(self):
        pytest.importorskip("torch", reason="Pyro's tests need torch (the newest-versions tier runs without it)")
        import pyro_sparsegp

        self.lib = pyro_sparsegp

    def reset(self, seed=0):
        pyro.clear_param_store()
        pyro.set_rng_seed(seed)

    def array(self, x, dtype=np.float64):
        return torch.as_tensor(np.asarray(x, dtype=dtype))

    def x64(self, enabled):
        """float64 at hand or not within the block: torch always has it."""
        return contextlib.nullcontext()

    def numpy(self, x):
        return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    def has_parameter(self, obj, name):
        return name in obj.__dict__.get("_pyro_params", ()) or name in obj.__dict__.get("_parameters", ())

    def bound(self, obj):
        """The object with parameters readable as attributes."""
        return obj

    def expected_log_prob(self, lik, y, mean, var, seed=0):
        torch.manual_seed(seed)
        return self.numpy(lik.expected_log_prob(self.array(y), self.array(mean), self.array(var)))

    def loss(self, model, guide, *args, mean_field=False, num_particles=1, seed=0, **kwargs):
        """-ELBO estimate of Pyro's Trace_ELBO / TraceMeanField_ELBO."""
        pyro.set_rng_seed(seed)
        elbo_cls = pyro.infer.TraceMeanField_ELBO if mean_field else pyro.infer.Trace_ELBO
        return float(elbo_cls(num_particles=num_particles).loss(model, guide, *args, **kwargs))

    def predict(self, model, X, params):
        """Predictive moments with trained ``params`` (the modules already hold them)."""
        return tuple(self.numpy(a).astype(float) for a in model.predict_f(X))

    def losses(self, model, guide, *args, replicates, mean_field=False, **kwargs):
        """-ELBO estimates from ``replicates`` independent seeds."""
        return np.array([self.loss(model, guide, *args, mean_field=mean_field, seed=s, **kwargs) for s in range(replicates)])

    def solve_lower(self, L, B):
        return torch.linalg.solve_triangular(L, B, upper=False)

    def user_model(self, gp, noise, subsample_size=10):
        """``y ~ N(f, noise)`` written by a user around the component (minibatches from the plate)."""
        def model(X, y):
            data = pyro.plate("data", len(X), subsample_size=subsample_size)
            f = gp.model(X, data)
            with data as idx:
                pyro.sample("y", pyro.distributions.Normal(f, noise**0.5), obs=y[idx])

        def guide(X, y):
            gp.guide(X, pyro.plate("data", len(X), subsample_size=subsample_size))

        return model, guide

    def grad(self, fn, *args):
        """Gradients of a scalar ``fn`` of arrays at ``args`` (NumPy in, NumPy out)."""
        xs = [self.array(a).requires_grad_() for a in args]
        return [self.numpy(g) for g in torch.autograd.grad(fn(*xs), xs)]

    def trace(self, fn, *args, seed=0, **kwargs):
        pyro.set_rng_seed(seed)
        return pyro.poutine.trace(fn).get_trace(*args, **kwargs).nodes

    def train(self, model, guide, args, steps, lr, mean_field=False, seed=0, kwargs=None):
        self.reset(seed)
        elbo = pyro.infer.TraceMeanField_ELBO() if mean_field else pyro.infer.Trace_ELBO()
        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": lr}), elbo)
        losses = [svi.step(*args, **(kwargs or {})) for _ in range(steps)]
        with pyro.poutine.trace(param_only=True) as params:  # the modules' own and the store's
            svi.evaluate_loss(*args, **(kwargs or {}))
        return losses, {k: self.numpy(site["value"]) for k, site in params.trace.nodes.items()}


class NumPyroBackend(Backend):
    name, ppl, handlers = "numpyro", numpyro, handlers

    def __init__(self):
        import numpyro_sparsegp

        self.lib = numpyro_sparsegp
        self._seed = 0

    def reset(self, seed=0):
        self._seed = seed

    def array(self, x, dtype=np.float64):
        return jax.numpy.asarray(np.asarray(x, dtype=dtype))

    def x64(self, enabled):
        """float64 at hand or not within the block: JAX's ``jax_enable_x64`` (the tests' default: on)."""
        return jax.enable_x64(enabled)

    def numpy(self, x):
        return np.asarray(x)

    def has_parameter(self, obj, name):
        return name in obj._constraints

    def bound(self, obj):
        return obj.bind()

    def expected_log_prob(self, lik, y, mean, var, seed=0):
        key = jax.random.PRNGKey(seed)
        return self.numpy(lik.bind().expected_log_prob(self.array(y), self.array(mean), self.array(var), key=key))

    def loss(self, model, guide, *args, mean_field=False, num_particles=1, seed=0, **kwargs):
        elbo_cls = numpyro.infer.TraceMeanField_ELBO if mean_field else numpyro.infer.Trace_ELBO
        elbo = elbo_cls(num_particles=num_particles)
        key = jax.random.PRNGKey(seed)
        params = _params(model, guide, key, args, kwargs)
        return float(elbo.loss(key, params, model, guide, *args, **kwargs))

    def predict(self, model, X, params):
        mean, var = handlers.substitute(model.predict_f, data=params)(X)
        return np.asarray(mean, dtype=float), np.asarray(var, dtype=float)

    def losses(self, model, guide, *args, replicates, mean_field=False, **kwargs):
        """-ELBO estimates from ``replicates`` independent keys, in one jit-compiled, vmapped call
        (hundreds of eager calls would compile hundreds of programs)."""
        elbo = (numpyro.infer.TraceMeanField_ELBO if mean_field else numpyro.infer.Trace_ELBO)()
        params = _params(model, guide, jax.random.PRNGKey(0), args, kwargs)
        loss = jax.jit(jax.vmap(lambda key: elbo.loss(key, params, model, guide, *args, **kwargs)))
        return np.asarray(loss(jax.random.split(jax.random.PRNGKey(1), replicates)))

    def solve_lower(self, L, B):
        return jax.scipy.linalg.solve_triangular(L, B, lower=True)

    def user_model(self, gp, noise, subsample_size=10):
        """``y ~ N(f, noise)`` written by a user around the component (minibatches from the plate)."""
        def model(X, y):
            data = numpyro.plate("data", len(X), subsample_size=subsample_size)
            f = gp.model(X, data)
            with data as idx:
                numpyro.sample("y", numpyro.distributions.Normal(f, noise**0.5), obs=y[idx])

        def guide(X, y):
            gp.guide(X, numpyro.plate("data", len(X), subsample_size=subsample_size))

        return model, guide

    def grad(self, fn, *args):
        return [np.asarray(g) for g in jax.grad(fn, argnums=tuple(range(len(args))))(*map(self.array, args))]

    def trace(self, fn, *args, seed=0, **kwargs):
        return handlers.trace(handlers.seed(fn, jax.random.PRNGKey(seed))).get_trace(*args, **kwargs)

    def train(self, model, guide, args, steps, lr, mean_field=False, seed=0, kwargs=None):
        elbo = numpyro.infer.TraceMeanField_ELBO() if mean_field else numpyro.infer.Trace_ELBO()
        svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(lr), elbo)
        result = svi.run(jax.random.PRNGKey(seed), steps, *args, progress_bar=False, **(kwargs or {}))
        return np.asarray(result.losses), {k: np.asarray(v) for k, v in result.params.items()}


def _params(model, guide, key, args, kwargs):
    """Initial (constrained) values of the param sites of model and guide."""
    params = {}
    for fn in (guide, model):
        tr = handlers.trace(handlers.seed(fn, key)).get_trace(*args, **kwargs)
        for name, site in tr.items():
            if site["type"] == "param":
                params.setdefault(name, site["value"])
    return params


BACKENDS = {"pyro": PyroBackend, "numpyro": NumPyroBackend}
