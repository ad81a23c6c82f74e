"""A GP prior inside a larger Pyro model: counts with a smooth trend and group effects.

    y_n ~ Poisson(exp(f(x_n) + effect[g_n])),   f ~ GP (SVGP component),
    effect_g ~ N(0, scale^2),                    scale ~ HalfNormal(1).

The GP component samples its own sites (``gp.u``, ``gp.kl``, ``gp.f``) and returns ``f`` at the
minibatch; the rest of the model is guided by an autoguide that does not see the GP's sites.
"""
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_sparsegp as psg


def simulate(num_data=3000, num_groups=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(num_data, 1, generator=generator) * 6 - 3
    g = torch.randint(0, num_groups, (num_data,), generator=generator)
    effect = torch.linspace(-0.8, 0.8, num_groups)
    rate = torch.exp(0.3 + torch.sin(2 * x[:, 0]) + effect[g])
    return x, g, torch.poisson(rate, generator=generator), effect


def fit(x, g, y, num_groups, num_steps=1500, batch_size=256, elbo=None, seed=0):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    gp = psg.SVGP(psg.Matern52(lengthscale=1.0), torch.linspace(-3, 3, 16)[:, None], name="gp")

    def model(x, g, y):
        data = pyro.plate("data", len(x), subsample_size=batch_size)
        f = gp.model(x, data)  # (batch,) -- call it outside the plate: u is global
        scale = pyro.sample("scale", dist.HalfNormal(1.0))
        with pyro.plate("groups", num_groups):
            effect = pyro.sample("effect", dist.Normal(0.0, scale))
        with data as idx:  # effect[..., g]: the export can then draw all draws at once
            pyro.sample("y", dist.Poisson(torch.exp(f + effect[..., g[idx]])), obs=y[idx])

    autoguide = AutoNormal(poutine.block(model, hide=list(gp.site_names)))

    def guide(x, g, y):
        data = pyro.plate("data", len(x), subsample_size=batch_size)
        gp.guide(x, data)
        autoguide(x, g, y)

    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), elbo or TraceMeanField_ELBO())
    losses = [svi.step(x, g, y) for _ in range(num_steps)]
    return gp, autoguide, losses


if __name__ == "__main__":
    x, g, y, effect = simulate()
    gp, autoguide, losses = fit(x, g, y, num_groups=len(effect))
    estimate = autoguide.median()["effect"]
    print("true effects (centred):     ", (effect - effect.mean()).numpy().round(2))
    print("estimated effects (centred):", (estimate - estimate.mean()).detach().numpy().round(2))
