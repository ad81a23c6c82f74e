"""The SVGPs the suites compare, each as a :class:`Runner`: one SVI step on the next minibatch, and
the predictive distribution of ``y`` at test inputs.

Every runner gets the same data, inducing inputs ``Z`` (rows of the training set), minibatches
(those of ``fit(batch_size=..., seed=...)``: :func:`~benchmarks.harness.minibatches`), kernel
(squared exponential with one lengthscale per input), initial hyperparameters, Adam learning rate
and dtype (float32):

* ``ours (Pyro)`` and ``ours (NumPyro, jit)``: ``GPModel(SVGP(...), Gaussian(), num_data=N)``
  trained by the product's own ``fit`` (``pyro_sparsegp.fit``: ``Trace_ELBO`` and
  ``torch.optim.Adam``; ``numpyro_sparsegp.fit``: one jit-compiled ``SVI.update`` per step, the
  minibatch gathered inside it), one step at a time (:class:`~benchmarks.harness.FitSteps`);
* ``GPyTorch``: ``ApproximateGP`` with ``CholeskyVariationalDistribution`` and
  ``VariationalStrategy(learn_inducing_locations=True)``, ``GaussianLikelihood``,
  ``VariationalELBO``, ``ScaleKernel(RBFKernel(ard_num_dims=D))``, zero mean;
* ``pyro.contrib.gp``: ``VariationalSparseGP(whiten=True)`` with ``TraceMeanField_ELBO`` and
  ``set_data`` per minibatch (its Gaussian data term is the predictive ``log N(y | mu, var + s2)``,
  not the ELBO's expected log-likelihood).

The peers keep their own training loops (a torch optimiser over the minibatch slices).
Initial values: lengthscales 1, kernel variance 1, noise variance 0.1; ``q(u)`` at the whitened
prior ``N(0, I)``.
"""
import numpy as np

LENGTHSCALE, VARIANCE, NOISE = 1.0, 1.0, 0.1


class Runner:
    """An SVGP being trained.

    Args:
        X: training inputs ``(N, D)``, NumPy.
        y: training targets ``(N,)``, NumPy.
        Z: initial inducing inputs ``(M, D)``, NumPy.
        batch_size: rows per step.
        lr: Adam learning rate.
        seed: seeds the minibatch order (and ``fit``'s RNG).
    """

    name = None  # for tables
    key = None  # for JSON and code

    def step(self):
        """One SVI step on the next minibatch; returns the loss (a Python float)."""
        raise NotImplementedError

    def predict(self, X):
        """Predictive mean and variance of ``y`` at ``X`` ``(T, D)``: two NumPy float64 ``(T,)``."""
        raise NotImplementedError

    def close(self):
        """Stop training (ours: end the ``fit`` running in its worker thread)."""


def close(group):
    """Close every runner of ``{key: runner}``."""
    for runner in group.values():
        runner.close()


class OursPyro(Runner):
    name = "ours (Pyro)"
    key = "ours_pyro"
    # Not the default name "likelihood": pyro.contrib.gp's Gaussian has that name in the same param store.
    likelihood_name = "ours_likelihood"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import torch

        import pyro_sparsegp as psg

        from .harness import FitSteps, tensor

        self.X, self.y = tensor(X), tensor(y)
        self.gp, loss = self.build(None if Z is None else tensor(Z))
        self.fit = FitSteps(psg.fit, self.gp.model, self.gp.guide, (self.X, self.y), batch_size=batch_size, lr=lr,
                            seed=seed, loss=loss)

    def build(self, Z):
        """The model trained and its loss (None: ``fit``'s default, ``Trace_ELBO``)."""
        import torch

        import pyro_sparsegp as psg

        kernel = psg.RBF(lengthscale=torch.full((self.X.shape[1],), LENGTHSCALE, device=self.X.device), variance=VARIANCE)
        likelihood = psg.Gaussian(variance=NOISE, name=self.likelihood_name)
        return psg.GPModel(self.prior(kernel, Z), likelihood, num_data=len(self.X)), None

    def prior(self, kernel, Z):
        """The GP prior component trained (the suites swap in other priors)."""
        import pyro_sparsegp as psg

        return psg.SVGP(kernel, Z)

    def step(self):
        return self.fit.step()

    def close(self):
        self.fit.close()

    def predict(self, X):
        import torch

        with torch.no_grad():  # the trained values are in Pyro's param store
            mean, var = self.gp.predict_f(torch.as_tensor(X, dtype=torch.float32, device=self.X.device))
            var = var + self.gp.likelihood.variance
        return mean.double().cpu().numpy(), var.double().cpu().numpy()


class OursNumPyro(Runner):
    name = "ours (NumPyro, jit)"
    key = "ours_numpyro"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import jax.numpy as jnp

        import numpyro_sparsegp as nsg

        from .harness import FitSteps

        data = (jnp.asarray(X, dtype=jnp.float32), jnp.asarray(y, dtype=jnp.float32))
        kernel = nsg.RBF(lengthscale=jnp.full((X.shape[1],), LENGTHSCALE, dtype=jnp.float32), variance=VARIANCE)
        prior = self.prior(kernel, jnp.asarray(Z, dtype=jnp.float32))
        self.gp = nsg.GPModel(prior, nsg.Gaussian(variance=NOISE), num_data=len(X))
        self.fit = FitSteps(nsg.fit, self.gp.model, self.gp.guide, data, batch_size=batch_size, lr=lr, seed=seed)

    def prior(self, kernel, Z):
        """The GP prior component trained (the suites swap in other priors)."""
        import numpyro_sparsegp as nsg

        return nsg.SVGP(kernel, Z)

    def step(self):
        return self.fit.step()

    def close(self):
        self.fit.close()

    def predict(self, X):
        import jax.numpy as jnp

        params = self.fit.params  # the values of the step taken last
        mean, var = self.gp.predict_f(jnp.asarray(X, dtype=jnp.float32), params=params)
        var = var + params["likelihood.variance"]
        return np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)


class GPyTorch(Runner):
    name = "GPyTorch"
    key = "gpytorch"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import gpytorch
        import torch

        from .harness import minibatches, tensor

        class SVGPModel(gpytorch.models.ApproximateGP):
            def __init__(self, Z):
                q = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[0])
                strategy = gpytorch.variational.VariationalStrategy(self, Z, q, learn_inducing_locations=True)
                super().__init__(strategy)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1]))

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        self.X, self.y = tensor(X), tensor(y)
        self.model = SVGPModel(tensor(Z)).to(self.X.device)
        self.model.covar_module.base_kernel.lengthscale = torch.full((1, X.shape[1]), LENGTHSCALE, device=self.X.device)
        self.model.covar_module.outputscale = VARIANCE
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood().to(self.X.device)
        self.likelihood.noise = NOISE
        self.mll = gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=len(X))
        params = list(self.model.parameters()) + list(self.likelihood.parameters())
        self.opt = torch.optim.Adam(params, lr=lr)
        self.batches = minibatches(len(X), batch_size, seed)
        self.model.train()
        self.likelihood.train()

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches), device=self.X.device)
        self.opt.zero_grad()
        loss = -self.mll(self.model(self.X[idx]), self.y[idx])
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def predict(self, X):
        import torch

        self.model.eval()
        self.likelihood.eval()
        try:
            with torch.no_grad():
                pred = self.likelihood(self.model(torch.as_tensor(X, dtype=torch.float32, device=self.X.device)))
                return pred.mean.double().cpu().numpy(), pred.variance.double().cpu().numpy()
        finally:
            self.model.train()
            self.likelihood.train()


class ContribGP(Runner):
    name = "pyro.contrib.gp"
    key = "contrib_gp"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import pyro
        import pyro.contrib.gp as gp
        import torch

        from .harness import minibatches, tensor

        self.X, self.y = tensor(X), tensor(y)
        kernel = gp.kernels.RBF(input_dim=X.shape[1], lengthscale=tensor(np.full(X.shape[1], LENGTHSCALE)),
                                variance=tensor(VARIANCE))
        likelihood = gp.likelihoods.Gaussian(variance=tensor(NOISE))
        self.model = gp.models.VariationalSparseGP(
            self.X[:2], self.y[:2], kernel, tensor(Z), likelihood, num_data=len(X), whiten=True,
        ).to(self.X.device)
        self.loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.batches = minibatches(len(X), batch_size, seed)

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches), device=self.X.device)
        self.model.set_data(self.X[idx], self.y[idx])
        self.opt.zero_grad()
        loss = self.loss(self.model.model, self.model.guide)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def predict(self, X):
        import torch

        with torch.no_grad():
            mean, var = self.model(torch.as_tensor(X, dtype=torch.float32, device=self.X.device))
            var = var + self.model.likelihood.variance
        return mean.double().cpu().numpy(), var.double().cpu().numpy()


class OursPyroSVI(Runner):
    """Ours as a Pyro user writes it: an ``SVGP`` component in their own model (its noise a
    ``pyro.param``), ``pyro.infer.SVI`` with ``pyro.optim.Adam`` and ``Trace_ELBO``, the minibatch
    passed to the model with a subsampling plate."""

    name = "ours (Pyro, SVI)"
    key = "ours_pyro_svi"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import pyro
        import torch
        from torch.distributions import constraints

        import pyro_sparsegp as psg

        from .harness import minibatches, tensor

        self.X, self.y = tensor(X), tensor(y)
        kernel = psg.RBF(lengthscale=torch.full((X.shape[1],), LENGTHSCALE, device=self.X.device), variance=VARIANCE)
        self.gp = gp = psg.SVGP(kernel, tensor(Z), name="svi_gp")  # beside ``ours (Pyro)``'s "gp"
        num_data = len(X)

        def model(X, y):
            noise = pyro.param("svi_noise", torch.tensor(NOISE, device=X.device), constraint=constraints.positive)
            data = pyro.plate("data", num_data, subsample_size=len(X))
            f = gp.model(X, data)
            with data:
                pyro.sample("y", pyro.distributions.Normal(f, noise.sqrt()), obs=y)

        def guide(X, y):
            gp.guide(X, pyro.plate("data", num_data, subsample_size=len(X)))

        self.svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": lr}), pyro.infer.Trace_ELBO())
        self.batches = minibatches(num_data, batch_size, seed)

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches), device=self.X.device)
        return self.svi.step(self.X[idx], self.y[idx])


class OursNumPyroSVI(Runner):
    """Ours as a NumPyro user writes it: the model of :class:`OursPyroSVI` with ``numpyro.infer.SVI``
    and ``numpyro.optim.Adam``, ``SVI.update`` compiled by ``jax.jit``, the minibatch sliced on the
    host each step."""

    name = "ours (NumPyro, SVI)"
    key = "ours_numpyro_svi"

    def __init__(self, X, y, Z, batch_size, lr, seed=0):
        import jax
        import jax.numpy as jnp
        import numpyro

        import numpyro_sparsegp as nsg

        from .harness import minibatches

        self.X, self.y = np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.float32)
        kernel = nsg.RBF(lengthscale=jnp.full((X.shape[1],), LENGTHSCALE, dtype=jnp.float32), variance=VARIANCE)
        gp = nsg.SVGP(kernel, jnp.asarray(Z, dtype=jnp.float32))
        num_data = len(X)

        def model(X, y):
            noise = numpyro.param("noise", jnp.float32(NOISE), constraint=numpyro.distributions.constraints.positive)
            data = numpyro.plate("data", num_data, subsample_size=len(X))
            f = gp.model(X, data)
            with data:
                numpyro.sample("y", numpyro.distributions.Normal(f, jnp.sqrt(noise)), obs=y)

        def guide(X, y):
            gp.guide(X, numpyro.plate("data", num_data, subsample_size=len(X)))

        svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(lr), numpyro.infer.Trace_ELBO())
        self.batches = minibatches(num_data, batch_size, seed)
        idx = next(self.batches)
        self.state = svi.init(jax.random.PRNGKey(seed), self.X[idx], self.y[idx])
        self.update = jax.jit(svi.update)

    def step(self):
        idx = next(self.batches)
        self.state, loss = self.update(self.state, self.X[idx], self.y[idx])
        return float(loss)


RUNNERS = {runner.key: runner for runner in (OursPyro, OursNumPyro, GPyTorch, ContribGP, OursPyroSVI, OursNumPyroSVI)}


class Apart:
    """The runner ``RUNNERS[key]`` built and stepped in a process of its own (a user runs one
    library per process: beside torch in the same process a NumPyro step at M = 256 took 15-40 %
    longer, benchmarks/RESULTS.md, "steps: the whitened q(f) from Kuu as one differentiated
    step"). :meth:`step` asks the process for one step and waits for it: the timing adds a
    round trip through a pipe (tens of microseconds)."""

    def __init__(self, key, X, y, Z, batch_size, lr=0.01, seed=0):
        import multiprocessing

        from . import harness

        self._key = key
        context = multiprocessing.get_context("spawn")  # no copy of this process's torch and JAX state
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, key, harness.DEVICE, X, y, Z, batch_size, lr, seed),
                                        daemon=True)
        self._process.start()
        self._answer()  # built

    def _call(self, *message):
        self._conn.send(message)
        return self._answer()

    def _answer(self):
        while not self._conn.poll(1.0):
            if not self._process.is_alive():  # e.g. a script without the __main__ guard spawn needs
                raise RuntimeError(f"the process of runner {self._key!r} ended (exit code {self._process.exitcode})")
        status, value = self._conn.recv()
        if status == "error":
            raise RuntimeError(f"a runner in its own process failed: {value}")
        return value

    def step(self):
        return self._call("step")

    def python_calls(self, count=5):
        """Python calls per step in the runner's process (see :func:`~benchmarks.harness.python_calls`)."""
        return self._call("calls", count)

    def close(self):
        self._call("close")
        self._process.join()


def _serve(conn, key, device, X, y, Z, batch_size, lr, seed):
    """The child's loop of :class:`Apart`: build the runner, then answer ``step``, ``calls`` and ``close``."""
    from . import harness

    harness.DEVICE = device
    try:
        runner = RUNNERS[key](X, y, Z, batch_size, lr, seed)
        conn.send(("ok", None))
        while True:
            message = conn.recv()
            if message[0] == "step":
                conn.send(("ok", float(runner.step())))
            elif message[0] == "calls":
                conn.send(("ok", harness.python_calls(runner.step, *message[1:])))
            else:  # close
                runner.close()
                conn.send(("ok", None))
                return
    except Exception as error:  # noqa: BLE001 (reported in the parent, which raises it)
        conn.send(("error", f"{type(error).__name__}: {error}"))


def build(keys, X, y, Z, batch_size, lr=0.01, seed=0):
    """The runners ``keys`` (keys of :data:`RUNNERS`) on the same problem, side by side.

    Pyro's param store is cleared once here, before any of them is built: the Pyro runners then
    share it without clashing names, and clearing it later would detach their parameters.

    Returns:
        ``{key: runner}``; all draw the same minibatches (those of ``fit`` with ``seed``).
    """
    import pyro

    pyro.clear_param_store()
    return {key: RUNNERS[key](X, y, Z, batch_size, lr, seed) for key in keys}


def timed_rows(suite, dataset, keys, opts, extra=None, measure=None, apart=False):
    """The runners ``keys`` side by side on ``dataset`` at each M of ``opts["sizes"]``, timed in
    alternating blocks (:func:`~benchmarks.harness.time_steps`): one row per M with the problem,
    ``seconds_<key>`` (median) and ``blocks_<key>`` of every step function.

    Args:
        extra: optional ``extra(X, Z, batch) -> {name: step}``, more step functions timed beside.
        measure: optional ``measure(group, steps) -> {column: value}``, run on the runners and
            the step functions after the timing (before the runners are closed).
        apart: each runner in a process of its own (:class:`Apart`).
    """
    from . import harness

    problem = harness.regression_problem(dataset)
    X, y = problem["X_train"], problem["y_train"]
    rows = []
    for M in opts["sizes"]:
        Z = harness.inducing_inputs(X, M)
        group = ({key: Apart(key, X, y, Z, opts["batch"]) for key in keys} if apart
                 else build(keys, X, y, Z, opts["batch"]))
        steps = {key: runner.step for key, runner in group.items()}
        steps.update(extra(X, Z, opts["batch"]) if extra else {})
        blocks = harness.time_steps(steps, opts["repeats"], opts["block_seconds"], opts["warmup"])
        row = {
            "suite": suite, "dataset": dataset, "synthetic": problem["synthetic"], "num_data": len(X),
            "input_dim": X.shape[1], "M": M, "batch": opts["batch"], "dtype": "float32", "device": harness.device_name(),
            "threads": harness.threads(), "repeats": opts["repeats"], "load_average": harness.load_average(),
            **(measure(group, steps) if measure else {}),
        }
        close(group)
        for key, values in blocks.items():
            row[f"seconds_{key}"], row[f"blocks_{key}"] = harness.median(values), values
        rows.append(row)
    return rows
