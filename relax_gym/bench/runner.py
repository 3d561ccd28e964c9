"""Finding benchmark scripts and running each one in a child process.

A benchmark is a file ``benchmarks/<name>.py`` (names starting with ``_`` are helpers, not benchmarks) with a
top-level ``run(quick: bool = False) -> dict``. Scripts are listed without importing them (their imports are
heavy: torch, Ray); the child process imports the one it runs. The child's output goes to ``<name>.log`` in the
output folder and its result to ``<name>.json``; a child that dies or runs past its time limit is reported as
failed with the last line of its log, and its whole process group is killed so no Ray or engine process stays.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from relax_gym.watchdog import guard

# Display order; scripts not listed here follow in alphabetical order.
KNOWN_ORDER = ("env_reset", "sandbox", "learning", "agent_learning", "modes", "weight_sync", "databus", "faults", "r3",
               "megatron_step")

Status = Literal["ok", "skipped", "failed"]


class BenchError(Exception):
    """The request cannot be carried out (no benchmarks folder, an unknown name); nothing was run."""


@dataclass
class BenchResult:
    """One benchmark's outcome. ``figures`` is what its ``run()`` returned; ``reason`` says why it was skipped or
    failed; ``log`` is the file holding everything the child process printed."""

    name: str
    status: Status
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    log: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_bench_dir(explicit: Path | None = None) -> Path:
    """``explicit``, else ``./benchmarks``, else the ``benchmarks/`` folder of the source checkout this package
    runs from. The scripts are not part of the wheel, so an installed relax-gym needs a checkout."""
    if explicit is not None:
        if not Path(explicit).is_dir():
            raise BenchError(f"benchmark folder {explicit} does not exist")
        return Path(explicit)
    for candidate in (Path.cwd() / "benchmarks", Path(__file__).resolve().parents[2] / "benchmarks"):
        if candidate.is_dir():
            return candidate
    raise BenchError("no benchmarks/ folder here: run `relax-gym bench` from a relax-gym source checkout, "
                     "or pass --bench-dir PATH")


def discover(bench_dir: Path) -> dict[str, Path]:
    """``{name: script}`` for every ``*.py`` in ``bench_dir`` not starting with ``_``, in display order."""
    scripts = {p.stem: p for p in Path(bench_dir).glob("*.py") if not p.name.startswith("_")}
    rank = {name: i for i, name in enumerate(KNOWN_ORDER)}
    return {n: scripts[n] for n in sorted(scripts, key=lambda n: (rank.get(n, len(rank)), n))}


def describe(script: Path, width: int = 110) -> str:
    """The first sentence of a script's docstring, cut to ``width`` characters (read without importing it)."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    except SyntaxError as exc:
        return f"(does not parse: {exc.msg}, line {exc.lineno})"
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0]
    return sentence if len(sentence) <= width else sentence[: width - 1].rstrip() + "…"


def has_run(script: Path) -> bool:
    """Whether the script defines a top-level ``run`` function (checked on the source, not imported)."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except SyntaxError:
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body)


def select(available: dict[str, Path], names: Iterable[str], all_: bool) -> list[str]:
    """The benchmarks to run, in display order; an unknown name is a :class:`BenchError` with close matches."""
    names = list(names)
    if all_ and names:
        raise BenchError("give benchmark names or --all, not both")
    if not all_ and not names:
        raise BenchError(f"name the benchmarks to run, or pass --all; available: {', '.join(available) or 'none'}")
    if all_:
        return list(available)
    for name in names:
        if name not in available:
            close = difflib.get_close_matches(name, list(available), n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise BenchError(f"no benchmark {name!r}{hint}; available: {', '.join(available)}")
    return [n for n in available if n in set(names)]


def run_one(name: str, script: Path, *, quick: bool, out_dir: Path, timeout_s: float | None = None,
            cwd: Path | None = None) -> BenchResult:
    """Run ``script``'s ``run(quick)`` in a child Python process (cwd: the checkout, so ``runs/`` lands there)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result_file, log_file = out_dir / f"{name}.json", out_dir / f"{name}.log"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "relax_gym.bench.worker", str(script), str(result_file), *(["--quick"] if quick else [])]
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")  # local single-machine clusters only; see docs/troubleshooting.md
    env.setdefault("MPLBACKEND", "Agg")
    started = time.monotonic()
    problem = ""
    with log_file.open("wb") as log:
        child = subprocess.Popen(cmd, cwd=cwd or script.parent.parent, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        guard(child)  # a killed `relax-gym bench` takes its benchmark's process group with it
        try:
            code = child.wait(timeout=timeout_s)
            if code != 0:
                problem = f"exit code {code}"
        except subprocess.TimeoutExpired:
            problem = f"timed out after {timeout_s:g} s"
        finally:
            _kill_group(child)
    seconds = time.monotonic() - started
    if result_file.is_file():  # the worker wrote its verdict (even if the process then hung on exit)
        data = json.loads(result_file.read_text())
        return BenchResult(name, data["status"], seconds, data.get("figures") or {}, data.get("reason", ""), str(log_file))
    tail = _last_line(log_file)
    return BenchResult(name, "failed", seconds, reason=problem + (f": {tail}" if tail else ""), log=str(log_file))


def _kill_group(child: subprocess.Popen) -> None:
    """Kill the child's process group (the benchmark and whatever it started that is still in the group)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
