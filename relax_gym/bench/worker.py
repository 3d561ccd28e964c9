"""The child process of ``relax-gym bench``: import one benchmark script, call its ``run(quick)``, write the verdict.

    python -m relax_gym.bench.worker benchmarks/databus.py /tmp/out/databus.json [--quick]

The verdict is JSON: ``{"status": "ok"|"skipped"|"failed", "figures": {...}, "reason": "...", "seconds": s}``. A
script says it cannot run here by returning ``{"skipped": reason}``; a few benchmarks also have a preflight check
here (what they need from the machine), so the skip comes with a reason instead of a traceback. Any exception is a
failure: the traceback goes to the log (stdout), its last line into ``reason``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _sandbox_problem() -> str | None:
    from relax_gym.sandbox import SandboxUnavailable, select_backend

    try:
        select_backend()
    except SandboxUnavailable as exc:
        return f"its tool-use workload runs code in a sandbox: {exc}"
    return None


# name -> check returning why the benchmark cannot run on this machine (None: it can)
PREFLIGHT: dict[str, Callable[[], str | None]] = {"modes": _sandbox_problem}


def load_script(path: Path):
    """Import a benchmark script by path, as module ``relax_bench_<name>`` (its folder goes at the end of sys.path,
    so a script may import a sibling helper but cannot shadow an installed package)."""
    sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"relax_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def verdict(path: Path, quick: bool) -> dict[str, Any]:
    problem = PREFLIGHT.get(path.stem, lambda: None)()
    if problem:
        return {"status": "skipped", "reason": problem}
    module = load_script(path)
    run = getattr(module, "run", None)
    if not callable(run):
        return {"status": "failed", "reason": f"{path} defines no run(quick: bool = False) -> dict function"}
    figures = run(quick=quick)
    if not isinstance(figures, dict):
        return {"status": "failed", "reason": f"run() returned {type(figures).__name__}, not a dict"}
    if "skipped" in figures:
        return {"status": "skipped", "reason": str(figures["skipped"])}
    return {"status": "ok", "figures": figures}


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, unknown objects their str()."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one benchmark script's run(quick) and write its verdict")
    parser.add_argument("script", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        result = verdict(args.script, args.quick)
    except BaseException as exc:  # noqa: BLE001 - everything a benchmark raises is reported, then we exit
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}".strip()[:500]}
    result["seconds"] = time.monotonic() - started
    args.out.write_text(json.dumps(_plain(result), indent=2))
    sys.stdout.flush()
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
