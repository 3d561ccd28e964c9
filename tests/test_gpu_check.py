"""``scripts/gpu_check.sh``: its CPU dry run runs the same checks as the GPU run (gloo instead of nccl) and passes;
a failing step makes the script fail; bad arguments are refused. ``scripts/gpu_wheelhouse.sh`` pins every wheel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def results(out: Path) -> dict[str, dict]:
    return {row["check"]: row for row in map(json.loads, (out / "gpu_check.jsonl").read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_runs_every_check_on_cpu_and_passes(tmp_path):
    proc = run("--dry-run", "--out", str(tmp_path), timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = results(tmp_path)
    assert list(rows) == ["env", "install", "megatron", "megatron_group", "dcs", "summary"]
    assert all(r["ok"] for r in rows.values())
    assert rows["env"]["dry_run"] is True and rows["env"]["device"] == "cpu"
    assert "dry run without --wheelhouse" in rows["install"]["skipped"]
    megatron = rows["megatron"]
    assert megatron["device"] == "cpu" and megatron["steps"] == 2 and megatron["conversion_bit_exact"] is True
    assert megatron["logprob_max_abs_diff"] <= megatron["tolerance"] == 1e-4
    group = rows["megatron_group"]  # the rank-group launcher at world size 1
    assert group["weights_bit_identical"] is True and group["weight_gap"] <= 1e-4 and len(group["layout"]) == 1
    dcs = rows["dcs"]
    assert dcs["transport"] == "tcp" and dcs["engine_weight_version"] == "2"
    assert [p["bit_identical"] for p in dcs["pushes"]] == [True, True]
    assert dcs["sglang_layout"] == {"ok": True, "backend": "cpu:gloo", "bit_identical": True, "error": None}
    table = (tmp_path / "gpu-results.md").read_text()
    assert table.startswith("Run: dry run (CPU)") and "| dcs | yes |" in table


def test_a_failed_install_fails_the_run_and_skips_the_checks(tmp_path):
    proc = run("--dry-run", "--wheelhouse", str(tmp_path / "missing"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    rows = results(tmp_path / "out")
    assert rows["install"]["ok"] is False and "no wheelhouse at" in rows["install"]["error"]
    assert rows["megatron"]["skipped"] == rows["megatron_group"]["skipped"] == rows["dcs"]["skipped"] == "the install failed"
    assert rows["summary"] == {"check": "summary", "ok": False, "wall_s": rows["summary"]["wall_s"],
                               "checks": {"env": True, "install": False, "megatron": False, "megatron_group": False,
                                          "dcs": False}}


@pytest.mark.parametrize("args, message", [(["--bogus"], "unknown argument '--bogus'"),
                                           (["--steps", "x"], "--steps must be a positive integer")])
def test_bad_arguments_are_refused(args, message):
    proc = run(*args)
    assert proc.returncode == 2 and message in proc.stderr


def test_the_wheelhouse_list_is_pinned_and_leaves_out_what_the_gpu_machine_has():
    text = (REPO / "scripts" / "gpu_wheelhouse.sh").read_text()
    block = text[text.index("PACKAGES=(") + len("PACKAGES=("):text.index("\n)\n")]
    names = [tok for line in block.splitlines() if not line.strip().startswith("#") for tok in line.split()]
    assert names and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", n) for n in names), names
    dists = {n.split("==")[0].lower() for n in names}
    assert {"megatron-core", "pydantic", "httpx", "hatchling"} <= dists
    assert not dists & {"torch", "transformers", "triton", "sglang", "numpy"}
