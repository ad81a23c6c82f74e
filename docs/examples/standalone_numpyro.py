"""Stand-alone SVGP regression and classification with NumPyro's SVI.

``GPModel(prior, likelihood)`` is a model/guide pair whose ELBO is the SVGP bound with a
closed-form (Gaussian) or Gauss-Hermite (Bernoulli) data term, so the loss has no Monte Carlo
noise beyond the minibatch.
"""
import jax
import jax.numpy as jnp
import numpyro
from jax.scipy.special import ndtr
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO

import numpyro_sparsegp as nsg


def toy_data(num_data=500, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    X = jax.random.uniform(k1, (num_data, 1), minval=-5, maxval=5)
    f = jnp.sin(X[:, 0]) + 0.3 * X[:, 0]
    labels = jax.random.bernoulli(k3, ndtr(3 * f)).astype(X.dtype)
    return X, f + 0.2 * jax.random.normal(k2, (num_data,)), labels


def train(likelihood, X, y, num_steps=800, batch_size=100):
    prior = nsg.SVGP(nsg.RBF(lengthscale=1.0), jnp.linspace(-5, 5, 15)[:, None])
    model = nsg.GPModel(prior, likelihood)
    svi = SVI(model.model, model.guide, numpyro.optim.Adam(0.02), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), num_steps, X, y, subsample_size=batch_size, progress_bar=False)
    return model, result


def regression():
    X, y, _ = toy_data()
    model, result = train(nsg.Gaussian(variance=1.0), X, y)
    Xtest = jnp.linspace(-5, 5, 101)[:, None]
    mean, var = handlers.substitute(model.predict_f, data=result.params)(Xtest)
    rmse = float(jnp.sqrt(jnp.mean((mean - (jnp.sin(Xtest[:, 0]) + 0.3 * Xtest[:, 0])) ** 2)))
    return rmse, float(result.params["likelihood.variance"]) ** 0.5


def classification():
    X, _, labels = toy_data()
    model, result = train(nsg.Bernoulli(link="probit"), X, labels)
    Xtest = jnp.linspace(-5, 5, 101)[:, None]
    mean, var = handlers.substitute(model.predict_f, data=result.params)(Xtest)
    p = ndtr(mean / jnp.sqrt(1 + var))  # p(y = 1) under the probit link
    return float(jnp.mean((p > 0.5) == (jnp.sin(Xtest[:, 0]) + 0.3 * Xtest[:, 0] > 0)))


if __name__ == "__main__":
    rmse, noise = regression()
    print(f"regression: RMSE to the true function {rmse:.3f}, learnt noise sd {noise:.3f} (true 0.2)")
    print(f"classification: agreement with the Bayes classifier {classification():.3f}")
