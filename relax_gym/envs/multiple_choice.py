"""A data environment: one multiple-choice question about some media per episode, answered in one turn.

The opening is a system prompt that asks for ``<think>…</think><answer>X</answer>`` and a user message with
the media parts (video, image, audio, in that order) followed by the question and its lettered options. The
reward is :class:`~relax_gym.envs.multiple_choice_reward.MultipleChoiceReward` (accuracy + format, weights configurable); the
terminal step's reward context (for a rubric) holds ``gold_letter``, ``options`` and ``question``.
``nextqa-video`` and ``echo-ink`` are this class with different manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

from gymnasium.utils import seeding

from relax_gym.envs import samples
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.datasets import DatasetError, DatasetSpec, McqSample, load_dataset
from relax_gym.envs.multiple_choice_reward import MultipleChoiceReward
from relax_gym.envs.rewards import LETTERS
from relax_gym.omni import (
    AudioPart,
    ImagePart,
    MediaError,
    MediaSource,
    Message,
    TextPart,
    VideoPart,
)
from relax_gym.omni.decode_pool import DecodePool, shared_pool
from relax_gym.omni.sampling import AudioSampling, ImageSampling, VideoSampling

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You answer multiple-choice questions about the media you are given. Think first, inside <think></think>, "
    "then give only the option letter inside <answer></answer>, e.g. <think>...</think><answer>B</answer>."
)
_announced_samples: set[str] = set()


def record_index(options: dict[str, Any], n_records: int, rng: Any) -> int:
    """The record an episode shows: ``options["index"]`` (checked against ``n_records``), else one drawn from the
    env's seeded ``rng`` (a NumPy generator). The multiple-choice envs, single-turn and agentic, pick this way."""
    if "index" not in options:
        return int(rng.integers(n_records))
    index = int(options["index"])
    if not 0 <= index < n_records:
        raise IndexError(f"options['index']={index} is out of range 0..{n_records - 1}")
    return index


class MultipleChoiceEnv(AgentEnv):
    def __init__(
        self,
        *,
        dataset: DatasetSpec | dict[str, Any],
        data_dir: str | Path | None = None,
        split: str | None = None,
        reward: MultipleChoiceReward | dict[str, float] | None = None,
        video: VideoSampling | dict[str, Any] | None = None,
        image: ImageSampling | dict[str, Any] | None = None,
        audio: AudioSampling | dict[str, Any] | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        decode_on_reset: bool = True,
        max_action_chars: int = 32_768,
        render_mode: str | None = None,
        pick: Literal["random", "cycle"] = "random",
    ) -> None:
        if pick not in ("random", "cycle"):
            raise ValueError(f"pick must be 'random' or 'cycle', got {pick!r}")
        self.pick = pick
        self.dataset_spec = dataset if isinstance(dataset, DatasetSpec) else DatasetSpec.model_validate(dataset)
        self.samples = self._load(self.dataset_spec, data_dir, split)
        self.media_kinds = tuple(sorted({k for s in self.samples for k in s.media}))
        super().__init__(max_turns=1, max_action_chars=max_action_chars, render_mode=render_mode)
        self.reward_fn = reward if isinstance(reward, MultipleChoiceReward) else MultipleChoiceReward.model_validate(reward or {})
        self.video_sampling = _spec(VideoSampling, video)
        self.image_sampling = _spec(ImageSampling, image)
        self.audio_sampling = _spec(AudioSampling, audio)
        self.system_prompt = system_prompt
        self.decode_on_reset = decode_on_reset
        self.sample: McqSample | None = None

    @staticmethod
    def _load(spec: DatasetSpec, data_dir: str | Path | None, split: str | None) -> list[McqSample]:
        return load_samples(spec, data_dir, split)

    # -- episode -----------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """``pick="random"`` (the default) draws the record from the seed, with replacement; ``pick="cycle"``
        takes record ``seed % len(records)``, so len(records) consecutive seeds visit every record once (an
        evaluation pass over a whole split). ``options["index"]`` wins over both."""
        if self.pick == "cycle" and seed is not None and "index" not in (options or {}):
            options = {**(options or {}), "index": seed % len(self.samples)}
        return super().reset(seed=seed, options=options)

    def prefetch(self, seeds: Iterable[int], *, pool: DecodePool | None = None) -> list[Future]:
        """Start decoding, in the background, the media that ``reset(seed=s)`` will show for each of ``seeds``, into
        the decode cache (``pool``: the process's shared decode pool by default). A trainer calls it with the next
        step's seeds while the current step runs, so those resets find their clips decoded. Returns the futures
        of the decodes started (failures stay in them: the reset that needs the media raises as usual)."""
        parts = [part for seed in seeds for part in self._media_parts(self.samples[self.record_for_seed(seed)])]
        return (pool or shared_pool()).prefetch(parts)

    def record_for_seed(self, seed: int) -> int:
        """The record ``reset(seed=seed)`` (without ``options["index"]``) shows: the first draw of the env's RNG
        seeded with ``seed``, or ``seed % len(records)`` with ``pick="cycle"``."""
        if self.pick == "cycle":
            return seed % len(self.samples)
        return record_index({}, len(self.samples), seeding.np_random(seed)[0])

    def _reset(self, options: dict[str, Any]) -> Opening:
        index = record_index(options, len(self.samples), self.np_random)
        self.sample = sample = self.samples[index]
        parts = self._media_parts(sample)
        if self.decode_on_reset:
            for part in parts:
                try:
                    part.decode()
                except MediaError as exc:
                    raise DatasetError(exc.source, f"{exc.reason} (record {sample.origin})") from exc
        lettered = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(sample.options))
        question = TextPart(f"{sample.question}\nOptions:\n{lettered}")
        messages = [
            Message(role="system", content=(TextPart(self.system_prompt),)),
            Message(role="user", content=(*parts, question)),
        ]
        gold = f"<think>The media shows it: {sample.options[sample.answer_index]}.</think><answer>{sample.answer_letter}</answer>"
        return Opening(messages=messages, gold=gold, info={"sample_id": sample.uid, "sample_index": index, "origin": sample.origin})

    def _step(self, action: str) -> Outcome:
        assert self.sample is not None
        reward, breakdown = self.reward_fn(action, self.sample.answer_letter, self.sample.options)
        context = {"gold_letter": self.sample.answer_letter, "options": list(self.sample.options), "question": self.sample.question}
        return Outcome(messages=[], reward=reward, terminated=True, reward_breakdown=breakdown, info={"sample_id": self.sample.uid},
                       reward_context=context)

    def _media_parts(self, sample: McqSample) -> list[VideoPart | ImagePart | AudioPart]:
        parts: list[VideoPart | ImagePart | AudioPart] = []
        if "video" in sample.media:
            parts.append(VideoPart(source=MediaSource(path=sample.media["video"]), sampling=self.video_sampling))
        if "image" in sample.media:
            parts.append(ImagePart(source=MediaSource(path=sample.media["image"]), sampling=self.image_sampling))
        if "audio" in sample.media:
            parts.append(AudioPart(source=MediaSource(path=sample.media["audio"]), sampling=self.audio_sampling))
        return parts


def load_samples(spec: DatasetSpec, data_dir: str | Path | None, split: str | None) -> list[McqSample]:
    """The records of ``split`` from ``data_dir``; without one, from the spec's bundled synthetic sample (generated
    on first use, announced once per process)."""
    if data_dir is None:
        if spec.sample is None:
            raise ValueError(f"this {spec.format} environment has no bundled sample: pass data_dir=")
        data_dir = samples.ensure_sample(spec.sample)
        if spec.sample not in _announced_samples:
            _announced_samples.add(spec.sample)
            log.warning("no data_dir given: using the bundled synthetic %r sample at %s", spec.sample, data_dir)
    return load_dataset(spec, Path(data_dir), split)


def _spec(cls, value):
    if value is None:
        return cls()
    return value if isinstance(value, cls) else cls.model_validate(value)
