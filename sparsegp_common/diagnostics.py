"""``to_inference_data`` written once (:func:`make_to_inference_data`) around each backend's way of
drawing from a guide and replaying the model: argument checks, dimension names after plates, and
the ``arviz.InferenceData`` assembled from NumPy arrays."""
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


TO_INFERENCE_DATA = """Draws from the guide turned into an ``arviz.InferenceData``.

    Groups: ``posterior`` (the guide's latent sites), ``posterior_predictive`` and
    ``log_likelihood`` (every observed site of the model, replayed on each draw; pointwise, so
    ``az.loo`` and ``az.waic`` run), ``observed_data``, and ``sample_stats.elbo`` (the ELBO of
    every training step, when ``result`` is given). Dimensions are named after the plates.

    Args:
        model: a {ppl} model, or a :class:`~{package}.GPModel` (then ``guide`` is None and its
            :meth:`~{package}.GPModel.sampled_model` pair is used, whose ``<name>.f`` draws
            come from the marginals ``q(f_n)``: all per-observation diagnostics need), or a
            :class:`~{package}.CoxProcess` (its sampled pair likewise).
        guide: the guide fitted with ``model``.
        data: tuple of arguments of the model and guide (all observations, e.g. ``(X, y)``).
        num_samples: number of draws, split into ``num_chains`` chains of independent draws so
            that ArviZ's per-chain diagnostics run (``r_hat`` is 1 up to noise by construction).
        seed: seed of the draws{seed}.
        result: the :class:`~{package}.FitResult` of training: its ``params`` are used and its
            losses become ``sample_stats.elbo``; without it {without}.
        **kwargs: passed to the model and guide.
    """


def make_to_inference_data(draw, model_types, module, **doc):
    """The ``to_inference_data`` of a backend around ``draw(model, guide, data, num_samples, seed,
    params, kwargs)``, which returns ``(posterior, predictive, log_likelihood, observed, dims)``:
    NumPy arrays with a leading draw axis (``observed`` without it) and each site's dimension
    names; ``model_types`` are the backend's ``(GPModel, CoxProcess)``; ``doc`` fills the
    backend's phrases of :data:`TO_INFERENCE_DATA`."""

    def to_inference_data(model, guide=None, data=(), *, num_samples=1000, num_chains=4, seed=0, result=None, **kwargs):
        model, guide = model_guide_pair(model, guide, model_types)
        num_chains, _ = draws_layout(num_samples, num_chains)
        params = None if result is None else result.params
        posterior, predictive, log_lik, observed, dims = draw(model, guide, tuple(data), num_samples, seed, params, kwargs)
        if not log_lik:
            raise ValueError("the model has no observed sites: pass the observations in data")
        return inference_data(posterior, predictive, log_lik, observed, dims, num_chains,
                              None if result is None else result.losses)

    to_inference_data.__module__ = module
    to_inference_data.__doc__ = TO_INFERENCE_DATA.format(**doc)
    return to_inference_data
