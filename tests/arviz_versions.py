"""The few ArviZ calls that differ between 0.x (CI's pins) and 1.x (the newest-versions tier,
``.ci/newest``), so that the export tests run under both."""
import arviz as az

ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1


def groups(data):
    """Group names of an ``InferenceData`` (0.x) or a ``DataTree`` (1.x)."""
    return set(data.children) if ARVIZ_1 else set(data.groups())


def loo(data):
    """``(n_data_points, elpd)`` of PSIS-LOO."""
    result = az.loo(data)
    return result.n_data_points, result.elpd if ARVIZ_1 else result.elpd_loo
