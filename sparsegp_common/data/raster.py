"""Covariate images on a regular 2-D grid: values at arbitrary points by bilinear interpolation,
for the mean functions (:class:`~sparsegp_common.priors.mean_functions.Covariates`), and the pixel grid
as a Cox-process integration rule (:class:`PixelRule`)."""
import numpy as np

from sparsegp_common.objectives import windows
from sparsegp_common.ops import backend, device, namespace


class Raster:
    """One or more images over the extent ``[x0, x1] x [y0, y1]``, pixel ``[..., i, j]`` centred
    at ``(x0 + (j + 1/2) dx, y0 + (i + 1/2) dy)``: rows run up in y (spatstat's ``im`` layout;
    ``imshow(..., origin="lower")`` draws it).

    ``evaluate(X)`` interpolates bilinearly between pixel centres (within half a pixel of the
    border, the border pixels' values); points outside the extent are refused with a ValueError,
    as are points where an image has no value (NaN), whenever the points are concrete (Pyro
    always; NumPyro outside ``jit``).

    Args:
        images: ``(H, W)`` or ``(K, H, W)`` NumPy values (NaN where there is none).
        extent: ``((x0, x1), (y0, y1))``.
        standardize: subtract each image's mean and divide by its standard deviation (over
            the pixels with values); ``mean`` and ``scale`` keep them, so that a coefficient
            ``b`` of a standardised image is ``b / scale`` per unit of the original.
        names: optional names of the ``K`` images (for plots and messages).
    """

    def __init__(self, images, extent, standardize=False, names=None):
        try:
            values = np.array(images, dtype=np.float64)
            extent = np.array(extent, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError("images and extent must be arrays of numbers") from None
        if values.ndim == 2:
            values = values[None]
        if values.ndim != 3 or min(values.shape) < 1:
            raise ValueError(f"images must have shape (H, W) or (K, H, W), got {np.shape(images)}")
        if extent.shape != (2, 2) or not np.all(np.isfinite(extent)) or not np.all(extent[:, 1] > extent[:, 0]):
            raise ValueError(f"extent must be ((x0, x1), (y0, y1)) with x0 < x1 and y0 < y1, got {extent.tolist()}")
        if np.isinf(values).any():
            raise ValueError("images contain inf")
        self.names = tuple(names) if names is not None else tuple(f"image_{k}" for k in range(len(values)))
        if len(self.names) != len(values):
            raise ValueError(f"names has {len(self.names)} entries for {len(values)} images")
        self.mean, self.scale = np.zeros(len(values)), np.ones(len(values))
        if standardize:
            self.mean, self.scale = np.nanmean(values, axis=(1, 2)), np.nanstd(values, axis=(1, 2))
            if not np.all(self.scale > 0):
                raise ValueError("an image is constant: it cannot be standardised")
            values = (values - self.mean[:, None, None]) / self.scale[:, None, None]
        self.values, self.extent = values, extent
        self.pixel = (extent[:, 1] - extent[:, 0]) / np.array(values.shape[:0:-1])  # (dx, dy)

    @property
    def num_images(self):
        return self.values.shape[0]

    @property
    def shape(self):
        """``(H, W)`` pixels."""
        return self.values.shape[1:]

    def centres(self):
        """Pixel centres ``(H * W, 2)``, row by row (the order of ``values[k].ravel()``)."""
        (x0, _), (y0, _) = self.extent
        H, W = self.shape
        x = x0 + (np.arange(W) + 0.5) * self.pixel[0]
        y = y0 + (np.arange(H) + 0.5) * self.pixel[1]
        return np.stack([g.ravel() for g in np.meshgrid(x, y, indexing="xy")], axis=-1)

    def check_inside(self, X):
        """A ValueError for NumPy points ``(N, 2)`` outside the extent."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != 2:
            raise ValueError(f"a Raster is evaluated at 2-D points (N, 2), got shape {X.shape}")
        outside = ~np.all((X >= self.extent[:, 0]) & (X <= self.extent[:, 1]), axis=1)
        if outside.any():
            raise ValueError(f"{int(outside.sum())} point(s) lie outside the raster's extent {self.extent.tolist()}, "
                             f"e.g. {X[outside][0].tolist()}")

    def evaluate(self, X):
        """Bilinear values at ``X`` ``(N, 2)`` (the backend's array): ``(N, K)`` in ``X``'s dtype."""
        xp, ops = namespace(X), backend(X)
        concrete = ops.is_concrete(X)
        if concrete:
            self.check_inside(_host(X))
        H, W = self.shape
        flat = xp.asarray(self.values.reshape(self.num_images, H * W), dtype=X.dtype, device=device(X))
        lows = xp.asarray(self.extent[:, 0], dtype=X.dtype, device=device(X))
        pixel = xp.asarray(self.pixel, dtype=X.dtype, device=device(X))
        # continuous pixel coordinates (column, row), clamped to the centres of the border pixels
        uv = (X - lows) / pixel - 0.5
        u = xp.clip(uv[:, 0], min=0.0, max=float(W - 1))
        v = xp.clip(uv[:, 1], min=0.0, max=float(H - 1))
        j0 = xp.clip(ops.as_index(xp.floor(u)), max=max(W - 2, 0))
        i0 = xp.clip(ops.as_index(xp.floor(v)), max=max(H - 2, 0))
        j1, i1 = xp.clip(j0 + 1, max=W - 1), xp.clip(i0 + 1, max=H - 1)
        t = (u - xp.astype(j0, X.dtype))[None]
        s = (v - xp.astype(i0, X.dtype))[None]

        def at(i, j):
            return xp.take(flat, i * W + j, axis=1)  # (K, N)

        value = (1 - s) * ((1 - t) * at(i0, j0) + t * at(i0, j1)) + s * ((1 - t) * at(i1, j0) + t * at(i1, j1))
        if concrete and not bool(xp.all(xp.isfinite(value))):
            missing = ~np.all(np.isfinite(_host(value)), axis=0)
            raise ValueError(f"the images have no value (NaN) at {int(missing.sum())} point(s), e.g. "
                             f"{_host(X)[missing][0].tolist()}")
        return value.mT

    def rule(self):
        """The pixel grid as a Cox-process integration rule (:class:`PixelRule`)."""
        return PixelRule(self)


def _host(array):
    if hasattr(array, "detach"):
        return array.detach().cpu().numpy()
    return np.asarray(array)


class PixelRule(windows.Rule):
    """A raster's pixels as a fixed integration rule: one node per pixel that meets the window,
    at the centre of the pixel's part inside the window, weighted by that part's exact area
    (border pixels clipped). Pixels where an image has no value are dropped (their area is then
    missing from the integral: keep the window within the images' data).

    Args:
        raster: the :class:`Raster`; the window must lie within its extent.
    """

    def __init__(self, raster):
        if not isinstance(raster, Raster):
            raise TypeError(f"raster must be a Raster, got {type(raster).__name__}")
        self.raster = raster

    def layout(self, window):
        bounds = windows._box(window, self)
        raster = self.raster
        if window.dim != 2:
            raise ValueError(f"a PixelRule integrates over 2-D windows, got a {window.dim}-D window")
        if np.any(bounds[:, 0] < raster.extent[:, 0] - 1e-12) or np.any(bounds[:, 1] > raster.extent[:, 1] + 1e-12):
            raise ValueError(f"the window {bounds.tolist()} extends beyond the raster's extent {raster.extent.tolist()}")
        centres = raster.centres()
        half = raster.pixel / 2
        low = np.maximum(centres - half, bounds[:, 0])
        high = np.minimum(centres + half, bounds[:, 1])
        sides = np.clip(high - low, 0.0, None)
        area = sides.prod(axis=1)
        keep = (area > 0) & np.all(np.isfinite(raster.values.reshape(raster.num_images, -1)), axis=0)
        return windows.Layout((low + high)[keep] / 2, area[keep])
