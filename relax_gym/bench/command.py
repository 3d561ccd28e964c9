"""What ``relax-gym bench`` does, kept out of the typer layer: select, run, print, plot, write the docs section.

Outputs of one invocation go to ``out_dir`` (default ``runs/bench/<time>``): ``<name>.log`` and ``<name>.json`` per
benchmark, ``bench-<name>.png`` charts and ``results.json`` with everything. With ``docs`` (the default for
``--all``) the charts are copied to ``docs/img/`` and the generated section of ``docs/benchmarks.md`` is rewritten.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from relax_gym.bench import report
from relax_gym.bench.runner import BenchResult, describe, discover, find_bench_dir, has_run, run_one, select

QUICK_TIMEOUT_S = 900.0  # per benchmark in --quick mode; a full run has no limit unless --timeout says so


@dataclass
class BenchOptions:
    names: list[str]
    all_: bool = False
    quick: bool = False
    docs: bool | None = None  # None: write the docs section when --all
    docs_file: Path | None = None
    out_dir: Path | None = None
    bench_dir: Path | None = None
    timeout_s: float | None = None

    def command(self) -> str:
        return " ".join(["relax-gym bench", *(["--all"] if self.all_ else self.names), *(["--quick"] if self.quick else [])])


def list_benchmarks(bench_dir: Path | None, console: Console) -> None:
    found = discover(find_bench_dir(bench_dir))
    width = max((len(name) for name in found), default=0)
    for name, script in found.items():
        extra = "" if has_run(script) else "  [red](no run() function)[/]"
        line = f"[bold]{name:<{width}}[/] {escape(describe(script))}{extra}"
        if console.is_terminal:  # one screen line each, cut at the terminal's edge
            console.print(line, overflow="ellipsis", no_wrap=True)
        else:  # a pipe or a log: whole lines, whatever their length
            console.print(line, soft_wrap=True)


def run_bench(opts: BenchOptions, console: Console) -> list[BenchResult]:
    """Run the selected benchmarks one after the other and report them; returns the results."""
    bench_dir = find_bench_dir(opts.bench_dir)
    available = discover(bench_dir)
    chosen = select(available, opts.names, opts.all_)
    out_dir = opts.out_dir or bench_dir.parent / "runs" / "bench" / time.strftime("%Y%m%d-%H%M%S")
    timeout = opts.timeout_s if opts.timeout_s is not None else (QUICK_TIMEOUT_S if opts.quick else None)
    mode = "quick" if opts.quick else "full"
    results = []
    for name in chosen:
        console.print(f"[bold]{name}[/] ({mode}) running; output in {out_dir / (name + '.log')}")
        result = run_one(name, available[name], quick=opts.quick, out_dir=out_dir, timeout_s=timeout, cwd=bench_dir.parent)
        colour = {"ok": "green", "skipped": "yellow", "failed": "red"}[result.status]
        console.print(f"  [{colour}]{result.status}[/] in {result.seconds:.0f} s" + (f": {escape(result.reason)}" if result.reason else ""))
        results.append(result)
    sums = report.summaries(results)
    images = {name: path for name, s in sums.items() if (path := report.plot(name, s.bars, out_dir)) is not None}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    console.print(report.table(results, sums, title=f"{opts.command()}  ({when})"))
    (out_dir / "results.json").write_text(json.dumps(
        {"command": opts.command(), "when": when, "results": [r.to_json() for r in results]}, indent=2, default=str))
    console.print(f"results, logs and charts: {out_dir}")
    if opts.docs if opts.docs is not None else opts.all_:
        docs_file = opts.docs_file or bench_dir.parent / "docs" / "benchmarks.md"
        img_dir = docs_file.parent / "img"
        img_dir.mkdir(parents=True, exist_ok=True)
        published = {name: Path(shutil.copy2(path, img_dir / path.name)) for name, path in images.items()}
        section = report.markdown(results, sums, command=opts.command(), when=when, machine=machine(),
                                  images=published, docs_file=docs_file)
        report.write_docs_section(docs_file, section)
        console.print(f"wrote the generated section of {docs_file} and {len(published)} chart(s) in {img_dir}")
    return results


def machine() -> str:
    """A few words on where the figures come from: the CPU model, cores, GPU or not, Python. Absolute figures do not
    compare across machines (two 2-core machines of one kind have differed by 1.6-1.8x), and some ratios move with
    the machine's speed too."""
    try:
        import torch

        gpu = f"GPU: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU"
    except Exception:  # noqa: BLE001 - only a description
        gpu = "GPU unknown"
    return f"{cpu_model()}, {os.cpu_count()} CPU cores, {gpu}, Python {platform.python_version()}"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux: ``cpuinfo``'s "model name"; elsewhere what ``platform`` knows)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU unknown"
