"""Media returned by tools stay in the model inputs of every later turn: rendering an agent episode turn by turn
(``relax_gym.omni.render.extend``, as the rollout does) only ever appends, so the inputs of turn k+1 start with the
exact ids, loss mask and media tensors of turn k, and the tool's media are still there at the end. Through the
episode runner, every generate request carries all media items so far, and the engine's decoding of them equals
the tensors the trainer trains on."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

import relax_gym
from relax_gym.omni.render import extend, render
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.policy.processor import MEDIA_KEYS
from relax_gym.trainer.rollout.episode import run_episode

CASES = [
    ("nextqa-video-agent", {}),
    ("echo-ink-agent", {}),
    ("echo-ink-agent", {"media_role": "user"}),
]


@pytest.fixture(scope="module")
def processor():
    _, proc = build_policy(PolicyConfig())
    return proc


def assert_prefix(before, after):
    n = len(before.input_ids)
    assert after.input_ids[:n] == before.input_ids
    assert after.loss_mask[:n] == before.loss_mask
    for key, tensor in before.mm.items():
        assert torch.equal(after.mm[key][: tensor.shape[0]], tensor), key
    assert all(after.num_media[k] >= v for k, v in before.num_media.items())


@pytest.mark.parametrize("env_id, kwargs", CASES, ids=[f"{i}{'-user' if k else ''}" for i, k in CASES])
def test_turn_k_plus_1_starts_with_turn_k(processor, env_id, kwargs):
    env = relax_gym.make(env_id, **kwargs)
    obs, info = env.reset(seed=7)
    rendered = render(obs, processor)
    opening_media = dict(rendered.num_media)
    returned = {"image": 0, "video": 0, "audio": 0}
    done = False
    while not done:
        action = info["gold"]
        sampled = processor.encode_text(action) + [processor.eos_token_id]
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        for part in (p for m in obs for p in m.media()):
            returned[part.kind] += 1
        after = extend(rendered, obs, assistant_token_ids=sampled, add_generation_prompt=not done)
        assert_prefix(rendered, after)
        n = len(rendered.input_ids)
        assert after.input_ids[n : n + len(sampled)] == sampled and after.loss_mask[n : n + len(sampled)] == [1] * len(sampled)
        rendered = after
    assert sum(returned.values()) >= 1, "the gold plan returned no media"
    assert rendered.num_media == {k: opening_media[k] + returned[k] for k in returned}
    # the incremental rendering is the rendering of the whole conversation
    whole = render(env.unwrapped.history, processor, add_generation_prompt=False)
    assert whole.input_ids == rendered.input_ids and whole.loss_mask == rendered.loss_mask
    assert all(torch.equal(whole.mm[k], rendered.mm[k]) for k in whole.mm) and whole.mm.keys() == rendered.mm.keys()


def test_the_watched_video_is_fed_to_the_model_in_every_later_turn(processor):
    """Two tool turns: the video from the first is still the first video in the third turn's inputs."""
    env = relax_gym.make("nextqa-video-agent")
    obs, info = env.reset(seed=2)
    rendered = render(obs, processor)
    actions = ['<tool_call>{"name": "watch", "arguments": {"start_s": 1, "end_s": 2, "fps": 4}}</tool_call>',
               '<tool_call>{"name": "frame", "arguments": {"t_s": 1.5}}</tool_call>']
    snapshots = []
    for action in actions:
        obs, *_ = env.step(action)
        rendered = extend(rendered, obs, assistant_token_ids=processor.encode_text(action) + [processor.eos_token_id])
        snapshots.append(rendered)
    first, second = snapshots
    assert first.num_media["video"] == second.num_media["video"] == 1
    assert second.num_media["image"] == first.num_media["image"] + 1
    assert torch.equal(second.mm["pixel_values_videos"], first.mm["pixel_values_videos"])
    assert torch.equal(second.mm["video_grid_thw"], first.mm["video_grid_thw"])
    assert_prefix(first, second)


class ScriptedEngine:
    """Answers each generate with the next gold action's tokens; records the ids and media it was sent."""

    def __init__(self, processor, texts):
        self.processor, self.texts, self.calls = processor, list(texts), []

    async def generate(self, input_ids, *, sampling_params, return_logprob, **media):
        self.calls.append({"input_ids": list(input_ids), **media})
        ids = self.processor.encode_text(self.texts[len(self.calls) - 1]) + [self.processor.eos_token_id]
        return SimpleNamespace(output_ids=ids, output_logprobs=[-0.5] * len(ids), weight_version="1")


def gold_script(env_id: str, seed: int) -> list[str]:
    env = relax_gym.make(env_id)
    _, info = env.reset(seed=seed)
    script, done = [], False
    while not done:
        script.append(info["gold"])
        _, _, terminated, truncated, info = env.step(info["gold"])
        done = terminated or truncated
    return script


def engine_tensors(processor, media: dict) -> dict:
    """What the engine computes from a request's media items (URL + sampling spec), in render order."""
    from relax_gym.omni import from_openai

    encodings = {}
    for key, items in media.items():
        kind = key.removesuffix("_data")
        for item in items:
            js = {"type": f"{kind}_url", f"{kind}_url": {"url": item["url"]}, "sampling": item["sampling"]}
            (part,) = from_openai([{"role": "user", "content": [js]}])[0].content
            encodings.setdefault(kind, []).append(processor.encode_media(kind, part.decode()).tensors)
    return encodings


@pytest.mark.parametrize("env_id, sent", [
    ("nextqa-video-agent", [{"image_data": 4}, {"image_data": 4, "video_data": 1}]),
    ("echo-ink-agent", [{"image_data": 1, "audio_data": 1}, {"image_data": 1, "audio_data": 2}, {"image_data": 2, "audio_data": 2}]),
])
def test_rollout_sends_every_earlier_media_item_each_turn(processor, env_id, sent):
    script = gold_script(env_id, seed=6)
    engine = ScriptedEngine(processor, script)
    traj = asyncio.run(run_episode(relax_gym.make(env_id), engine, processor, seed=6, group_id=0,
                                   sampling_params={"max_new_tokens": 64}))
    assert traj.status == "ok" and traj.reward == 1.0 and traj.turns == len(script) == len(sent)
    assert [{k: len(v) for k, v in call.items() if k.endswith("_data")} for call in engine.calls] == sent
    for before, after in zip(engine.calls, engine.calls[1:]):
        assert after["input_ids"][: len(before["input_ids"])] == before["input_ids"]
        for key, items in before.items():
            if key.endswith("_data"):
                assert after[key][: len(items)] == items  # same URLs and sampling specs, in the same order
    # the engine's decoding of the last request gives exactly the media tensors the trainer trains on
    by_kind = engine_tensors(processor, {k: v for k, v in engine.calls[-1].items() if k.endswith("_data")})
    for kind, keys in MEDIA_KEYS.items():
        for key in keys:
            if kind in by_kind:
                assert torch.equal(torch.cat([t[key] for t in by_kind[kind]]), traj.mm[key]), key
