"""Loaders for the offline datasets (regression, classification, multi-output, point patterns)
and standardisation helpers that return their transform.

Nothing is downloaded and nothing is cached: files are read from a directory given as
``data_dir`` or through the environment variable ``SPARSEGP_DATA``, each dataset from the
sub-folder its loader names (the layout of the project's shared data directory, whose folders each
have a README with the source, licence and format). Every loader returns NumPy arrays: float64
inputs and targets, int64 class labels; convert them with ``torch.as_tensor`` or ``jnp.asarray``.
"""
import os
import pathlib
from typing import NamedTuple

import numpy as np

from sparsegp_common.data.spatstat import ImagePattern, load_image_pattern

__all__ = [  # what the backends re-export
    "FLIGHTS_COLUMNS", "NUM_SPLITS", "POINT_PATTERNS", "UCI_NAMES", "MinMaxScaler", "PointPattern", "Split", "Standardizer",
    "CovariatePattern", "ImagePattern", "data_dir", "load_banana", "load_fashion_mnist", "load_flights", "load_image_pattern",
    "load_mnist", "load_point_pattern", "load_sarcos", "load_uci", "simulate_covariate_pattern", "standardize",
]

UCI_NAMES = ("pol", "elevators", "bike", "kin40k", "protein", "keggdirected")
NUM_SPLITS = 10
FLIGHTS_COLUMNS = (
    "hour", "day_of_week", "day_of_year", "distance",
    "origin_lat", "origin_lon", "destination_lat", "destination_lon",
)
POINT_PATTERNS = {  # name: (file, coordinate columns, window with one (low, high) row per column)
    # The documented span 15 Mar 1851 .. 22 Mar 1962 (both days included) in the file's decimal
    # years (fraction = elapsed fraction of the year; 1851 and 1962 have 365 days): 73 days
    # elapsed at the start of 15 Mar, 81 at the end of 22 Mar.
    "coal_disasters": ("coal_disasters.csv", ("date",), ((1851 + 73 / 365, 1962 + 81 / 365),)),
    "redwood": ("redwood.csv", ("x", "y"), ((0.0, 1.0), (-1.0, 0.0))),
    "japanesepines": ("japanesepines.csv", ("x", "y"), ((0.0, 1.0), (0.0, 1.0))),
    "finpines": ("finpines.csv", ("x", "y"), ((-5.0, 5.0), (-8.0, 2.0))),
    "vff_pines": ("vff_pines_unitsquare.csv", ("x", "y"), ((0.0, 1.0), (0.0, 1.0))),
}


class Split(NamedTuple):
    """A train/test split: ``X_train (n, D)``, ``y_train (n,)``, ``X_test (m, D)``, ``y_test (m,)``."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


class PointPattern(NamedTuple):
    """Events ``(n, d)`` float64 and their observation window ``(d, 2)``: rows of (low, high)."""

    events: np.ndarray
    window: np.ndarray


def data_dir(path=None, dataset=None):
    """The data directory: ``path``, else the environment variable ``SPARSEGP_DATA``.

    Args:
        path: a directory (str or path-like), or None.
        dataset: the folder wanted, only to name it in error messages.

    Returns:
        The directory as a ``pathlib.Path``.

    Raises:
        ValueError: neither ``path`` nor ``SPARSEGP_DATA`` is set.
        FileNotFoundError: the directory does not exist.
    """
    wanted = f" for dataset {dataset!r}" if dataset else ""
    if path is None:
        path = os.environ.get("SPARSEGP_DATA") or None
        if path is None:
            raise ValueError(
                f"no data directory{wanted}: pass data_dir=... or set the environment variable "
                "SPARSEGP_DATA to the folder holding the dataset folders (uci_kin40k/, banana/, ...), "
                "e.g. `export SPARSEGP_DATA=/path/to/shared/data`"
            )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a str or path-like, got {type(path).__name__}")
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data directory {path}{wanted} does not exist")
    return path


def _file(folder, name, directory):
    path = data_dir(directory, dataset=folder) / folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the folder of dataset {folder!r} is missing or incomplete")
    return path


def _read_csv(path, columns):
    """The named columns of a CSV file with a header line, as float64 ``(n, len(columns))``."""
    with open(path) as f:
        header = f.readline().strip().split(",")
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(missing)} (header: {','.join(header)})")
    usecols = [header.index(c) for c in columns]
    return np.loadtxt(path, delimiter=",", skiprows=1, usecols=usecols, ndmin=2, dtype=np.float64)


def _integer(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")
    return int(value)


def load_uci(name, split=0, data_dir=None):
    """One of the 10 fixed train/test splits of a UCI regression set.

    Reads folder ``uci_<name>``: ``data.csv.gz`` (inputs, then the target in the last column) and
    ``test_mask.csv.gz`` (one 0/1 column per split marking its test rows, 10% of the rows; every
    row is a test row in exactly one split). The data are already centred upstream, not scaled.

    Args:
        name: one of :data:`UCI_NAMES` (pol, elevators, bike, kin40k, protein, keggdirected).
        split: split index, 0..9.
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        :class:`Split` of float64 arrays ``X_train (n, D)``, ``y_train (n,)``, ``X_test (m, D)``,
        ``y_test (m,)``, rows in file order.
    """
    if name not in UCI_NAMES:
        raise ValueError(f"name must be one of {', '.join(UCI_NAMES)}, got {name!r}")
    split = _integer(split, "split", 0, NUM_SPLITS - 1)
    folder = f"uci_{name}"
    data = np.loadtxt(_file(folder, "data.csv.gz", data_dir), delimiter=",", dtype=np.float64, ndmin=2)
    masks = np.loadtxt(_file(folder, "test_mask.csv.gz", data_dir), delimiter=",", dtype=np.int64, ndmin=2)
    if masks.shape != (len(data), NUM_SPLITS) or not np.isin(masks, (0, 1)).all():
        raise ValueError(f"{folder}/test_mask.csv.gz must hold 0/1 of shape ({len(data)}, {NUM_SPLITS}), "
                         f"got shape {masks.shape}")
    test = masks[:, split].astype(bool)
    X, y = data[:, :-1], data[:, -1]
    return Split(X[~test], y[~test], X[test], y[test])


def load_banana(data_dir=None):
    """The 400-point, 2-D banana classification set (no test set is provided).

    Args:
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        ``(X, y)``: inputs ``(400, 2)`` float64 and labels ``(400,)`` int64 in {0, 1}.
    """
    data = _read_csv(_file("banana", "banana.csv", data_dir), ("x1", "x2", "y"))
    return data[:, :2], data[:, 2].astype(np.int64)


def _images(images, flatten, dtype):
    pixels = images.astype(dtype)
    pixels /= 255.0
    return pixels.reshape(len(images), -1) if flatten else pixels


def load_mnist(flatten=True, dtype=np.float64, data_dir=None):
    """10,000 MNIST digits (folder ``mnist_10k``; a single set without a test split, its rows
    grouped by class: shuffle before splitting).

    Args:
        flatten: images as rows of 784 pixels; False keeps them ``(28, 28)``.
        dtype: floating dtype of the pixels (float32 halves the memory).
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        ``(X, y)``: pixels in [0, 1] (the uint8 grey levels divided by 255), ``(10000, 784)`` or
        ``(10000, 28, 28)``, and labels ``(10000,)`` int64 in 0..9.
    """
    with np.load(_file("mnist_10k", "mnist_10k.npz", data_dir)) as z:
        return _images(z["images"], flatten, dtype), z["labels"].astype(np.int64)


def load_fashion_mnist(flatten=True, dtype=np.float64, data_dir=None):
    """Fashion-MNIST with its official 60,000 / 10,000 train/test split (10 balanced classes).

    Args:
        flatten: images as rows of 784 pixels; False keeps them ``(28, 28)``.
        dtype: floating dtype of the pixels (the float64 training images take 376 MB; float32
            halves that).
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        :class:`Split` ``(X_train, y_train, X_test, y_test)``: pixels in [0, 1] of shape
        ``(60000, 784)`` and ``(10000, 784)`` (or ``(.., 28, 28)``), labels int64 in 0..9.
    """
    with np.load(_file("fashion_mnist", "fashion_mnist.npz", data_dir)) as z:
        return Split(_images(z["x_train"], flatten, dtype), z["y_train"].astype(np.int64),
                     _images(z["x_test"], flatten, dtype), z["y_test"].astype(np.int64))


def load_sarcos(data_dir=None):
    """SARCOS inverse dynamics, the official test file only (folder ``sarcos_test``), unscaled.

    Args:
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        ``(X, Y)``: float64 inputs ``(4449, 21)`` (7 joint positions, 7 velocities, 7
        accelerations) and the 7 joint torques ``(4449, 7)`` (column 0 is the usual single target).
    """
    with np.load(_file("sarcos_test", "sarcos_inv_test.npz", data_dir)) as z:
        return z["X"].astype(np.float64), z["Y"].astype(np.float64)


def load_flights(num_rows=None, seed=0, data_dir=None):
    """US domestic flight departure delays, 1 Jan .. 1 Jul 2001 (3,000,000 flights).

    The inputs are the features the folder's README suggests, in the order of
    :data:`FLIGHTS_COLUMNS`: hour of day (0..23), day of week (0 = Monday), day of year (0 = 1
    January), distance (miles), latitude and longitude of the origin airport, of the destination
    airport. The target is the departure delay in minutes, unfiltered (a few extreme negative
    delays look like recording errors).

    Args:
        num_rows: a random subset of this many rows, drawn without replacement with ``seed`` and
            kept in time order; None: all rows.
        seed: seed of the subset.
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        ``(X, y)``: float64 inputs ``(n, 8)`` and delays ``(n,)``.
    """
    with np.load(_file("flights_3m", "flights_3m.npz", data_dir)) as z:
        columns = {k: z[k] for k in ("minutes", "delay", "distance", "origin", "destination")}
        lat, lon = z["airport_lat"], z["airport_lon"]
    if num_rows is not None:
        total = len(columns["delay"])
        num_rows = _integer(num_rows, "num_rows", 1, total)
        rows = np.sort(np.random.default_rng(seed).choice(total, num_rows, replace=False))
        columns = {k: v[rows] for k, v in columns.items()}
    minutes = columns["minutes"]  # since 2001-01-01 00:00, a Monday
    day = minutes // (24 * 60)
    X = np.stack([
        (minutes // 60) % 24, day % 7, day, columns["distance"],
        lat[columns["origin"]], lon[columns["origin"]], lat[columns["destination"]], lon[columns["destination"]],
    ], axis=1).astype(np.float64)
    return X, columns["delay"].astype(np.float64)


def load_point_pattern(name, data_dir=None):
    """A point pattern from folder ``point_patterns`` and its observation window.

    Names: ``coal_disasters`` (1-D: 191 explosion dates in decimal years, window 15 Mar 1851 ..
    22 Mar 1962), ``redwood`` (62 trees, [0, 1] x [-1, 0]), ``japanesepines`` (65, [0, 1]^2),
    ``finpines`` (126, [-5, 5] x [-8, 2] metres; the marks are dropped) and ``vff_pines`` (127 rows
    on [0, 1]^2, the first two identical, as the VFF experiments used them).

    Args:
        name: one of the keys of :data:`POINT_PATTERNS`.
        data_dir: the data directory (default ``$SPARSEGP_DATA``).

    Returns:
        :class:`PointPattern` ``(events (n, d), window (d, 2))``, float64.
    """
    if name not in POINT_PATTERNS:
        raise ValueError(f"name must be one of {', '.join(POINT_PATTERNS)}, got {name!r}")
    file, columns, window = POINT_PATTERNS[name]
    path = _file("point_patterns", file, data_dir)
    events, window = _read_csv(path, columns), np.array(window, dtype=np.float64)
    if not np.all((events >= window[:, 0]) & (events <= window[:, 1])):
        raise ValueError(f"{path} has events outside the window {window.tolist()}")
    return PointPattern(events, window)


def _finite(a, name):
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array of real numbers, got {type(a).__name__}") from e
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _statistic(values):
    """Drop leading length-1 axes: broadcasting adds them back, and the moments of ``(n, D)``
    inputs over axis 0 come out as ``(D,)`` (a 0-d array for ``(n,)`` targets)."""
    shape = values.shape
    while shape and shape[0] == 1:
        shape = shape[1:]
    return values.reshape(shape)


def _fit_input(a, axis):
    a = _finite(a, "a")
    if a.size == 0:
        raise ValueError(f"a must not be empty, got shape {a.shape}")
    return a


def _transform_input(a, name, statistic):
    a = _finite(a, name)
    try:
        matches = np.broadcast_shapes(a.shape, statistic.shape) == a.shape
    except ValueError:
        matches = False
    if not matches:
        raise ValueError(f"{name} of shape {a.shape} does not match the fitted statistics of shape {statistic.shape}")
    return a


class Standardizer(NamedTuple):
    """``(a - mean) / std`` elementwise, with moments fitted on training data.

    ``mean`` and ``std`` broadcast against the data: ``(D,)`` for ``(n, D)`` inputs fitted over
    axis 0, 0-d arrays for ``(n,)`` targets. A constant column gets ``std = 1`` (it maps to 0).
    """

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, a, axis=0):
        """The moments of ``a`` over ``axis`` (an int, a tuple of ints or None for all).

        Args:
            a: training data, e.g. inputs ``(n, D)`` or targets ``(n,)``; finite.
            axis: the axis (or axes) of the observations.

        Returns:
            The fitted :class:`Standardizer`.
        """
        a = _fit_input(a, axis)
        mean, std = a.mean(axis=axis, keepdims=True), a.std(axis=axis, keepdims=True)
        # a constant column has a rounding-level std (~1e-17 for 0.1): treat it as exactly constant
        constant = std <= 1e3 * np.finfo(np.float64).eps * np.abs(mean)
        std = np.where(constant, 1.0, std)
        return cls(_statistic(mean), _statistic(std))

    def transform(self, a, name="a"):
        """``(a - mean) / std``; ``a`` has the fitted shape (any number of rows), float64 out."""
        return (_transform_input(a, name, self.mean) - self.mean) / self.std

    def inverse_transform(self, a, name="a"):
        """``a * std + mean``: standardised values (e.g. a predictive mean) in original units."""
        return _transform_input(a, name, self.mean) * self.std + self.mean

    def inverse_variance(self, var, name="var"):
        """``var * std**2``: a (predictive) variance in standardised units in original units."""
        var = _transform_input(var, name, self.std)
        if np.any(var < 0):
            raise ValueError(f"{name} must be non-negative")
        return var * self.std**2


class MinMaxScaler(NamedTuple):
    """Affine map of each column's training range ``[low, high]`` onto [-1, 1].

    Data outside the training range (e.g. test inputs) land outside [-1, 1]. A constant column maps
    to 0. ``low`` and ``high`` broadcast against the data like :class:`Standardizer`'s moments.
    """

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def fit(cls, a, axis=0):
        """The range of ``a`` over ``axis`` (an int, a tuple of ints or None for all).

        Args:
            a: training data, e.g. inputs ``(n, D)``; finite.
            axis: the axis (or axes) of the observations.

        Returns:
            The fitted :class:`MinMaxScaler`.
        """
        a = _fit_input(a, axis)
        return cls(_statistic(a.min(axis=axis, keepdims=True)), _statistic(a.max(axis=axis, keepdims=True)))

    def _centre_and_half_range(self):
        half = (self.high - self.low) / 2
        return (self.low + self.high) / 2, np.where(half > 0, half, 1.0)

    def transform(self, a, name="a"):
        """``(a - centre) / half_range``: the training range onto [-1, 1], float64 out."""
        centre, half = self._centre_and_half_range()
        return (_transform_input(a, name, self.low) - centre) / half

    def inverse_transform(self, a, name="a"):
        """Scaled values back in original units."""
        centre, half = self._centre_and_half_range()
        return _transform_input(a, name, self.low) * half + centre


def standardize(train, *others, axis=0):
    """Standardise ``train`` and ``others`` with the moments of ``train``.

    Args:
        train: training data, e.g. ``(n, D)``; finite.
        *others: arrays of the same trailing shape (test inputs, ...).
        axis: the axis of the observations in ``train``.

    Returns:
        ``(train_t, *others_t, transform)``: float64 arrays and the fitted :class:`Standardizer`
        (its ``inverse_transform`` and ``inverse_variance`` map predictions back).
    """
    transform = Standardizer.fit(_finite(train, "train"), axis=axis)
    scaled = [transform.transform(o, name=f"others[{i}]") for i, o in enumerate(others)]
    return (transform.transform(train, name="train"), *scaled, transform)


class CovariatePattern(NamedTuple):
    """A simulated point pattern with covariate images (:func:`simulate_covariate_pattern`)."""

    events: np.ndarray  # (n, 2)
    raster: "Raster"  # the standardised images ``wave`` and ``slope``
    coefficients: np.ndarray  # (3,) the true intercept and per-standard-deviation effects
    window: np.ndarray  # (2, 2): the unit square
    log_intensity: object  # the true log-intensity, a function of (N, 2) NumPy points


def simulate_covariate_pattern(seed=0, variance=0.1, lengthscale=0.25, coefficients=(np.log(800.0), 0.6, -0.4),
                               num_pixels=40):
    """A log-Gaussian Cox process on ``[0, 1]^2`` with ``log lambda = b0 + b1 wave + b2 slope + f``:
    two smooth covariate images (``num_pixels`` squared, standardised) and a squared-exponential
    GP draw ``f`` (``variance``, ``lengthscale``; 300 random Fourier features; ``variance=0``:
    none), simulated by thinning with the given ``seed``. For tests and benchmarks of covariate
    mean functions; about 1,100 events with the default coefficients."""
    from sparsegp_common.data.raster import Raster

    rng = np.random.default_rng(seed)
    x = (np.arange(num_pixels) + 0.5) / num_pixels
    gx, gy = np.meshgrid(x, x, indexing="xy")  # rows run up in y
    images = np.stack([np.sin(2 * np.pi * gx) * np.cos(np.pi * gy), (gx - 0.3) ** 2 + gy])
    raster = Raster(images, ((0, 1), (0, 1)), standardize=True, names=("wave", "slope"))
    omega, phase = rng.normal(size=(300, 2)) / lengthscale, rng.uniform(0, 2 * np.pi, 300)
    weights = rng.normal(size=300) * np.sqrt(2 * variance / 300)
    b = np.asarray(coefficients, dtype=np.float64)

    def log_intensity(X):
        return b[0] + raster.evaluate(X) @ b[1:] + np.cos(X @ omega.T + phase) @ weights

    bound = np.exp(log_intensity(rng.uniform(0, 1, (20000, 2))).max() + 0.5)
    candidates = rng.uniform(0, 1, (rng.poisson(bound), 2))
    keep = rng.uniform(size=len(candidates)) < np.exp(log_intensity(candidates)) / bound
    return CovariatePattern(candidates[keep], raster, b, np.array([[0.0, 1.0], [0.0, 1.0]]), log_intensity)

