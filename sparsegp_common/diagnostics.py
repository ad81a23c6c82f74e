"""Backend-free half of ``to_inference_data``: naming dimensions after plates and assembling the
``arviz.InferenceData`` from NumPy arrays collected by either backend."""
import numpy as np

from .checks import positive_int


def draws_layout(num_samples, num_chains):
    """Validate the draw counts; returns ``(num_chains, draws_per_chain)``."""
    num_samples = positive_int(num_samples, "num_samples")
    num_chains = positive_int(num_chains, "num_chains")
    if num_samples % num_chains:
        raise ValueError(f"num_samples ({num_samples}) must be a multiple of num_chains ({num_chains})")
    return num_chains, num_samples // num_chains


def model_guide_pair(model, guide, gp_model_type):
    """The pair to replay: a ``GPModel``'s sampled pair, or the user's model and guide."""
    if isinstance(model, gp_model_type):
        if guide is not None:
            raise ValueError("pass guide=None with a GPModel: its own guide is used")
        return model.sampled_model, model.sampled_guide
    if guide is None:
        raise ValueError("guide is required (unless model is a GPModel)")
    return model, guide


def site_dims(name, shape, event_dim, plates):
    """Dimension names of a site's value: its plates' names where a plate indexes the axis,
    ``<name>_dim_<k>`` elsewhere.

    Args:
        name: the site name.
        shape: the value's shape (one draw).
        event_dim: number of trailing event dimensions.
        plates: ``[(plate name, dim), ...]`` with negative ``dim`` counted from the batch shape.
    """
    dims = [f"{name}_dim_{k}" for k in range(len(shape))]
    batch_ndim = len(shape) - event_dim
    for plate, dim in plates:
        if dim is not None and -dim <= batch_ndim:
            dims[batch_ndim + dim] = plate
    return dims


def inference_data(posterior, predictive, log_likelihood, observed, dims, num_chains, losses=None):
    """Assemble the ``InferenceData``.

    Args:
        posterior, predictive, log_likelihood: ``{site: (num_samples, *shape)}`` arrays.
        observed: ``{site: array}`` observed values.
        dims: ``{site: [dim names]}`` for the per-draw shapes.
        num_chains: the draws are split into this many chains (they are independent draws).
        losses: optional loss history of the fit; stored as ``sample_stats.elbo = -losses``
            along a ``step`` dimension.
    """
    import arviz as az
    import xarray as xr

    def chains(group):
        return {k: np.reshape(np.asarray(v), (num_chains, -1) + np.shape(v)[1:]) for k, v in group.items()}

    data = az.from_dict(
        posterior=chains(posterior),
        posterior_predictive=chains(predictive),
        log_likelihood=chains(log_likelihood),
        observed_data={k: np.asarray(v) for k, v in observed.items()},
        dims=dims,
    )
    if losses is not None:
        elbo = -np.asarray(losses, dtype=np.float64)
        data.add_groups(sample_stats=xr.Dataset({"elbo": (("step",), elbo)}, coords={"step": np.arange(1, len(elbo) + 1)}))
    return data
