"""Demonstrations for the SFT warm-up: the env's gold policy, rendered.

With ``random_answers`` (the default for warm-up) the final ``<answer>`` letter is replaced by a random option
letter and the ``<think>`` text by a fixed short phrase: the warm-up teaches the output *format* only, never the
labels, so any accuracy gained later is learned by RL from the media. An env whose answers are not letters (an open-ended
env such as ``nextqa-describe``) gives its own answer-free demonstration instead: ``env.format_demo(rng)``.

``trainer.sft_think: describe`` (for a policy that starts from a base, relax_gym/trainer/base): the first turn's
thought is the policy's *own* greedy description of the episode's media, asked with the base's describe instruction
before the warm-up's first step (:class:`SelfDescriber`). The letter stays random, so the warm-up still teaches no
answer; it teaches the shape "say what you perceive, then answer", and RL then learns which answer goes with what
the policy said.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator

import numpy as np

from relax_gym.omni import Message, TextPart
from relax_gym.omni.render import Rendered, render
from relax_gym.trainer.base import describe_prompt
from relax_gym.trainer.engines.embedded import EmbeddedEngine

_ANSWER_LETTER = re.compile(r"<answer>\s*([A-Z])\s*</answer>")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
SHORT_THINK = "<think></think>"  # the shortest well-formed thought: fewer tokens to sample per episode


def demonstration(env, processor, seed: int, rng: np.random.Generator | None = None, *, random_answers: bool = True,
                  max_turns: int = 16, short_tool_thoughts: bool = False, thought: str | None = None) -> Rendered:
    """One gold episode rendered for SFT. ``random_answers`` (needs ``rng``): every thought shortened and the
    answer letter drawn at random (a format-only demonstration). ``short_tool_thoughts``: only the thoughts before
    tool calls are shortened (the answer's thought names the option, and stays). ``thought``: the first turn's
    thought is ``<think>{thought}</think>`` instead."""
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    messages = list(obs)
    for turn in range(max_turns):
        action = info["gold"]
        if thought is not None and turn == 0:
            action = _THINK.sub(lambda _: f"<think>{thought}</think>", action, count=1)
        elif random_answers or (short_tool_thoughts and "<tool_call>" in action):
            action = _THINK.sub(SHORT_THINK, action, count=1)
        if random_answers and rng is None:
            raise ValueError("random_answers needs an rng")
        if random_answers and callable(getattr(base, "format_demo", None)):
            action = base.format_demo(rng)  # an open-ended env's own answer-free demonstration (random facts)
        elif random_answers:
            n_options = len(getattr(getattr(base, "sample", None), "options", ()) or getattr(base, "options", ()) or "ABCD")
            action = _ANSWER_LETTER.sub(lambda m: f"<answer>{'ABCDEFGHIJ'[int(rng.integers(n_options))]}</answer>", action)
        messages.append(Message(role="assistant", content=(TextPart(action),)))
        obs, _, terminated, truncated, info = env.step(action)
        messages += list(obs)
        if terminated or truncated:
            break
    return render(messages, processor, add_generation_prompt=False)


WARMUP_SEED = 1_000_000  # demonstration episodes use seeds from here: apart from rollout and eval seeds


class SelfDescriber:
    """The policy describes media in its own words: greedy generation on a private embedded engine over ``model``
    (a frozen copy: the actor's ``hf_model()``), with the base's describe instruction. ``close`` frees it."""

    def __init__(self, model, processor, *, max_new_tokens: int = 16) -> None:
        self.engine = EmbeddedEngine(model, processor, max_batch=64)
        self.max_new_tokens = max_new_tokens

    def __call__(self, openings: list[list[Message]]) -> list[str]:
        """One description per opening (the media of its messages, in order)."""
        from concurrent.futures import ThreadPoolExecutor

        prompts = []
        for messages in openings:
            media = [p for m in messages for p in m.media()]
            if not media:
                raise ValueError("trainer.sft_think=describe needs episodes that open with media; this env's opening has none")
            prompts.append(self.engine.render([Message(role="user", content=(*media, TextPart(describe_prompt(p.kind for p in media))))]))
        with ThreadPoolExecutor(max(1, min(64, len(prompts)))) as pool:
            outs = list(pool.map(lambda r: self.engine.generate_rendered(
                r.input_ids, r.mm, sampling_params={"max_new_tokens": self.max_new_tokens, "temperature": 0.0},
                return_logprob=False), prompts))
        return [" ".join((o.text or "").replace(self.engine.processor.eos_token, " ").split()) for o in outs]

    def close(self) -> None:
        self.engine.close()


def warmup_seeds(steps: int, batch_size: int) -> list[list[int]]:
    """The env seeds of the warm-up's demonstrations, batch by batch (consecutive, from :data:`WARMUP_SEED`)."""
    return [[WARMUP_SEED + k * batch_size + i for i in range(batch_size)] for k in range(steps)]


def describe_warmup(env, describer, *, steps: int, batch_size: int) -> list[list[str]]:
    """The policy's description of every warm-up episode's media, batch by batch (one describer call per batch)."""
    return [list(describer([list(env.reset(seed=s)[0]) for s in seeds])) for seeds in warmup_seeds(steps, batch_size)]


def warmup_batches(env, processor, rng: np.random.Generator, *, steps: int, batch_size: int,
                   random_answers: bool = True, thoughts: list[list[str]] | None = None) -> Iterator[list[Rendered]]:
    """The SFT warm-up's batches, ``steps`` of ``batch_size`` demonstrations on consecutive seeds (the same in
    every trainer mode, so colocate and async runs warm up identically). ``thoughts`` (from
    :func:`describe_warmup`): each demonstration's first thought."""
    for k, seeds in enumerate(warmup_seeds(steps, batch_size)):
        mine = thoughts[k] if thoughts is not None else [None] * len(seeds)
        yield [demonstration(env, processor, s, rng, random_answers=random_answers, thought=t) for s, t in zip(seeds, mine)]


def run_warmup(actor, env, processor, rng: np.random.Generator, trainer, *, lr: float, on_row=None) -> list[dict[str, float]]:
    """The SFT warm-up as both trainer modes run it: ``trainer.sft_warmup_steps`` SFT steps of ``actor`` at
    ``trainer.sft_lr`` on :func:`warmup_batches` of ``env``, then the learning rate back to ``lr``. ``on_row(i,
    metrics)`` sees each step's metrics as it ends; the rows are also returned. The caller pushes the weights."""
    rows: list[dict[str, float]] = []
    thoughts = None
    if trainer.sft_think == "describe":  # every description comes from the policy as it is before the first SFT step
        describer = SelfDescriber(actor.hf_model(), processor)
        try:
            thoughts = describe_warmup(env, describer, steps=trainer.sft_warmup_steps, batch_size=trainer.sft_batch_size)
        finally:
            describer.close()
            # its frozen copy of the policy goes now, not when this function returns: the SFT steps below add the
            # gradients and the optimizer's states beside the actor's (and the engine's) weights
            del describer
            gc.collect()
    batches = warmup_batches(env, processor, rng, steps=trainer.sft_warmup_steps, batch_size=trainer.sft_batch_size,
                             random_answers=trainer.sft_random_answers, thoughts=thoughts)
    actor.set_lr(trainer.sft_lr)
    try:
        for i, batch in enumerate(batches):
            row = actor.sft_step(batch)
            rows.append(row)
            if on_row is not None:
                on_row(i, row)
    finally:
        actor.set_lr(lr)
    return rows


def report_warmup_row(metrics, progress, trainer, i: int, row: dict[str, float]) -> None:
    """Warm-up step ``i`` (from 0) in the run's metrics (steps ``-sft_warmup_steps`` … ``-1``) and progress."""
    progress("sft", {"step": i + 1, "of": trainer.sft_warmup_steps, **row})
    metrics.write(-trainer.sft_warmup_steps + i, row)
