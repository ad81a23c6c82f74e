"""Dataset loaders and standardisation helpers (:mod:`sparsegp_common.datasets`): NumPy float64
arrays (int64 class labels), to turn into torch tensors (``torch.as_tensor``) at the dtype you train in."""
from sparsegp_common.datasets import (  # noqa: F401  (re-exported)
    FLIGHTS_COLUMNS, NUM_SPLITS, POINT_PATTERNS, UCI_NAMES, MinMaxScaler, PointPattern, Split, Standardizer,
    data_dir, load_banana, load_fashion_mnist, load_flights, load_mnist, load_point_pattern, load_sarcos,
    load_uci, standardize,
)
