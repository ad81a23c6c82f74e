"""Dataset loaders and standardisation helpers, shared by both backends: they return NumPy float64
arrays (int64 class labels); see :mod:`sparsegp_common.datasets`."""
from sparsegp_common.datasets import (  # noqa: F401  (re-exported)
    FLIGHTS_COLUMNS, NUM_SPLITS, POINT_PATTERNS, UCI_NAMES, MinMaxScaler, PointPattern, Split, Standardizer,
    data_dir, load_banana, load_fashion_mnist, load_flights, load_mnist, load_point_pattern, load_sarcos,
    load_uci, standardize,
)
