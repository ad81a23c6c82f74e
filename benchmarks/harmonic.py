"""Suite ``harmonic``: the harmonic decomposition's SVGP (HVGP, Sun et al. 2021) against SVGPs, in
three parts (``--part`` runs one).

Speed: median seconds per SVI step of HVGP T x m (T = 8 components: 3-way reflections, the
input axes dealt to the ways round-robin, so that the SE-ARD kernel of the other runners stays
invariant) beside our SVGP with M = m, 2m and 8m and GPyTorch's SVGP with the same M, all in one
run with alternating timed blocks (:func:`~benchmarks.harness.time_steps`), both backends. kin40k
(split 0, standardised), minibatch 1024, float32, Gaussian likelihood, full Cholesky q blocks,
whitened; every runner's inducing inputs start at training rows (HVGP: the same m rows in every
component). The ratios: HVGP's step over the SVGP-m step (the cost of T blocks of m) and the
SVGP-8m step over HVGP's (the same number of inducing points).

Accuracy (the paper's Sec. 6.3 protocol on our data, Pyro): Matern-3/2 with one lengthscale from
the median heuristic, 3-way reflections along PCA directions (8 components), K-means initial
``Z`` (every component from the same), noise 0.1, Adam 0.003, batch 256, float32; HVGP 8 x M,
SVGP-M and SVGP-2M on kin40k, protein, keggdirected, bike and 1M rows of flights_3m (10,000
test rows): the Nystrom trace error per point before training (Eq. 24), test RMSE and NLPD in
standardised units after the same number of steps, and the SVGPs' after HVGP's training time.

Classification (Sec. 6.2, Translate-MNIST, Pyro): images rolled circularly by 0..27 pixels along
each axis, 10-class softmax, RBF with one median-heuristic lengthscale, ``Z`` at random training
images; TRAN 16 x m (circular translations by 4 pixels, orders (7, 7)), TRAN-S (one shared ``Z``)
and SVGPs; test accuracy and NLL after the same number of steps.
"""
from . import harness, runners

DATASET = "kin40k"
NUM_WAYS = 3  # T = 2^3 = 8 components
PARTS = ("speed", "accuracy", "classification")


def settings(quick):
    if harness.tiny():
        return {"sizes": (16,), "multiples": (1, 8), "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 1}
    if quick:
        return {"sizes": (128,), "multiples": (1, 8), "batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    if harness.DEVICE != "cpu":  # steps of milliseconds: shorter blocks, within a GPU lease
        return {"sizes": (512, 1024), "multiples": (1, 2, 8), "batch": 1024, "repeats": 5, "block_seconds": 0.4,
                "warmup": 3}
    return {"sizes": (256, 512, 1024), "multiples": (1, 2, 8), "batch": 1024, "repeats": 7, "block_seconds": 1.5,
            "warmup": 3}


def _transformation(input_dim):
    from sparsegp_common.features.harmonic import Reflections

    return Reflections.along_axes([range(j, input_dim, NUM_WAYS) for j in range(NUM_WAYS)])


class HarmonicPyro(runners.OursPyro):
    """The Pyro SVGP runner with ``HarmonicFeatures`` (the same ``Z`` rows in every component)."""

    name = "HVGP (Pyro)"
    key = "hvgp_pyro"
    likelihood_name = "hvgp_likelihood"

    def prior(self, kernel, Z):
        import pyro_sparsegp as psg

        return psg.SVGP(kernel, psg.HarmonicFeatures(Z, _transformation(Z.shape[1])), name="hvgp")


class HarmonicNumPyro(runners.OursNumPyro):
    """The NumPyro (jit) SVGP runner with ``HarmonicFeatures``, as :class:`HarmonicPyro`."""

    name = "HVGP (NumPyro, jit)"
    key = "hvgp_numpyro"

    def prior(self, kernel, Z):
        import numpyro_sparsegp as nsg

        return nsg.SVGP(kernel, nsg.HarmonicFeatures(Z, _transformation(Z.shape[1])), name="hvgp")


BASELINES = {"ours_pyro": "SVGP (Pyro)", "ours_numpyro": "SVGP (NumPyro)", "gpytorch": "GPyTorch"}


def title(rows):
    row = rows[0]
    return (
        f"harmonic: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, D = {row['input_dim']}), "
        f"HVGP {row['T']} x m against SVGPs with M = {', '.join(f'{k}m' for k in row['multiples'])}, batch "
        f"{row['batch']}, {row['dtype']}, {row['device']}, {row['threads']} threads, medians of {row['repeats']} blocks"
    )


def tables(rows):
    parts = {"speed": speed_table, "accuracy": accuracy_table, "classification": classification_table}
    return [parts[part]([row for row in rows if row["part"] == part]) for part in PARTS
            if any(row["part"] == part for row in rows)]


def speed_table(rows):
    multiples = rows[0]["multiples"]
    columns = (
        [("m", "m", "{}"), ("HVGP (Pyro)", "seconds_hvgp_pyro", "{:.4f} s"),
         ("HVGP (NumPyro, jit)", "seconds_hvgp_numpyro", "{:.4f} s")]
        + [(f"{name} M={k}m", f"seconds_{key}_{k}", "{:.4f} s") for key, name in BASELINES.items() for k in multiples]
        + [("HVGP / SVGP-m (Pyro)", "hvgp_over_svgp_pyro", "{:.2f}"),
           ("HVGP / SVGP-m (NumPyro)", "hvgp_over_svgp_numpyro", "{:.2f}"),
           (f"SVGP-{multiples[-1]}m / HVGP (Pyro)", "svgp_over_hvgp_pyro", "{:.2f}"),
           (f"SVGP-{multiples[-1]}m / HVGP (NumPyro)", "svgp_over_hvgp_numpyro", "{:.2f}")]
    )
    return title(rows), columns, rows


def run(quick, parts=PARTS):
    """The rows of ``parts`` (of :data:`PARTS`), each with its ``part``."""
    rows = speed_rows(settings(quick)) if "speed" in parts else []
    if "accuracy" in parts:
        rows += accuracy_rows(accuracy_settings(quick))
    if "classification" in parts:
        rows += classification_rows(classification_settings(quick))
    return rows


def speed_rows(opts):
    """One row per m: seconds per step of HVGP T x m in both backends and of each baseline at
    every multiple of m, and the ratios."""
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    T = 2**NUM_WAYS
    rows = []
    for m in opts["sizes"]:
        import pyro

        pyro.clear_param_store()  # once, before any Pyro runner of this m is built (see runners.build)
        Z = harness.inducing_inputs(X, m)
        group = {"hvgp_pyro": HarmonicPyro(X, y, Z, opts["batch"], 0.01),
                 "hvgp_numpyro": HarmonicNumPyro(X, y, Z, opts["batch"], 0.01)}
        for k in opts["multiples"]:
            Zk = harness.inducing_inputs(X, k * m)
            group.update({f"{key}_{k}": runners.RUNNERS[key](X, y, Zk, opts["batch"], 0.01) for key in BASELINES})
        blocks = harness.time_steps({key: runner.step for key, runner in group.items()}, opts["repeats"],
                                    opts["block_seconds"], opts["warmup"])
        runners.close(group)
        seconds = {key: harness.median(values) for key, values in blocks.items()}
        row = {
            "suite": "harmonic", "part": "speed", "dataset": DATASET, "synthetic": problem["synthetic"], "num_data": len(X),
            "input_dim": X.shape[1], "m": m, "T": T, "multiples": list(opts["multiples"]), "batch": opts["batch"],
            "dtype": "float32", "device": harness.device_name(), "threads": harness.threads(), "repeats": opts["repeats"],
            "load_average": harness.load_average(),
        }
        for key in group:
            row[f"seconds_{key}"], row[f"blocks_{key}"] = seconds[key], blocks[key]
        top = opts["multiples"][-1]
        for backend in ("pyro", "numpyro"):
            row[f"hvgp_over_svgp_{backend}"] = seconds[f"hvgp_{backend}"] / seconds[f"ours_{backend}_1"]
            row[f"svgp_over_hvgp_{backend}"] = seconds[f"ours_{backend}_{top}"] / seconds[f"hvgp_{backend}"]
        rows.append(row)
    return rows


# -- accuracy (Sun et al. 2021, Sec. 6.2 protocol on our data) -------------------------------------

ACCURACY_SETS = ("kin40k", "protein", "keggdirected", "bike", "flights_3m")
FLIGHTS_TEST = 10_000  # flights: test rows beside the training rows (the UCI sets have their splits)


def accuracy_settings(quick):
    if harness.tiny():
        return {"sets": ("kin40k",), "M": 8, "steps": 3, "splits": (0,), "trace_points": 200, "flights_train": 2000,
                "lr": 0.003, "batch": 256}
    if quick:  # M = 256: HVGP 8 x 512 takes 0.55 s per step here (2 threads), its T T~ m (m + B) kernel entries
        return {"sets": ACCURACY_SETS, "M": 256, "steps": 1000, "splits": (0,), "trace_points": 3000,
                "flights_train": 1_000_000, "lr": 0.003, "batch": 256}
    return {"sets": ACCURACY_SETS, "M": 1000, "steps": 5000, "splits": (0, 1, 2), "trace_points": 3000,
            "flights_train": 1_000_000, "lr": 0.003, "batch": 256}


def accuracy_problem(name, split, opts):
    """Standardised ``(X, y, X_test, y_test, synthetic)`` (targets in standardised units, as the
    paper's code reports RMSE); flights: ``flights_train`` rows and 10,000 test rows drawn with
    the split as seed."""
    import numpy as np

    if name != "flights_3m":
        p = harness.regression_problem(name, split)
        return p["X_train"], p["y_train"], p["X_test"], p["y_scaler"].transform(p["y_test"]), p["synthetic"]
    from sparsegp_common.data import datasets

    n = opts["flights_train"] + FLIGHTS_TEST
    if (harness.data_dir() / "flights_3m").is_dir():
        X, y = datasets.load_flights(num_rows=n, seed=split, data_dir=harness.data_dir())
        synthetic = False
    else:
        rng = np.random.default_rng(split)
        X = rng.normal(size=(n, 8))
        y, synthetic = np.sin(X[:, 0]) + 0.5 * rng.normal(size=n), True
    test = np.zeros(n, dtype=bool)
    test[np.random.default_rng(split).choice(n, FLIGHTS_TEST, replace=False)] = True
    x_scaler, y_scaler = (datasets.Standardizer.fit(a[~test]) for a in (X, y))
    X, y = x_scaler.transform(X), y_scaler.transform(y)
    return X[~test], y[~test], X[test], y[test], synthetic


def median_heuristic(X, size=3000, seed=0):
    """The median distance between distinct rows of a random subset of ``X`` (the paper's shared
    Matern lengthscale)."""
    import numpy as np

    sub = X[np.random.default_rng(seed).choice(len(X), min(size, len(X)), replace=False)]
    sq = (sub**2).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None] - 2 * sub @ sub.T, 0.0)
    return float(np.sqrt(np.median(d2[np.triu_indices(len(sub), 1)])))


def kmeans_inputs(X, M, seed=0):
    """``M`` K-means centres of a 10,000-row subset of ``X`` (the paper's initial ``Z``)."""
    import numpy as np
    from scipy.cluster.vq import kmeans2

    sub = X[np.random.default_rng(seed).choice(len(X), min(10_000, len(X)), replace=False)]
    centres, _ = kmeans2(sub, M, seed=seed, minit="++")
    return centres


def _fit_and_score(model, X, y, Xt, yt, opts, seconds=None):
    """Train ``model`` (Pyro) for ``opts['steps']`` steps and, given ``seconds``, on until that much
    training time (scoring paused); the test RMSE and NLPD after the steps (``*_at_steps``) and at
    the end (``*_at_time``), the steps and seconds trained."""
    import time

    import numpy as np
    import torch

    import pyro_sparsegp as psg

    tensor = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731

    def score(params, suffix):
        with torch.no_grad():
            pred = model.predict_y(tensor(Xt), params=params)
        mean, var = pred.mean.double().numpy(), pred.variance.double().numpy()
        return {f"rmse_{suffix}": float(np.sqrt(np.mean((mean - yt) ** 2))),
                f"nlpd_{suffix}": harness.gaussian_nlpd(mean, var, yt)}

    scores, clock = {}, {"start": time.perf_counter(), "paused": 0.0}

    def trained():
        return time.perf_counter() - clock["start"] - clock["paused"]

    def callback(state):
        if state.step == opts["steps"]:
            scores["steps"], scores["seconds_at_steps"] = state.step, trained()
            pause = time.perf_counter()
            scores.update(score(state.params, "at_steps"))
            clock["paused"] += time.perf_counter() - pause
        if state.step >= opts["steps"] and (seconds is None or trained() >= seconds):
            state.stop = True

    result = psg.fit(model.model, model.guide, (tensor(X), tensor(y)), num_steps=10**9, batch_size=opts["batch"],
                     lr=opts["lr"], callbacks=[callback], progress=False)
    scores["steps_at_time"], scores["seconds"] = len(result.losses), trained()
    scores.update(score(result.params, "at_time"))
    return scores


def accuracy_rows(opts):
    """Per set and split: HVGP 8 x M (3-way PCA reflections), SVGP-M and SVGP-2M from the same
    start (Matern-3/2, one median-heuristic lengthscale, K-means ``Z``, noise 0.1), each with its
    Nystrom trace error per point before training and its test RMSE / NLPD after the same number
    of steps and (the SVGPs trained on) after HVGP's training time."""
    import numpy as np
    import pyro
    import torch

    import pyro_sparsegp as psg

    rows = []
    for name in opts["sets"]:
        for split in opts["splits"]:
            X, y, Xt, yt, synthetic = accuracy_problem(name, split, opts)
            lengthscale, M = median_heuristic(X), opts["M"]
            pca = psg.harmonic.Reflections.pca(X, num_ways=NUM_WAYS)
            Z = torch.as_tensor(kmeans_inputs(X, M), dtype=torch.float32)
            Z2 = torch.as_tensor(kmeans_inputs(X, 2 * M), dtype=torch.float32)
            sub = torch.as_tensor(X[np.random.default_rng(1).choice(len(X), min(opts["trace_points"], len(X)),
                                                                     replace=False)], dtype=torch.float32)
            hvgp_seconds = None
            for label, features in ((f"HVGP {2**NUM_WAYS} x {M}", psg.HarmonicFeatures(Z, pca)),
                                    (f"SVGP {M}", psg.InducingPoints(Z)), (f"SVGP {2 * M}", psg.InducingPoints(Z2))):
                pyro.clear_param_store()
                kernel = psg.Matern32(lengthscale=torch.tensor([lengthscale]))
                model = psg.GPModel(psg.SVGP(kernel, features), psg.Gaussian(variance=0.1), num_data=len(X))
                error = psg.harmonic.trace_error(kernel, features, sub) / len(sub)
                scores = _fit_and_score(model, X, y, Xt, yt, opts, seconds=hvgp_seconds)
                hvgp_seconds = hvgp_seconds or scores["seconds"]
                rows.append({"suite": "harmonic", "part": "accuracy", "dataset": name, "split": split,
                             "synthetic": synthetic, "num_data": len(X), "input_dim": X.shape[1], "model": label,
                             "M": M, "lengthscale": lengthscale, "trace_error": error, "lr": opts["lr"],
                             "batch": opts["batch"], "dtype": "float32", "threads": harness.threads(), **scores})
    return rows


# -- classification: translated images (Sun et al. 2021, Sec. 6.2, Translate-MNIST) --------------

IMAGE_SHAPE, SHIFT = (28, 28), 4  # circular translations by 4 pixels: orders (7, 7), 16 real components


def classification_settings(quick):
    if harness.tiny():
        return {"sets": ("fashion_mnist",), "train": 300, "test": 100, "m": 2, "svgp_M": (4,), "steps": 2,
                "lr": 0.01, "batch": 64}
    if quick:
        return {"sets": ("fashion_mnist",), "train": 60000, "test": 10000, "m": 50, "svgp_M": (50, 800),
                "steps": 1500, "lr": 0.01, "batch": 256}
    return {"sets": ("fashion_mnist", "mnist_10k"), "train": 60000, "test": 10000, "m": 50, "svgp_M": (50, 800),
            "steps": 10000, "lr": 0.001, "batch": 256}


def translated_images(name, opts, seed=0):
    """``(X, y, X_test, y_test, synthetic)``: images rolled circularly by 0..27 pixels along each
    axis (one random shift per image), pixels in [0, 1], flattened; mnist_10k (no test split, its
    rows grouped by class): 2,000 of its rows at random are the test set. Synthetic stripes of 10
    orientations when absent."""
    import numpy as np

    from sparsegp_common.data import datasets

    rng = np.random.default_rng(seed)
    folder = harness.data_dir() / name
    if folder.is_dir():
        if name == "mnist_10k":
            X, y = datasets.load_mnist(flatten=False, dtype=np.float32, data_dir=harness.data_dir())
            order = rng.permutation(len(X))  # the file holds the 0s, then the 1s, ...
            X, y, Xt, yt = X[order[:8000]], y[order[:8000]], X[order[8000:]], y[order[8000:]]
        else:
            X, y, Xt, yt = datasets.load_fashion_mnist(flatten=False, dtype=np.float32, data_dir=harness.data_dir())
        synthetic = False
    else:  # ten classes of stripes, one per period, at random phases
        n = opts["train"] + opts["test"]
        labels = rng.integers(0, 10, n)
        rows = np.arange(IMAGE_SHAPE[0])[None, :, None]
        images = 0.5 + 0.5 * np.sin(2 * np.pi * rows / (2 + labels[:, None, None]) + rng.uniform(0, 7, (n, 1, 1)))
        images = np.broadcast_to(images, (n,) + IMAGE_SHAPE).astype(np.float32)
        X, y, Xt, yt = images[: opts["train"]], labels[: opts["train"]], images[opts["train"]:], labels[opts["train"]:]
        synthetic = True
    X, y, Xt, yt = X[: opts["train"]], y[: opts["train"]], Xt[: opts["test"]], yt[: opts["test"]]

    def roll(images):
        shifts = rng.integers(0, IMAGE_SHAPE[0], (len(images), 2))
        return np.stack([np.roll(im, tuple(s), axis=(0, 1)) for im, s in zip(images, shifts)]).reshape(len(images), -1)

    return roll(X), y, roll(Xt), yt, synthetic


def classification_rows(opts):
    """Per set: HVGP 16 x m with circular translations (TRAN), the same with one shared ``Z``
    (TRAN-S) and SVGPs of ``svgp_M`` points, softmax likelihood over 10 latent functions (RBF, one
    median-heuristic lengthscale, ``Z`` at random training images); test accuracy (argmax of the
    latent mean) and NLL (the predictive class probabilities) after the same number of steps."""
    import time

    import numpy as np
    import pyro
    import torch

    import pyro_sparsegp as psg

    rows = []
    for name in opts["sets"]:
        X, y, Xt, yt, synthetic = translated_images(name, opts)
        lengthscale, m = median_heuristic(X, size=2000), opts["m"]
        rng = np.random.default_rng(0)
        tensor = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
        translation = psg.harmonic.ImageTranslation(IMAGE_SHAPE, SHIFT)
        T = translation.num_components
        models = [(f"TRAN {T} x {m}", psg.HarmonicFeatures(tensor(X[rng.choice(len(X), m, replace=False)]), translation)),
                  (f"TRAN-S {T} x {m}", psg.HarmonicFeatures(tensor(X[rng.choice(len(X), m, replace=False)]), translation,
                                                            shared=True))]
        models += [(f"SVGP {M}", psg.InducingPoints(tensor(X[rng.choice(len(X), M, replace=False)])))
                   for M in opts["svgp_M"]]
        for label, features in models:
            pyro.clear_param_store()
            kernel = psg.RBF(lengthscale=torch.tensor([lengthscale]))
            model = psg.GPModel(psg.SVGP(kernel, features, num_latent=10), psg.Softmax(10), num_data=len(X))
            start = time.perf_counter()
            result = psg.fit(model.model, model.guide, (tensor(X), torch.as_tensor(y)), num_steps=opts["steps"],
                             batch_size=opts["batch"], lr=opts["lr"], progress=False)
            seconds = time.perf_counter() - start
            with torch.no_grad():
                means, probs = [], []
                for rows_ in np.array_split(np.arange(len(Xt)), max(1, len(Xt) // 2000)):
                    mean, _ = model.predict_f(tensor(Xt[rows_]), params=result.params)
                    means.append(mean.numpy())
                    probs.append(model.predict_y(tensor(Xt[rows_]), params=result.params).mean.numpy())
            mean, prob = np.concatenate(means), np.concatenate(probs)
            accuracy = float(np.mean(mean.argmax(-1) == yt))
            nll = float(-np.mean(np.log(np.maximum(prob[np.arange(len(yt)), yt], 1e-12))))
            rows.append({"suite": "harmonic", "part": "classification", "dataset": name, "synthetic": synthetic,
                         "num_data": len(X), "model": label, "accuracy": accuracy, "nll": nll, "steps": opts["steps"],
                         "seconds": seconds, "lengthscale": lengthscale, "lr": opts["lr"], "batch": opts["batch"],
                         "dtype": "float32", "threads": harness.threads()})
    return rows


def accuracy_table(rows):
    row = rows[0]
    title = (f"harmonic accuracy: Matern-3/2 (one median-heuristic lengthscale), HVGP {2**NUM_WAYS} x M (3-way "
             f"reflections along PCA directions) against SVGP-M and SVGP-2M, K-means Z, Adam {row['lr']}, batch "
             f"{row['batch']}, {row['dtype']}, {row['threads']} threads; RMSE and NLPD in standardised target units")
    columns = [("dataset", "dataset", "{}"), ("split", "split", "{}"), ("model", "model", "{}"),
               ("trace error / point", "trace_error", "{:.4f}"),
               ("RMSE", "rmse_at_steps", "{:.4f}"), ("NLPD", "nlpd_at_steps", "{:.4f}"), ("steps", "steps", "{}"),
               ("RMSE, equal time", "rmse_at_time", "{:.4f}"), ("NLPD, equal time", "nlpd_at_time", "{:.4f}"),
               ("steps in that time", "steps_at_time", "{}"), ("seconds", "seconds", "{:.0f}")]
    return title, columns, rows


def classification_table(rows):
    row = rows[0]
    title = (f"harmonic classification: translated images (circular shifts of 0..27 pixels), softmax over 10 "
             f"latent functions, RBF (one median-heuristic lengthscale), Adam {row['lr']}, batch {row['batch']}, "
             f"{row['steps']} steps, {row['dtype']}, {row['threads']} threads")
    columns = [("dataset", "dataset", "{}"), ("model", "model", "{}"), ("test accuracy", "accuracy", "{:.4f}"),
               ("test NLL", "nll", "{:.4f}"), ("seconds", "seconds", "{:.0f}")]
    return title, columns, rows
