"""``nextqa-describe``: say what happens in a synthetic clip, in words; a judge compares the words with the clip's facts.

One turn. A short system prompt asks for one sentence about what happens; the user message holds the clip (a red
square that moves or stays, or blue squares to count; see :mod:`relax_gym.envs.describe_facts`) and the question
``what happens in the video ?``; the action is the description.
The reward is a rubric (:data:`DESCRIBE_RUBRIC`):

* ``match`` (weight 0.9), a **judge** part: its prompt (:data:`MATCH_TEMPLATE`) shows the clip's facts and the
  description and asks yes or no;
* ``format`` (weight 0.1), a rule: one to three short lower-case sentences, each closed by " .".

Without a ``judge`` the ``match`` part is left pending: the terminal step's reward counts it 0, and ``info`` carries
``judge_requests`` and ``reward_weights`` for whoever judges (the trainer's judge, ``judge:`` in a recipe). With
``judge=`` (``list[JudgeRequest] -> list[float | None]``) the env asks it at once, for gym users who judge in
process. ``info["reward_context"]`` holds ``facts`` (the text the judge sees) and ``rule_match``, the rule verdict
of the same description (:func:`~relax_gym.envs.describe_facts.rule_verdict`): it measures the judge's agreement and
is never part of the reward.

``format_demo(rng)`` gives an action in the answer format whose facts are drawn from ``rng``, not from the episode:
the format warm-up's demonstration (the multiple-choice envs' random letters, here random facts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from relax_gym.envs import samples
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.describe_facts import (
    Clip,
    canonical_description,
    facts_text,
    load_clips,
    random_description,
    rule_verdict,
)
from relax_gym.envs.multiple_choice import record_index
from relax_gym.envs.rubric import JudgeRequest, Rubric, RubricPart
from relax_gym.omni import MediaError, MediaSource, Message, TextPart, VideoPart
from relax_gym.omni.sampling import VideoSampling

__all__ = ["DESCRIBE_RUBRIC", "MATCH_TEMPLATE", "DescribeEnv", "rule_judge"]

log = logging.getLogger(__name__)

#: The judge's prompt for the ``match`` part (``str.format`` over the reward context and the response).
MATCH_TEMPLATE = "facts : {facts}\ndescription : {response}\nyes or no ?"
#: The description the judge sees is cut to this many characters (a description is a sentence or three).
MAX_JUDGED_CHARS = 300
#: The env's own instruction. A base model learned to caption when asked "describe the video ."
#: (relax_gym/trainer/base/spec.py); this env asks in its own words, as a real task would.
DEFAULT_SYSTEM_PROMPT = "Say what happens in the video in one short sentence."
DEFAULT_PROMPT = "what happens in the video ?"

DESCRIBE_RUBRIC = Rubric(parts=[
    RubricPart(name="match", weight=0.9, kind="judge", template=MATCH_TEMPLATE, verdict="label",
               labels={"yes": 1.0, "no": 0.0}),
    RubricPart(name="format", weight=0.1, kind="rule", rule="relax_gym.envs.describe_facts:describe_format"),
])

Judge = Callable[[list[JudgeRequest]], Sequence["float | None"]]
_announced = False


def rule_judge(requests: list[JudgeRequest]) -> list[float | None]:
    """A stand-in judge that answers with the rule verdict, read back from the prompt (:data:`MATCH_TEMPLATE`). For
    tests and experiments only: the env's reward is the judge model's verdict, never this."""
    from relax_gym.envs.describe_facts import DIRECTIONS, NUMBER_WORDS

    out: list[float | None] = []
    for request in requests:
        head, _, rest = request.prompt.partition("\ndescription : ")
        description = rest.rsplit("\nyes or no ?", 1)[0]
        facts: dict[str, Any] = {}
        for line in head.removeprefix("facts : ").split(" ; "):
            key, _, value = line.partition(" : ")
            if key == "motion" and value in DIRECTIONS:
                facts["motion"] = value
            elif key == "blue squares" and value in NUMBER_WORDS:
                facts["blue_squares"] = NUMBER_WORDS.index(value) + 1
        out.append(float(rule_verdict(description, facts)) if facts else None)
    return out


class DescribeEnv(AgentEnv):
    media_kinds = ("video",)

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        split: str = "val",
        video: VideoSampling | dict[str, Any] | None = None,
        prompt: str = DEFAULT_PROMPT,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        judge: Judge | None = None,
        pick: Literal["random", "cycle"] = "random",
        decode_on_reset: bool = True,
        max_action_chars: int = 32_768,
        render_mode: str | None = None,
    ) -> None:
        if pick not in ("random", "cycle"):
            raise ValueError(f"pick must be 'random' or 'cycle', got {pick!r}")
        if judge is not None and not callable(judge):
            raise TypeError(f"judge must be a callable list[JudgeRequest] -> list[float | None], got {type(judge).__name__}")
        super().__init__(max_turns=1, max_action_chars=max_action_chars, render_mode=render_mode)
        self.clips = load_clips(self._folder(data_dir), split)
        self.sampling = video if isinstance(video, VideoSampling) else VideoSampling.model_validate(video or {})
        self.prompt, self.system_prompt = prompt, system_prompt
        self.judge, self.pick, self.decode_on_reset = judge, pick, decode_on_reset
        self.clip: Clip | None = None

    @staticmethod
    def _folder(data_dir: str | Path | None) -> Path:
        global _announced
        if data_dir is not None:
            return Path(data_dir)
        folder = samples.ensure_sample("describe")
        if not _announced:
            _announced = True
            log.warning("no data_dir given: using the bundled synthetic 'describe' clips at %s", folder)
        return folder

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """``pick="cycle"`` shows clip ``seed % len(clips)`` (a pass over a split); ``options["index"]`` wins."""
        if self.pick == "cycle" and seed is not None and "index" not in (options or {}):
            options = {**(options or {}), "index": seed % len(self.clips)}
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> Opening:
        index = record_index(options, len(self.clips), self.np_random)
        self.clip = clip = self.clips[index]
        part = VideoPart(source=MediaSource(path=str(clip.video)), sampling=self.sampling)
        if self.decode_on_reset:
            try:
                part.decode()
            except MediaError as exc:
                raise ValueError(f"clip {clip.uid}: {exc}") from exc
        messages = [Message(role="user", content=(part, TextPart(self.prompt)))]
        if self.system_prompt:
            messages.insert(0, Message(role="system", content=(TextPart(self.system_prompt),)))
        return Opening(messages=messages, gold=canonical_description(clip.facts),
                       info={"sample_id": clip.uid, "sample_index": index})

    def _step(self, action: str) -> Outcome:
        assert self.clip is not None
        description = action[:MAX_JUDGED_CHARS]
        context = {"facts": facts_text(self.clip.facts), "rule_match": rule_verdict(description, self.clip.facts)}
        score = DESCRIBE_RUBRIC.score(description, context, judge=self.judge)
        info: dict[str, Any] = {"sample_id": self.clip.uid, **score.judge_info()}
        if score.failed:
            info["judge_failed"] = list(score.failed)
        return Outcome(messages=[], reward=score.total, terminated=True, reward_breakdown=dict(score.breakdown),
                       info=info, reward_context=context)

    def format_demo(self, rng: np.random.Generator) -> str:
        """An action in the answer format with facts drawn from ``rng`` (never the episode's): for the format warm-up."""
        return random_description(rng)
