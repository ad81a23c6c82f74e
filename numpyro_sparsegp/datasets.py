"""Dataset loaders and standardisation helpers (NumPy arrays; backend-independent, see
:mod:`sparsegp_common.datasets`)."""
from sparsegp_common.datasets import (  # noqa: F401  (re-exported)
    NUM_SPLITS, POINT_PATTERNS, UCI_NAMES, MinMaxScaler, PointPattern, Split, Standardizer, data_dir,
    load_banana, load_fashion_mnist, load_flights, load_mnist, load_point_pattern, load_sarcos, load_uci,
    standardize,
)
