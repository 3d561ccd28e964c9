"""Time to first token of a streamed answer against the whole answer's time, on the three APIs the gateway speaks.

The embedded engine serves a random policy with the agents' routes (``serve_with_agents``, loopback HTTP); each
call asks for a 64-token answer (sampled at temperature 1: a random policy almost never ends early; calls that did
are left out and counted) with ``stream: true`` on ``/v1/chat/completions``, ``/v1/responses`` and
``/v1/messages``, read with httpx as Server-Sent Events. Measured per call: the time to the first event that
carries text (TTFT) and to the end of the stream; and, for the same prompt, a non-streamed call's time. Printed:
medians over ``--repeats`` calls per API and the ratio TTFT / whole, for the tiny test policy and for a wider one
(``--wide``: hidden 1024, 8 layers, so a token costs what it costs on a small real model on CPU). One torch thread
(as the inference role runs); ratios within one run, so the machine's speed cancels.

    python benchmarks/stream_ttft.py [--repeats 5] [--tokens 64] [--wide] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
import torch
from rich.console import Console
from rich.table import Table

from relax_gym.trainer.engines.client import with_engine_token
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.gateway.mount import serve_with_agents
from relax_gym.trainer.policy import PolicyConfig, build_policy

PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


def bodies(tokens: int) -> dict[str, tuple[str, dict]]:
    return {
        "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": PROMPT}],
                                          "max_tokens": tokens, "temperature": 1.0}),
        "responses": ("/v1/responses", {"model": "m", "input": PROMPT, "max_output_tokens": tokens,
                                        "temperature": 1.0}),
        "messages": ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": PROMPT}],
                                      "max_tokens": tokens, "temperature": 1.0}),
    }


def has_text(api: str, event: dict) -> bool:
    if api == "chat":
        return bool(event.get("choices") and (event["choices"][0].get("delta") or {}).get("content"))
    if api == "responses":
        return event.get("type") == "response.output_text.delta"
    return event.get("type") == "content_block_delta"


def output_tokens(api: str, event: dict) -> int | None:
    if api == "chat" and event.get("usage"):
        return event["usage"]["completion_tokens"]
    if api == "responses" and event.get("type") in ("response.completed", "response.incomplete"):
        return event["response"]["usage"]["output_tokens"]
    if api == "messages" and event.get("type") == "message_delta":
        return event["usage"]["output_tokens"]
    return None


def streamed(http: httpx.Client, api: str, path: str, body: dict) -> tuple[float, float, int | None]:
    """(TTFT, whole, output tokens) of one streamed call."""
    extra = {"stream_options": {"include_usage": True}} if api == "chat" else {}
    start = time.perf_counter()
    first, tokens = None, None
    with http.stream("POST", path, json={**body, **extra, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and has_text(api, event):
                first = time.perf_counter() - start
            tokens = output_tokens(api, event) or tokens
    return (first if first is not None else float("nan")), time.perf_counter() - start, tokens


def plain(http: httpx.Client, path: str, body: dict) -> float:
    start = time.perf_counter()
    http.post(path, json=body).raise_for_status()
    return time.perf_counter() - start


def measure(cfg: PolicyConfig, label: str, repeats: int, tokens: int) -> list[tuple]:
    model, processor = build_policy(cfg)
    engine = EmbeddedEngine(model, processor)
    server = serve_with_agents(engine)
    rows = []
    try:
        with httpx.Client(base_url=server.url, trust_env=False, timeout=600,
                          headers=with_engine_token({"x-api-key": "EMPTY"})) as http:
            for api, (path, body) in bodies(tokens).items():
                streamed(http, api, path, body)  # warm-up
                ttft, whole, plains, short = [], [], [], 0
                for _ in range(repeats):
                    t_first, t_all, n = streamed(http, api, path, body)
                    if n != tokens:
                        short += 1
                        continue
                    ttft.append(t_first)
                    whole.append(t_all)
                    plains.append(plain(http, path, body))
                if ttft:
                    f, w, p = statistics.median(ttft), statistics.median(whole), statistics.median(plains)
                    rows.append((label, api, len(ttft), short, f, w, p, f / w))
    finally:
        server.close()
        engine.close()
    return rows


def run(quick: bool = False, *, repeats: int | None = None, tokens: int | None = None,
        wide: bool | None = None) -> dict:
    """The figures: per policy and API, the calls measured (and those that ended early), the median TTFT, streamed
    and plain seconds and TTFT / streamed. ``quick``: one call of 16 tokens per API, the tiny policy only."""
    repeats = repeats or (1 if quick else 5)
    tokens = tokens or (16 if quick else 64)
    wide = (not quick) if wide is None else wide
    torch.set_num_threads(1)
    rows = measure(PolicyConfig(), "tiny (hidden 128, 2 layers)", repeats, tokens)
    if wide:
        rows += measure(PolicyConfig(hidden_size=1024, num_layers=8, num_heads=8, num_kv_heads=4),
                        "wide (hidden 1024, 8 layers)", repeats, tokens)
    return {"tokens": tokens, "repeats": repeats, "rows": [
        {"policy": r[0], "api": r[1], "calls": r[2], "ended_early": r[3], "ttft_s": round(r[4], 4),
         "streamed_s": round(r[5], 4), "plain_s": round(r[6], 4), "ttft_over_streamed": round(r[7], 4)} for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--wide", action="store_true", help="also a wider policy (hidden 1024, 8 layers)")
    parser.add_argument("--quick", action="store_true", help="one 16-token call per API, the tiny policy only")
    args = parser.parse_args()
    out = run(args.quick, repeats=None if args.quick else args.repeats, tokens=None if args.quick else args.tokens,
              wide=args.wide and not args.quick)
    table = Table(title=f"stream: {out['tokens']}-token answers, medians")
    for name in ("policy", "API", "calls", "ended early", "TTFT s", "streamed s", "plain s", "TTFT / streamed"):
        table.add_column(name)
    for r in out["rows"]:
        table.add_row(r["policy"], r["api"], str(r["calls"]), str(r["ended_early"]), f"{r['ttft_s']:.3f}",
                      f"{r['streamed_s']:.3f}", f"{r['plain_s']:.3f}", f"{r['ttft_over_streamed']:.1%}")
    Console().print(table)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
