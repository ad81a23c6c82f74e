"""The ``cox`` suite's real pattern: spatstat's ``gorillas`` (647 nest sites in a polygonal
window of 19.9 km^2, Kagwene Gorilla Sanctuary, Cameroon) with its covariate images on a 30.7 m
grid (read from ``$SPARSEGP_DATA/gorillas/gorillas.npz``; see ``sparsegp_common.data.spatstat`` to
convert the GPL package's ``.rda``; the rows are skipped without it). The images are padded by
one edge pixel: a vertex of the window lies 7 m beyond them.

``log lambda = b0 + b . c(x) + f(x)``, ``c`` the standardised elevation, slope angle and distance
to water (bilinear; the 59 edge pixels without values inside the window take their nearest
pixel's), ``f`` an SVGP (Matern-5/2, 12 x 10 inducing inputs, coefficients prior N(0, 10^2),
coupled with ``u``), on the ``Polygon`` window with the default randomised rule (32 x 32 cells on
its bounding box, those outside weighing nothing), in Pyro and in NumPyro. Beside them a Poisson GLM of the same covariates without ``f`` (Newton's method on
the pixel rule; standard errors from the Hessian). Coordinates in km from the images' corner.
Events split 80/20 by independent thinning (seed 0); the held-out score per test event is
``[sum_j E log lambda(x_j) - int_W E lambda] / n_test`` with the intensity scaled by 0.2 / 0.8,
on the pixel rule. Seconds per step include compilation (NumPyro).
"""
import math
import time

import numpy as np

from . import harness

COVARIATES = ("elevation", "slopeangle", "waterdist")
COLUMNS = [
    ("model", "method", "{}"), ("backend", "backend", "{}"), ("steps", "steps", "{}"),
    ("elevation", "elevation", "{}"), ("slope angle", "slopeangle", "{}"), ("water distance", "waterdist", "{}"),
    ("held-out log-lik / event", "heldout", "{:.3f}"), ("ms / step", "ms_per_step", "{:.1f}"),
]
TITLE = ("cox gorillas: 647 nests, effects per standard deviation (± sd), held-out log-likelihood (80/20 thinning), "
         "float64")


def _fill_nearest(images):
    """Pixels without a value take their nearest valued pixel's."""
    from scipy import ndimage

    out = images.copy()
    for image in out:
        missing = np.isnan(image)
        index = ndimage.distance_transform_edt(missing, return_distances=False, return_indices=True)
        image[missing] = image[tuple(index)][missing]
    return out


def load():
    """``(events, window vertices, Raster, pixel centres inside, pixel area)`` in km, or None."""
    from sparsegp_common.data.raster import Raster
    from sparsegp_common.data.spatstat import load_image_pattern
    from sparsegp_common.objectives import windows

    if not (harness.data_dir() / "gorillas" / "gorillas.npz").is_file():
        return None
    pattern = load_image_pattern("gorillas", harness.data_dir())
    origin = pattern.extent[:, 0]
    keep = [pattern.names.index(n) for n in COVARIATES]
    # one edge pixel around: a vertex of the window lies 7 m beyond the images
    images = np.pad(_fill_nearest(pattern.images[keep]), ((0, 0), (1, 1), (1, 1)), mode="edge")
    pixel = (pattern.extent[:, 1] - pattern.extent[:, 0]) / np.array(pattern.images.shape[:0:-1])
    extent = pattern.extent + np.stack([-pixel, pixel], axis=1)
    raster = Raster(images, (extent - origin[:, None]) / 1000, standardize=True, names=COVARIATES)
    window = windows.Polygon((pattern.window - origin) / 1000)
    centres = raster.centres()
    return (pattern.events - origin) / 1000, window, raster, centres[window.contains(centres)], float(np.prod(raster.pixel))


def glm(events, raster, centres, area):
    """Poisson GLM ``log lambda = F beta`` by Newton's method on the pixel rule: ``(beta, sd)``."""
    Fe = np.hstack([np.ones((len(events), 1)), raster.evaluate(events)])
    Fq = np.hstack([np.ones((len(centres), 1)), raster.evaluate(centres)])
    beta = np.zeros(Fe.shape[1])
    beta[0] = math.log(len(events) / (area * len(centres)))
    for _ in range(50):
        rate = area * np.exp(Fq @ beta)
        hessian = (Fq * rate[:, None]).T @ Fq
        step = np.linalg.solve(hessian, Fe.sum(0) - rate @ Fq)
        beta += step
        if np.abs(step).max() < 1e-10:
            break
    return beta, np.sqrt(np.diag(np.linalg.inv(hessian)))


def fit_lgcp(backend, events, window, raster, steps):
    """The LGCP in ``backend`` ("pyro" / "numpyro"), float64; returns (model, FitResult, seconds,
    the backend's array function)."""
    if backend == "pyro":
        import pyro
        import pyro.distributions as dist
        import torch

        import pyro_sparsegp as lib

        pyro.clear_param_store()
        array = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64))
    else:
        import jax
        import numpyro.distributions as dist

        import numpyro_sparsegp as lib

        jax.config.update("jax_enable_x64", True)
        array = lambda a: jax.numpy.asarray(np.asarray(a, dtype=np.float64))
    (x0, x1), (y0, y1) = window.bounds
    grid = np.meshgrid(np.linspace(x0, x1, 12), np.linspace(y0, y1, 10))
    Z = array(np.stack([g.ravel() for g in grid], -1))
    prior = dist.Normal(array(0.0), array(10.0))
    mean = lib.Covariates(raster, bias=math.log(len(events) / window.volume), prior=prior)
    kernel = lib.Matern52(lengthscale=array([0.5, 0.5]), variance=1.0)
    model = lib.CoxProcess(lib.SVGP(kernel, Z, mean_function=mean), window)
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (array(events),), num_steps=steps, lr=0.02,
                     lr_schedule=lambda step: 0.05 ** (step / steps), progress=False)
    return model, result, time.perf_counter() - start, array


def heldout(log_lam_test, log_lam_q, var_q, area, num_test):
    """Per test event, the intensity scaled by 0.2 / 0.8 (``var_q``: the variance of log lambda at the nodes)."""
    scale = math.log(0.2 / 0.8)
    return (np.sum(log_lam_test + scale) - area * np.sum(np.exp(log_lam_q + var_q / 2 + scale))) / num_test


def effects(loc, sd):
    return {name: f"{m:.3f} ± {s:.3f}" for name, m, s in zip(COVARIATES, loc[1:], sd[1:])}


def rows(steps, map_path=None):
    data = load()
    if data is None:
        return []
    events, window, raster, centres, area = data
    keep = np.random.default_rng(0).uniform(size=len(events)) < 0.8
    train, test = events[keep], events[~keep]
    base = {"suite": "cox", "dataset": "gorillas", "table": "gorillas", "num_train": int(keep.sum()),
            "num_test": int((~keep).sum())}
    start = time.perf_counter()
    beta, sd = glm(train, raster, centres, area)
    seconds = time.perf_counter() - start
    Fq = np.hstack([np.ones((len(centres), 1)), raster.evaluate(centres)])
    Ft = np.hstack([np.ones((len(test), 1)), raster.evaluate(test)])
    out = [{**base, "method": "Poisson GLM (no GP)", "backend": "NumPy", "steps": "Newton", "seconds": seconds,
            "coefficients": beta.tolist(), "sd": sd.tolist(), **effects(beta, sd),
            "heldout": heldout(Ft @ beta, Fq @ beta, 0.0, area, len(test))}]
    for backend in ("pyro", "numpyro"):
        model, result, seconds, array = fit_lgcp(backend, train, window, raster, steps)
        params = {k: np.asarray(v.detach() if hasattr(v, "detach") else v) for k, v in result.params.items()}
        loc = params["gp.mean_function.coefficients_loc"]
        sd = np.sqrt((params["gp.mean_function.coefficients_scale_tril"] ** 2).sum(-1))
        moments = lambda X: [np.asarray(a.detach() if hasattr(a, "detach") else a, dtype=np.float64)
                             for a in model.prior.predict_f(array(X), params=result.params)]
        m_test, _ = moments(test)
        m_q, v_q = moments(centres)
        out.append({**base, "method": "LGCP, default rule", "backend": {"pyro": "Pyro", "numpyro": "NumPyro"}[backend],
                    "steps": steps, "seconds": seconds, "ms_per_step": 1000 * seconds / steps,
                    "coefficients": loc.tolist(), "sd": sd.tolist(), **effects(loc, sd),
                    "lengthscale": params["gp.kernel.lengthscale"].tolist(),
                    "variance": float(params["gp.kernel.variance"]),
                    "heldout": heldout(m_test, m_q, v_q, area, len(test))})
        if map_path is not None and backend == "pyro":
            draw_map(model, result, events, map_path)
    return out


def draw_map(model, result, events, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    for ax, part in zip(axes, ("f", "mean", "gp")):
        model.plot_intensity(events, part=part, ax=ax, params=result.params, resolution=160)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
