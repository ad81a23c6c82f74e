"""The SVGPs the suites compare, each as a :class:`Runner`: one SVI step on the next minibatch, and
the predictive distribution of ``y`` at test inputs.

Every runner gets the same data, inducing inputs ``Z`` (rows of the training set), minibatch
stream, kernel (squared exponential with one lengthscale per input), initial hyperparameters,
Adam learning rate and dtype (float32), and slices its minibatch in its step the same way:

* ``ours (Pyro)``: ``GPModel(SVGP(...), Gaussian(), num_data=N)`` with external minibatches,
  ``Trace_ELBO().differentiable_loss``, ``backward`` and ``torch.optim.Adam`` over the param
  store's unconstrained parameters, as ``pyro_sparsegp.fit`` steps;
* ``ours (NumPyro, jit)``: ``numpyro.infer.SVI(...).update`` under ``jax.jit``, gathering the
  minibatch inside the compiled step, as ``numpyro_sparsegp.fit`` does;
* ``GPyTorch``: ``ApproximateGP`` with ``CholeskyVariationalDistribution`` and
  ``VariationalStrategy(learn_inducing_locations=True)``, ``GaussianLikelihood``,
  ``VariationalELBO``, ``ScaleKernel(RBFKernel(ard_num_dims=D))``, zero mean;
* ``pyro.contrib.gp``: ``VariationalSparseGP(whiten=True)`` with ``TraceMeanField_ELBO`` and
  ``set_data`` per minibatch (its Gaussian data term is the predictive ``log N(y | mu, var + s2)``,
  not the ELBO's expected log-likelihood).

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
        batches: iterator of row-index arrays ``(B,)``.
        lr: Adam learning rate.
    """

    name = None  # for tables
    key = None  # for JSON and code

    def step(self):
        """One SVI step on the next minibatch; returns the loss (a Python float)."""
        raise NotImplementedError

    def predict(self, X):
        """Predictive mean and variance of ``y`` at ``X`` ``(T, D)``: two NumPy float64 ``(T,)``."""
        raise NotImplementedError


class OursPyro(Runner):
    name = "ours (Pyro)"
    key = "ours_pyro"
    # Not the default name "likelihood": pyro.contrib.gp's Gaussian has that name in the same param store.
    likelihood_name = "ours_likelihood"

    def __init__(self, X, y, Z, batches, lr):
        import pyro
        import torch
        from pyro import poutine

        import pyro_sparsegp as psg

        self.X, self.y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
        kernel = psg.RBF(lengthscale=torch.full((X.shape[1],), LENGTHSCALE), variance=VARIANCE)
        prior = self.prior(kernel, torch.as_tensor(Z, dtype=torch.float32))
        likelihood = psg.Gaussian(variance=NOISE, name=self.likelihood_name)
        self.gp = psg.GPModel(prior, likelihood, num_data=len(X))
        self.loss = pyro.infer.Trace_ELBO().differentiable_loss
        self.batches = batches
        with poutine.trace(param_only=True) as capture:  # create the parameters, as fit does
            self.loss(self.gp.model, self.gp.guide, self.X[:2], self.y[:2])
        store = pyro.get_param_store()
        params = [store.get_param(name).unconstrained() for name in sorted(capture.trace.nodes)]
        self.opt = torch.optim.Adam(params, lr=lr)

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches))
        self.opt.zero_grad()
        loss = self.loss(self.gp.model, self.gp.guide, self.X[idx], self.y[idx])
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def prior(self, kernel, Z):
        """The GP prior component trained (the suites swap in other priors)."""
        import pyro_sparsegp as psg

        return psg.SVGP(kernel, Z)

    def predict(self, X):
        import torch

        with torch.no_grad():
            mean, var = self.gp.predict_f(torch.as_tensor(X, dtype=torch.float32))
            var = var + self.gp.likelihood.variance
        return mean.double().numpy(), var.double().numpy()


class OursNumPyro(Runner):
    name = "ours (NumPyro, jit)"
    key = "ours_numpyro"

    def __init__(self, X, y, Z, batches, lr):
        import jax
        import jax.numpy as jnp
        import numpyro
        from numpyro.infer import SVI, Trace_ELBO

        import numpyro_sparsegp as nsg

        self.data = (jnp.asarray(X, dtype=jnp.float32), jnp.asarray(y, dtype=jnp.float32))
        kernel = nsg.RBF(lengthscale=jnp.full((X.shape[1],), LENGTHSCALE, dtype=jnp.float32), variance=VARIANCE)
        prior = self.prior(kernel, jnp.asarray(Z, dtype=jnp.float32))
        self.gp = nsg.GPModel(prior, nsg.Gaussian(variance=NOISE), num_data=len(X))
        self.svi = SVI(self.gp.model, self.gp.guide, numpyro.optim.Adam(lr), Trace_ELBO())
        self.batches = batches
        self.state = self.svi.init(jax.random.PRNGKey(0), *(a[:2] for a in self.data))
        self.update = jax.jit(lambda state, data, idx: self.svi.update(state, *(a[idx] for a in data)))

    def step(self):
        self.state, loss = self.update(self.state, self.data, next(self.batches))
        return float(loss)

    def prior(self, kernel, Z):
        """The GP prior component trained (the suites swap in other priors)."""
        import numpyro_sparsegp as nsg

        return nsg.SVGP(kernel, Z)

    def predict(self, X):
        import jax.numpy as jnp
        from numpyro import handlers

        params = self.svi.get_params(self.state)
        mean, var = handlers.substitute(self.gp.predict_f, data=params)(jnp.asarray(X, dtype=jnp.float32))
        var = var + params["likelihood.variance"]
        return np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)


class GPyTorch(Runner):
    name = "GPyTorch"
    key = "gpytorch"

    def __init__(self, X, y, Z, batches, lr):
        import gpytorch
        import torch

        class SVGPModel(gpytorch.models.ApproximateGP):
            def __init__(self, Z):
                q = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[0])
                strategy = gpytorch.variational.VariationalStrategy(self, Z, q, learn_inducing_locations=True)
                super().__init__(strategy)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1]))

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        self.X, self.y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
        self.model = SVGPModel(torch.as_tensor(Z, dtype=torch.float32))
        self.model.covar_module.base_kernel.lengthscale = torch.full((1, X.shape[1]), LENGTHSCALE)
        self.model.covar_module.outputscale = VARIANCE
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.likelihood.noise = NOISE
        self.mll = gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=len(X))
        params = list(self.model.parameters()) + list(self.likelihood.parameters())
        self.opt = torch.optim.Adam(params, lr=lr)
        self.batches = batches
        self.model.train()
        self.likelihood.train()

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches))
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
                pred = self.likelihood(self.model(torch.as_tensor(X, dtype=torch.float32)))
                return pred.mean.double().numpy(), pred.variance.double().numpy()
        finally:
            self.model.train()
            self.likelihood.train()


class ContribGP(Runner):
    name = "pyro.contrib.gp"
    key = "contrib_gp"

    def __init__(self, X, y, Z, batches, lr):
        import pyro
        import pyro.contrib.gp as gp
        import torch

        self.X, self.y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
        kernel = gp.kernels.RBF(
            input_dim=X.shape[1], lengthscale=torch.full((X.shape[1],), LENGTHSCALE), variance=torch.tensor(VARIANCE)
        )
        likelihood = gp.likelihoods.Gaussian(variance=torch.tensor(NOISE))
        self.model = gp.models.VariationalSparseGP(
            self.X[:2], self.y[:2], kernel, torch.as_tensor(Z, dtype=torch.float32), likelihood,
            num_data=len(X), whiten=True,
        )
        self.loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.batches = batches

    def step(self):
        import torch

        idx = torch.as_tensor(next(self.batches))
        self.model.set_data(self.X[idx], self.y[idx])
        self.opt.zero_grad()
        loss = self.loss(self.model.model, self.model.guide)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def predict(self, X):
        import torch

        with torch.no_grad():
            mean, var = self.model(torch.as_tensor(X, dtype=torch.float32))
            var = var + self.model.likelihood.variance
        return mean.double().numpy(), var.double().numpy()


RUNNERS = {runner.key: runner for runner in (OursPyro, OursNumPyro, GPyTorch, ContribGP)}


def build(keys, X, y, Z, batch_size, lr=0.01, seed=0):
    """The runners ``keys`` (keys of :data:`RUNNERS`) on the same problem, side by side.

    Pyro's param store is cleared once here, before any of them is built: the Pyro runners then
    share it without clashing names, and clearing it later would detach their parameters.

    Returns:
        ``{key: runner}``; each runner draws its own stream of the same minibatches
        (:func:`~benchmarks.harness.minibatches` with ``seed``).
    """
    import pyro

    from .harness import minibatches

    pyro.clear_param_store()
    return {key: RUNNERS[key](X, y, Z, minibatches(len(X), batch_size, seed), lr) for key in keys}
