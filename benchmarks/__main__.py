"""``python -m benchmarks <suite> [--quick] [--part PART] [--out PATH] [--threads N] [--device cpu|cuda] [--state DIR]``:
run a suite, print its markdown table and append its rows as JSON lines (with the command, date, versions and
machine)."""
import argparse
import importlib
import time

from . import harness

# name -> module, imported only when its suite runs (each pulls in torch, JAX, GPyTorch, ...).
SUITES = {
    "peers": "benchmarks.peers",
    "decoupled": "benchmarks.decoupled",
    "accuracy": "benchmarks.accuracy",
    "cox": "benchmarks.cox",
    "vof": "benchmarks.vof",
    "dbk": "benchmarks.dbk",
    "export": "benchmarks.export",
    "harmonic": "benchmarks.harmonic",
    "qsgp": "benchmarks.qsgp",
    "steps": "benchmarks.steps",
    "startup": "benchmarks.startup",
    "heap": "benchmarks.heap",
    "gpu": "benchmarks.gpu",
}
ON_GPU = {"peers", "harmonic", "qsgp", "gpu"}  # the suites whose runners place their tensors (harness.tensor)


def _have_gpu():
    """Whether torch sees a CUDA GPU (says so when it does not)."""
    import torch

    if torch.cuda.is_available():
        return True
    print("no CUDA GPU: measuring on the CPU (--device cpu)", flush=True)
    return False


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--quick", action="store_true", help="the short version run in CI (< 2 minutes)")
    parser.add_argument("--part", action="append",
                        help="run only this part of a suite that has parts (harmonic: speed, accuracy, classification; "
                             "qsgp: speed, accuracy, inducing, convergence, variance; gpu: steps, memory, startup, "
                             "graphs); repeatable")
    parser.add_argument("--out", help="JSON-lines file to append to (default: outputs/benchmarks/<suite>.jsonl)")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and XLA (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="where torch and JAX run (cuda: an NVIDIA GPU; default cpu, and for suite gpu "
                             "cuda where torch sees one)")
    parser.add_argument("--state", help="keep the long runs' checkpoints and rows in this directory, and continue a "
                                        "stopped run from them when the same command runs again (qsgp: convergence)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}")
    if args.device is not None and args.device != "cpu" and args.suite not in ON_GPU:
        parser.error(f"--device {args.device}: suite {args.suite} runs on the CPU only (on a GPU: {', '.join(sorted(ON_GPU))})")

    harness.pin_threads(args.threads)  # before the suite imports torch or JAX
    if args.device is None:
        args.device = "cuda" if args.suite == "gpu" and _have_gpu() else "cpu"
    harness.use_device(args.device)
    harness.STATE = args.state
    suite = importlib.import_module(SUITES[args.suite])
    start = time.perf_counter()
    if args.part:
        unknown = set(args.part) - set(getattr(suite, "PARTS", ()))
        if unknown:
            parser.error(f"--part {', '.join(sorted(unknown))}: suite {args.suite} has parts "
                         f"{', '.join(getattr(suite, 'PARTS', ())) or '(none)'}")
    rows = suite.run(quick=args.quick, parts=tuple(args.part)) if args.part else suite.run(quick=args.quick)
    # a suite prints one table (title, COLUMNS) or several (tables)
    tables = suite.tables(rows) if hasattr(suite, "tables") else [(suite.title(rows), suite.COLUMNS, rows)]
    for title, columns, table_rows in tables:
        if any(row.get("synthetic") for row in table_rows):
            title += " - SYNTHETIC data of the same shape (data directory not found)"
        print(harness.markdown_table(columns, table_rows, title=title) + "\n")
    meta = harness.environment()
    meta.update({"quick": args.quick, "tiny": harness.tiny(), "suite_seconds": time.perf_counter() - start})
    out = args.out or harness.REPO / "outputs" / "benchmarks" / f"{args.suite}.jsonl"
    print(f"\n{len(rows)} rows appended to {harness.write_jsonl(out, rows, meta)}")


if __name__ == "__main__":
    main()
