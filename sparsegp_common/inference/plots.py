"""Plots of fitted models (matplotlib, imported when a plot is drawn)."""
import numpy as np


def plot_intensity(cox, events, part, stat, resolution, ax, params, **kwargs):
    """:meth:`CoxProcess.plot_intensity <sparsegp_common.objectives.cox.CoxProcess.plot_intensity>` of ``cox``."""
    if cox.window.dim != 2:
        raise ValueError(f"plot_intensity draws 2-D windows, this one is {cox.window.dim}-D")
    stats = ("mean", "lower", "upper", "width")
    if stat not in stats:
        raise ValueError(f"stat must be one of {stats}, got {stat!r}")
    import matplotlib.pyplot as plt

    (x0, x1), (y0, y1) = cox.window.bounds
    steps = np.maximum(np.round(resolution * np.array([x1 - x0, y1 - y0]) / max(x1 - x0, y1 - y0)), 2).astype(int)
    gx, gy = np.meshgrid(np.linspace(x0, x1, steps[0]), np.linspace(y0, y1, steps[1]))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=-1)
    inside = cox.window.contains(grid)  # a Polygon's or UserRule's shape; covariates may stop at it
    pred = cox.intensity(cox.as_array(grid[inside]), quantiles=(0.025, 0.975), part=part, params=params)
    mean, (low, high) = cox._checks.host(pred.mean), cox._checks.host(pred.quantiles)
    values = np.full(len(grid), np.nan)
    values[inside] = {"mean": mean, "lower": low, "upper": high, "width": (high - low) / mean}[stat]
    ax = ax if ax is not None else plt.subplots(figsize=(6, 6 * (y1 - y0) / (x1 - x0) + 0.5))[1]
    image = ax.pcolormesh(gx, gy, values.reshape(gx.shape), shading="auto", **{"cmap": "viridis", **kwargs})
    if events is not None:
        ax.plot(*cox._checks.host(cox._checks.as_array(events, "events")).T, ".", color="white", ms=3,
                mec="black", mew=0.3)
    label = {"f": "intensity", "mean": "covariate part exp(m + offset)", "gp": "GP factor exp(g)"}[part]
    ax.set(aspect="equal", title=f"{label}: {'95% band width / mean' if stat == 'width' else stat}")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return ax
