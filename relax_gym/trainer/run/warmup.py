"""Demonstrations for the SFT warm-up of random-init policies: the env's gold policy, rendered.

With ``random_answers`` (the default for warm-up) the final ``<answer>`` letter is replaced by a random option
letter and the ``<think>`` text by a fixed short phrase: the warm-up teaches the output *format* only, never the
labels, so any accuracy gained later is learned by RL from the media.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from relax_gym.omni import Message, TextPart
from relax_gym.omni.render import Rendered, render

_ANSWER_LETTER = re.compile(r"<answer>\s*([A-Z])\s*</answer>")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
SHORT_THINK = "<think></think>"  # the shortest well-formed thought: fewer tokens to sample per episode


def demonstration(env, processor, seed: int, rng: np.random.Generator | None = None, *, random_answers: bool = True,
                  max_turns: int = 16, short_tool_thoughts: bool = False) -> Rendered:
    """One gold episode rendered for SFT. ``random_answers`` (needs ``rng``): every thought shortened and the
    answer letter drawn at random (a format-only demonstration). ``short_tool_thoughts``: only the thoughts before
    tool calls are shortened (the answer's thought names the option, and stays)."""
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    messages = list(obs)
    for _ in range(max_turns):
        action = info["gold"]
        if random_answers or (short_tool_thoughts and "<tool_call>" in action):
            action = _THINK.sub(SHORT_THINK, action, count=1)
        if random_answers:
            if rng is None:
                raise ValueError("random_answers needs an rng")
            n_options = len(getattr(getattr(base, "sample", None), "options", ()) or getattr(base, "options", ()) or "ABCD")
            action = _ANSWER_LETTER.sub(lambda m: f"<answer>{'ABCDEFGHIJ'[int(rng.integers(n_options))]}</answer>", action)
        messages.append(Message(role="assistant", content=(TextPart(action),)))
        obs, _, terminated, truncated, info = env.step(action)
        messages += list(obs)
        if terminated or truncated:
            break
    return render(messages, processor, add_generation_prompt=False)


WARMUP_SEED = 1_000_000  # demonstration episodes use seeds from here: apart from rollout and eval seeds


def warmup_batches(env, processor, rng: np.random.Generator, *, steps: int, batch_size: int,
                   random_answers: bool = True) -> Iterator[list[Rendered]]:
    """The SFT warm-up's batches, ``steps`` of ``batch_size`` demonstrations on consecutive seeds (the same in
    every trainer mode, so colocate and async runs warm up identically)."""
    seed = WARMUP_SEED
    for _ in range(steps):
        batch = [demonstration(env, processor, seed + i, rng, random_answers=random_answers) for i in range(batch_size)]
        seed += batch_size
        yield batch


def run_warmup(actor, env, processor, rng: np.random.Generator, trainer, *, lr: float, on_row=None) -> list[dict[str, float]]:
    """The SFT warm-up as both trainer modes run it: ``trainer.sft_warmup_steps`` SFT steps of ``actor`` at
    ``trainer.sft_lr`` on :func:`warmup_batches` of ``env``, then the learning rate back to ``lr``. ``on_row(i,
    metrics)`` sees each step's metrics as it ends; the rows are also returned. The caller pushes the weights."""
    rows: list[dict[str, float]] = []
    actor.set_lr(trainer.sft_lr)
    try:
        for i, batch in enumerate(warmup_batches(env, processor, rng, steps=trainer.sft_warmup_steps,
                                                 batch_size=trainer.sft_batch_size, random_answers=trainer.sft_random_answers)):
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
