"""The judge model built in code: its examples are the env's own judge prompts rendered as the server renders them;
a tiny spec builds, caches, loads and answers a readable verdict. (The real judge's agreement is a benchmark figure:
docs/judges.md.)"""

from __future__ import annotations

import json

import pytest

from relax_gym.envs.describe import DescribeEnv
from relax_gym.envs.describe_facts import (
    PAIR_KINDS,
    Pair,
    canonical_description,
    make_pairs,
    write_describe_sample,
)
from relax_gym.envs.verdict import parse_verdict
from relax_gym.omni.render import render
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.rewards.judge_model import (
    JUDGES,
    JudgeSpec,
    agreement,
    ensure_judge,
    judge_item,
    judge_key,
    judge_prompt,
)
from relax_gym.trainer.rewards.judge_prompt import judge_messages

TINY = JudgeSpec(steps=25, batch_size=16, lr=3e-3, held_pairs=24, hidden_size=64, num_layers=1)


@pytest.fixture(scope="module")
def processor():
    return build_policy(TINY.policy())[1]


def test_the_judge_prompt_is_the_envs_request(tmp_path):
    write_describe_sample(tmp_path, n_train=1, n_val=2)
    env = DescribeEnv(data_dir=tmp_path)
    _, info = env.reset(seed=0)
    for description in (info["gold"], "three blue squares . the red square moves up .", "x " * 400):
        env.reset(seed=0)
        _, _, _, _, step = env.step(description)
        assert step["judge_requests"][0]["prompt"] == judge_prompt(Pair(env.clip.facts, description, False, "any"))


def test_an_example_is_the_served_prompt_then_the_verdict_and_end_of_turn(processor):
    pair = Pair({"motion": "up"}, canonical_description({"motion": "up"}), True, "canonical")
    item = judge_item(pair, processor)
    served = render(judge_messages(judge_prompt(pair)), processor, add_generation_prompt=True).input_ids
    assert item.input_ids[:len(served)] == served
    target = item.input_ids[len(served):]
    assert processor.decode(target) == "yes" + processor.eos_token + "\n"  # the template's newline after the turn
    assert item.loss_mask == [0] * len(served) + [1] * (len(target) - 1) + [0]
    no = judge_item(Pair({"motion": "up"}, "it moves down .", False, "wrong_value"), processor)
    assert processor.decode([t for t, m in zip(no.input_ids, no.loss_mask) if m]) == "no" + processor.eos_token


def test_the_cache_key_follows_the_spec():
    assert judge_key(TINY) == judge_key(TINY.model_copy())
    assert judge_key(TINY) != judge_key(TINY.model_copy(update={"steps": 26}))
    assert judge_key(TINY) != judge_key(TINY.model_copy(update={"seed": 1}))
    assert "describe-judge" in JUDGES
    with pytest.raises(ValueError, match="no known judge"):
        ensure_judge("no-such-judge")


def test_a_tiny_judge_builds_caches_loads_and_answers_a_verdict(tmp_path, processor):
    steps = []
    info = ensure_judge("tiny", tmp_path, spec=TINY, progress=lambda event, data: steps.append(data["step"])
                        if event == "judge_step" else None)
    assert info.built and steps == list(range(1, TINY.steps + 1))
    assert info.path.parent == tmp_path and info.path.name == f"tiny-{judge_key(TINY)}"
    report = json.loads((info.path / "judge.json").read_text())
    assert report == info.report and report["steps"] == TINY.steps
    held = report["held_out"]
    assert held["n"] == TINY.held_pairs and 0.0 <= held["overall"] <= 1.0 and set(held["per_kind"]) <= set(PAIR_KINDS)
    assert [p.name for p in tmp_path.iterdir()] == [info.path.name]  # no temporary folder left

    again = ensure_judge("tiny", tmp_path, spec=TINY)
    assert not again.built and again.path == info.path and again.report == info.report

    model, loaded = build_policy(PolicyConfig(path=str(info.path)))
    engine = EmbeddedEngine(model, loaded, max_batch=8)
    try:
        for pair in make_pairs(4, seed=99):
            ids = render(judge_messages(judge_prompt(pair)), loaded, add_generation_prompt=True).input_ids
            out = engine.generate_rendered(ids, None, sampling_params={"max_new_tokens": 4, "temperature": 0.0},
                                           return_logprob=False)
            text = loaded.decode(out.output_ids, skip_special_tokens=True)
            assert parse_verdict(text, "label", labels={"yes": 1.0, "no": 0.0}) in (0.0, 1.0), text
    finally:
        engine.close()
    measured = agreement(model, loaded, make_pairs(8, seed=5))
    assert measured["n"] == 8 and measured["malformed"] == 0
