"""Dataset loaders and standardisation helpers (:mod:`sparsegp_common.data.datasets`): NumPy float64
arrays (int64 class labels), to turn into torch tensors (``torch.as_tensor``) at the dtype you train in."""
from sparsegp_common.data.datasets import *  # noqa: F403  (its __all__)
