"""Comparing two optimisation trajectories (the same model fitted by Pyro and by NumPyro) at a
tolerance derived from how sensitive the trajectory is to round-off.

Both backends compute the same loss and gradients at the same parameters, to about 1e-14 of the
gradient's scale where the model is well conditioned (the tests check that at 1e-10). After
several Adam steps the parameters agree far less well, and how well depends on the BLAS and the
CPU: Adam's step is ``lr * m / (sqrt(v) + 1e-8)``, so an entry whose exact gradient is 0 (the
inducing inputs and lengthscales of a whitened SVGP at ``q = p``, say) moves by
``lr * g / (|g| + 1e-8)`` with ``g`` whatever round-off left there: 1e-16 of round-off becomes a
5e-10 step (1e-15, 5e-9), of either sign, and the coupling of the parameters carries it to the
others in the next steps. A fixed tolerance is then either loose everywhere or flaky on some
machine (1e-7 failed on CI's: ``gp.q_sqrt`` 2.1e-8 off after 4 steps).

So the tolerance is measured: the reference run (Pyro) is repeated with every gradient entry
perturbed, at every step, by ``eps * max|g| * N(0, 1)`` (``max`` over all the parameters of
that step: a bound on the round-off of an entry whose exact value cancels from terms the size of
the gradient; what the backends leave in such entries is about 5e-16, 1/20 to 1/80 of it in the
tests), and ``FACTOR`` times the largest deviation of those runs from the reference, plus
``RTOL`` of the value, is the tolerance of each compared quantity (each step's loss, each
parameter, each prediction). A real difference (a parameter not trained, another learning rate
or Adam constant, a gradient wrong in one of its terms) moves the parameters by a fraction of
``lr`` per step, far beyond it; a gradient wrong by a constant factor leaves Adam's steps as
they were, which is why the gradients themselves are compared
(:func:`assert_same_loss_and_gradients`).
"""
import zlib

import jax
import numpy as np
import numpyro

try:
    import pyro
    import torch
    from pyro import poutine
    from torch.distributions import transform_to
except ModuleNotFoundError:  # the newest-versions tier (.ci/newest) installs the NumPyro extras only
    pyro = torch = None

#: the tolerance is this many times the largest deviation of the perturbed runs (3 random
#: perturbations sample the directions round-off can take: a safety factor for an unlucky draw
#: and for a machine whose round-off is larger than this one's)
FACTOR = 4.0
#: and at least this relative difference (what is left where nothing amplifies round-off)
RTOL = 1e-10
SEEDS = (0, 1, 2)


def noisy_adam(seed):
    """``torch.optim.Adam`` whose gradients get ``eps * max|g| * N(0, 1)`` added to each entry
    before every step (``max`` over every parameter's gradient; ``eps`` of their dtype)."""
    generator = torch.Generator().manual_seed(seed)

    class NoisyAdam(torch.optim.Adam):
        @torch.no_grad()
        def step(self, closure=None):
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            scale = torch.finfo(grads[0].dtype).eps * max(float(g.abs().max()) for g in grads)
            for g in grads:
                g.add_(scale * torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device))
            return super().step(closure)

    return NoisyAdam


def spread(run, reference):
    """``{key: largest |run(noisy_adam(seed))[key] - reference[key]| over the seeds and the
    key's entries}``; ``run(optimizer)`` fits the reference's model with that torch optimiser
    class and returns ``{key: array}`` like ``reference``."""
    out = {key: 0.0 for key in reference}
    for seed in SEEDS:
        for key, value in run(noisy_adam(seed)).items():
            out[key] = max(out[key], float(np.max(np.abs(np.asarray(value) - reference[key]), initial=0.0)))
    return out


def assert_same_trajectory(expected, actual, spread):
    """``|actual - expected| <= RTOL * |expected| + FACTOR * spread[key]`` for every key (the keys
    must match); returns ``{key: largest |actual - expected| / tolerance}`` (the margin is its inverse)."""
    assert expected.keys() == actual.keys(), (sorted(expected), sorted(actual))
    ratios, failures = {}, []
    for key, want in expected.items():
        want, got = np.asarray(want, dtype=float), np.asarray(actual[key], dtype=float)
        assert want.shape == got.shape, (key, want.shape, got.shape)
        tol = RTOL * np.abs(want) + FACTOR * spread[key]
        diff = np.abs(got - want)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[key] = float(np.max(np.where(diff == 0, 0.0, diff / tol), initial=0.0))
        if not np.all(diff <= tol):  # NaN fails too
            failures.append(f"{key}: max |difference| {np.max(diff):.3g} (tolerance {np.max(tol):.3g}, "
                            f"spread of the perturbed runs {spread[key]:.3g})")
    assert not failures, "the trajectories differ beyond round-off:\n" + "\n".join(failures)
    return ratios


def shift(name, shape):
    """A fixed direction to move the unconstrained parameter ``name`` in (the same in every
    backend and run): standard normal entries seeded by the name."""
    return np.random.default_rng(zlib.crc32(name.encode())).normal(size=shape)


def loss_and_gradients(backend, model, guide, args, moves=(0.0,)):
    """``[(loss, {name: gradient}, {name: value}) for move in moves]``: the loss ``fit``
    minimises (``Trace_ELBO``), its gradients with respect to the unconstrained parameters (what
    Adam sees; both backends unconstrain the same way, so they have the same shapes) and the
    constrained values, at the unconstrained initial values plus ``move * shift(name)``."""
    out = []
    if backend.name == "pyro":
        loss_fn = pyro.infer.Trace_ELBO().differentiable_loss
        with poutine.trace(param_only=True) as capture:
            loss_fn(model, guide, *args)
        names = sorted(capture.trace.nodes)
        sites = [capture.trace.nodes[name] for name in names]
        free = [site["value"].unconstrained() for site in sites]
        initial = [u.detach().clone() for u in free]
        for move in moves:
            with torch.no_grad():
                for name, u, u0 in zip(names, free, initial):
                    u.copy_(u0 + move * torch.as_tensor(shift(name, tuple(u.shape)), dtype=u.dtype))
            loss = loss_fn(model, guide, *args)
            grads = torch.autograd.grad(loss, free, allow_unused=True)  # a held parameter has none: zero
            grads = [torch.zeros_like(u) if g is None else g for g, u in zip(grads, free)]
            with torch.no_grad():
                values = [transform_to(site["kwargs"]["constraint"])(u) for site, u in zip(sites, free)]
            out.append((float(loss.detach()), {name: backend.numpy(g) for name, g in zip(names, grads)},
                        {name: backend.numpy(v).copy() for name, v in zip(names, values)}))  # not views of u
        return out
    elbo, key = numpyro.infer.Trace_ELBO(), jax.random.PRNGKey(0)
    svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.0), elbo)
    # jit-compiled: one program to compile (eagerly, each operation compiles its own, 3 to 5 times slower)
    initial = svi.optim.get_params(jax.jit(svi.init)(key, *args).optim_state)
    value_and_grad = jax.jit(jax.value_and_grad(lambda u: elbo.loss(key, svi.constrain_fn(u), model, guide, *args)))
    for move in moves:
        free = {name: u + move * shift(name, u.shape) for name, u in initial.items()}
        loss, grads = value_and_grad(free)
        out.append((float(loss), {name: np.asarray(g) for name, g in grads.items()},
                    {name: np.asarray(v) for name, v in svi.constrain_fn(free).items()}))
    return out


def assert_same_loss_and_gradients(expected, actual, rtol=1e-10):
    """Two ``loss_and_gradients`` of the same parameters: the same values, the losses to ``rtol``,
    and each parameter's gradient to ``rtol`` times the larger of its own largest entry and 1e-3
    of the whole gradient's (the floor for a parameter whose exact gradient is 0 at these values,
    the inducing inputs at ``q = p`` say, where only round-off is left). Returns the largest ratio
    of a difference to its tolerance (the margin is its inverse)."""
    (loss_a, grads_a, values_a), (loss_b, grads_b, values_b) = expected, actual
    assert grads_a.keys() == grads_b.keys() == values_a.keys() == values_b.keys(), (sorted(grads_a), sorted(grads_b))
    for name in values_a:
        np.testing.assert_allclose(values_b[name], values_a[name], rtol=1e-12, atol=1e-14, err_msg=name)
    assert abs(loss_b - loss_a) <= rtol * abs(loss_a), (loss_a, loss_b)
    ratios = [abs(loss_b - loss_a) / (rtol * abs(loss_a))]
    scale = max(float(np.max(np.abs(g), initial=0.0)) for g in grads_a.values())
    for name, g in grads_a.items():
        assert np.shape(grads_b[name]) == np.shape(g), name
        diff = float(np.max(np.abs(grads_b[name] - g), initial=0.0))
        tol = rtol * max(float(np.max(np.abs(g), initial=0.0)), 1e-3 * scale)
        assert diff <= tol, f"gradient of {name}: max |difference| {diff:.3g} > {tol:.3g}"
        ratios.append(diff / tol if tol > 0 else 0.0)
    return max(ratios)
