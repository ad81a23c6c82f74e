"""The array namespace of the inputs, and the few operations the array API standard lacks.

The formulas of the core take ``xp = namespace(*arrays)`` (``jax.numpy``, or the
``array-api-compat`` namespace of torch or NumPy) for everything the standard has, and
``backend(*arrays)`` for the rest: one small module per array library with the same functions
(``solve_lower``, ``cholesky``, ``precise_matmul``, ``stop_gradient``, ``with_partials``,
``is_concrete``, ``normal``, ``output_shape``, ``check_dtype``, and ``cos`` and ``sin``, which JAX
evaluates faster by polynomial on a CPU), steps differentiated as one (``cholesky_and_solve``,
``whitened_moments``) and, where a library has one, a fused kernel (``se_matvec``). The choice follows the arrays passed, never a process-wide switch, so both
packages work in one process.
"""
import functools
import importlib
import numbers

import array_api_compat
import numpy as np

_MODULES = {"torch": "_torch", "jax": "_jax", "numpy": "_numpy"}


_BY_TYPES = {}  # the arguments' types -> their namespace, where the types alone decide it


def namespace(*arrays):
    """The array API namespace shared by ``arrays``: ``None`` and numbers are skipped, and NumPy
    arrays beside torch or JAX ones follow them (as the libraries themselves convert them)."""
    # every formula asks, many times a step: array_api_compat's inspection once per combination
    # of types (not for NumPy's: a float0 NumPy array counts as JAX's)
    types = tuple(map(type, arrays))
    xp = _BY_TYPES.get(types)
    if xp is None:
        xp = _namespace(arrays)
        if not any(issubclass(t, (np.ndarray, np.generic)) for t in types):
            _BY_TYPES[types] = xp
    return xp


def _namespace(arrays):
    arrays = [a for a in arrays if a is not None and not isinstance(a, numbers.Number)]
    foreign = [a for a in arrays if not array_api_compat.is_numpy_array(a)]
    return array_api_compat.array_namespace(*(foreign or arrays))


def backend(*arrays):
    """The per-library operations for ``arrays``: ``sparsegp_common.ops._torch``, ``_jax`` or ``_numpy``."""
    return _operations(namespace(*arrays))


@functools.cache  # once per namespace, not an import lookup per call
def _operations(xp):
    for library, module in _MODULES.items():
        if getattr(array_api_compat, f"is_{library}_namespace")(xp):
            return importlib.import_module(f"{__name__}.{module}")
    raise TypeError(f"arrays of {xp.__name__} are not supported (torch, JAX and NumPy are)")


def device(array):
    return array_api_compat.device(array)


def plain_moments(Phi, y, s, wide):
    """``Phi^T S^-1 Phi``, ``Phi^T S^-1 y``, ``y^T S^-1 y`` (dtype ``wide``) and ``|phi_n|^2``
    (dtype of ``Phi``) for ``S = diag(s)`` (``s`` wide ``(N,)``; None: ``S = I``), as plain
    products: the ``dbk_moments`` of the libraries without a blocked kernel (JAX, NumPy)."""
    xp = namespace(Phi, y)
    P, t = xp.astype(Phi, wide), xp.astype(y, wide)
    sq = xp.sum(Phi**2, axis=-1)
    if s is None:
        return P.T @ P, P.T @ t, xp.sum(t**2), sq
    scaled = P / s[:, None]
    return P.T @ scaled, scaled.T @ t, xp.sum(t**2 / s), sq
