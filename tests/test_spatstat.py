"""Point patterns with covariate images from spatstat: the ``.npz`` loader (on a generated file),
the ``.rda`` conversion (where ``rdata`` and a ``gorillas.rda`` are at hand), and the benchmark's
Poisson GLM on a simulated pattern."""
import os
import pathlib

import numpy as np
import pytest

from sparsegp_common.data.spatstat import load_image_pattern, spatstat_to_npz


def write(folder, **arrays):
    (folder / "toy").mkdir(parents=True, exist_ok=True)
    np.savez(folder / "toy" / "toy.npz", **arrays)


def toy_arrays():
    return dict(events=np.array([[0.5, 0.5], [1.0, 0.2]]), window=np.array([[0, 0], [2, 0], [1, 1]]),
                images=np.arange(24.0).reshape(2, 3, 4), extent=np.array([[0, 2], [0, 1]]), names=np.array(["a", "b"]))


def test_load_image_pattern(tmp_path):
    write(tmp_path, **toy_arrays())
    pattern = load_image_pattern("toy", tmp_path)
    assert pattern.events.shape == (2, 2) and pattern.images.shape == (2, 3, 4) and pattern.names == ("a", "b")
    assert pattern.window.dtype == np.float64
    arrays = toy_arrays()
    del arrays["names"]
    write(tmp_path, **arrays)
    with pytest.raises(ValueError, match="lacks names"):
        load_image_pattern("toy", tmp_path)
    write(tmp_path, **{**toy_arrays(), "names": np.array(["a"])})
    with pytest.raises(ValueError, match="1 names for 2 images"):
        load_image_pattern("toy", tmp_path)
    with pytest.raises(FileNotFoundError, match="gorillas"):
        load_image_pattern("gorillas", tmp_path)


def test_gorillas_conversion(tmp_path):
    pytest.importorskip("rdata")
    rda = pathlib.Path(os.environ.get("SPARSEGP_DATA", "/nonexistent")) / "gorillas" / "gorillas.rda"
    if not rda.is_file():
        pytest.skip("gorillas.rda (spatstat.data, GPL) is not in the data directory")
    (path,) = spatstat_to_npz(rda, tmp_path)
    pattern = load_image_pattern("gorillas", tmp_path)
    assert path.name == "gorillas.npz" and pattern.events.shape == (647, 2) and pattern.images.shape == (7, 149, 181)
    assert pattern.names == ("aspect", "elevation", "heat", "slopeangle", "slopetype", "vegetation", "waterdist")
    from sparsegp_common.objectives.windows import Polygon

    assert Polygon(pattern.window).contains(pattern.events).all()
    assert np.isnan(pattern.images).sum() == 7 * 5927  # R's NA, integer images included


def test_glm_recovers_a_simulated_pattern():
    """The benchmark's Poisson GLM (Newton on the pixel rule) on a pattern without a GP term."""
    from benchmarks.cox_gorillas import glm

    from sparsegp_common.data.datasets import simulate_covariate_pattern

    pattern = simulate_covariate_pattern(0, variance=0.0)
    centres = pattern.raster.centres()
    beta, sd = glm(pattern.events, pattern.raster, centres, float(np.prod(pattern.raster.pixel)))
    assert np.all(np.abs(beta - pattern.coefficients) < 3 * sd), (beta, sd)
    assert np.all(sd < 0.06)
