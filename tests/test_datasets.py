"""Dataset loaders and standardisation helpers.

The first tests read the shared data directory (``$SPARSEGP_DATA`` or ``<repo>/../shared/data``,
each skipped when its folder is absent) and check the facts its READMEs state; the rest write tiny
files in the same formats to ``tmp_path`` and always run.
"""
import gzip
import os
import pathlib

import numpy as np
import pytest

from sparsegp_common.data import datasets as ds

UCI_SHAPES = {"pol": (15000, 26), "elevators": (16599, 18), "bike": (17379, 17), "kin40k": (40000, 8),
              "protein": (45730, 9), "keggdirected": (48827, 20)}
POINT_PATTERN_SIZES = {"coal_disasters": (191, 1), "redwood": (62, 2), "japanesepines": (65, 2),
                       "finpines": (126, 2), "vff_pines": (127, 2)}


@pytest.fixture(scope="module")
def shared():
    """``folder -> data directory``, skipping the test when that folder is absent."""
    root = pathlib.Path(os.environ.get("SPARSEGP_DATA") or pathlib.Path(__file__).parents[2] / "shared" / "data")

    def require(folder):
        if not (root / folder).is_dir():
            pytest.skip(f"{root / folder} is absent")
        return root

    return require


def sorted_rows(a):
    return a[np.lexsort(a.T[::-1])]


# ---- the shared data directory ------------------------------------------------------------------

@pytest.mark.parametrize("name", ds.UCI_NAMES)
def test_uci_splits_partition_the_rows(shared, name):
    root = shared(f"uci_{name}")
    n, D = UCI_SHAPES[name]
    splits = [ds.load_uci(name, s, data_dir=root) for s in range(ds.NUM_SPLITS)]
    train_rows = [np.column_stack([s.X_train, s.y_train]) for s in splits]
    test_rows = [np.column_stack([s.X_test, s.y_test]) for s in splits]
    full = sorted_rows(np.vstack([train_rows[0], test_rows[0]]))
    assert full.shape == (n, D + 1)
    for s, train, test in zip(splits, train_rows, test_rows):
        assert s.X_train.shape == (len(s.y_train), D) and s.X_test.shape == (len(s.y_test), D)
        assert s.y_train.ndim == s.y_test.ndim == 1
        assert all(a.dtype == np.float64 for a in s)
        assert abs(len(s.y_test) - n / 10) <= 1
        # train and test of every split together are all the rows
        np.testing.assert_array_equal(sorted_rows(np.vstack([train, test])), full)
    # every row is a test row in exactly one split
    np.testing.assert_array_equal(sorted_rows(np.vstack(test_rows)), full)


def test_uci_split_matches_the_readme_recipe(shared):
    folder = shared("uci_elevators") / "uci_elevators"
    a = np.loadtxt(folder / "data.csv.gz", delimiter=",")
    test = np.loadtxt(folder / "test_mask.csv.gz", delimiter=",", dtype=bool)[:, 7]
    split = ds.load_uci("elevators", 7, data_dir=folder.parent)
    for got, want in zip(split, (a[~test, :-1], a[~test, -1], a[test, :-1], a[test, -1])):
        np.testing.assert_array_equal(got, want)


def test_banana(shared):
    X, y = ds.load_banana(shared("banana"))
    assert X.shape == (400, 2) and X.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), [183, 217])


def test_mnist(shared):
    root = shared("mnist_10k")
    X, y = ds.load_mnist(data_dir=root)
    assert X.shape == (10000, 784) and X.dtype == np.float64 and 0 <= X.min() and X.max() == 1
    assert y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978])
    images, _ = ds.load_mnist(flatten=False, dtype=np.float32, data_dir=root)
    assert images.shape == (10000, 28, 28) and images.dtype == np.float32
    np.testing.assert_allclose(images.reshape(10000, -1), X, rtol=1e-6)


def test_fashion_mnist(shared):
    split = ds.load_fashion_mnist(dtype=np.float32, data_dir=shared("fashion_mnist"))  # float32: half the memory
    assert split.X_train.shape == (60000, 784) and split.X_test.shape == (10000, 784)
    assert split.X_train.dtype == np.float32 and 0 <= split.X_train.min() and split.X_train.max() <= 1
    assert split.y_train.dtype == split.y_test.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(split.y_train), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(split.y_test), [1000] * 10)


def test_sarcos(shared):
    X, Y = ds.load_sarcos(shared("sarcos_test"))
    assert X.shape == (4449, 21) and Y.shape == (4449, 7) and X.dtype == Y.dtype == np.float64


def test_flights(shared):
    root = shared("flights_3m")
    X, y = ds.load_flights(data_dir=root)
    assert X.shape == (3_000_000, len(ds.FLIGHTS_COLUMNS)) and y.shape == (3_000_000,)
    assert X.dtype == y.dtype == np.float64 and (y.min(), y.max()) == (-1116, 1688)
    col = dict(zip(ds.FLIGHTS_COLUMNS, X.T))
    assert (col["hour"].min(), col["hour"].max()) == (0, 23)
    assert (col["day_of_week"].min(), col["day_of_week"].max()) == (0, 6)
    assert (col["day_of_year"].min(), col["day_of_year"].max()) == (0, 181)  # 1 Jan .. 1 Jul
    assert np.all(np.diff(col["day_of_year"]) >= 0)  # rows are in time order
    assert col["distance"].max() == 4962
    for side in ("origin", "destination"):
        assert np.all((col[f"{side}_lat"] > 17) & (col[f"{side}_lat"] < 72))
        assert np.all((col[f"{side}_lon"] > -167) & (col[f"{side}_lon"] < -64))
    Xs, ys = ds.load_flights(5000, seed=1, data_dir=root)
    assert Xs.shape == (5000, 8) and np.all(np.diff(Xs[:, 2]) >= 0)
    np.testing.assert_array_equal(ds.load_flights(5000, seed=1, data_dir=root)[1], ys)
    assert not np.array_equal(ds.load_flights(5000, seed=2, data_dir=root)[1], ys)


@pytest.mark.parametrize("name", sorted(POINT_PATTERN_SIZES))
def test_point_patterns(shared, name):
    events, window = ds.load_point_pattern(name, shared("point_patterns"))
    n, d = POINT_PATTERN_SIZES[name]
    assert events.shape == (n, d) and window.shape == (d, 2) and events.dtype == window.dtype == np.float64
    assert np.all(window[:, 0] < window[:, 1])
    assert np.all((events >= window[:, 0]) & (events <= window[:, 1]))


# ---- generated files ------------------------------------------------------------------------------

def write_csv_gz(path, array, fmt):
    with gzip.open(path, "wt") as f:
        np.savetxt(f, array, delimiter=",", fmt=fmt)


@pytest.fixture
def fake_dir(tmp_path):
    """A data directory with every format, in miniature. Returns ``(path, uci_data, uci_masks)``."""
    rng = np.random.default_rng(0)
    (tmp_path / "uci_pol").mkdir()
    data = rng.normal(size=(23, 4))
    masks = np.zeros((23, 10), dtype=int)
    masks[np.arange(23), rng.permutation(23) % 10] = 1
    write_csv_gz(tmp_path / "uci_pol" / "data.csv.gz", data, "%.17g")
    write_csv_gz(tmp_path / "uci_pol" / "test_mask.csv.gz", masks, "%d")
    (tmp_path / "banana").mkdir()
    (tmp_path / "banana" / "banana.csv").write_text("x1,x2,y\n0.5,-1.5,1\n2.0,0.25,0\n-1,3,1\n")
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    (tmp_path / "mnist_10k").mkdir()
    np.savez(tmp_path / "mnist_10k" / "mnist_10k.npz", images=images, labels=np.arange(5, dtype=np.uint8))
    (tmp_path / "fashion_mnist").mkdir()
    np.savez(tmp_path / "fashion_mnist" / "fashion_mnist.npz", x_train=images[:3], y_train=np.uint8([0, 9, 4]),
             x_test=images[3:], y_test=np.uint8([1, 2]))
    (tmp_path / "sarcos_test").mkdir()
    np.savez(tmp_path / "sarcos_test" / "sarcos_inv_test.npz", X=rng.normal(size=(6, 21)), Y=rng.normal(size=(6, 7)))
    (tmp_path / "flights_3m").mkdir()
    # 2001-01-01 00:01, 2001-01-02 13:30 (a Tuesday), 2001-03-01 00:00 (a Thursday, day 59), 2001-07-01 00:00
    np.savez(tmp_path / "flights_3m" / "flights_3m.npz", minutes=np.int32([1, 1440 + 810, 59 * 1440, 181 * 1440]),
             delay=np.int16([-3, 25, 0, 7]), distance=np.int16([100, 200, 300, 400]),
             origin=np.uint8([0, 1, 1, 0]), destination=np.uint8([1, 0, 0, 1]),
             airport_iata=np.array(["AAA", "BBB"]), airport_lat=np.array([30.0, 40.0]),
             airport_lon=np.array([-100.0, -80.0]))
    (tmp_path / "point_patterns").mkdir()
    (tmp_path / "point_patterns" / "redwood.csv").write_text("x,y\n0.5,-0.5\n0.1,-0.9\n")
    (tmp_path / "point_patterns" / "finpines.csv").write_text("x,y,diameter,height\n-4.5,1.5,2,1.7\n4,-7,1,1.2\n")
    (tmp_path / "point_patterns" / "coal_disasters.csv").write_text("date\n1851.202601\n1962.219713\n")
    return tmp_path, data, masks


def test_generated_uci_splits(fake_dir):
    path, data, masks = fake_dir
    seen = np.zeros(len(data), dtype=int)
    for s in range(ds.NUM_SPLITS):
        split = ds.load_uci("pol", s, data_dir=path)
        test = masks[:, s].astype(bool)
        np.testing.assert_array_equal(split.X_train, data[~test, :-1])
        np.testing.assert_array_equal(split.y_train, data[~test, -1])
        np.testing.assert_array_equal(split.X_test, data[test, :-1])
        np.testing.assert_array_equal(split.y_test, data[test, -1])
        seen += test
    np.testing.assert_array_equal(seen, 1)
    assert isinstance(split, ds.Split) and split._fields == ("X_train", "y_train", "X_test", "y_test")


def test_generated_classification_sets(fake_dir):
    path, _, _ = fake_dir
    X, y = ds.load_banana(path)
    np.testing.assert_array_equal(X, [[0.5, -1.5], [2.0, 0.25], [-1, 3]])
    np.testing.assert_array_equal(y, [1, 0, 1])
    assert y.dtype == np.int64
    with np.load(path / "mnist_10k" / "mnist_10k.npz") as z:
        images = z["images"]
    X, y = ds.load_mnist(data_dir=path)
    np.testing.assert_allclose(X, images.reshape(5, 784) / 255.0)
    assert X.dtype == np.float64 and y.dtype == np.int64 and y.tolist() == [0, 1, 2, 3, 4]
    X, _ = ds.load_mnist(flatten=False, data_dir=path)
    np.testing.assert_allclose(X, images / 255.0)
    split = ds.load_fashion_mnist(data_dir=path)
    np.testing.assert_allclose(split.X_test, images[3:].reshape(2, 784) / 255.0)
    assert split.y_train.tolist() == [0, 9, 4] and split.y_test.dtype == np.int64


def test_generated_sarcos(fake_dir):
    path, _, _ = fake_dir
    X, Y = ds.load_sarcos(path)
    assert X.shape == (6, 21) and Y.shape == (6, 7) and Y.dtype == np.float64


def test_generated_flights(fake_dir):
    path, _, _ = fake_dir
    X, y = ds.load_flights(data_dir=path)
    np.testing.assert_array_equal(X, [
        # hour, day of week, day of year, distance, origin lat/lon, destination lat/lon
        [0, 0, 0, 100, 30, -100, 40, -80],
        [13, 1, 1, 200, 40, -80, 30, -100],
        [0, 3, 59, 300, 40, -80, 30, -100],
        [0, 6, 181, 400, 30, -100, 40, -80],
    ])
    np.testing.assert_array_equal(y, [-3, 25, 0, 7])
    Xs, ys = ds.load_flights(2, seed=3, data_dir=path)
    rows = [np.flatnonzero(y == v)[0] for v in ys]
    assert rows == sorted(rows) and len(set(rows)) == 2  # distinct rows, in file order
    np.testing.assert_array_equal(Xs, X[rows])
    np.testing.assert_array_equal(ds.load_flights(4, seed=3, data_dir=path)[0], X)
    with pytest.raises(ValueError, match="num_rows"):
        ds.load_flights(5, data_dir=path)
    with pytest.raises(ValueError, match="num_rows"):
        ds.load_flights(0, data_dir=path)
    with pytest.raises(TypeError, match="num_rows"):
        ds.load_flights(2.0, data_dir=path)


def test_generated_point_patterns(fake_dir):
    path, _, _ = fake_dir
    pattern = ds.load_point_pattern("finpines", path)  # the marks columns are dropped
    assert isinstance(pattern, ds.PointPattern)
    np.testing.assert_array_equal(pattern.events, [[-4.5, 1.5], [4, -7]])
    np.testing.assert_array_equal(pattern.window, [[-5, 5], [-8, 2]])
    events, window = ds.load_point_pattern("coal_disasters", path)
    assert events.shape == (2, 1) and window.shape == (1, 2)
    np.testing.assert_allclose(window, [[1851.2, 1962 + 81 / 365]])
    (path / "point_patterns" / "redwood.csv").write_text("x,y\n0.5,0.5\n")  # y outside [-1, 0]
    with pytest.raises(ValueError, match="outside the window"):
        ds.load_point_pattern("redwood", path)
    (path / "point_patterns" / "redwood.csv").write_text("a,b\n0.5,-0.5\n")
    with pytest.raises(ValueError, match="no column x, y"):
        ds.load_point_pattern("redwood", path)
    with pytest.raises(ValueError, match="name must be one of"):
        ds.load_point_pattern("bei", path)


def test_data_dir_resolution(fake_dir, monkeypatch):
    path, _, _ = fake_dir
    monkeypatch.setenv("SPARSEGP_DATA", str(path))
    assert ds.data_dir() == path and ds.data_dir(str(path)) == path
    assert ds.load_point_pattern("redwood").events.shape == (2, 2)
    monkeypatch.setenv("SPARSEGP_DATA", str(path / "nowhere"))
    assert ds.load_banana(data_dir=path)[0].shape == (3, 2)  # the argument wins
    with pytest.raises(FileNotFoundError, match="nowhere.*'banana'"):
        ds.load_banana()
    monkeypatch.delenv("SPARSEGP_DATA")
    with pytest.raises(ValueError, match="SPARSEGP_DATA"):
        ds.load_point_pattern("redwood")
    with pytest.raises(ValueError, match="SPARSEGP_DATA"):
        ds.data_dir()
    with pytest.raises(TypeError, match="data_dir"):
        ds.data_dir(3)


def test_missing_files_and_bad_arguments(fake_dir):
    path, _, _ = fake_dir
    with pytest.raises(FileNotFoundError, match="nowhere for dataset 'uci_pol' does not exist"):
        ds.load_uci("pol", data_dir=path / "nowhere")
    with pytest.raises(FileNotFoundError, match="uci_kin40k"):
        ds.load_uci("kin40k", data_dir=path)
    with pytest.raises(FileNotFoundError, match="vff_pines_unitsquare.csv"):
        ds.load_point_pattern("vff_pines", path)
    for bad in (10, -1):
        with pytest.raises(ValueError, match="split must be in 0..9"):
            ds.load_uci("pol", bad, data_dir=path)
    for bad in (1.0, True, "0"):
        with pytest.raises(TypeError, match="split must be an integer"):
            ds.load_uci("pol", bad, data_dir=path)
    assert len(ds.load_uci("pol", np.int64(9), data_dir=path).y_test) >= 1
    with pytest.raises(ValueError, match="name must be one of"):
        ds.load_uci("boston", data_dir=path)
    write_csv_gz(path / "uci_pol" / "test_mask.csv.gz", np.zeros((23, 9)), "%d")
    with pytest.raises(ValueError, match="test_mask"):
        ds.load_uci("pol", data_dir=path)


# ---- standardisation -----------------------------------------------------------------------------

def test_standardizer_round_trip_and_constant_columns():
    a = np.random.default_rng(1).normal(3.0, 2.0, size=(50, 4))
    a[:, 2], a[:, 3] = 7.0, 0.1  # constant columns (0.1's computed std is ~1e-17, not 0)
    t = ds.Standardizer.fit(a)
    assert t.mean.shape == t.std.shape == (4,)
    z = t.transform(a)
    np.testing.assert_allclose(z[:, :2].mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(z[:, :2].std(0), 1)
    np.testing.assert_allclose(z[:, 2:], 0, atol=1e-12)
    np.testing.assert_array_equal(t.std[2:], 1)
    np.testing.assert_allclose(t.inverse_transform(z), a)
    np.testing.assert_allclose(t.transform(a[:3] + 1.0), (a[:3] + 1.0 - a.mean(0)) / t.std)  # other rows


def test_standardizer_inverse_variance():
    y = np.random.default_rng(2).normal(-4.0, 0.3, size=200)
    t = ds.Standardizer.fit(y)
    assert t.mean.shape == t.std.shape == ()  # targets (n,): scalar moments
    np.testing.assert_allclose(float(t.std), y.std())
    # a predictive distribution in standardised units: draws mapped back have the variance it states
    draws = np.random.default_rng(3).normal(0.5, np.sqrt(0.2), size=(100_000, 3))
    original = t.inverse_transform(draws)
    np.testing.assert_allclose(t.inverse_variance(draws.var(0)), original.var(0), rtol=1e-10)
    np.testing.assert_allclose(t.inverse_variance(np.array([0.2])), 0.2 * y.var())
    with pytest.raises(ValueError, match="var must be non-negative"):
        t.inverse_variance(np.array([-1.0]))


def test_standardizer_axes():
    scale, shift = np.array([[1.0], [5.0], [0.1]]), np.array([[0.0], [2.0], [-3.0]])
    a = np.random.default_rng(4).normal(size=(3, 40)) * scale + shift
    t = ds.Standardizer.fit(a, axis=1)  # one row per series
    assert t.mean.shape == (3, 1)
    np.testing.assert_allclose(t.transform(a).mean(1), 0, atol=1e-12)
    np.testing.assert_allclose(t.transform(a).std(1), 1)
    everything = ds.Standardizer.fit(a, axis=None)
    np.testing.assert_allclose(everything.transform(a).std(), 1)


def test_min_max_scaler():
    a = np.random.default_rng(5).uniform(-3, 8, size=(30, 3))
    a[:, 1] = 2.5
    m = ds.MinMaxScaler.fit(a)
    s = m.transform(a)
    np.testing.assert_allclose(s[:, [0, 2]].min(0), -1)
    np.testing.assert_allclose(s[:, [0, 2]].max(0), 1)
    np.testing.assert_array_equal(s[:, 1], 0)
    np.testing.assert_allclose(m.inverse_transform(s), a)
    outside = m.transform(a.max(0, keepdims=True) + 1.0)
    assert np.all(outside[:, [0, 2]] > 1)


def test_standardize_uses_the_training_moments():
    a = np.random.default_rng(6).normal(2.0, 3.0, size=(60, 2))
    train, test, transform = ds.standardize(a[:40], a[40:])
    np.testing.assert_allclose(transform.mean, a[:40].mean(0))
    np.testing.assert_allclose(train, (a[:40] - a[:40].mean(0)) / a[:40].std(0))
    np.testing.assert_allclose(test, (a[40:] - a[:40].mean(0)) / a[:40].std(0))
    np.testing.assert_allclose(transform.inverse_transform(test), a[40:])
    assert len(ds.standardize(a)) == 2


def test_standardisation_validates_its_inputs():
    with pytest.raises(ValueError, match="a contains NaN or inf"):
        ds.Standardizer.fit(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="a contains NaN or inf"):
        ds.MinMaxScaler.fit(np.array([[1.0], [np.inf]]))
    with pytest.raises(ValueError, match="must not be empty"):
        ds.Standardizer.fit(np.zeros((0, 3)))
    with pytest.raises(TypeError, match="a must be an array of real numbers"):
        ds.Standardizer.fit(["x", "y"])
    good = np.ones((4, 2)) * [[1.0], [2.0], [3.0], [4.0]]
    with pytest.raises(ValueError, match="train contains NaN"):
        ds.standardize(np.array([[np.nan, 1.0], [2.0, 3.0]]))
    with pytest.raises(ValueError, match=r"others\[1\] contains NaN"):
        ds.standardize(good, good, np.array([[0.0, np.inf]]))
    with pytest.raises(ValueError, match=r"X_test of shape \(4, 3\) does not match"):
        ds.Standardizer.fit(good).transform(np.ones((4, 3)), name="X_test")
    with pytest.raises(ValueError, match=r"a of shape \(4,\) does not match"):  # would broadcast to (2, 4)
        ds.MinMaxScaler.fit(good.T, axis=1).inverse_transform(np.ones(4))


def test_backends_reexport_the_same_names():
    import numpyro_sparsegp
    import pyro_sparsegp

    public = {n for n in dir(ds) if not n.startswith("_") and n not in {"os", "pathlib", "np", "NamedTuple"}}
    for module in (pyro_sparsegp.datasets, numpyro_sparsegp.datasets):
        names = {n for n in dir(module) if not n.startswith("_") and n != "annotations"}
        assert names == public
        assert all(getattr(module, n) is getattr(ds, n) for n in public)
