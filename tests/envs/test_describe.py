"""nextqa-describe: facts, the description grammar, the rule verdict, the judge pairs, and the env with its rubric."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.describe import (
    DESCRIBE_RUBRIC,
    MATCH_TEMPLATE,
    DescribeEnv,
    rule_judge,
)
from relax_gym.envs.describe_facts import (
    DIRECTIONS,
    PAIR_KINDS,
    all_facts,
    canonical_description,
    claims,
    describe_format,
    facts_text,
    grammar_words,
    load_clips,
    make_pairs,
    random_description,
    rule_verdict,
    variants,
    write_describe_sample,
)
from relax_gym.envs.rubric import JudgeRequest
from relax_gym.omni import VideoPart

LEFT, STILL, THREE = {"motion": "left"}, {"motion": "still"}, {"blue_squares": 3}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("describe")
    write_describe_sample(folder, n_train=6, n_val=10)
    return folder


# ---------------------------------------------------------------------------------------------- facts and verdict


def test_canonical_descriptions_are_the_caption_corpus_sentences():
    assert canonical_description(LEFT) == "the red square moves left ."
    assert canonical_description(STILL) == "the red square stays still ."
    assert canonical_description(THREE) == "three blue squares ."
    assert canonical_description({"blue_squares": 1}) == "one blue square ."
    assert facts_text(LEFT) == "motion : left" and facts_text(THREE) == "blue squares : three"


@pytest.mark.parametrize("facts", all_facts(), ids=lambda f: str(f))
def test_every_correct_description_passes_and_every_other_value_fails(facts):
    for text in (canonical_description(facts), *variants(facts)):
        assert rule_verdict(text, facts), text
        for other in all_facts():
            if other != facts:
                assert not rule_verdict(text, other), (text, other)


@pytest.mark.parametrize(("text", "facts", "verdict"), [
    ("the red square moves left", LEFT, True),  # unfinished after the value: still says it
    ("The red square moves LEFT.", LEFT, True),
    ("the red square moves to the left .", LEFT, True),
    ("the red square does not move .", STILL, True),
    ("the red square moves", LEFT, False),  # cut before the value
    ("the red square moves left and up .", LEFT, False),  # a second direction contradicts
    ("the red square moves left and then up .", LEFT, False),
    ("the red square moves left . the red square moves up .", LEFT, False),
    ("the red square moves left . three blue squares .", LEFT, False),  # a claim the facts do not hold
    ("the red square does not move left .", LEFT, False),
    ("left", LEFT, False),  # a bare word is no description
    ("three blue square", THREE, True),
    ("there are three blue squares .", THREE, True),
    ("three squares .", THREE, False),  # which squares?
    ("three blue squares . two blue squares .", THREE, False),
    ("the red square stays still . three blue squares .", THREE, False),
    ("", LEFT, False),
    ("<think></think><answer>B</answer>", THREE, False),
])
def test_rule_verdict_cases(text, facts, verdict):
    assert rule_verdict(text, facts) is verdict


def test_claims_read_counts_and_negations():
    assert claims("there is a blue square .") == {"blue_squares": {1}}
    assert claims("no blue squares .") == {"blue_squares": {0}}
    assert claims("a red square and two blue squares") == {"blue_squares": {2}}
    assert claims("it moves to the left , up") == {"motion": {"left", "up"}}


def test_format_rule():
    assert describe_format("the red square moves left .") == 1.0
    assert describe_format("three blue squares . the red square stays still .") == 1.0
    for bad in ("the red square moves left", "The red square moves left.", "no tags at all", "<answer>B</answer>",
                "a ." * 30, "x" * 400, ""):
        assert describe_format(bad) == 0.0, bad


def test_description_words_are_whole_tokens_of_the_policy_tokenizer():
    from relax_gym.trainer.policy import build_tokenizer

    tok = build_tokenizer()
    vocab = tok.get_vocab()
    for word in sorted(grammar_words()):
        pieces = tok.tokenize(" " + word)
        assert all(p in vocab for p in pieces)
        if word == "moves":  # the caption corpus's verb: two vocabulary pieces, as the base models learned it
            assert pieces == ["Ġmove", "s"]
        else:
            assert len(pieces) == 1 or (word == "." and pieces == ["Ġ", "."]), (word, pieces)
    for facts in all_facts():
        ids = tok.encode(canonical_description(facts), add_special_tokens=False)
        assert len(ids) <= 8 and tok.decode(ids) == canonical_description(facts)


# ---------------------------------------------------------------------------------------------- pairs


def test_pairs_have_the_kind_mix_and_their_labels_are_the_rule_verdict():
    pairs = make_pairs(2000, seed=7)
    counts = Counter(p.kind for p in pairs)
    assert set(counts) == set(PAIR_KINDS)
    for kind, share in PAIR_KINDS.items():
        assert abs(counts[kind] - share * 2000) <= 1, kind
    assert all(p.verdict is rule_verdict(p.description, p.facts) for p in pairs)
    right = {"canonical", "variant", "cut_after"}
    wrong = {"wrong_value", "wrong_kind", "mixed", "truncated"}
    assert all(p.verdict for p in pairs if p.kind in right)
    assert not any(p.verdict for p in pairs if p.kind in wrong)
    yes = sum(p.verdict for p in pairs) / len(pairs)
    assert 0.4 <= yes <= 0.6, yes
    kinds_of_facts = Counter(next(iter(p.facts)) for p in pairs)
    assert 0.4 <= kinds_of_facts["motion"] / 2000 <= 0.6
    values = Counter(p.facts.get("motion") for p in pairs if "motion" in p.facts)
    assert set(values) == set(DIRECTIONS)


def test_pairs_follow_their_seed():
    assert make_pairs(50, seed=3) == make_pairs(50, seed=3)
    assert make_pairs(50, seed=3) != make_pairs(50, seed=4)


# ---------------------------------------------------------------------------------------------- clips and env


def test_clip_set_layout_and_balanced_val(clips):
    val = load_clips(clips, "val")
    assert len(val) == 10 and len(load_clips(clips, "train")) == 6
    assert [next(iter(c.facts)) for c in val] == ["motion", "blue_squares"] * 5
    assert [c.facts.get("motion") for c in val[::2]] == list(DIRECTIONS)
    assert all(c.video.is_file() for c in val)
    with pytest.raises(ValueError, match="no clips"):
        load_clips(clips, "test")


def test_reset_shows_the_clip_and_the_instruction(clips):
    env = DescribeEnv(data_dir=clips, video={"fps": 4.0, "max_frames": 8, "min_frames": 8})
    obs, info = env.reset(seed=0)
    system, user = obs
    assert system.role == "system" and "one short sentence" in system.text
    (video,) = [p for p in user.content if isinstance(p, VideoPart)]
    assert video.decode().frames.shape[0] == 8
    assert user.text == "what happens in the video ?"
    assert info["gold"] == canonical_description(env.clip.facts)


def test_step_leaves_the_judge_part_pending_without_a_judge(clips):
    env = DescribeEnv(data_dir=clips)
    _, info = env.reset(seed=1)
    _, reward, terminated, _, step = env.step(info["gold"])
    assert terminated and reward == pytest.approx(0.1)  # the format part alone; the judge's 0.9 is pending
    assert step["reward_breakdown"] == {"format": 1.0}
    assert step["reward_weights"] == {"match": 0.9, "format": 0.1}
    (request,) = step["judge_requests"]
    facts = facts_text(env.clip.facts)
    assert request["part"] == "match" and request["labels"] == {"yes": 1.0, "no": 0.0}
    assert request["prompt"] == MATCH_TEMPLATE.format(facts=facts, response=info["gold"])
    assert step["reward_context"] == {"facts": facts, "rule_match": True}


def test_step_with_a_judge_callable_scores_at_once(clips):
    calls: list[list[JudgeRequest]] = []

    def judge(requests):
        calls.append(requests)
        return rule_judge(requests)

    env = DescribeEnv(data_dir=clips, judge=judge)
    _, info = env.reset(seed=2)
    _, reward, _, _, step = env.step(info["gold"])
    assert reward == pytest.approx(1.0) and "judge_requests" not in step
    assert step["reward_breakdown"] == {"match": 1.0, "format": 1.0}
    wrong = next(canonical_description(f) for f in all_facts() if f != env.clip.facts)
    env.reset(seed=2)
    _, reward, _, _, step = env.step(wrong)
    assert reward == pytest.approx(0.1) and step["reward_breakdown"]["match"] == 0.0
    assert step["reward_context"]["rule_match"] is False
    assert len(calls) == 2 and all(len(c) == 1 for c in calls)


def test_a_judge_without_a_verdict_is_reported(clips):
    env = DescribeEnv(data_dir=clips, judge=lambda requests: [None] * len(requests))
    _, info = env.reset(seed=0)
    _, reward, _, _, step = env.step(info["gold"])
    assert step["judge_failed"] == ["match"] and reward == pytest.approx(0.1)


def test_rule_judge_reads_the_prompt_back():
    part = next(p for p in DESCRIBE_RUBRIC.parts if p.name == "match")
    for pair in make_pairs(300, seed=11):
        request = part.request(pair.description, {"facts": facts_text(pair.facts)})
        assert rule_judge([request]) == [float(pair.verdict)]


def test_the_judge_sees_a_cut_description(clips):
    env = DescribeEnv(data_dir=clips)
    _, info = env.reset(seed=0)
    _, reward, _, _, step = env.step(info["gold"] + " x" * 5000)
    assert len(step["judge_requests"][0]["prompt"]) < 400 and reward == 0.0


def test_envs_check_passes_for_the_registered_env(clips):
    env = relax_gym.make("nextqa-describe", data_dir=clips)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed


def test_format_demos_come_from_the_rng_not_the_episode(clips):
    env = DescribeEnv(data_dir=clips, split="val", pick="cycle")
    demos, golds = [], []
    for seed in range(10):
        _, info = env.reset(seed=seed)
        golds.append(info["gold"])
        demos.append(env.format_demo(np.random.default_rng(0)))
    assert len(set(demos)) == 1  # the same rng state, the same demo, whatever the clip
    drawn = [random_description(np.random.default_rng(k)) for k in range(400)]
    assert all(describe_format(d) == 1.0 for d in drawn)
    shares = Counter(drawn)
    assert len(shares) == 10 and max(shares.values()) < 70  # every fact, none favoured


def test_the_warm_up_demonstrates_random_facts(clips):
    from relax_gym.trainer.policy import PolicyConfig, build_policy
    from relax_gym.trainer.run.warmup import demonstration

    _, processor = build_policy(PolicyConfig(hidden_size=64, intermediate_size=64, num_layers=1, vision_depth=1,
                                             vision_embed=32, vision_intermediate=32, audio_layers=1,
                                             audio_d_model=32, audio_ffn=32))
    env = DescribeEnv(data_dir=clips, split="val", pick="cycle", video={"fps": 4.0, "max_frames": 8, "min_frames": 8})
    said = []
    for k in range(12):
        rendered = demonstration(env, processor, 0, np.random.default_rng(k))
        said.append(rendered.text.rsplit("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0])
    assert said == [random_description(np.random.default_rng(k)) for k in range(12)]
    assert len(set(said)) > 3
