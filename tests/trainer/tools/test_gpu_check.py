"""``scripts/gpu_check.sh``: its CPU dry run runs the same checks as the GPU run (gloo instead of nccl) and passes;
a failing step makes the script fail; bad arguments are refused. ``scripts/gpu_wheelhouse.sh`` pins every wheel.

The dry run's ``models`` step runs ``relax_gym.trainer.tools.model_check`` on the session's 1-layer Qwen2.5-Omni-3B
stand-in (``standin_3b``, tests/conftest.py) through ``MODEL_CHECK_ARGS``, with ``--freeze-vocab`` (its process
peaks at ~4.3 GiB, the fp32 parity forward; ~50 s on a loaded 2-core machine). The tool's own machinery (budget,
guarded parts, argument checks) is tested in-process with stand-in parts, without a model."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version

from relax_gym.envs.samples import sample_root
from relax_gym.trainer.policy.requirements import MIN_TRANSFORMERS
from relax_gym.trainer.tools import model_check

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def results(out: Path) -> dict[str, dict]:
    return {row["check"]: row for row in map(json.loads, (out / "gpu_check.jsonl").read_text().splitlines())}


@pytest.mark.slow(reason="runs every step of scripts/gpu_check.sh on the CPU, real-width stand-in included")
@pytest.mark.timeout(2100)
def test_dry_run_runs_every_check_on_cpu_and_passes(tmp_path, standin_3b):
    model_args = f"--layers 1 --standin {standin_3b} --freeze-vocab"
    # the suite's sample cache: the checks' envs read the nextqa and avqa samples the suite has (or makes once),
    # instead of generating them again in the script's default OUT/cache (~50 s of the run on a loaded machine)
    cache = str(sample_root().parent)
    # the GPU run's budget (460 s) and caps, times 4: a busy 2-core machine is no H200 (~70 s when quiet)
    proc = run("--dry-run", "--out", str(tmp_path), timeout=2000,
               env={"MODEL_CHECK_ARGS": model_args, "RELAX_GYM_CACHE": cache, "GPU_CHECK_TIME_SCALE": "4"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = results(tmp_path)
    assert list(rows) == ["env", "install", "megatron", "megatron_group", "dcs", "models", "summary"]
    assert all(r["ok"] for r in rows.values())
    assert rows["env"]["dry_run"] is True and rows["env"]["device"] == "cpu"
    assert "dry run without --wheelhouse" in rows["install"]["skipped"]
    megatron = rows["megatron"]
    assert megatron["device"] == "cpu" and megatron["steps"] == 2 and megatron["conversion_bit_exact"] is True
    assert megatron["logprob_max_abs_diff"] <= megatron["tolerance"] == 1e-4 and megatron["tokens_compared"] > 50
    # the megatron_check CLI on the CPU (this row is its one JSON line): the patch applied, the steps trained
    assert megatron["cpu_patch"] is True and megatron["tensors_changed"] > 0
    assert len(megatron["losses"]) == 2 and all(math.isfinite(x) for x in megatron["losses"])
    group = rows["megatron_group"]  # the rank-group launcher at world size 1
    assert group["weights_bit_identical"] is True and group["weight_gap"] <= 1e-4 and len(group["layout"]) == 1
    dcs = rows["dcs"]
    assert dcs["transport"] == "tcp" and dcs["engine_weight_version"] == "2"
    assert [p["bit_identical"] for p in dcs["pushes"]] == [True, True]
    assert dcs["sglang_layout"] == {"ok": True, "backend": "cpu:gloo", "bit_identical": True, "error": None}
    _assert_model_check_passed(rows["models"], standin_3b)
    assert not (tmp_path / "models").exists()  # the step's work folder is removed
    table = (tmp_path / "gpu-results.md").read_text()
    assert table.startswith("Run: dry run (CPU)") and "| dcs | yes |" in table and "| models | yes |" in table


def _assert_model_check_passed(models: dict, standin: Path) -> None:
    """Every part of model_check ran and passed on the 1-layer 3B stand-in, with the figures that show it."""
    assert models["ok"] is True and models["failures"] == [] and models["device"] == "cpu" and models["layers"] == 1
    parts = models["parts"]
    assert list(parts) == list(model_check.PARTS) and all(p["ok"] for p in parts.values()), parts
    assert parts["standin"] == {**parts["standin"], "written": False, "path": str(standin), "shards": 3}
    load = parts["load"]
    assert load["check"] == "OK" and load["dtype"] == ["bfloat16"] and load["architecture"]["layout"] == "full"
    widths = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    assert {k: load["text"][k] for k in widths} == \
        {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936}
    assert load["thinker_parameters"] == load["parameters"] > 8e8
    logits = parts["logits"]
    assert logits["inputs_identical"] is True and logits["official_processor"] == "Qwen2_5OmniProcessor"
    assert logits["image_tokens"] == 48 and logits["audio_tokens"] == 32  # 168 x 224 px; 1.3 s at 16 kHz
    assert logits["logits_shape"] == [1, logits["tokens"], 151936] and logits["logits_finite"] is True
    assert logits["logits_max_abs_diff"] <= logits["tolerance"] == 1e-4
    conversion = parts["conversion"]
    assert conversion["bit_exact"] is True and conversion["differ_count"] == 0
    assert conversion["tensors"] == load["tensors"]
    train = parts["train"]
    assert math.isfinite(train["loss"]) and train["loss_tokens"] > 0 and "--freeze-vocab" in train["what"]
    changed = {part: tuple(map(int, text.split(" of "))) for part, text in train["changed"].items()}
    assert changed["head"] == (0, 1)  # frozen: the freeze really left it out
    assert all(0 < changed[p][0] <= changed[p][1] for p in ("text", "vision", "audio")), changed
    checkpoint = parts["checkpoint"]
    assert checkpoint["weights"] == "trained (part e)" and checkpoint["bit_identical"] is True
    assert checkpoint["reloaded_dtype"] == ["bfloat16"] and checkpoint["tensors"] == load["tensors"]
    head = models["headline"]
    assert head["conversion_bit_exact"] is True and head["checkpoint_bit_identical"] is True
    assert all(isinstance(v, float) for v in head["part_seconds"].values())
    print(f"\nmodel_check, 1-layer 3B stand-in on CPU: {head['part_seconds']}; peak RSS {head['peak_rss_mib']} MiB")


def test_a_failed_install_fails_the_run_and_skips_the_checks(tmp_path):
    proc = run("--dry-run", "--wheelhouse", str(tmp_path / "missing"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    rows = results(tmp_path / "out")
    assert rows["install"]["ok"] is False and "no wheelhouse at" in rows["install"]["error"]
    assert rows["megatron"]["skipped"] == rows["megatron_group"]["skipped"] == rows["dcs"]["skipped"] == \
        rows["models"]["skipped"] == "the install failed"
    assert rows["summary"] == {"check": "summary", "ok": False, "wall_s": rows["summary"]["wall_s"],
                               "checks": {"env": True, "install": False, "megatron": False, "megatron_group": False,
                                          "dcs": False, "models": False}}


@pytest.mark.parametrize("args, env, message", [
    (["--bogus"], {}, "unknown argument '--bogus'"),
    (["--steps", "x"], {}, "--steps must be a positive integer"),
    (["--dry-run"], {"GPU_CHECK_TIME_SCALE": "0"}, "GPU_CHECK_TIME_SCALE must be a positive integer, got '0'")])
def test_bad_arguments_are_refused(args, env, message):
    proc = run(*args, env=env)
    assert proc.returncode == 2 and message in proc.stderr


def test_the_wheelhouse_list_is_pinned_and_carries_what_the_gpu_machine_lacks_or_has_too_old():
    text = (REPO / "scripts" / "gpu_wheelhouse.sh").read_text()
    block = text[text.index("PACKAGES=(") + len("PACKAGES=("):text.index("\n)\n")]
    names = [tok for line in block.splitlines() if not line.strip().startswith("#") for tok in line.split()]
    assert names and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", n) for n in names), names
    pins = {n.split("==")[0].lower(): n.split("==")[1] for n in names}
    assert {"megatron-core", "pydantic", "httpx", "hatchling", "ray"} <= set(pins)
    assert not set(pins) & {"torch", "triton", "sglang", "numpy"}  # the GPU machine's own (CUDA builds)
    # the machine's transformers (5.17) is older than the policy code needs: the wheelhouse carries one that is not
    assert Version(pins["transformers"]) >= Version(MIN_TRANSFORMERS)


# -- relax_gym.trainer.tools.model_check's machinery, without a model ----------------------------------------------

class _Actor:
    closed = False

    def close(self) -> None:
        self.closed = True


def _passes(state, out) -> None:
    out["ok"] = True


def _converts(state, out) -> None:
    state.actor = _Actor()  # what the checkpoint part takes the weights from
    out["ok"] = True


def _raises(exc: Exception):
    def part(state, out):
        raise exc
    return part


def _with_parts(monkeypatch, **fns) -> list[str]:
    """Replace model_check's parts (keeping what each needs): each passes unless ``fns`` says otherwise. Returns
    the list the parts append their names to as they run."""
    ran: list[str] = []
    for name in model_check.PARTS:
        _, needs = model_check._RUN[name]
        chosen = fns.get(name, _converts if name == "conversion" else _passes)

        def logged(state, out, chosen=chosen, name=name):
            ran.append(name)
            chosen(state, out)
        monkeypatch.setitem(model_check._RUN, name, (logged, needs))
    return ran


def test_a_failed_part_is_recorded_and_the_parts_that_do_not_need_it_still_run(monkeypatch, tmp_path):
    ran = _with_parts(monkeypatch, logits=_raises(RuntimeError("shapes differ")))
    report = model_check.run_check("cpu", work=tmp_path)
    assert ran == list(model_check.PARTS)  # conversion, train and checkpoint do not need the logits part
    assert report["ok"] is False and report["failures"] == ["logits: RuntimeError: shapes differ"]
    assert report["parts"]["logits"]["ok"] is False and report["parts"]["checkpoint"]["ok"] is True
    assert report["headline"]["part_seconds"]["logits"] >= 0


def test_a_failed_load_skips_what_needs_it(monkeypatch, tmp_path):
    ran = _with_parts(monkeypatch, load=_raises(ValueError("no config.json")))
    report = model_check.run_check("cpu", work=tmp_path)
    assert ran == ["standin", "load"]
    parts = report["parts"]
    assert parts["logits"]["skipped"] == parts["conversion"]["skipped"] == "needs load, which did not pass"
    assert parts["train"]["skipped"] == parts["checkpoint"]["skipped"] == "needs conversion, which did not pass"
    assert report["headline"]["part_seconds"]["train"] == "skipped"
    assert len(report["failures"]) == 5


def test_a_part_stopped_by_the_budget_says_so_and_the_rest_is_skipped(monkeypatch, tmp_path):
    ran = _with_parts(monkeypatch, train=_raises(model_check.BudgetSpent("the 420 s budget ran out")))
    report = model_check.run_check("cpu", work=tmp_path)
    assert ran == ["standin", "load", "logits", "conversion", "train"]
    parts = report["parts"]
    assert parts["train"]["error"].startswith("stopped: the 420 s budget ran out after ")
    assert parts["checkpoint"]["skipped"].startswith("the 420 s budget is spent")


def test_a_spent_budget_skips_every_part_and_the_tool_exits_1(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    rc = model_check.main(["--device", "cpu", "--budget-s", "1", "--out", str(tmp_path)])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and report["ok"] is False
    assert [p["skipped"].split(" (")[0] for p in report["parts"].values()] == ["the 1 s budget is spent"] * 6
    assert list(tmp_path.iterdir()) == []  # the work folder it made is removed


@pytest.mark.timeout(60)
def test_the_budget_alarm_interrupts_a_running_part():
    budget = model_check.Budget(1, start=time.monotonic() - 2)  # already spent: the alarm rings at once
    with pytest.raises(model_check.BudgetSpent, match="the 1 s budget ran out"):
        with budget.alarm():
            signal.pause()  # returns only through the alarm's handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("args, message", [
    (["--name", "qwen9-omni"], "unknown published model 'qwen9-omni'"),
    (["--layers", "0"], "--layers must be >= 1"),
    (["--layers", "2", "--standin", "{standin}"], "has 1 text layers, not --layers 2"),
    (["--standin", "{missing}"], "is not a directory"),
])
def test_model_check_refuses_bad_arguments(args, message, tmp_path, capsys):
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "config.json").write_text(json.dumps({"thinker_config": {"text_config": {"num_hidden_layers": 1}}}))
    args = [a.format(standin=standin, missing=tmp_path / "missing") for a in args]
    with pytest.raises(SystemExit) as exit_:
        model_check.main(["--device", "cpu", *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
