"""Training against an LLM judge, end to end: ``nextqa-describe`` (whose ``match`` part only a judge can score) for 2
steps in colocate mode and 3 in async mode, with a judge model built in code and served — in colocate mode by an engine in the trainer's
process, in async mode by the ``genrm`` role on real Ray Serve, whose replica is killed mid-run.

The judge here is a small one trained for a few steps (enough to answer yes/no; its agreement with the rule verdict
is a benchmark figure, docs/judges.md). Checked: every unmasked episode was judged (one call each), the judged part
is in the metrics, the judge's failures are counted, and after the genrm kill (level 1) no sample is lost or
duplicated, one replacement is counted, and no episode was masked by the kill.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.trainer.rewards.judge_model import JudgeSpec, ensure_judge

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="trains against a judge model in both modes, one on real Ray Serve with a genrm kill"),
              pytest.mark.timeout(600)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-describe.yaml"
P, G, STEPS = 2, 2, 3
SMALL = ["model.base=null", f"trainer.steps={STEPS}", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=4",
         f"trainer.prompts_per_step={P}", f"trainer.group_size={G}", "trainer.eval_episodes=3", "trainer.eval_every=3",
         "trainer.checkpoint_every=3", "trainer.time_budget_s=null", "metrics.tensorboard=false"]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    spec = JudgeSpec(steps=25, batch_size=16, lr=3e-3, held_pairs=24, hidden_size=64, num_layers=1)
    return ensure_judge("describe-judge", tmp_path_factory.mktemp("judges"), spec=spec).path


def train(args: list[str]) -> list[dict]:
    run_dir = Path(args[args.index("--run-dir") + 1])
    result = CliRunner().invoke(app, ["train", str(RECIPE), *SMALL, *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


def judged_every_episode(rows: list[dict]) -> None:
    for r in rows:
        episodes = P * G
        masked_before_judge = r.get("status_env_error", 0) + r.get("status_engine_error", 0)
        assert r["judge_calls"] == episodes - masked_before_judge, r  # one match verdict per episode that ended
        assert r["judge_failures"] == r.get("status_judge_error", 0)
        assert "match_mean" in r and "format_mean" in r  # both rubric parts are logged
        assert 0.0 <= r["judge_rule_agreement"] <= 1.0


def test_colocate_run_is_judged_in_process(judge_dir, tmp_path):
    run_dir = tmp_path / "run"
    rows = train([f"judge.model={judge_dir}", "trainer.steps=2", "trainer.eval_every=2", "trainer.sft_warmup_steps=1",
                  "--run-dir", str(run_dir)])  # two steps show it: the async run below goes on for three
    assert [r["step"] for r in rows] == [1, 2]
    judged_every_episode(rows)
    assert "eval_match" in rows[-1] and "eval_reward" in rows[-1]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["judge"]["model"] == str(judge_dir)


def test_async_run_judged_by_the_genrm_role_survives_a_genrm_kill(ray_session, judge_dir, tmp_path):
    run_dir = tmp_path / "run"
    rows = train([f"judge.model={judge_dir}", "trainer.mode=async", "trainer.max_staleness=1", "roles.bus=transferqueue",
                  "roles.health_check_period_s=2", "faults.inject=[{kind: kill, role: genrm, at_step: 2}]",
                  "--run-dir", str(run_dir)])
    assert [r["step"] for r in rows] == [1, 2, 3]
    judged_every_episode(rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples_consumed"] == summary["samples_produced"] == STEPS * P * G
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0 and summary["samples_unconsumed"] == 0
    assert summary["faults_injected"] == {"kill": 1, "kill:genrm": 1}
    assert summary["restarts_level1"] == {"genrm": 1} and summary["restarts_level2"] == 0
    # the kill reached no episode: the workers' calls waited for the new replica instead of failing
    assert not any(r.get("status_env_error") or r.get("status_engine_error") for r in rows)
    assert not any(r.get("judge_failed_engine_error") or r.get("judge_failed_timeout") for r in rows)
