"""Speed and accuracy benchmarks: ``python -m benchmarks <suite> [--quick] [--out PATH]``.

Each suite is a module with ``run(quick) -> list[dict]`` (one dict per table row), ``COLUMNS``
(``[(header, key, format), ...]``) and ``title(rows)``; :mod:`benchmarks.__main__` registers them
and :mod:`benchmarks.harness` holds what they share. Results: ``benchmarks/RESULTS.md`` (tables
with their commands); what they show: ``docs/benchmark_notes.md``.
"""
