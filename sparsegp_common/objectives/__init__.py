"""The data plate every objective shares: minibatch selection and the ``num_data`` scaling.

An objective (``GPModel``'s minibatch ELBO, the VOF estimate, the Cox ELBO, the DBK weight
model) sums a data term over a batch of rows and must scale it to the full data set. It gets
the batch in one of two ways:

* the full data (``size == num_data``): the plate subsamples ``subsample_size`` rows per step
  and the PPL scales the plate's sites by ``size / subsample_size``;
* an external minibatch (``size < num_data``, e.g. from ``fit(batch_size=...)``): nothing is
  subsampled and the plate's sites are scaled by ``num_data / size``.
"""
import contextlib


def data_scale(num_data, size):
    """``num_data / size``: the factor that takes a data term summed over ``size`` rows to the full
    data set (``num_data`` None: the rows are the full data set)."""
    return (num_data or size) / size


@contextlib.contextmanager
def data_plate(sites, name, size, num_data=None, subsample_size=None, like=None):
    """Enter the data plate ``name`` and yield ``select(a)``: the rows of ``a`` (``(size, ...)``
    or None) in this step's batch.

    Args:
        sites: the backend's site module (``plate``, ``scale``).
        size: rows of the data given; num_data: rows of the full data set (None: ``size``).
        subsample_size: rows per step drawn by the plate (full data only).
        like: an array whose device the plate's indices follow.
    """
    num_data = num_data or size
    if num_data < size:
        raise ValueError(f"the data have {size} rows, more than num_data={num_data}")
    if num_data == size:
        with rows(sites.plate(name, size, subsample_size, like), size) as select:
            yield select
    elif subsample_size is not None:
        raise ValueError(f"subsample_size needs the full data set, but it has {size} rows and num_data={num_data}")
    else:
        with sites.scale(scale=data_scale(num_data, size)), sites.plate(name, size, like=like):
            yield lambda a: a


@contextlib.contextmanager
def rows(plate, size):
    """Enter ``plate`` (a data plate, e.g. the user's) and yield ``select(a)`` for arrays of
    ``size`` rows: the plate's subsample of the full data (``size == plate.size``), or the
    arrays as they are when they already are the minibatch (``size`` the subsample's size)."""
    with plate as idx:
        if size == plate.size and plate.subsample_size < plate.size:
            yield lambda a: a[idx] if a is not None else a
        elif size in (plate.size, idx.shape[0]):
            yield lambda a: a
        else:
            raise ValueError(
                f"X has {size} rows but the plate {plate.name!r} has size {plate.size} "
                f"and subsample size {idx.shape[0]}: pass either the full inputs or the minibatch"
            )
