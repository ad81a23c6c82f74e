"""Stand-alone SVGP regression and classification with Pyro's SVI.

``GPModel(prior, likelihood)`` is a model/guide pair whose ELBO is the SVGP bound with a
closed-form (Gaussian) or Gauss-Hermite (Bernoulli) data term, so the loss has no Monte Carlo
noise beyond the minibatch.
"""
import pyro
import torch
from pyro.infer import SVI, Trace_ELBO

import pyro_sparsegp as psg


def toy_data(num_data=500, seed=0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(num_data, 1, generator=generator, dtype=torch.float64) * 10 - 5
    f = torch.sin(X[:, 0]) + 0.3 * X[:, 0]
    labels = torch.bernoulli(torch.special.ndtr(3 * f), generator=generator)
    return X, f + 0.2 * torch.randn(num_data, generator=generator, dtype=X.dtype), labels


def train(make_likelihood, X, y, num_steps=800, batch_size=100):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    likelihood = make_likelihood()
    prior = psg.SVGP(psg.RBF(lengthscale=torch.ones(1, dtype=X.dtype)), torch.linspace(-5, 5, 15, dtype=X.dtype)[:, None])
    model = psg.GPModel(prior, likelihood)
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    losses = [svi.step(X, y, subsample_size=batch_size) for _ in range(num_steps)]
    return model, losses


def regression():
    X, y, _ = toy_data()
    model, losses = train(lambda: psg.Gaussian(variance=1.0), X, y)
    Xtest = torch.linspace(-5, 5, 101, dtype=X.dtype)[:, None]
    mean, var = model.predict_f(Xtest)
    rmse = (mean - (torch.sin(Xtest[:, 0]) + 0.3 * Xtest[:, 0])).pow(2).mean().sqrt().item()
    return rmse, model.likelihood.variance.item() ** 0.5


def classification():
    X, _, labels = toy_data()
    model, losses = train(lambda: psg.Bernoulli(link="probit"), X, labels)
    Xtest = torch.linspace(-5, 5, 101, dtype=X.dtype)[:, None]
    mean, var = model.predict_f(Xtest)
    p = torch.special.ndtr(mean / (1 + var).sqrt())  # p(y = 1) under the probit link
    truth = torch.sin(Xtest[:, 0]) + 0.3 * Xtest[:, 0] > 0
    return ((p > 0.5) == truth).to(X.dtype).mean().item()


if __name__ == "__main__":
    rmse, noise = regression()
    print(f"regression: RMSE to the true function {rmse:.3f}, learnt noise sd {noise:.3f} (true 0.2)")
    print(f"classification: agreement with the Bayes classifier {classification():.3f}")
