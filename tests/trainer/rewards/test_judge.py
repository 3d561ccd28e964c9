"""The judge's code path with a scripted engine: verdicts, time limits, engine failures, malformed answers, and
what an episode becomes (rewards recombined from every rubric part, or masked as judge_error — never a raise)."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.engines.client import EngineHTTPError, GenerateOutput
from relax_gym.trainer.policy import PolicyConfig
from relax_gym.trainer.policy.model import build_processor
from relax_gym.trainer.rewards.judge import JUDGE_ERROR, Judge, judge_trajectory
from relax_gym.trainer.rollout.episode import MASKED_STATUSES, Trajectory
from relax_gym.trainer.rollout.samples import summary_dict
from relax_gym.trainer.run.step_row import rollout_row


@pytest.fixture(scope="module")
def processor():
    return build_processor(PolicyConfig())


class ScriptedEngine:
    """Answers each prompt with the text the script maps the prompt's part to: a string, an exception, or 'hang'."""

    def __init__(self, processor, answers):
        self.processor, self.answers, self.calls = processor, answers, []

    async def generate(self, input_ids, *, sampling_params=None, return_logprob=True, **_):
        self.calls.append((list(input_ids), dict(sampling_params or {})))
        text = self.processor.decode(input_ids, skip_special_tokens=True)
        answer = next(a for key, a in self.answers.items() if key in text)
        if answer == "hang":
            await asyncio.sleep(3600)
        if isinstance(answer, Exception):
            raise answer
        ids = self.processor.tokenizer(answer, add_special_tokens=False)["input_ids"]
        return GenerateOutput(output_ids=ids, output_logprobs=None, text=answer, finish_reason={"type": "stop"},
                              weight_version=None, prompt_tokens=len(input_ids))


def request(part, prompt, weight=0.9, verdict="label"):
    return {"part": part, "prompt": prompt, "verdict": verdict, "labels": {"yes": 1.0, "no": 0.0}, "max_score": 10.0,
            "weight": weight}


def trajectory(requests, breakdown=None, weights=None, status="ok", rule_match=None, reward=0.1):
    """An ended episode whose env scored ``breakdown`` (its step's reward counted the pending parts 0: ``reward``)."""
    info = {"judge_requests": requests, "reward_weights": weights or {"match": 0.9, "format": 0.1},
            "reward_context": {"facts": "the red square moves left .", **({"rule_match": rule_match} if rule_match is not None else {})}}
    return Trajectory(group_id=0, seed=0, input_ids=[1, 2, 3], loss_mask=[0, 1, 1], reward=reward,
                      reward_breakdown=dict(breakdown or {"format": 1.0}), status=status, info=info)


def run(coro):
    return asyncio.run(coro)


def test_a_yes_verdict_fills_the_part_and_recombines_the_reward(processor):
    engine = ScriptedEngine(processor, {"left": "yes"})
    judge = Judge(engine, processor, max_new_tokens=4, timeout_s=5)
    traj = run(judge_trajectory(trajectory([request("match", "facts : the red square moves left .")], rule_match=True), judge))
    assert traj.status == "ok" and traj.trainable
    assert traj.reward_breakdown == {"format": 1.0, "match": 1.0}
    assert traj.reward == pytest.approx(1.0)  # (0.9 * 1 + 0.1 * 1) / 1.0
    assert traj.info["judge_calls"] == 1 and traj.info["judge_failures"] == 0 and traj.info["judge_agrees"] == 1
    assert "judge_requests" not in traj.info  # consumed
    (ids, sampling), = engine.calls
    assert sampling == {"max_new_tokens": 4, "temperature": 0.0, "top_p": 1.0}  # greedy, capped
    assert "the red square moves left" in processor.decode(ids, skip_special_tokens=True)


def test_a_no_verdict_scores_zero_and_disagreement_with_the_rule_is_recorded(processor):
    judge = Judge(ScriptedEngine(processor, {"left": "no"}), processor)
    traj = run(judge_trajectory(trajectory([request("match", "left")], rule_match=True), judge))
    assert traj.status == "ok" and traj.reward == pytest.approx(0.1)
    assert traj.reward_breakdown["match"] == 0.0 and traj.info["judge_agrees"] == 0


@pytest.mark.parametrize(("answer", "status"), [
    ("maybe", "malformed"), ("yes no", "malformed"), ("", "malformed"),
    (EngineHTTPError(500, "boom", "/generate"), "engine_error"), (RuntimeError("replica died"), "engine_error"),
    ("hang", "timeout"),
])
def test_failed_verdicts_mask_the_episode_and_are_counted_never_raised(processor, answer, status):
    judge = Judge(ScriptedEngine(processor, {"left": answer}), processor, timeout_s=0.2)
    traj = run(judge_trajectory(trajectory([request("match", "left")]), judge))
    assert traj.status == JUDGE_ERROR and JUDGE_ERROR in MASKED_STATUSES and not traj.trainable
    assert traj.reward == 0.0 and f"judge part 'match': {status}" in traj.error
    assert traj.info["judge_failures"] == 1 and judge.counts == {status: 1}
    assert "judge_agrees" not in traj.info and traj.info["judge_failure"] == status


def test_one_failed_part_of_two_masks_the_episode_and_the_calls_run_concurrently(processor):
    engine = ScriptedEngine(processor, {"left": "yes", "right": "hang"})
    judge = Judge(engine, processor, timeout_s=0.3)
    reqs = [request("match", "left", 0.5), request("detail", "right", 0.5)]

    async def both():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        traj = await judge_trajectory(trajectory(reqs, weights={"match": 0.5, "detail": 0.5}), judge)
        return traj, loop.time() - t0

    traj, elapsed = run(both())
    assert traj.status == JUDGE_ERROR and "'detail': timeout" in traj.error and "'match'" not in traj.error
    assert judge.counts == {"ok": 1, "timeout": 1} and len(engine.calls) == 2
    assert elapsed < 3.0  # one time limit, not one per part in sequence (generous: no timing claim beyond that)


def test_score_verdicts_and_weights(processor):
    judge = Judge(ScriptedEngine(processor, {"left": "7"}), processor)
    traj = run(judge_trajectory(trajectory([request("match", "left", verdict="score")],
                                           breakdown={"format": 0.0}, weights={"match": 3.0, "format": 1.0}, reward=0.0),
                                judge))
    assert traj.reward_breakdown["match"] == pytest.approx(0.7)
    assert traj.reward == pytest.approx(3.0 * 0.7 / 4.0)


def test_rewards_of_earlier_turns_stay_and_missing_weights_are_an_error(processor):
    judge = Judge(ScriptedEngine(processor, {"left": "yes"}), processor)
    # a two-turn episode: 0.25 of shaping on turn 1, then the terminal step's rule part (0.1 of the rubric)
    traj = run(judge_trajectory(trajectory([request("match", "left")], reward=0.25 + 0.1), judge))
    assert traj.reward == pytest.approx(0.25 + 0.1 + 0.9)
    broken = trajectory([request("match", "left")])
    broken.info.pop("reward_weights")
    out = run(judge_trajectory(broken, judge))
    assert out.status == JUDGE_ERROR and "reward_weights" in out.error and out.info["judge_failure"] == "no_weights"


def test_an_unreadable_answer_is_a_malformed_verdict_not_a_raise(processor):
    class Undecodable:  # the judge's processor fails on the answer's ids (e.g. an id outside its vocabulary)
        def __getattr__(self, name):
            return getattr(processor, name)

        def decode(self, ids, **kwargs):
            if kwargs.get("skip_special_tokens") and len(ids) < 5:  # the answer, not the engine's prompt check
                raise IndexError("piece id is out of range")
            return processor.decode(ids, **kwargs)

    judge = Judge(ScriptedEngine(processor, {"left": "yes"}), Undecodable())
    traj = run(judge_trajectory(trajectory([request("match", "left")]), judge))
    assert traj.status == JUDGE_ERROR and traj.info["judge_failure"] == "malformed"
    assert "IndexError: piece id is out of range" in traj.error


def test_no_judge_configured_is_a_judge_error_naming_the_fix(processor):
    traj = run(judge_trajectory(trajectory([request("match", "left")]), None))
    assert traj.status == JUDGE_ERROR and "no judge" in traj.error and "judge: section" in traj.error


def test_episodes_already_masked_or_without_pending_parts_are_left_alone(processor):
    engine = ScriptedEngine(processor, {"left": "yes"})
    judge = Judge(engine, processor)
    failed = run(judge_trajectory(trajectory([request("match", "left")], status="env_error"), judge))
    assert failed.status == "env_error" and engine.calls == []
    plain = Trajectory(group_id=0, seed=0, reward=0.5, reward_breakdown={"accuracy": 1.0}, info={"sample_id": "x"})
    assert run(judge_trajectory(plain, judge)).reward == 0.5 and engine.calls == []
    with pytest.raises(ValueError, match="timeout_s"):
        Judge(engine, processor, timeout_s=0)


def test_the_step_row_counts_calls_failures_by_kind_and_agreement(processor):
    judge = Judge(ScriptedEngine(processor, {"left": "yes", "right": "no", "up": "maybe"}), processor)
    cases = [("left", True), ("left", False), ("right", False), ("up", True)]
    trajs = [run(judge_trajectory(trajectory([request("match", prompt)], rule_match=rule), judge)) for prompt, rule in cases]
    trajs.append(Trajectory(group_id=1, seed=1, reward=0.5, status="ok", loss_mask=[1]))  # an env with no judge parts
    row = rollout_row([summary_dict(t) for t in trajs], 1.0)
    assert row["judge_calls"] == 4 and row["judge_failures"] == 1 and row["judge_failed_malformed"] == 1
    assert row["judge_rule_agreement"] == pytest.approx(2 / 3)  # yes/True agree, yes/False not, no/False agree
    assert row["status_judge_error"] == 1 and row["status_ok"] == 4
    assert row["match_mean"] == pytest.approx((1 + 1 + 0 + 0) / 4)  # over the unmasked episodes
    assert rollout_row([summary_dict(trajs[-1])], 1.0).get("judge_calls") is None  # no judged episode: no judge keys
