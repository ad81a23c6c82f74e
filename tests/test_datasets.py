"""Dataset loaders: the shared data directory (skipped when absent) and small generated files in
the same formats (always run): shapes, splits, windows, errors, and the standardisation helpers."""
import gzip
import os
import pathlib

import numpy as np
import pytest

from sparsegp_common import datasets as ds

SHARED = pathlib.Path(os.environ.get("SPARSEGP_DATA", pathlib.Path(__file__).parents[2] / "shared" / "data"))
needs_shared = pytest.mark.skipif(not (SHARED / "uci_kin40k").is_dir(), reason=f"{SHARED} is absent")


@needs_shared
@pytest.mark.parametrize("name", ds.UCI_NAMES)
def test_uci_splits_partition_the_rows(name):
    splits = [ds.load_uci(name, s, data_dir=SHARED) for s in range(ds.NUM_SPLITS)]
    n = len(splits[0].X_train) + len(splits[0].X_test)
    assert all(len(s.X_train) + len(s.X_test) == n for s in splits)
    assert sum(len(s.y_test) for s in splits) == n  # every row is a test row exactly once
    tests = np.concatenate([s.y_test for s in splits])
    full = np.concatenate([splits[0].y_train, splits[0].y_test])
    np.testing.assert_allclose(np.sort(tests), np.sort(full))
    s = splits[0]
    assert s.X_train.dtype == np.float64 and s.X_train.shape[1] == s.X_test.shape[1] and s.y_train.ndim == 1


@needs_shared
def test_other_shared_sets():
    X, y = ds.load_banana(SHARED)
    assert X.shape == (400, 2) and set(np.unique(y)) == {0, 1} and y.dtype == np.int64
    images, labels = ds.load_mnist(SHARED)
    assert images.shape == (10000, 784) and 0 <= images.min() and images.max() <= 1 and labels.max() == 9
    fashion = ds.load_fashion_mnist(SHARED)
    assert fashion.X_train.shape == (60000, 784) and fashion.X_test.shape == (10000, 784)
    X, Y = ds.load_sarcos(SHARED)
    assert X.shape == (4449, 21) and Y.shape == (4449, 7)
    X, y = ds.load_flights(5000, seed=1, data_dir=SHARED)
    assert X.shape == (5000, 5) and np.all((X[:, 0] >= 0) & (X[:, 0] < 24)) and np.all((X[:, 2] >= 1) & (X[:, 2] <= 366))
    assert set(np.unique(X[:, 1])) <= set(range(7))
    np.testing.assert_array_equal(ds.load_flights(5000, seed=1, data_dir=SHARED)[1], y)


@needs_shared
@pytest.mark.parametrize("name, n, d", [("coal_disasters", 191, 1), ("redwood", 62, 2), ("japanesepines", 65, 2), ("finpines", 126, 2)])
def test_point_patterns(name, n, d):
    events, window = ds.load_point_pattern(name, SHARED)
    assert events.shape == (n, d) and window.shape == (d, 2)
    assert np.all((events >= window[:, 0]) & (events <= window[:, 1]))


@pytest.fixture
def fake_dir(tmp_path):
    """A data directory with a tiny UCI set, a banana file and a point pattern."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "uci_pol"
    folder.mkdir()
    data = rng.normal(size=(20, 4))
    masks = np.zeros((20, 10), dtype=int)
    masks[np.arange(20), np.arange(20) % 10] = 1
    for name, array, fmt in (("data.csv.gz", data, "%.17g"), ("test_mask.csv.gz", masks, "%d")):
        with gzip.open(folder / name, "wt") as f:
            np.savetxt(f, array, delimiter=",", fmt=fmt)
    (tmp_path / "point_patterns").mkdir()
    (tmp_path / "point_patterns" / "redwood.csv").write_text("x,y\n0.5,-0.5\n0.1,-0.9\n")
    return tmp_path, data, masks


def test_generated_uci_split(fake_dir):
    path, data, masks = fake_dir
    split = ds.load_uci("pol", 3, data_dir=path)
    test = masks[:, 3].astype(bool)
    np.testing.assert_array_equal(split.X_test, data[test, :-1])
    np.testing.assert_array_equal(split.y_train, data[~test, -1])


def test_environment_variable(fake_dir, monkeypatch):
    path, _, _ = fake_dir
    monkeypatch.setenv("SPARSEGP_DATA", str(path))
    assert ds.load_point_pattern("redwood").events.shape == (2, 2)
    monkeypatch.delenv("SPARSEGP_DATA")
    with pytest.raises(ValueError, match="SPARSEGP_DATA"):
        ds.load_point_pattern("redwood")


def test_missing_and_bad_arguments(fake_dir):
    path, _, _ = fake_dir
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ds.load_uci("pol", data_dir=path / "nowhere")
    with pytest.raises(FileNotFoundError, match="uci_kin40k"):
        ds.load_uci("kin40k", data_dir=path)
    with pytest.raises(ValueError, match="split"):
        ds.load_uci("pol", 10, data_dir=path)
    with pytest.raises(ValueError, match="name"):
        ds.load_uci("boston", data_dir=path)
    (path / "point_patterns" / "redwood.csv").write_text("x,y\n0.5,0.5\n")  # y outside [-1, 0]
    with pytest.raises(ValueError, match="outside the window"):
        ds.load_point_pattern("redwood", path)


def test_standardizer_round_trip():
    rng = np.random.default_rng(1)
    a = rng.normal(3.0, 2.0, size=(50, 3))
    a[:, 2] = 7.0  # a constant column
    t = ds.Standardizer.fit(a)
    z = t.transform(a)
    np.testing.assert_allclose(z[:, :2].mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(z[:, :2].std(0), 1)
    np.testing.assert_array_equal(z[:, 2], 0)
    np.testing.assert_allclose(t.inverse_transform(z), a)
    np.testing.assert_allclose(t.inverse_variance(np.ones(3)), t.std**2)
    train, test, transform = ds.standardize(a[:40], a[40:])
    np.testing.assert_allclose(transform.inverse_transform(test), a[40:])
    m = ds.MinMaxScaler.fit(a)
    s = m.transform(a)
    np.testing.assert_allclose(s[:, :2].min(0), -1)
    np.testing.assert_allclose(s[:, :2].max(0), 1)
    np.testing.assert_allclose(m.inverse_transform(s), a)
    with pytest.raises(ValueError, match="finite"):
        ds.Standardizer.fit(np.array([1.0, np.nan]))


def test_backends_reexport_the_same_names():
    import numpyro_sparsegp
    import pyro_sparsegp

    assert pyro_sparsegp.datasets.load_uci is numpyro_sparsegp.datasets.load_uci is ds.load_uci
