"""benchmarks/agent_learning.py end to end at smoke size: clips, a base trained here, the prior, both arms and the
watch-coverage pass (the figures of a smoke run say nothing about learning); and its coverage helpers on real clips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("agent_learning")


def call(name: str, **arguments) -> str:
    return f"<think></think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_event_frames_and_watched_frames_on_real_clips(bench, tmp_path):
    data = bench.ensure_data(tmp_path / "data", n_val=4, n_train=2)
    assert json.loads((data / "done.json").read_text())["n_val"] == 4
    import relax_gym

    env = relax_gym.make("nextqa-video-agent", data_dir=str(data)).unwrapped
    for sample in env.samples:
        event = bench.event_frames(sample.media["video"])
        still = sample.options[sample.answer_index] == "it stays still"
        assert (not event) == still
        if event:  # one run of frames strictly between the keyframes 6, 18, 30, 42
            assert len(event) == max(event) - min(event) + 1 and 3 <= len(event) <= 9
            assert not event & {6, 18, 30, 42}
            first = min(event)
            assert bench.watched_frames(call("frame", t_s=(first + 0.5) / 8), 8.0, 6.0) & event
            assert not bench.watched_frames(call("frame", t_s=(max(event) + 2.5) / 8), 8.0, 6.0) & event
    whole = bench.watched_frames(call("watch", start_s=0, end_s=6, fps=2.66), 8.0, 6.0)
    assert len(whole) == 15 and bench.watched_frames("<answer>A</answer>", 8.0, 6.0) == set()


@pytest.mark.slow(reason="trains a base, a prior and both arms of benchmarks/agent_learning.py at smoke size")
@pytest.mark.timeout(300)
def test_quick_run_goes_through_every_stage(bench, tmp_path):
    result = bench.run(quick=True, out=tmp_path)
    assert (tmp_path / "prior" / "policy" / "config.json").is_file()
    spec = json.loads((tmp_path / "prior" / "prior.json").read_text())["spec"]
    assert (spec["steps"], spec["batch"]) == (result["prior"]["sft_steps"], result["prior"]["sft_batch"]) == (2, 2)
    assert [a["arm"] for a in result["arms"]] == ["tools", "no tools"]
    for arm in result["arms"]:
        assert arm["steps"] == 2 and 0.0 <= arm["eval_reward_end"] <= 1.0 and arm["eval_episodes"] == 4
        config = json.loads((Path(arm["run_dir"]) / "config.json").read_text())
        assert config["model"]["path"] == str(tmp_path / "prior" / "policy")
        assert config["env"]["kwargs"].get("tools_enabled", True) == (arm["arm"] == "tools")
        assert config["trainer"]["sft_warmup_steps"] == 0
