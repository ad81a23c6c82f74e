"""A GP prior inside a larger NumPyro model: counts with a smooth trend and group effects.

    y_n ~ Poisson(exp(f(x_n) + effect[g_n])),   f ~ GP (SVGP component),
    effect_g ~ N(0, scale^2),                    scale ~ HalfNormal(1).

The GP component samples its own sites (``gp.u``, ``gp.kl``, ``gp.f``) and returns ``f`` at the
minibatch; the rest of the model is guided by an autoguide that does not see the GP's sites.
"""
import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import SVI, TraceMeanField_ELBO
from numpyro.infer.autoguide import AutoNormal

import numpyro_sparsegp as nsg


def simulate(num_data=3000, num_groups=6, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.uniform(k1, (num_data, 1), minval=-3, maxval=3)
    g = jax.random.randint(k2, (num_data,), 0, num_groups)
    effect = jnp.linspace(-0.8, 0.8, num_groups)
    rate = jnp.exp(0.3 + jnp.sin(2 * x[:, 0]) + effect[g])
    return x, g, jax.random.poisson(k3, rate).astype(x.dtype), effect


def fit(x, g, y, num_groups, num_steps=1500, batch_size=256, elbo=None, seed=0):
    gp = nsg.SVGP(nsg.Matern52(lengthscale=1.0), jnp.linspace(-3, 3, 16)[:, None], name="gp")

    def model(x, g, y):
        data = numpyro.plate("data", len(x), subsample_size=batch_size)
        f = gp.model(x, data)  # (batch,) -- call it outside the plate: u is global
        scale = numpyro.sample("scale", dist.HalfNormal(1.0))
        with numpyro.plate("groups", num_groups):
            effect = numpyro.sample("effect", dist.Normal(0.0, scale))
        with data as idx:  # effect[..., g]: the export can then draw all draws at once
            numpyro.sample("y", dist.Poisson(jnp.exp(f + effect[..., g[idx]])), obs=y[idx])

    autoguide = AutoNormal(handlers.block(model, hide=list(gp.site_names)))

    def guide(x, g, y):
        data = numpyro.plate("data", len(x), subsample_size=batch_size)
        gp.guide(x, data)
        autoguide(x, g, y)

    svi = SVI(model, guide, numpyro.optim.Adam(0.02), elbo or TraceMeanField_ELBO())
    result = svi.run(jax.random.PRNGKey(seed), num_steps, x, g, y, progress_bar=False)
    return gp, autoguide, result


if __name__ == "__main__":
    x, g, y, effect = simulate()
    gp, autoguide, result = fit(x, g, y, num_groups=len(effect))
    estimate = autoguide.median(result.params)["effect"]
    print("true effects (centred):     ", (effect - effect.mean()).round(2))
    print("estimated effects (centred):", (estimate - estimate.mean()).round(2))
