"""Harmonic kernel decomposition: the groups, the real weights and the component features against a
dense reference that builds the inducing variables from the orbit points' joint prior."""
import numpy as np
import pytest
import reference as ref

from sparsegp_common.features import harmonic as core
from sparsegp_common.ops import namespace


def _rotation(angle):
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def _groups():
    """name -> (transformation, the group's maps as NumPy functions in W's column order, D):
    the maps written here from their definitions, not with the library's ``apply``."""
    basis = np.linalg.qr(np.random.default_rng(7).normal(size=(3, 3)))[0]
    center = np.array([0.3, -0.2, 0.1])

    def reflect(signs):
        return lambda x: center + (x - center) @ basis @ np.diag(signs) @ basis.T

    def roll(a, b, shape=(4, 4), step=(2, 2)):
        return lambda x: np.roll(x.reshape(-1, *shape), (step[0] * a, step[1] * b), axis=(1, 2)).reshape(x.shape)

    def flip(a, b):  # a 3 x 4 image upside down (a) and left to right (b)
        return lambda x: x.reshape(-1, 3, 4)[:, :: (-1) ** a, :: (-1) ** b].reshape(x.shape)

    return {
        "negation": (core.Negation(center=0.5), [lambda x: x, lambda x: 1.0 - x], 2),
        "axes": (core.Reflections.along_axes([[0], [1, 2]]),
                 [lambda x, s=s: x * np.array([(-1) ** s[0], (-1) ** s[1], (-1) ** s[1]]) for s in np.ndindex(2, 2)], 3),
        "pca": (core.Reflections([[0, 2], [1]], basis, center),
                [reflect([(-1) ** s[0], (-1) ** s[1], (-1) ** s[0]]) for s in np.ndindex(2, 2)], 3),
        "rotation5": (core.Rotation(5), [lambda x, s=s: x @ _rotation(2 * np.pi * s / 5).T for s in range(5)], 2),
        "translation": (core.ImageTranslation((4, 4), 2), [roll(a, b) for a, b in np.ndindex(2, 2)], 16),
        "translation_4x6": (core.ImageTranslation((4, 6), (2, 3)),
                            [roll(a, b, (4, 6), (2, 3)) for a, b in np.ndindex(2, 2)], 24),
        "flips": (core.ImageFlips((3, 4)), [flip(a, b) for a, b in np.ndindex(2, 2)], 12),
        "rotation4_x_flip": (
            core.MultiWay(core.Rotation(4), core.Reflections.along_axes([[2]])),
            [lambda x, s=s: np.concatenate([x[:, :2] @ _rotation(np.pi * s[0] / 2).T, x[:, 2:] * (-1) ** s[1]], axis=1)
             for s in np.ndindex(4, 2)], 3),
        # a map of the user's (not isometric to the library): the kernels of the transformed inputs
        "cyclic_user_map": (core.CyclicMap(lambda x: x[..., [1, 2, 0]] + 0.0, 3),
                            [lambda x, s=s: x[:, np.roll([0, 1, 2], -s)] for s in range(3)], 3),
    }


GROUPS = _groups()


@pytest.mark.parametrize("order", range(1, 9))
def test_real_weights(order):
    """The real rows from the complex DFT; the columns sum to the identity element's indicator (the
    components sum to k); row 0 is 1 / T~."""
    W = core.real_weights(order)
    np.testing.assert_allclose(W, ref.harmonic_weights(order), atol=1e-15)
    np.testing.assert_allclose(W.sum(axis=0), np.eye(order)[0], atol=1e-15)
    np.testing.assert_allclose(W[0], 1 / order)
    if order == 2:
        np.testing.assert_array_equal(W, [[0.5, 0.5], [0.5, -0.5]])
    multi = core.MultiWay(core.Rotation(order), core.Negation()).weights()
    np.testing.assert_allclose(multi, np.kron(W, ref.harmonic_weights(2)), atol=1e-15)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_group_maps(name, rng):
    """``apply`` is the group's map and obeys the group law ``G^a G^b = G^(a+b mod T~)``."""
    transformation, maps, D = GROUPS[name]
    X = rng.normal(size=(5, D))
    elements = transformation.elements
    assert len(elements) == len(maps) == transformation.weights().shape[1]
    for s, G in zip(elements, maps):
        np.testing.assert_allclose(transformation.apply(X, s), G(X), atol=1e-12, err_msg=str(s))
        for s2 in elements:
            total = tuple((a + b) % n for a, b, n in zip(s, s2, transformation.orders))
            np.testing.assert_allclose(transformation.apply(transformation.apply(X, s), s2), transformation.apply(X, total),
                                       atol=1e-12, err_msg=f"{s} then {s2}")
        np.testing.assert_allclose(transformation.apply(G(X), transformation.inverse(s)), X, atol=1e-12)
        if transformation.isometric:  # an isometry about the centre: what the kernels' reuse relies on
            GX, center = G(X), np.asarray(transformation.center)
            np.testing.assert_allclose(transformation.linear(X - center, s), GX - center, atol=1e-12)
            np.testing.assert_allclose(np.linalg.norm(GX[:, None] - GX[None], axis=-1),
                                       np.linalg.norm(X[:, None] - X[None], axis=-1), atol=1e-12)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("name", sorted(GROUPS))
def test_features_and_elbo_against_the_orbit(backend, rng, name, whiten):
    """Kuu is block-diagonal (the dense reference's off-diagonal blocks vanish for any locations),
    its blocks and Kuf are the orbit's covariances, and q(f) and the ELBO of the SVGP with one q
    block per component are the dense formulas' with the whole ``K_UU``."""
    lib, (transformation, maps, D), m, noise, jitter = backend.lib, GROUPS[name], 3, 0.4, 1e-6
    T = transformation.num_components
    X, y, Z = rng.normal(size=(12, D)), rng.normal(size=12), rng.normal(size=(T, m, D))
    kern = ("matern32", [1.3], 0.8)
    KUU, KUf = ref.harmonic_covariances(lambda A, B: ref.kernel(kern[0], A, B, *kern[1:]), maps, transformation.weights(), Z, X)
    blocks = [slice(t * m, (t + 1) * m) for t in range(T)]
    off = KUU - np.kron(np.eye(T), np.ones((m, m))) * KUU
    assert np.abs(off).max() < 1e-12 * np.abs(KUU).max(), "components are not orthogonal"

    q_mu = rng.normal(size=(T, m))
    q_sqrt = np.tril(rng.normal(size=(T, m, m)) * 0.3, -1) + np.eye(m) * rng.uniform(0.3, 1.2, size=(T, m, 1))
    features = lib.HarmonicFeatures(backend.array(Z), transformation)
    gp = backend.set(lib.SVGP(backend.kernel(*kern), features, whiten=whiten, jitter=jitter), q_mu=q_mu, q_sqrt=q_sqrt)
    bound = backend.bound(gp)
    Kuu, Kuf = (backend.numpy(a) for a in (lib.Kuu(bound.features, bound.kernel),
                                           lib.Kuf(bound.features, bound.kernel, backend.array(X))))
    np.testing.assert_allclose(Kuu, np.stack([KUU[b, b] for b in blocks]), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(Kuf, np.stack([KUf[b] for b in blocks]), rtol=1e-10, atol=1e-13)
    for t in range(T):
        assert np.linalg.eigvalsh(Kuu[t]).min() > -1e-12 * np.abs(Kuu).max(), f"block {t} is not PSD"

    mean_ref, cov_ref, kl_ref = ref.block_q_predict(KUU, KUf, ref.kernel(kern[0], X, X, *kern[1:]), q_mu, q_sqrt, jitter, whiten)
    mean, cov = (backend.numpy(a) for a in gp.predict_f(backend.array(X), full_cov=True))
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, cov_ref, rtol=1e-8, atol=1e-10)
    model = lib.GPModel(gp, backend.set(lib.Gaussian(), variance=noise))
    expected = ref.gaussian_ell(noise)(y, mean_ref, np.diag(cov_ref)).sum() - kl_ref
    assert float(backend.numpy(model.elbo(backend.array(X), backend.array(y)))) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", ["negation", "axes"])
def test_axis_flips_with_ard_lengthscales(backend, rng, name):
    """Maps that keep the axes allow one lengthscale per dimension: the blocks of Kuu and Kuf are
    still the orbit's covariances (the inputs scaled once, then flipped)."""
    transformation, maps, D = GROUPS[name]
    T, m = transformation.num_components, 3
    X, Z, lengthscale = rng.normal(size=(9, D)), rng.normal(size=(T, m, D)), rng.uniform(0.5, 2.0, size=D)
    KUU, KUf = ref.harmonic_covariances(lambda A, B: ref.kernel("matern52", A, B, lengthscale, 0.8), maps,
                                        transformation.weights(), Z, X)
    features = backend.lib.HarmonicFeatures(backend.array(Z), transformation)
    gp = backend.bound(backend.lib.SVGP(backend.kernel("matern52", lengthscale, 0.8), features))
    blocks = [slice(t * m, (t + 1) * m) for t in range(T)]
    np.testing.assert_allclose(backend.numpy(backend.lib.Kuu(gp.features, gp.kernel)),
                               np.stack([KUU[b, b] for b in blocks]), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(backend.numpy(backend.lib.Kuf(gp.features, gp.kernel, backend.array(X))),
                               np.stack([KUf[b] for b in blocks]), rtol=1e-10, atol=1e-13)


def _flip_cases():
    """name -> (transformation, maps, D) for the squared exponential's closed form: the groups of
    sign flips above, a way that flips one of three principal directions (a remainder r), and
    three ways of one principal direction each."""
    basis = np.linalg.qr(np.random.default_rng(8).normal(size=(3, 3)))[0]
    center = np.array([0.2, 0.0, -0.3])
    partial = (core.Reflections([[1]], basis, center),
               [lambda x, s=s: center + (x - center) @ basis @ np.diag([1, (-1) ** s, 1]) @ basis.T for s in range(2)], 3)
    three = (core.Reflections([[0], [1], [2]], basis, center),  # J = 3 (the paper's regressions): products of 3 factors
             [lambda x, s=s: center + (x - center) @ basis @ np.diag(np.power(-1.0, s)) @ basis.T
              for s in np.ndindex(2, 2, 2)], 3)
    return {**{name: GROUPS[name] for name in ("negation", "axes", "pca")}, "pca_partial": partial, "pca_3_ways": three}


@pytest.mark.parametrize("name", sorted(_flip_cases()))
def test_squared_exponential_under_sign_flips_in_closed_form(backend, rng, name):
    """Under sign flips (Negation, Reflections) the squared exponential's components are a product
    of cosh and sinh of the ways' inner products: Kuu and Kuf are the orbit's covariances, also with
    an inducing input and a data point at the centre (every way's inner product zero, where sinh's
    derivative is 1), and their gradients with respect to Z (per component or shared), X and (Pyro)
    the kernel's parameters are the orbit sum's."""
    transformation, maps, D = _flip_cases()[name]
    T, m, lib = transformation.num_components, 3, backend.lib
    X, Z = rng.normal(size=(9, D)), rng.normal(size=(T, m, D))
    Z[:, 0], X[0] = transformation.center, transformation.center
    lengthscale = rng.uniform(0.5, 2.0, size=D) if transformation.keeps_axes else [1.3]
    KUU, KUf = ref.harmonic_covariances(lambda A, B: ref.kernel("rbf", A, B, lengthscale, 0.8), maps,
                                        transformation.weights(), Z, X)
    gp = backend.bound(lib.SVGP(backend.kernel("rbf", lengthscale, 0.8), lib.HarmonicFeatures(backend.array(Z), transformation)))
    assert core._sign_flips(transformation, gp.kernel, D) is not None  # the closed form is what is tested
    blocks = [slice(t * m, (t + 1) * m) for t in range(T)]
    np.testing.assert_allclose(backend.numpy(lib.Kuu(gp.features, gp.kernel)), np.stack([KUU[b, b] for b in blocks]),
                               rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(backend.numpy(lib.Kuf(gp.features, gp.kernel, backend.array(X))),
                               np.stack([KUf[b] for b in blocks]), rtol=1e-10, atol=1e-13)

    weights = [backend.array(rng.normal(size=shape)) for shape in ((T, m, m), (T, m, len(X)))]
    flips = core._sign_flips(transformation, gp.kernel, D)

    def closed(Z, X):
        return sum((w * core._flip_products(flips, transformation.center, gp.kernel, Z, x)).sum()
                   for w, x in zip(weights, (None, X)))

    def orbit(Z, X):
        terms = (core._orbit_kernel(transformation, gp.kernel, Z, x) for x in (None, X))
        return sum((w * core._orbit_sum(transformation, term, Z.ndim == 3)).sum() for w, term in zip(weights, terms))

    for inputs in (Z, Z[0]):  # each component's own Z, and one Z shared by every component
        for ours, theirs in zip(backend.grad(closed, inputs, X), backend.grad(orbit, inputs, X)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    if backend.name == "pyro":  # and with respect to the kernel's parameters (the data held)
        import torch

        params = list(gp.kernel.parameters())
        for ours, theirs in zip(*(torch.autograd.grad(fn(backend.array(Z), backend.array(X)), params)
                                  for fn in (closed, orbit))):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-9, atol=1e-12)


def test_a_subclass_that_redefines_the_squared_exponential_keeps_the_orbit_sum(backend, rng):
    """A user's subclass of the squared exponential with a shape of its own is not given the
    squared exponential's closed form: its components are its own orbit's covariances."""
    transformation, maps, D = GROUPS["axes"]
    T, m, lib = transformation.num_components, 3, backend.lib
    X, Z = rng.normal(size=(7, D)), rng.normal(size=(T, m, D))

    class Sharper(lib.RBF):
        def shape_fn(self, r2):
            return namespace(r2).exp(-r2)

    kernel = Sharper(lengthscale=backend.array([1.3]), variance=backend.array(0.8))
    sharper = lambda A, B: 0.8 * np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / 1.3**2)  # noqa: E731
    KUU, KUf = ref.harmonic_covariances(sharper, maps, transformation.weights(), Z, X)
    gp = backend.bound(lib.SVGP(kernel, lib.HarmonicFeatures(backend.array(Z), transformation)))
    assert core._sign_flips(transformation, gp.kernel, D) is None
    np.testing.assert_allclose(backend.numpy(gp.kernel.K(backend.array(X), backend.array(Z[0]))), sharper(X, Z[0]),
                               rtol=1e-12)  # its own values outside the harmonic features too
    blocks = [slice(t * m, (t + 1) * m) for t in range(T)]
    np.testing.assert_allclose(backend.numpy(lib.Kuu(gp.features, gp.kernel)), np.stack([KUU[b, b] for b in blocks]),
                               rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(backend.numpy(lib.Kuf(gp.features, gp.kernel, backend.array(X))),
                               np.stack([KUf[b] for b in blocks]), rtol=1e-10, atol=1e-13)


def _closed_form_edges(backend, variance, dtype, compiled):
    """Kuu and Kuf of the closed form at the edges, and the gradients of ``sum(W * K)`` with respect
    to Z and X (eager, or under ``jax.jit``)."""
    transformation = core.Reflections.along_axes([[0], [1, 2]])
    Z = np.array([[0.0, 0.0, 0.0], [0.3, -0.2, 0.1], [0.3, -0.2, 0.1], [3.0, -2.0, 1.0], [12.0, -8.0, 4.0]])
    X = np.concatenate([Z, [[-12.0, 8.0, -4.0], [0.1, 0.0, -0.1]]])
    kernel = backend.bound(backend.lib.SquaredExponential(lengthscale=backend.array([0.3, 0.3, 0.3], dtype),
                                                           variance=backend.array(variance, dtype)))
    flips = core._sign_flips(transformation, kernel, 3)
    weights = [backend.array(np.random.default_rng(3).normal(size=(4, len(Z), n)), dtype) for n in (len(Z), len(X))]

    def matrices(Z, X):
        return [core._flip_products(flips, transformation.center, kernel, Z, x) for x in (None, X)]

    def total(Z, X):
        return sum((w * K).sum() for w, K in zip(weights, matrices(Z, X)))

    Za, Xa = backend.array(Z, dtype), backend.array(X, dtype)
    if compiled:
        import jax

        values, grads = jax.jit(matrices)(Za, Xa), jax.jit(jax.grad(total, argnums=(0, 1)))(Za, Xa)
    else:
        values, grads = matrices(Za, Xa), backend.grad(total, Za, Xa)
    norms = [np.sum((A / 0.3) ** 2, axis=-1) for A in (Z, X)]
    return [backend.numpy(v) for v in values], [np.asarray(g) for g in grads], norms


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("variance", [1e-6, 1.0, 1e6])
def test_float32_closed_form_at_the_edges(backend, variance, compiled):
    """float32 Kuu and Kuf of the closed form against float64 (eager, and under ``jax.jit``):
    coincident inputs, inputs at the centre, and inputs 10 to 40 lengthscales from it (the orbit's
    exponentials underflow; nothing overflows or turns NaN). Each entry within 1e-5 of the variance
    plus the inner-product expansion's round-off (a few float32 ulps of the pair's squared norms, as
    for the library's squared exponential itself); Kuu's diagonal, the components' variances, to
    float32 precision; the gradients with respect to Z and X within 1e-3 of their float64 norms."""
    if compiled and backend.name != "numpyro":
        pytest.skip("torch's steps are eager")
    (low_k, low_g, norms), (high_k, high_g, _) = (_closed_form_edges(backend, variance, dtype, compiled)
                                                  for dtype in (np.float32, np.float64))
    for low, high, x2 in zip(low_k, high_k, norms):
        assert low.dtype == np.float32 and np.isfinite(low).all()
        bound = variance * (1e-5 + 4 * np.finfo(np.float32).eps * (norms[0][:, None] + x2[None, :]))
        assert (np.abs(low - high) <= bound).all(), np.abs(low - high).max() / variance
    np.testing.assert_allclose(np.diagonal(low_k[0], axis1=1, axis2=2), np.diagonal(high_k[0], axis1=1, axis2=2),
                               rtol=1e-6, atol=0)
    for low, high in zip(low_g, high_g):
        assert np.isfinite(low).all() and np.linalg.norm(low - high) <= 1e-3 * np.linalg.norm(high)


def test_components_sum_to_the_kernel(backend, rng):
    """With one set of inputs for every component, ``sum_t k_t(Z, X) = k(Z, X)`` and
    ``sum_t k_t(Z, Z) = k(Z, Z)``, for every group."""
    for name, (transformation, _, D) in GROUPS.items():
        backend.reset()
        X, Z = rng.normal(size=(7, D)), rng.normal(size=(4, D))
        kernel = backend.kernel("rbf", [1.1], 0.7)
        features = backend.lib.HarmonicFeatures(backend.array(Z), transformation, shared=True)
        gp = backend.bound(backend.lib.SVGP(kernel, features))
        Kuu, Kuf = (backend.numpy(a) for a in (backend.lib.Kuu(gp.features, gp.kernel),
                                               backend.lib.Kuf(gp.features, gp.kernel, backend.array(X))))
        assert Kuf.shape == (transformation.num_components, 4, 7)
        # atol: in 24 dimensions some entries are 1e-16 of the variance, below the sum's round-off
        np.testing.assert_allclose(Kuf.sum(0), ref.kernel("rbf", Z, X, [1.1], 0.7), rtol=1e-10, atol=1e-14, err_msg=name)
        np.testing.assert_allclose(Kuu.sum(0), ref.kernel("rbf", Z, Z, [1.1], 0.7), rtol=1e-10, atol=1e-14, err_msg=name)


def test_one_component_is_the_svgp(backend, rng):
    """A group of order 1 (W = [[1]]) gives the SVGP on the same points and q, to round-off."""
    X, y, Z = rng.normal(size=(15, 2)), rng.normal(size=15), rng.normal(size=(4, 2))
    q_mu, q_sqrt = rng.normal(size=(1, 4)), np.tril(rng.normal(size=(1, 4, 4))) * 0.3 + np.eye(4)
    lib, kern = backend.lib, ("matern52", [0.9, 1.4], 1.2)
    harmonic = lib.SVGP(backend.kernel(*kern), lib.HarmonicFeatures(backend.array(Z), core.CyclicMap(lambda x: x, 1, True)))
    harmonic = backend.set(harmonic, q_mu=q_mu, q_sqrt=q_sqrt)
    plain = backend.svgp(Z, kern, q_mu[0], q_sqrt[0], name="plain")
    elbos = [float(backend.numpy(lib.GPModel(gp, backend.set(lib.Gaussian(), variance=0.3)).elbo(backend.array(X),
                                                                                                backend.array(y))))
             for gp in (harmonic, plain)]
    assert elbos[0] == pytest.approx(elbos[1], rel=1e-12)
    for a, b in zip(harmonic.predict_f(backend.array(X)), plain.predict_f(backend.array(X))):
        np.testing.assert_allclose(backend.numpy(a), backend.numpy(b), rtol=1e-12)


def test_latent_functions_share_the_components(backend, rng):
    """``num_latent`` independent functions over the same components: each latent's q(f) is the
    dense reference's with that latent's q blocks."""
    lib, (transformation, maps, D), m = backend.lib, GROUPS["axes"], 3
    T, L = transformation.num_components, 2
    X, Z = rng.normal(size=(9, D)), rng.normal(size=(T, m, D))
    q_mu = rng.normal(size=(T, L, m))
    q_sqrt = np.tril(rng.normal(size=(T, L, m, m)) * 0.3, -1) + np.eye(m)
    gp = lib.SVGP(backend.kernel("rbf", [1.2], 0.9), lib.HarmonicFeatures(backend.array(Z), transformation), num_latent=L)
    mean, var = (backend.numpy(a) for a in backend.set(gp, q_mu=q_mu, q_sqrt=q_sqrt).predict_f(backend.array(X)))
    assert mean.shape == var.shape == (9, L)
    KUU, KUf = ref.harmonic_covariances(lambda A, B: ref.kernel("rbf", A, B, [1.2], 0.9), maps, transformation.weights(), Z, X)
    for latent in range(L):
        mean_ref, cov_ref, _ = ref.block_q_predict(KUU, KUf, ref.kernel("rbf", X, X, [1.2], 0.9), q_mu[:, latent],
                                                   q_sqrt[:, latent], 1e-6)
        np.testing.assert_allclose(mean[:, latent], mean_ref, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(var[:, latent], np.diag(cov_ref), rtol=1e-8)


def test_shared_inputs_span_the_orbit(backend, rng):
    """Theorem 4.1 (2^J-way negations, one Z for every component): the components' Nystrom terms add
    up to the SVGP's on the whole orbit ``{G^s Z}``, so the trace errors agree; and no features
    of rank Tm beat the eigen-truncation (:func:`trace_floor`)."""
    lib, (transformation, maps, D) = backend.lib, GROUPS["axes"]
    X, Z = rng.normal(size=(30, D)), rng.normal(size=(3, D))
    kernel = backend.kernel("matern32", [1.0], 1.0)
    features = lib.HarmonicFeatures(backend.array(Z), transformation, shared=True)
    gp = backend.bound(lib.SVGP(kernel, features))
    error = lib.harmonic.trace_error(gp.kernel, gp.features, backend.array(X), jitter=1e-12)
    V = np.concatenate([G(Z) for G in maps])
    k = lambda A, B: ref.kernel("matern32", A, B, [1.0], 1.0)  # noqa: E731
    dense = np.trace(k(X, X) - k(X, V) @ np.linalg.solve(k(V, V), k(V, X)))
    assert error == pytest.approx(dense, rel=1e-7)
    floor = lib.diagnostics.trace_floor(gp.kernel, backend.array(X), len(V))
    assert error >= len(X) * floor - 1e-9


def test_ways_about_different_centres(backend, rng):
    """A rotation about one centre and a flip about another commute, but no one centre serves
    both: the blocks of Kuu and Kuf are still the orbit's covariances (each way applied about
    its own centre)."""
    c_rotation, c_flip = np.array([0.3, -0.2, 0.0]), np.array([0.0, 0.0, 0.7])
    transformation = core.MultiWay(core.Rotation(4, center=c_rotation), core.Reflections.along_axes([[2]], center=c_flip))

    def element(a, b):
        def G(x):
            x01 = c_rotation[:2] + (x[:, :2] - c_rotation[:2]) @ _rotation(np.pi * a / 2).T
            return np.concatenate([x01, c_flip[2] + (-1) ** b * (x[:, 2:] - c_flip[2])], axis=1)
        return G

    T, m = transformation.num_components, 2
    X, Z = rng.normal(size=(5, 3)), rng.normal(size=(T, m, 3))
    KUU, KUf = ref.harmonic_covariances(lambda A, B: ref.kernel("matern32", A, B, [1.3], 0.8),
                                        [element(a, b) for a, b in np.ndindex(4, 2)], transformation.weights(), Z, X)
    gp = backend.bound(backend.lib.SVGP(backend.kernel("matern32", [1.3], 0.8),
                                        backend.lib.HarmonicFeatures(backend.array(Z), transformation)))
    blocks = [slice(t * m, (t + 1) * m) for t in range(T)]
    np.testing.assert_allclose(backend.numpy(backend.lib.Kuu(gp.features, gp.kernel)),
                               np.stack([KUU[b, b] for b in blocks]), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(backend.numpy(backend.lib.Kuf(gp.features, gp.kernel, backend.array(X))),
                               np.stack([KUf[b] for b in blocks]), rtol=1e-10, atol=1e-13)


def test_kernels_that_are_not_invariant_are_refused(backend, rng):
    """ARD lengthscales under a map that mixes coordinates, alone or in either factor of a sum
    or product: an error naming both; under reflections along the axes they are invariant and
    accepted."""
    lib, X = backend.lib, rng.normal(size=(20, 3))
    ard = backend.kernel("matern32", [0.5, 1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match=r"3 ARD lengthscales .* Reflections"):
        lib.SVGP(ard, lib.HarmonicFeatures(backend.array(X[:4]), core.Reflections.pca(X, 2)))
    with pytest.raises(ValueError, match=r"2 ARD lengthscales .* Rotation"):
        lib.SVGP(backend.kernel("rbf", [0.5, 1.0], 1.0), lib.HarmonicFeatures(backend.array(X[:4, :2]), core.Rotation(4)))
    shared = backend.kernel("rbf", [0.7], 1.0)
    for kernel in (lib.Sum(shared, backend.kernel("matern32", [0.5, 1.0], 1.0)),  # the ARD term second
                   lib.Product(shared, backend.kernel("matern32", [0.5, 1.0], 1.0))):
        with pytest.raises(ValueError, match=r"Matern32 with 2 ARD lengthscales .* Rotation"):
            lib.SVGP(kernel, lib.HarmonicFeatures(backend.array(X[:4, :2]), core.Rotation(4)))
    with pytest.raises(ValueError, match=r"3 ARD lengthscales .* MultiWay"):  # one way keeps the axes, one mixes them
        lib.SVGP(ard, lib.HarmonicFeatures(backend.array(X[:4]), GROUPS["rotation4_x_flip"][0]))
    gp = lib.SVGP(ard, lib.HarmonicFeatures(backend.array(X[:4]), core.Reflections.along_axes([[0], [2]])), name="axes")
    assert backend.numpy(gp.predict_f(backend.array(X))[0]).shape == (20,)


def test_bad_arguments(backend, rng):
    lib, Z = backend.lib, backend.array(rng.normal(size=(4, 2)))
    with pytest.raises(TypeError, match="transformation"):
        lib.HarmonicFeatures(Z, "negation")
    with pytest.raises(ValueError, match="3 component blocks"):
        lib.HarmonicFeatures(backend.array(rng.normal(size=(3, 4, 2))), core.Negation())
    with pytest.raises(ValueError, match="Z contains NaN"):
        lib.HarmonicFeatures(backend.array(np.full((4, 2), np.nan)), core.Negation())
    with pytest.raises(ValueError, match="step must divide"):
        core.ImageTranslation((28, 28), 5)
    with pytest.raises(ValueError, match="disjoint"):
        core.Reflections.along_axes([[0, 1], [1]])
    with pytest.raises(ValueError, match="num_ways"):
        core.Reflections.pca(rng.normal(size=(10, 2)), 3)
    with pytest.raises(ValueError, match="order"):
        core.Rotation(0)
    with pytest.raises(ValueError, match="orthonormal columns"):
        core.Reflections([[0]], np.array([[1.0, 0.5], [0.0, 1.0]]))


def _float32_problem():
    """Inputs spread over [0, 30]^2, inducing inputs at the first 6 (in every component), the
    reflections about the data's centre."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 30, size=(60, 2))
    y = np.sin(X[:, 0] / 4) + 0.1 * rng.normal(size=60)
    return X, y, X[:6].copy(), core.Reflections.along_axes([[0], [1]], center=X.mean(axis=0))


def _pyro_gradients(lib, dtype):
    import torch

    X, y, Z, transformation = _float32_problem()
    as_tensor = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    gp = lib.SVGP(lib.Matern52(lengthscale=as_tensor([4.0])), lib.HarmonicFeatures(as_tensor(Z), transformation))
    model = lib.GPModel(gp, lib.Gaussian(variance=as_tensor(0.1)))
    named = dict(model.named_parameters())
    loss = -model.elbo(as_tensor(X), as_tensor(y))
    grads = torch.autograd.grad(loss, list(named.values()))
    return float(loss.detach()), {k: g.numpy() for k, g in zip(named, grads)}


def _numpyro_gradients(lib, dtype, compiled):
    import jax
    import jax.numpy as jnp
    from numpyro import handlers

    from backends import xla_optimisations

    X, y, Z, transformation = (jnp.asarray(a, dtype) if isinstance(a, np.ndarray) else a for a in _float32_problem())
    gp = lib.SVGP(lib.Matern52(lengthscale=jnp.asarray([4.0], dtype)), lib.HarmonicFeatures(Z, transformation))
    model = lib.GPModel(gp, lib.Gaussian(variance=jnp.asarray(0.1, dtype)))
    with xla_optimisations(False):  # the set-up's eager run: not what is compared
        params = {k: s["value"] for k, s in handlers.trace(model.elbo).get_trace(X, y).items() if s["type"] == "param"}

    def loss(p):
        return -handlers.substitute(model.elbo, data=p)(X, y)

    value_and_grad = jax.value_and_grad(loss)
    with xla_optimisations(dtype == jnp.float32):  # the float64 reference compiles faster
        value, grads = (jax.jit(value_and_grad) if compiled else value_and_grad)(params)
    return float(value), {k: np.asarray(g) for k, g in grads.items()}


@pytest.mark.parametrize("run", ["pyro", "numpyro-jit"])
def test_float32_loss_and_gradients_at_data_points(run):
    """Inducing inputs at data points (every component's): the float32 loss within 1e-4 of float64
    and each gradient within 10 % of its float64 norm, eager (torch) and compiled (``jax.jit``;
    eager JAX runs the same operations one compiled program each, as the kernels' own float32
    tests in ``test_float32_gradients.py`` check)."""
    from backends import BACKENDS

    lib = BACKENDS[run.split("-")[0]]().lib
    if run == "pyro":
        import torch

        out = {dtype: _pyro_gradients(lib, dtype) for dtype in (torch.float32, torch.float64)}
        (l32, g32), (l64, g64) = out[torch.float32], out[torch.float64]
    else:
        import jax.numpy as jnp

        (l32, g32), (l64, g64) = (_numpyro_gradients(lib, dtype, run.endswith("jit")) for dtype in (jnp.float32, jnp.float64))
    assert l32 == pytest.approx(l64, rel=1e-4)
    assert set(g32) == set(g64) and len(g64) >= 5
    for key in g64:
        error = np.linalg.norm(np.asarray(g32[key], np.float64) - g64[key])
        assert np.isfinite(g32[key]).all() and error <= 0.1 * np.linalg.norm(g64[key]) + 1e-6, (key, error)


@pytest.mark.parametrize("name", ["negation", "rotation5", "pca"])
def test_component_predictions(backend, rng, name):
    """``predict_f(part="components")``: each component ``f_t(x) = sum_s w_t(s) f(G^s x)`` given q,
    against the dense joint prior over the orbits; the components' means add up to ``f``'s."""
    lib, (transformation, maps, D), m = backend.lib, GROUPS[name], 3
    T = transformation.num_components
    X, Z = rng.normal(size=(8, D)), rng.normal(size=(T, m, D))
    q_mu = rng.normal(size=(T, m))
    q_sqrt = np.tril(rng.normal(size=(T, m, m)) * 0.3, -1) + np.eye(m) * rng.uniform(0.3, 1.2, size=(T, m, 1))
    gp = lib.SVGP(backend.kernel("matern52", [1.1], 0.9), lib.HarmonicFeatures(backend.array(Z), transformation))
    gp = backend.set(gp, q_mu=q_mu, q_sqrt=q_sqrt)
    mean, var = (backend.numpy(a) for a in gp.predict_f(backend.array(X), part="components", batch_size=5))
    assert mean.shape == var.shape == (8, T)
    k = lambda A, B: ref.kernel("matern52", A, B, [1.1], 0.9)  # noqa: E731
    mean_ref, var_ref = ref.harmonic_component_predict(k, maps, transformation.weights(), Z, X, q_mu, q_sqrt, 1e-6)
    np.testing.assert_allclose(mean, mean_ref.T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var, var_ref.T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(mean.sum(1), backend.numpy(gp.predict_f(backend.array(X))[0]), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="component axis"):
        backend.svgp(Z[0], name="plain").predict_f(backend.array(X), part="components")


class HarmonicRef:
    """Dense q(f) of the harmonic SVGP (for the Cox reference): ``predict(X)`` and ``kl()``."""

    def __init__(self, kern, maps, W, Z, q_mu, q_sqrt, jitter=1e-6):
        self.k = lambda A, B: ref.kernel(kern[0], A, B, *kern[1:])  # noqa: E731
        self.args = maps, W, Z, q_mu, q_sqrt, jitter

    def predict(self, X):
        maps, W, Z, q_mu, q_sqrt, jitter = self.args
        KUU, KUf = ref.harmonic_covariances(self.k, maps, W, Z, X)
        return ref.block_q_predict(KUU, KUf, self.k(X, X), q_mu, q_sqrt, jitter)[:2]

    def kl(self):
        maps, W, Z, q_mu, q_sqrt, jitter = self.args
        KUU, KUf = ref.harmonic_covariances(self.k, maps, W, Z, Z[0])
        return ref.block_q_predict(KUU, KUf, self.k(Z[0], Z[0]), q_mu, q_sqrt, jitter)[2]


def test_cox_process_with_a_harmonic_prior(backend, rng):
    """The Cox likelihood takes the harmonic prior as any other: the ELBO (reflection about the
    window's centre) against the dense reference with exact integration."""
    from sparsegp_common.objectives import windows

    lib, m, kern = backend.lib, 4, ("rbf", [2.0], 1.2)
    transformation = core.Negation(center=5.0)
    Z = np.stack([np.linspace(0.5, 9.5, m)[:, None], rng.uniform(0, 10, (m, 1))])
    q_mu = rng.normal(size=(2, m)) * 0.5
    q_sqrt = np.tril(rng.normal(size=(2, m, m)) * 0.1, -1) + np.eye(m) * rng.uniform(0.3, 0.8, size=(2, m, 1))
    events = np.sort(rng.uniform(0, 10, (25, 1)), axis=0)
    gp = lib.SVGP(backend.kernel(*kern), lib.HarmonicFeatures(backend.array(Z), transformation))
    process = lib.CoxProcess(backend.set(gp, q_mu=q_mu, q_sqrt=q_sqrt), windows.Interval(0.0, 10.0),
                             integration=lib.GaussLegendre(64), offset=0.5)
    dense = HarmonicRef(kern, [lambda x: x, lambda x: 10.0 - x], transformation.weights(), Z, q_mu, q_sqrt)
    expected = ref.cox_elbo(dense, events, [(0.0, 10.0)], 0.5)
    assert -backend.loss(process.model, process.guide, backend.array(events)) == pytest.approx(expected, rel=1e-9)


def test_fit_predict_sample_and_export_with_a_mean_function(backend, rng):
    """The harmonic prior as every other: a linear mean function (its own part of the prediction),
    ``fit``, ``predict_f``/``predict_y`` by part, ``sample_f`` and the ArviZ export."""
    lib = backend.lib
    X = rng.uniform(-3, 3, size=(60, 1))
    y = 0.7 * X[:, 0] + np.cos(2 * X[:, 0]) + 0.1 * rng.normal(size=60)
    Xa, ya = backend.array(X), backend.array(y)
    features = lib.HarmonicFeatures(backend.array(X[:10]), lib.harmonic.Negation())
    prior = lib.SVGP(lib.Matern52(lengthscale=backend.array([1.0])), features,
                     mean_function=lib.Linear(backend.array([0.0])))
    model = lib.GPModel(prior, lib.Gaussian(variance=backend.array(0.1)), num_data=60)
    result = lib.fit(model.model, model.guide, (Xa, ya), num_steps=60, batch_size=20, lr=0.05, progress=False)
    assert result.losses[-10:].mean() < result.losses[:10].mean()
    params = result.params
    f_mean, f_var = (backend.numpy(t) for t in model.predict_f(Xa[:7], params=params))
    m_mean = backend.numpy(model.predict_f(Xa[:7], part="mean", params=params)[0])
    g_mean, g_var = (backend.numpy(t) for t in model.predict_f(Xa[:7], part="gp", params=params))
    c_mean, c_var = (backend.numpy(t) for t in model.predict_f(Xa[:7], part="components", params=params))
    np.testing.assert_allclose(f_mean, m_mean + g_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c_mean.sum(-1), g_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f_var, g_var, rtol=1e-10)
    assert c_mean.shape == c_var.shape == (7, 2) and np.all(c_var.sum(-1) <= g_var + 1e-12)
    assert np.abs(m_mean).max() > 0.1  # the trend went to the mean function's weight
    noise = backend.numpy(params["likelihood.variance"])
    np.testing.assert_allclose(backend.numpy(model.predict_y(Xa[:7], params=params).variance), f_var + noise, rtol=1e-10)
    draws = backend.numpy(model.sample_f(Xa[:7], num_samples=4000, params=params))
    assert np.abs(draws.mean(0) - f_mean).max() < 5 * np.sqrt(f_var.max() / 4000) + 1e-6
    idata = lib.to_inference_data(model, data=(Xa, ya), num_samples=8, num_chains=2, result=result)
    assert idata.log_likelihood["y"].shape == (2, 4, 60)
    assert set(idata.posterior.data_vars) == {"gp.u", "gp.f"}
    assert idata.posterior["gp.u"].shape == (2, 4, 2, 10)  # a block of u per component
