"""What a run judged by a model must show, for the runs of tests/integration that train against a judge."""

from __future__ import annotations

from relax_gym.trainer.rewards.judge_model import JudgeSpec

# a judge trained for a few steps: enough to answer yes/no (its agreement with the rule verdict is a benchmark
# figure, docs/judges.md)
SMALL_JUDGE = JudgeSpec(steps=25, batch_size=16, lr=3e-3, held_pairs=24, hidden_size=64, num_layers=1)


def judged_every_episode(rows: list[dict], episodes: int) -> None:
    """Each step row: one match verdict per episode that ended, the judge's failures counted as judge errors,
    both rubric parts logged, the agreement with the rule verdict a fraction."""
    for r in rows:
        masked_before_judge = r.get("status_env_error", 0) + r.get("status_engine_error", 0)
        assert r["judge_calls"] == episodes - masked_before_judge, r
        assert r["judge_failures"] == r.get("status_judge_error", 0)
        assert "match_mean" in r and "format_mean" in r
        assert 0.0 <= r["judge_rule_agreement"] <= 1.0
