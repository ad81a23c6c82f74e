"""Backend-free pieces of the decoupled-basis prior (Cheng & Boots, 2017): option checks and the
layout of the chunked KL quadratic form.

The formulas themselves live in each backend's ``decoupled.py``; see ``specs/decoupled.md``.
"""
from .checks import one_of, positive_int

PARAMETRIZATIONS = ("direct", "jacobi", "hybrid")

#: Scale of the initial covariance factor ``L = L_INIT * I``: ``L = 0`` is the prior but a
#: stationary point of the ELBO in ``L`` (spec section 7.2), so learning would never start there.
L_INIT = 1e-3


def check_options(parametrization, kl_chunk_size, kl_subsample_size, num_alpha):
    """Validate the constructor options; returns them normalised."""
    one_of(parametrization, "parametrization", PARAMETRIZATIONS)
    kl_chunk_size = positive_int(kl_chunk_size, "kl_chunk_size")
    if kl_subsample_size is not None:
        kl_subsample_size = positive_int(kl_subsample_size, "kl_subsample_size")
        if kl_subsample_size > num_alpha:
            raise ValueError(
                f"kl_subsample_size={kl_subsample_size} exceeds the size of the mean basis "
                f"(Z_alpha has {num_alpha} rows)"
            )
    return parametrization, kl_chunk_size, kl_subsample_size


def check_active(active, name, size):
    """Initial number of active basis points (None: all ``size``)."""
    if active is None:
        return None
    if isinstance(active, bool) or not isinstance(active, int) or not 0 <= active <= size:
        raise ValueError(f"{name} must be an integer in [0, {size}], got {active!r}")
    return active


def num_chunks(size, chunk):
    """Number of row blocks of ``chunk`` rows covering ``size`` rows."""
    return -(-size // chunk)
