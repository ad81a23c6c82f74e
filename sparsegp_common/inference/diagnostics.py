"""``to_inference_data`` written once (:func:`make_to_inference_data`) around each backend's way of
drawing from a guide and replaying the model: argument checks, the walk over the full data of a
plate that subsamples (:func:`full_data_draws`), dimension names after plates, and the
ArviZ data (``InferenceData`` under ArviZ 0.x, ``DataTree`` under 1.x) assembled from NumPy arrays."""
import dataclasses

import numpy as np

from sparsegp_common.checks import positive_int


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


@dataclasses.dataclass
class Draws:
    """What a backend draws for one batch of rows: NumPy arrays with a leading draw axis
    (``observed`` without it).

    Attributes:
        latent: ``{site: (S, *shape)}`` the guide's latent sites (guide internals left out).
        log_lik: ``{site: (S, *batch_shape)}`` pointwise log-likelihood of each observed site.
        predictive: ``{site: (S, *shape)}`` draws of each observed site.
        observed: ``{site: array}`` the observed values.
        dims: ``{site: [dim names]}`` of the per-draw values.
        axes: ``{site: axis}`` the axis of a per-draw value along the subsampling plate (None
            for sites outside it, which :func:`full_data_draws` draws once and holds fixed).
        fixed: the backend's record of this batch's draws of the sites outside the plate, which
            later batches replay.
    """

    latent: dict
    log_lik: dict
    predictive: dict
    observed: dict
    dims: dict
    axes: dict
    fixed: object = None


def full_data_chunks(size, subsample_size):
    """Row indices ``(num_chunks, subsample_size)`` that cover ``range(size)`` in order, the
    last chunk wrapping round to the first rows so that every chunk has the plate's length."""
    num_chunks = -(-size // subsample_size)
    return np.arange(num_chunks * subsample_size).reshape(num_chunks, subsample_size) % size


def subsampling_plate(plates):
    """The one plate ``(name, size, subsample_size)`` that subsamples, or None; a clear error
    for more than one."""
    plates = sorted({p for p in plates if p[2] is not None and p[2] < p[1]})
    if len(plates) > 1:
        names = ", ".join(repr(p[0]) for p in plates)
        raise ValueError(
            f"the plates {names} all subsample; the export walks the full data of one plate only: "
            "give the model an argument that turns subsampling off (subsample_size=None) and pass it "
            "to to_inference_data"
        )
    return plates[0] if plates else None


def full_data_draws(draw, plate):
    """The draws over all rows of a subsampling plate, in batches of its length.

    Args:
        draw: ``draw(chunk, index, fixed)`` -> :class:`Draws` for batch number ``chunk``, with
            the plate's indices conditioned to ``index`` (``{plate name: rows}``, empty when no
            plate subsamples) and the sites outside the plate replayed from ``fixed`` (None for
            the first batch, which draws them).
        plate: ``(name, size, subsample_size)`` from :func:`subsampling_plate`, or None.

    Returns:
        one :class:`Draws` with every site along the plate of full length ``size``: the memory
        of the result, and of one batch at a time.
    """
    if plate is None:
        return draw(0, {}, None)
    name, size, _ = plate
    chunks, fixed = [], None
    for k, rows in enumerate(full_data_chunks(*plate[1:])):
        chunks.append(draw(k, {name: rows}, fixed))
        fixed = chunks[0].fixed
    first = chunks[0]

    def gather(group, offset):
        out = {}
        for site, value in getattr(first, group).items():
            axis = first.axes.get(site)
            if axis is None:
                out[site] = value
            else:
                whole = np.concatenate([getattr(c, group)[site] for c in chunks], axis=axis + offset)
                out[site] = np.take(whole, np.arange(size), axis=axis + offset)
        return out

    return Draws(gather("latent", 1), gather("log_lik", 1), gather("predictive", 1), gather("observed", 0),
                 first.dims, first.axes)


def plate_axis(shape, event_dim, plate_dim):
    """The axis of a value ``shape`` along a plate at batch dimension ``plate_dim`` (negative)."""
    batch_ndim = len(shape) - event_dim
    return None if plate_dim is None or -plate_dim > batch_ndim else batch_ndim + plate_dim


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


def arviz_major():
    """The installed ArviZ's major version (0: ``InferenceData``; 1: an xarray ``DataTree`` built by
    ``arviz_base``)."""
    import arviz as az

    return int(az.__version__.split(".")[0])


def inference_data(posterior, predictive, log_likelihood, observed, dims, num_chains, losses=None):
    """Assemble what the installed ArviZ works with, by its own ``from_dict``: an
    ``arviz.InferenceData`` under ArviZ 0.x, an ``xarray.DataTree`` under 1.x. Both have the same
    groups, variables and dims, with the draws along ``(chain, draw)``.

    Args:
        posterior, predictive, log_likelihood: ``{site: (num_samples, *shape)}`` arrays.
        observed: ``{site: array}`` observed values.
        dims: ``{site: [dim names]}`` for the per-draw shapes.
        num_chains: the draws are split into this many chains (they are independent draws).
        losses: optional loss history of the fit; stored as ``sample_stats.elbo = -losses``
            along a ``step`` dimension.
    """
    import xarray as xr

    def chains(group):
        return {k: np.reshape(np.asarray(v), (num_chains, -1) + np.shape(v)[1:]) for k, v in group.items()}

    groups = {"posterior": chains(posterior), "posterior_predictive": chains(predictive),
              "log_likelihood": chains(log_likelihood),
              "observed_data": {k: np.asarray(v) for k, v in observed.items()}}
    stats = None
    if losses is not None:
        elbo = -np.asarray(losses, dtype=np.float64)
        stats = xr.Dataset({"elbo": (("step",), elbo)}, coords={"step": np.arange(1, len(elbo) + 1)})
    if arviz_major() >= 1:
        import arviz_base

        data = arviz_base.from_dict(groups, dims=dims)
        if stats is not None:
            data["sample_stats"] = xr.DataTree(stats)
        return data
    import arviz as az

    data = az.from_dict(**groups, dims=dims)
    if stats is not None:
        data.add_groups(sample_stats=stats)
    return data


TO_INFERENCE_DATA = """Draws from the guide turned into ArviZ data: an ``arviz.InferenceData`` under
    ArviZ 0.x, an ``xarray.DataTree`` under ArviZ 1.x, with the same groups and dims.

    Groups: ``posterior`` (the guide's latent sites in constrained space; guide internals such
    as an autoguide's auxiliary sites are left out), ``posterior_predictive`` and
    ``log_likelihood`` (every observed site of the model, replayed on each draw; pointwise, so
    ``az.loo`` and ``az.compare`` run), ``observed_data``, and ``sample_stats.elbo`` (the ELBO of
    every training step, when ``result`` is given). Dimensions are named after the plates.

    A plate that subsamples during training (``subsample_size``) is walked over its full data in
    batches of its subsample size, so the pointwise log-likelihood covers every observation once;
    the sites outside that plate are drawn once per draw and held fixed across the batches.

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
        parallel: {parallel}
        **kwargs: passed to the model and guide.
    """


def make_to_inference_data(draw, model_types, module, **doc):
    """The ``to_inference_data`` of a backend around ``draw(model, guide, data, num_samples, seed,
    params, kwargs, parallel)``, which returns the :class:`Draws` over the full data;
    ``model_types`` are the backend's ``(GPModel, CoxProcess)``; ``doc`` fills the backend's
    phrases of :data:`TO_INFERENCE_DATA`."""

    def to_inference_data(model, guide=None, data=(), *, num_samples=1000, num_chains=4, seed=0, result=None,
                          parallel=True, **kwargs):
        model, guide = model_guide_pair(model, guide, model_types)
        num_chains, _ = draws_layout(num_samples, num_chains)
        params = None if result is None else result.params
        draws = draw(model, guide, tuple(data), num_samples, seed, params, kwargs, bool(parallel))
        if not draws.log_lik:
            raise ValueError("the model has no observed sites: pass the observations in data")
        return inference_data(draws.latent, draws.predictive, draws.log_lik, draws.observed, draws.dims, num_chains,
                              None if result is None else result.losses)

    to_inference_data.__module__ = module
    to_inference_data.__doc__ = TO_INFERENCE_DATA.format(**doc)
    return to_inference_data
