"""``relax-gym bench``: run the scripts in ``benchmarks/`` and report their figures in one place.

Every benchmark script exposes ``run(quick: bool = False) -> dict``. The runner (:mod:`.runner`) starts each one in
its own Python process (:mod:`.worker`), so a benchmark that starts Ray, spawns an engine or crashes cannot leave
anything behind for the next one; a script returns ``{"skipped": reason}`` (or its preflight check fails) when it
cannot run on this machine, and that is reported as a skip, not an error. :mod:`.summaries` turns each result into
table rows and bar charts, :mod:`.report` prints the table, draws the PNGs and rewrites the generated section of
``docs/benchmarks.md`` between its markers.
"""

from relax_gym.bench.runner import BenchError, BenchResult, discover, find_bench_dir, run_one, select

__all__ = ["BenchError", "BenchResult", "discover", "find_bench_dir", "run_one", "select"]
