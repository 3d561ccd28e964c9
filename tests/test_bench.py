"""``relax-gym bench``: selection, child processes, skips and failures in the table, the docs section, the charts.

Most tests run the real command on a folder of small fake benchmark scripts (the real ones take minutes); the
summaries are fed dicts shaped like the real scripts' ``run()`` results, and the real scripts are checked to
define ``run(quick=...)``.
"""

from __future__ import annotations

import ast
import json
import os
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.bench import report
from relax_gym.bench.runner import BenchError, discover, select
from relax_gym.bench.summaries import SUMMARIES, summarise
from relax_gym.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

FAKES = {
    "alpha.py": '''
        """Alpha: a benchmark that works."""
        def run(quick: bool = False) -> dict:
            return {"latency_ms": 1.5 if quick else 3.0, "nested": {"ratio": 2.0, "ok": True}, "note": "text"}
        ''',
    "beta.py": '''
        """Beta: needs a widget this machine lacks."""
        def run(quick: bool = False) -> dict:
            return {"skipped": "no widget on this machine"}
        ''',
    "gamma.py": '''
        """Gamma: crashes."""
        def run(quick: bool = False) -> dict:
            raise RuntimeError("boom in gamma")
        ''',
    "_helper.py": '''
        """Not a benchmark (leading underscore)."""
        ''',
}

SLEEPER = '''
    """Sleeps, with a grandchild process, past any reasonable timeout."""
    import subprocess, sys, time
    from pathlib import Path

    def run(quick: bool = False) -> dict:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        Path(__file__).with_name("grandchild.pid").write_text(str(child.pid))
        time.sleep(120)
        return {}
    '''


def _write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (folder / name).write_text(textwrap.dedent(body))
    return folder


@pytest.fixture
def fakes(tmp_path) -> Path:
    return _write(tmp_path / "checkout" / "benchmarks", FAKES)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Rich wraps table cells at 80 columns off a terminal; a wide console keeps each cell on one line."""
    from relax_gym import cli

    monkeypatch.setattr(cli.console, "_width", 250)
    monkeypatch.setattr(cli.err_console, "_width", 250)


def test_discover_orders_known_names_first_and_ignores_helpers(tmp_path):
    folder = _write(tmp_path / "b", {n: '"""x"""\ndef run(quick=False):\n    return {}\n'
                                     for n in ("zeta.py", "databus.py", "env_reset.py", "_util.py", "modes.py")})
    assert list(discover(folder)) == ["env_reset", "modes", "databus", "zeta"]


def test_select_rejects_unknown_names_and_ambiguous_requests(fakes):
    available = discover(fakes)
    assert select(available, ["gamma", "alpha"], False) == ["alpha", "gamma"]
    with pytest.raises(BenchError, match="did you mean alpha"):
        select(available, ["alpah"], False)
    with pytest.raises(BenchError, match="not both"):
        select(available, ["alpha"], True)
    with pytest.raises(BenchError, match="pass --all"):
        select(available, [], False)


def test_unknown_name_exits_2_with_a_suggestion(fakes):
    result = runner.invoke(app, ["bench", "alpah", "--bench-dir", str(fakes)])
    assert result.exit_code == 2
    assert "no benchmark 'alpah' (did you mean alpha?)" in result.output


@pytest.mark.slow(reason="runs the benchmark runner end to end over every registered benchmark (fakes)")
@pytest.mark.timeout(300)
def test_all_reports_ok_skipped_and_failed_and_rewrites_only_the_docs_section(fakes, tmp_path):
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text(f"# Benchmarks\n\nhand-written figures\n\n{report.BEGIN}\nold generated text\n{report.END}\n\ntrailer\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["bench", "--all", "--quick", "--bench-dir", str(fakes), "--out", str(out),
                                 "--docs-file", str(docs)])
    assert result.exit_code == 1, result.output  # gamma failed
    text = " ".join(result.output.split())
    assert "alpha" in text and "latency_ms" in text and "1.5" in text
    assert "skipped" in text and "no widget on this machine" in text
    assert "failed" in text and "RuntimeError: boom in gamma" in text
    assert "_helper" not in text

    saved = json.loads((out / "results.json").read_text())
    assert saved["command"] == "relax-gym bench --all --quick"
    assert {r["name"]: r["status"] for r in saved["results"]} == {"alpha": "ok", "beta": "skipped", "gamma": "failed"}
    assert "boom in gamma" in (out / "gamma.log").read_text()  # the traceback is kept

    md = docs.read_text()
    assert md.startswith("# Benchmarks\n\nhand-written figures\n\n") and md.endswith(f"{report.END}\n\ntrailer\n")
    assert "old generated text" not in md
    prose = " ".join(md.split())
    assert "Generated by `relax-gym bench --all --quick`" in prose and "These are quick-mode figures" in prose
    assert "| beta | **skipped** | | | no widget on this machine |" in md
    assert "| alpha (" in md and "| latency_ms | 1.5 |" in md


@pytest.mark.slow(reason="waits for a benchmark child to pass its timeout and be killed")
@pytest.mark.timeout(120)
def test_a_benchmark_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    folder = _write(tmp_path / "benchmarks", {"sleeper.py": SLEEPER})
    result = runner.invoke(app, ["bench", "sleeper", "--timeout", "8", "--bench-dir", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1  # the sleeper sleeps 120 s: without the kill the test's own 120 s limit fails it
    assert "timed out after 8 s" in " ".join(result.output.split())
    pid = int((folder / "grandchild.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the benchmark's own child process survived the timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ", 1)[1].startswith("Z"))  # a zombie is gone


def test_docs_section_is_appended_once_then_replaced(tmp_path):
    docs = tmp_path / "b.md"
    docs.write_text("# B\n\ntext\n")
    report.write_docs_section(docs, "first")
    report.write_docs_section(docs, "second")
    assert docs.read_text() == f"# B\n\ntext\n\n{report.BEGIN}\nsecond\n{report.END}\n"


def test_docs_with_one_marker_are_left_alone(tmp_path):
    docs = tmp_path / "b.md"
    docs.write_text(f"# B\n{report.BEGIN}\nno end marker\n")
    with pytest.raises(report.DocsMarkerError, match="once each"):
        report.write_docs_section(docs, "new")
    assert docs.read_text() == f"# B\n{report.BEGIN}\nno end marker\n"


def test_list_shows_every_real_benchmark():
    result = runner.invoke(app, ["bench", "--list", "--bench-dir", str(REPO / "benchmarks")])
    assert result.exit_code == 0, result.output
    for name in ("env_reset", "sandbox", "learning", "modes", "weight_sync", "databus"):
        assert name in result.output
    assert "no run() function" not in result.output


@pytest.mark.parametrize("script", sorted((REPO / "benchmarks").glob("[!_]*.py")), ids=lambda p: p.stem)
def test_real_scripts_define_run_with_quick(script):
    tree = ast.parse(script.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "run" in funcs and "main" in funcs, f"{script.name} needs run(quick=False) and main()"
    args = funcs["run"].args
    assert args.args and args.args[0].arg == "quick" and args.defaults, f"{script.name}: run's first parameter must be quick=False"


# Dicts shaped like each real script's run() result (see their run() docstrings).
SAMPLES = {
    "env_reset": {"resets": 10, "cases": [
        {"label": "nextqa-video", "env": "nextqa-video", "cold_p50_ms": 6.2, "cached_p50_ms": 0.043, "cold_over_cached": 144.0},
        {"label": "echo-ink", "env": "echo-ink", "cold_p50_ms": 0.45, "cached_p50_ms": 0.057, "cold_over_cached": 7.9}],
        "seek": [{"label": "20 s, keyframes every 1 s", "keyframe_s": 1.0, "seconds": 20.0, "cold_p50_ms": 150.0,
                  "full_decode_ms": 600.0, "ratio": 0.25, "target": 0.3}]},
    "sandbox": {"repeats": 10, "episodes": 8, "backends": {
        "docker": {"problem": "no Docker engine answers at unix:///var/run/docker.sock: start dockerd"},
        "bwrap": {"problem": None, "acquire_p50_ms": 0.03, "acquire_p99_ms": 0.2, "episode_ms": 30.2,
                  "episode_phases_ms": {"acquire": 0.1, "write": 0.8, "exec": 28.0, "release": 1.3},
                  "episodes_per_s": 20.5, "warm_episodes_per_s": 22.0}},
        "bwrap_exec": {"ours_ms": 12.8, "bare_ms": 11.4, "ratio": 1.12}},
    "learning": {"recipe": "recipes/cpu-nextqa.yaml", "quick": True, "overrides": [], "seeds": [
        {"seed": 0, "steps": 8, "minutes": 1.5, "eval_reward_start": 0.23, "eval_reward_end": 0.25, "gain": 0.02,
         "eval_accuracy_end": 0.2, "best_eval_reward": 0.25, "best_step": 8, "run_dir": "runs/x"}],
        "engine": {"batch": 8, "new_tokens": 32, "plain_tok_s": 2589.0, "engine_tok_s": 2526.0, "http_tok_s": 1773.0,
                   "engine_over_plain": 0.98, "http_over_plain": 0.68}},
    "convergence": {"modes": {m: {"steps": 120, "steps_per_hour": sph, "speedup": sph / 1500, "eval_reward_start": 0.29,
                                  "eval_reward_end": end, "best_eval_reward": end, "curve": [[0, 60.0, 0.29], [120, 400.0, end]],
                                  "run_dir": "r"} for m, sph, end in (("colocate", 1500, 0.8), ("async S=0", 1300, 0.78),
                                                                      ("async S=2 carry", 1900, 0.81))},
                    "targets": {"final eval rewards within +-0.05 of each other": True, "every final eval reward >= 0.6": True},
                    "workload": {"recipe": "recipes/cpu-nextqa.yaml", "steps": 120, "seed": 0, "quick": False}},
    "modes": {"modes": {m: {"steps": 4, "steps_per_hour": s, "speedup": s / 271, "eval_reward_end": 0.09,
                            "data_wait_fraction": None, **({"samples_discarded_stale": 24} if "carry" in m else {})}
                        for m, s in (("colocate", 271.0), ("async S=0", 262.0), ("async S=2", 469.0), ("async S=2 carry", 650.0))},
              "targets": {"async S=2 >= 2x colocate steps/hour": False}, "workload": {"steps": 4}},
    "weight_sync": {"bucket_mb": 64.0, "repeats": 2, "rounds": 3, "bytes": 57671680, "model_mib": 55.0,
                    "floor": {"seconds": 0.02, "mib_per_s": 2700.0, "rounds_s": [0.02, 0.021, 0.019]},
                    "tcp": {"seconds": 0.025, "mib_per_s": 2200.0, "vs_floor": 0.82, "vs_floor_rounds": [0.8, 0.82, 0.9],
                            "paused_s": 0.004, "buckets": 1, "phases": {"stage": 0.02, "pause": 0.001, "load": 0.001,
                                                                        "resume": 0.002}, "verified": True},
                    "tcp_unstaged": {"seconds": 0.05, "mib_per_s": 1200.0, "vs_floor": 0.45, "vs_floor_rounds": [0.45, 0.4, 0.5],
                                     "paused_s": 0.045, "buckets": 1, "phases": {"stage": 0.0, "pause": 0.001, "load": 0.04,
                                                                                 "resume": 0.002}, "verified": True},
                    "disk": {"seconds": 0.04, "mib_per_s": 1400.0, "vs_floor": 0.52, "vs_floor_rounds": [0.5, 0.52, 0.6],
                             "paused_s": 0.02, "buckets": 1, "phases": {"stage": 0.02, "pause": 0.001, "load": 0.015,
                                                                        "resume": 0.002}, "verified": True}},
    "databus": {"rows": 50, "batch": 25, "mb": 50.0, "reps": 1, "raw_put_mb_s": 900.0, "raw_get_mb_s": 800.0,
                "bus_put_mb_s": 640.0, "bus_get_mb_s": 750.0, "put_ratio": 1.41, "get_ratio": 1.07, "total_ratio": 1.10,
                "raw_empty_get_ms": 0.9, "bus_empty_fetch_ms": 2.5},
    "r3": {"cost": {"episodes": 16, "tokens": 2400, "rounds": 3, "generate_s": {"plain": 1.2, "recorded": 1.22},
                    "record_ratio": 1.017, "train_step_s": {"plain": 0.5, "measured": 0.505, "replay": 0.507},
                    "measure_ratio": 1.01, "replay_ratio": 1.014, "mismatch_used_replay": 0.0},
           "async_s2": {"no replay": {"steps": 4, "routing_mismatch": 0.021, "routing_mismatch_used": 0.021},
                        "replay": {"steps": 4, "routing_mismatch": 0.019, "routing_mismatch_used": 0.0}},
           "replay_overhead": 0.014, "targets": {"replay overhead <= 3% of step time": True}},
    "faults": {"clean": {"wall_s": 40.0, "steps": 6, "samples_produced": 24, "samples_consumed": 24, "samples_lost": 0,
                         "samples_duplicated": 0, "samples_regenerated": 0, "masked_engine_error": 0, "restarts_level1": {},
                         "restarts_level2": 0, "faults_injected": {}},
               "faulted": {"wall_s": 120.0, "steps": 6, "samples_produced": 24, "samples_consumed": 24, "samples_lost": 0,
                           "samples_duplicated": 0, "samples_regenerated": 8, "masked_engine_error": 2,
                           "restarts_level1": {"env_worker": 1, "inference": 1}, "restarts_level2": 1,
                           "faults_injected": {"kill": 5, "kill:actor": 1, "engine_error": 1}},
               "wall_ratio": 3.0, "workload": {"steps": 6}},
    "megatron_step": {"repeats": 8, "batch": 16, "tokens": 2530, "threads": 2,
                      "sft_step": {"hf_wall_ms": 135.4, "megatron_wall_ms": 163.1, "megatron_over_hf_wall": 1.204,
                                   "hf_cpu_ms": 272.1, "megatron_cpu_ms": 325.5, "megatron_over_hf_cpu": 1.196},
                      "logprobs": {"hf_wall_ms": 51.3, "megatron_wall_ms": 58.1, "megatron_over_hf_wall": 1.133,
                                   "hf_cpu_ms": 102.2, "megatron_cpu_ms": 114.1, "megatron_over_hf_cpu": 1.117}},
    "agent_learning": {"prior": {"path": "p", "base": "b", "sft_steps": 160}, "settings": {"quick": False, "seed": 1},
                       "arms": [{"arm": "tools", "steps": 60, "eval_reward_start": 0.4, "eval_reward_end": 0.559,
                                 "eval_tool_calls_end": 1.0, "episodes_with_event": 91, "event_seen_share": 1.0},
                                {"arm": "no tools", "steps": 60, "eval_reward_start": 0.344, "eval_reward_end": 0.344,
                                 "eval_tool_calls_end": 0.0, "episodes_with_event": 91, "event_seen_share": 0.0}]},
}


def test_every_known_benchmark_has_a_sample():
    assert set(SAMPLES) == set(SUMMARIES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_summaries_give_rows_and_a_png(name, tmp_path):
    s = summarise(name, SAMPLES[name])
    assert s.rows and not s.rows[0].figure.startswith("(figures not in the expected shape")
    assert all(row.figure and isinstance(row.value, str) for row in s.rows)
    png = report.plot(name, s.bars, tmp_path)
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_specific_rows_carry_the_ratio_and_the_reason():
    rows = {r.figure: r for r in summarise("sandbox", SAMPLES["sandbox"]).rows}
    assert rows["docker backend"].value == "unavailable" and "start dockerd" in rows["docker backend"].note
    assert rows["python3 -c pass: bwrap exec / bare subprocess"].ratio == "1.12x"
    learning = summarise("learning", SAMPLES["learning"]).rows
    assert "NOT the 10-minute learning figure" in learning[0].note and learning[0].ratio == "+0.020"
    modes = {r.figure: r for r in summarise("modes", SAMPLES["modes"]).rows}
    assert modes["target: async S=2 >= 2x colocate steps/hour"].value == "NOT met"
    assert "data wait n/a" in modes["steps/hour, colocate (4 steps)"].note
    assert "24 samples discarded as stale" in modes["steps/hour, async S=2 carry (4 steps)"].note
    assert "discarded" not in modes["steps/hour, async S=2 (4 steps)"].note


def test_a_result_in_an_unexpected_shape_falls_back_to_its_raw_figures():
    s = summarise("databus", {"put_ratio": 1.2, "something_new": {"x": 3}})
    assert s.rows[0].figure.startswith("(figures not in the expected shape")
    assert [r.figure for r in s.rows[1:]] == ["put_ratio", "something_new.x"]


def test_a_benchmark_with_nothing_numeric_still_gets_a_row():
    assert [r.figure for r in summarise("newcomer", {"note": "only text"}).rows] == ["(run() returned no numeric figures)"]


def test_machine_names_the_cpu_model_from_cpuinfo(tmp_path):
    from relax_gym.bench.command import cpu_model, machine

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: Example\nmodel name\t: Example CPU 9000 @ 3.0GHz\n\nprocessor\t: 1\n")
    assert cpu_model(info) == "Example CPU 9000 @ 3.0GHz"
    info.write_text("processor\t: 0\nmodel name\t:\n")  # no model name: the platform's word for it, never empty
    assert cpu_model(info)
    assert cpu_model(tmp_path / "missing")
    assert machine().startswith(cpu_model() + ", ") and "CPU cores" in machine()
