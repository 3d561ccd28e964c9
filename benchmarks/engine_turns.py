"""The embedded engine on multi-turn traffic: continuous vs static batching, and the prefix cache, in one run.

For each env (image-zoom: an image in the prompt; nextqa-video: a video; tool-use: text), 8 first turns are sent one
after another (as an episode's turns arrive), then their 8 second turns (each: the first turn's ids, its answer, a
tool's reply), one after another. Printed: the second turns' time without and with the prefix cache (median of
``--repeats``), and a batch of 8 equal prompts sent at once with static rounds and with continuous batching
(tokens/s, greedy and sampled). A tiny random policy, one torch thread (as the inference role runs).

    python benchmarks/engine_turns.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.policy import PolicyConfig, build_policy

ENVS = ("image-zoom", "nextqa-video", "tool-use")


def first_turns(env_id: str, processor, n: int = 8) -> list[dict]:
    env = relax_gym.make(env_id)
    out = []
    for s in range(n):
        obs, _ = env.reset(seed=s)
        out.append({"input_ids": render(obs, processor).input_ids, **media_data(obs), "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}})
    env.close()
    return out


def second_turn_seconds(model, processor, firsts: list[dict], prefix_tokens: int, repeats: int) -> tuple[float, int]:
    reply = processor.encode_text("the tool answered: 12345")
    with EmbeddedEngine(copy.deepcopy(model), processor, max_batch=16, prefix_cache_tokens=prefix_tokens) as engine:
        times = []
        for _ in range(repeats):
            engine.flush_cache()
            answers = [engine.generate(f) for f in firsts]
            seconds = [{**f, "input_ids": f["input_ids"] + a.output_ids + reply} for f, a in zip(firsts, answers)]
            t = time.perf_counter()
            for s in seconds:
                engine.generate(s)
            times.append(time.perf_counter() - t)
        return statistics.median(times), engine.stats()["prefix_cache_hits"]


def batch_tokens_per_s(model, processor, prompt: list[int], continuous: bool, greedy: bool, repeats: int) -> float:
    body = {"input_ids": [prompt] * 8, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 96, "temperature": 0.0 if greedy else 1.0}}
    with EmbeddedEngine(copy.deepcopy(model), processor, max_batch=32, continuous=continuous) as engine:
        engine.generate(body)
        torch.manual_seed(0)
        t = time.perf_counter()
        n = sum(len(o.output_ids) for _ in range(repeats) for o in engine.generate(body))
        return n / (time.perf_counter() - t)


def run(quick: bool = False, *, repeats: int | None = None) -> dict:
    """The figures: per env the second turns' seconds without / with the prefix cache, and the one-batch tokens/s of
    static rounds and continuous batching (greedy and sampled)."""
    repeats = repeats or (1 if quick else 3)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, processor = build_policy(PolicyConfig())
    turns = []
    for env_id in ENVS:
        firsts = first_turns(env_id, processor)
        plain, _ = second_turn_seconds(model, processor, firsts, 0, repeats)
        cached, hits = second_turn_seconds(model, processor, firsts, 1 << 16, repeats)
        turns.append({"env": env_id, "prompt_tokens": len(firsts[0]["input_ids"]), "no_cache_s": plain,
                      "prefix_cache_s": cached, "ratio": plain / cached, "hits": hits})
    prompt = first_turns("tool-use", processor, 1)[0]["input_ids"]
    batches = []
    for greedy in (True, False):
        static = batch_tokens_per_s(model, processor, prompt, False, greedy, repeats)
        cont = batch_tokens_per_s(model, processor, prompt, True, greedy, repeats)
        batches.append({"sampling": "greedy" if greedy else "temperature 1", "static_tok_s": static,
                        "continuous_tok_s": cont, "ratio": cont / static})
    return {"turns": turns, "batch": batches, "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    result = run(repeats=args.repeats)
    console = Console(width=140)
    turns = Table("env", "prompt tokens", "2nd turns, no cache (ms)", "with the prefix cache (ms)", "speed-up", "hits",
                  title="8 second turns, one after another (median of repeats)")
    for r in result["turns"]:
        turns.add_row(r["env"], str(r["prompt_tokens"]), f"{r['no_cache_s'] * 1000:.0f}", f"{r['prefix_cache_s'] * 1000:.0f}",
                      f"{r['ratio']:.2f}x", str(r["hits"]))
    console.print(turns)
    batch = Table("sampling", "static rounds (tok/s)", "continuous (tok/s)", "ratio",
                  title="one batch of 8 equal prompts sent at once, 96 new tokens")
    for r in result["batch"]:
        batch.add_row(r["sampling"], f"{r['static_tok_s']:.0f}", f"{r['continuous_tok_s']:.0f}", f"{r['ratio']:.2f}x")
    console.print(batch)


if __name__ == "__main__":
    main()
