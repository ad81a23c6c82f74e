"""The result type of ``predict_y``, shared by both backends."""
from typing import Any, NamedTuple, Optional


class Prediction(NamedTuple):
    """Moments of the predictive distribution of ``y`` (tensors in Pyro, arrays in NumPyro).

    Attributes:
        mean: ``(N,)`` (``(N, C)`` class probabilities for ``Softmax``).
        variance: same shape as ``mean``.
        quantiles: ``(Q, N)`` for the requested levels, or None.
    """

    mean: Any
    variance: Any
    quantiles: Optional[Any]
