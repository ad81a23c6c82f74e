"""Loaders for the offline datasets (regression, classification, multi-output, point patterns)
and standardisation helpers that return their transform.

Nothing is downloaded: files are read from a directory given as ``data_dir`` or through the
environment variable ``SPARSEGP_DATA``; each dataset lives in the sub-folder its loader names
(the layout of the project's shared data directory, one README per folder). Arrays are NumPy,
float64 for inputs and targets, int64 for class labels; convert them with ``torch.as_tensor`` or
``jnp.asarray``.
"""
import os
import pathlib
from typing import NamedTuple

import numpy as np

UCI_NAMES = ("pol", "elevators", "bike", "kin40k", "protein", "keggdirected")
NUM_SPLITS = 10
POINT_PATTERNS = {  # file, window ((low, high) per coordinate)
    # the documented span, 15 Mar 1851 .. 22 Mar 1962, in decimal years (rounded outwards so that
    # it contains the recorded event times)
    "coal_disasters": ("coal_disasters.csv", ((1851.2, 1962.3),)),
    "redwood": ("redwood.csv", ((0.0, 1.0), (-1.0, 0.0))),
    "japanesepines": ("japanesepines.csv", ((0.0, 1.0), (0.0, 1.0))),
    "finpines": ("finpines.csv", ((-5.0, 5.0), (-8.0, 2.0))),
    "vff_pines": ("vff_pines_unitsquare.csv", ((0.0, 1.0), (0.0, 1.0))),
}


class Split(NamedTuple):
    """A train/test split: ``X_train (n, D)``, ``y_train (n,)``, ``X_test (m, D)``, ``y_test (m,)``."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


class PointPattern(NamedTuple):
    """Events ``(n, d)`` and their observation window ``(d, 2)``: rows of (low, high)."""

    events: np.ndarray
    window: np.ndarray


def data_dir(path=None):
    """The data directory: ``path``, else ``$SPARSEGP_DATA``."""
    path = path if path is not None else os.environ.get("SPARSEGP_DATA")
    if path is None:
        raise ValueError(
            "no data directory: pass data_dir=... or set the environment variable SPARSEGP_DATA "
            "to the folder holding the dataset folders (e.g. uci_kin40k/, banana/)"
        )
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data directory {path} does not exist")
    return path


def _file(folder, name, data_dir_):
    path = data_dir(data_dir_) / folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the dataset folder {folder!r} is missing or incomplete")
    return path


def load_uci(name, split=0, data_dir=None):
    """One of the 10 fixed train/test splits of a UCI regression set (``uci_<name>`` folder:
    ``data.csv.gz`` with the target in the last column, ``test_mask.csv.gz`` with one column
    per split).

    Args:
        name: one of :data:`UCI_NAMES`.
        split: 0..9.
        data_dir: the data directory (default ``$SPARSEGP_DATA``).
    """
    if name not in UCI_NAMES:
        raise ValueError(f"name must be one of {', '.join(UCI_NAMES)}, got {name!r}")
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < NUM_SPLITS:
        raise ValueError(f"split must be an integer in 0..{NUM_SPLITS - 1}, got {split!r}")
    data = np.loadtxt(_file(f"uci_{name}", "data.csv.gz", data_dir), delimiter=",", dtype=np.float64)
    masks = np.loadtxt(_file(f"uci_{name}", "test_mask.csv.gz", data_dir), delimiter=",", dtype=np.int64)
    if masks.shape != (len(data), NUM_SPLITS):
        raise ValueError(f"test_mask.csv.gz of {name} has shape {masks.shape}, expected ({len(data)}, {NUM_SPLITS})")
    test = masks[:, split].astype(bool)
    X, y = data[:, :-1], data[:, -1]
    return Split(X[~test], y[~test], X[test], y[test])


def load_banana(data_dir=None):
    """The 400-point banana set: ``X (400, 2)``, labels ``y (400,)`` in {0, 1}."""
    data = np.loadtxt(_file("banana", "banana.csv", data_dir), delimiter=",", skiprows=1)
    return data[:, :2], data[:, 2].astype(np.int64)


def _images(images):
    return images.reshape(len(images), -1).astype(np.float64) / 255.0


def load_mnist(data_dir=None):
    """10,000 MNIST digits: images ``(10000, 784)`` scaled to [0, 1], labels ``(10000,)`` 0..9."""
    with np.load(_file("mnist_10k", "mnist_10k.npz", data_dir)) as z:
        return _images(z["images"]), z["labels"].astype(np.int64)


def load_fashion_mnist(data_dir=None):
    """Fashion-MNIST: ``(X_train (60000, 784), y_train, X_test (10000, 784), y_test)``, pixels in [0, 1]."""
    with np.load(_file("fashion_mnist", "fashion_mnist.npz", data_dir)) as z:
        return Split(_images(z["x_train"]), z["y_train"].astype(np.int64), _images(z["x_test"]), z["y_test"].astype(np.int64))


def load_sarcos(data_dir=None):
    """The SARCOS inverse-dynamics test file: ``X (4449, 21)``, torques ``Y (4449, 7)``."""
    with np.load(_file("sarcos_test", "sarcos_inv_test.npz", data_dir)) as z:
        return z["X"].astype(np.float64), z["Y"].astype(np.float64)


def load_flights(num_rows=None, seed=0, data_dir=None):
    """US flight delays (3M rows). Inputs ``(n, 5)``: hour of day, day of week (0 = Monday), day of
    year (1..366), distance (miles), and ``minutes`` since 2001-01-01; target: departure delay
    (minutes).

    Args:
        num_rows: a random subset of this many rows (without replacement, fixed by ``seed``);
            None: all rows.
    """
    with np.load(_file("flights_3m", "flights_3m.npz", data_dir)) as z:
        minutes, delay, distance = z["minutes"], z["delay"], z["distance"]
    if num_rows is not None:
        if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or not 0 < num_rows <= len(delay):
            raise ValueError(f"num_rows must be an integer in 1..{len(delay)}, got {num_rows!r}")
        rows = np.sort(np.random.default_rng(seed).choice(len(delay), num_rows, replace=False))
        minutes, delay, distance = minutes[rows], delay[rows], distance[rows]
    stamp = np.datetime64("2001-01-01") + minutes.astype("timedelta64[m]")
    days = stamp.astype("datetime64[D]")
    day_of_year = (days - days.astype("datetime64[Y]")).astype(np.int64) + 1
    day_of_week = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday (3)
    hour = (minutes % (24 * 60)) / 60.0
    X = np.stack([hour, day_of_week, day_of_year, distance, minutes], axis=1).astype(np.float64)
    return X, delay.astype(np.float64)


def load_point_pattern(name, data_dir=None):
    """A point pattern from ``point_patterns/``: coal_disasters (1-D, decimal years), redwood,
    japanesepines, finpines (coordinates only) or vff_pines (2-D)."""
    if name not in POINT_PATTERNS:
        raise ValueError(f"name must be one of {', '.join(POINT_PATTERNS)}, got {name!r}")
    file, window = POINT_PATTERNS[name]
    events = np.loadtxt(_file("point_patterns", file, data_dir), delimiter=",", skiprows=1, ndmin=2)
    events = events[:, : len(window)]
    window = np.asarray(window, dtype=np.float64)
    if not np.all((events >= window[:, 0]) & (events <= window[:, 1])):
        raise ValueError(f"{file} has events outside the window {window.tolist()}")
    return PointPattern(events, window)


def _finite(a, name):
    a = np.asarray(a, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return a


class Standardizer(NamedTuple):
    """``(a - mean) / std`` per column; constant columns get ``std = 1``."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, a, axis=0):
        a = _finite(a, "a")
        std = a.std(axis=axis)
        return cls(a.mean(axis=axis), np.where(std > 0, std, 1.0))

    def transform(self, a):
        return (_finite(a, "a") - self.mean) / self.std

    def inverse_transform(self, a):
        return np.asarray(a) * self.std + self.mean

    def inverse_variance(self, var):
        """A variance in standardised units back in original units."""
        return np.asarray(var) * self.std**2


class MinMaxScaler(NamedTuple):
    """Affine map of each column's training range onto [-1, 1]; constant columns map to 0."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def fit(cls, a, axis=0):
        a = _finite(a, "a")
        return cls(a.min(axis=axis), a.max(axis=axis))

    @property
    def _half_range(self):
        half = (self.high - self.low) / 2
        return np.where(half > 0, half, 1.0)

    def transform(self, a):
        return (_finite(a, "a") - (self.low + self.high) / 2) / self._half_range

    def inverse_transform(self, a):
        return np.asarray(a) * self._half_range + (self.low + self.high) / 2


def standardize(train, *others):
    """Standardise ``train`` and ``others`` with the moments of ``train``; returns
    ``(train_t, *others_t, transform)``."""
    transform = Standardizer.fit(train)
    return (transform.transform(train), *(transform.transform(o) for o in others), transform)
