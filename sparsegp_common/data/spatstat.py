"""Point patterns with covariate images from R's ``spatstat.data`` (e.g. ``gorillas``), read from
the user's data directory: the package is GPL, so nothing of it is shipped here.

Convert once from the package's ``.rda`` file (``data/gorillas.rda`` in the package sources or
the installed package's ``data`` folder) with the pure-Python reader ``rdata`` (``pip install
rdata``; no R needed)::

    python -m sparsegp_common.data.spatstat path/to/gorillas.rda      # writes $SPARSEGP_DATA/gorillas/gorillas.npz

then :func:`load_image_pattern` reads the ``.npz`` with NumPy alone.
"""
import pathlib
import sys
from typing import NamedTuple

import numpy as np

R_NA_INTEGER = np.iinfo(np.int32).min


class ImagePattern(NamedTuple):
    """A 2-D point pattern in a polygonal window with covariate images on one grid.

    Attributes:
        events: ``(n, 2)`` float64 locations.
        window: ``(K, 2)`` polygon vertices (a :class:`~sparsegp_common.objectives.windows.Polygon`'s).
        images: ``(I, H, W)`` float64, rows running up in y (a
            :class:`~sparsegp_common.data.raster.Raster`'s layout), NaN where an image has no value;
            factors hold their level codes ``1, 2, ...``.
        extent: ``((x0, x1), (y0, y1))``, the outer edges of the pixels.
        names: the ``I`` images' names.
    """

    events: np.ndarray
    window: np.ndarray
    images: np.ndarray
    extent: np.ndarray
    names: tuple


def load_image_pattern(name, data_dir=None):
    """The pattern ``name`` (e.g. ``"gorillas"``) from ``<data_dir>/<name>/<name>.npz`` (see the
    module docstring to make it).

    Args:
        name: the dataset's folder and file name.
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        :class:`ImagePattern`.
    """
    from sparsegp_common.data.datasets import _file

    path = _file(name, f"{name}.npz", data_dir)
    with np.load(path, allow_pickle=False) as f:
        missing = {"events", "window", "images", "extent", "names"} - set(f.files)
        if missing:
            raise ValueError(f"{path} lacks {', '.join(sorted(missing))}: convert it again")
        pattern = ImagePattern(f["events"].astype(np.float64), f["window"].astype(np.float64),
                               f["images"].astype(np.float64), f["extent"].astype(np.float64),
                               tuple(str(n) for n in f["names"]))
    if pattern.events.ndim != 2 or pattern.events.shape[1] != 2 or pattern.images.ndim != 3:
        raise ValueError(f"{path}: events must be (n, 2) and images (I, H, W), got {pattern.events.shape} "
                         f"and {pattern.images.shape}")
    if len(pattern.names) != len(pattern.images):
        raise ValueError(f"{path}: {len(pattern.names)} names for {len(pattern.images)} images")
    return pattern


def _read_rda(path):
    try:
        import rdata
    except ImportError:
        raise ImportError("converting spatstat's .rda needs the pure-Python reader rdata: pip install rdata") from None
    classes = dict(rdata.conversion.DEFAULT_CLASS_MAP)
    classes["factor"] = lambda obj, attrs: obj  # the marks' factors: their codes are enough here
    return rdata.conversion.convert(rdata.parser.parse_file(path), classes)


def _image(im):
    values = np.asarray(im["v"])
    out = values.astype(np.float64)
    if values.dtype.kind == "i":
        out[values == R_NA_INTEGER] = np.nan
    return out, np.array([im["xrange"], im["yrange"]], dtype=np.float64)


def spatstat_to_npz(rda_path, data_dir=None):
    """Convert each ``ppp`` of a spatstat ``.rda`` that has images ``<name>.extra`` into
    ``<data_dir>/<name>/<name>.npz``; returns the paths written."""
    from sparsegp_common.data.datasets import data_dir as resolve

    objects = _read_rda(rda_path)
    written = []
    for name, ppp in objects.items():
        extra = objects.get(f"{name}.extra")
        if not isinstance(ppp, dict) or "window" not in ppp or extra is None:
            continue
        boundaries = ppp["window"]["bdry"]
        if len(boundaries) != 1:
            raise NotImplementedError(f"{name}'s window has {len(boundaries)} polygons; one is supported")
        window = np.stack([np.asarray(boundaries[0]["x"]), np.asarray(boundaries[0]["y"])], axis=-1)
        images, extents = zip(*(_image(im) for im in extra.values()))
        if any(not np.allclose(e, extents[0]) for e in extents) or len({i.shape for i in images}) != 1:
            raise NotImplementedError(f"{name}'s images lie on different grids")
        folder = resolve(data_dir, dataset=name) / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.npz"
        np.savez_compressed(path, events=np.stack([np.asarray(ppp["x"]), np.asarray(ppp["y"])], axis=-1),
                            window=window, images=np.stack(images), extent=extents[0],
                            names=np.array([str(k) for k in extra.keys()]))
        written.append(path)
    if not written:
        raise ValueError(f"{rda_path} holds no point pattern with images (<name> and <name>.extra)")
    return written


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m sparsegp_common.data.spatstat path/to/<name>.rda [data_dir]")
    for written in spatstat_to_npz(pathlib.Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else None):
        print(written)
