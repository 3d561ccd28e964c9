"""trainer.sft_think=describe: each demonstration thinks the policy's own description of its media, answers at random."""

from __future__ import annotations

import numpy as np
import pytest

import relax_gym
from relax_gym.omni import Message, TextPart
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.run.warmup import (
    SelfDescriber,
    demonstration,
    describe_warmup,
    warmup_batches,
    warmup_seeds,
)

TINY = PolicyConfig(hidden_size=64, intermediate_size=64, num_layers=1, vision_depth=1, vision_embed=32, vision_intermediate=32,
                    audio_layers=1, audio_d_model=32, audio_ffn=32)


@pytest.fixture(scope="module")
def env():
    e = relax_gym.make("nextqa-video", split="train", video={"fps": 4.0, "max_frames": 8, "min_frames": 8})
    yield e
    e.close()


def test_a_thought_replaces_the_first_think_and_the_letter_stays_random(env):
    _, processor = build_policy(TINY)
    texts = {demonstration(env, processor, 3, np.random.default_rng(k), thought="the red square moves left .").text
             for k in range(8)}
    assert all("<think>the red square moves left .</think><answer>" in t for t in texts)
    letters = {t.split("<answer>")[-1][0] for t in texts}
    assert len(letters) > 1, "the answer letter is drawn at random, not the gold one"


def test_describe_warmup_asks_once_per_batch_with_each_episodes_media(env):
    seen = []

    def describer(openings):
        seen.append(openings)
        return [f"thought {len(seen)}-{i}" for i in range(len(openings))]

    thoughts = describe_warmup(env, describer, steps=2, batch_size=3)
    assert thoughts == [["thought 1-0", "thought 1-1", "thought 1-2"], ["thought 2-0", "thought 2-1", "thought 2-2"]]
    assert all(len(batch) == 3 and all(any(m.media() for m in o) for o in batch) for batch in seen)
    _, processor = build_policy(TINY)
    batches = list(warmup_batches(env, processor, np.random.default_rng(0), steps=2, batch_size=3, thoughts=thoughts))
    assert [[f"<think>{t}</think>" in r.text for r, t in zip(b, ts)] for b, ts in zip(batches, thoughts)] == [[True] * 3] * 2
    assert warmup_seeds(2, 3) == [[1_000_000, 1_000_001, 1_000_002], [1_000_003, 1_000_004, 1_000_005]]


@pytest.mark.timeout(300)
def test_self_describer_answers_one_description_per_opening(env):
    model, processor = build_policy(TINY)
    describer = SelfDescriber(model, processor, max_new_tokens=4)
    try:
        openings = [list(env.reset(seed=s)[0]) for s in range(3)]
        out = describer(openings)
        assert len(out) == 3 and all(isinstance(t, str) and processor.eos_token not in t for t in out)
        assert describer(openings) == out, "greedy: the same media get the same description"
        with pytest.raises(ValueError, match="needs episodes that open with media"):
            describer([[Message(role="user", content=(TextPart("no media here"),))]])
    finally:
        describer.close()
