"""Throughput of the embedded engine against plain ``model.generate`` on the same model and batch.

    python -m relax_gym.trainer.tools.engine_bench [--batch 8] [--new-tokens 32] [--repeats 5] [--serve]

Three measurements of generated tokens per second, each on the same left-padded batch of text prompts, sampling
at temperature 1 with EOS ignored so every row makes ``--new-tokens`` tokens: ``model.generate`` called directly;
``EmbeddedEngine.generate`` with the batch as one request list (adds the log-prob recorder, the per-row stopping
criterion and the output assembly); and 8 concurrent HTTP clients each sending one request (adds JSON, HTTP and
the batching window).

``--serve`` adds the async engine's path: the inference role (the same embedded engine) as a Ray Serve deployment
and 8 concurrent ``generate`` calls from this process through the env workers' client
(:class:`~relax_gym.trainer.engines.serve_client.HandleEngineClient`: coalesced into one handle call, then
``InferenceRole.generate`` → ``EmbeddedEngine.generate``), coalesced and one handle call per request. Ratios are
against ``EmbeddedEngine.generate`` in process (and plain ``model.generate``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import threading
import time
from typing import Any

import torch


def run(batch: int = 8, new_tokens: int = 32, repeats: int = 5, serve_path: bool = False) -> dict[str, Any]:
    from relax_gym.trainer.engines.client import EngineClient
    from relax_gym.trainer.engines.embedded import EmbeddedEngine
    from relax_gym.trainer.engines.http_server import serve
    from relax_gym.trainer.engines.protocol import EngineRequest, SamplingParams
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    model, processor = build_policy(PolicyConfig())
    prompts = [processor.encode_text(f"Prompt number {i}: tell me about the number {i * 7}." + " More." * (i % 3)) for i in range(batch)]
    rows = processor.pad([(p, [0] * len(p)) for p in prompts], padding_side="left")
    inputs = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}

    def plain() -> int:
        with torch.no_grad():
            seq = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        return (seq.shape[1] - inputs["input_ids"].shape[1]) * batch

    engine = EmbeddedEngine(copy.deepcopy(model), processor, max_batch=max(16, batch))
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    requests = [EngineRequest(rid=str(i), input_ids=p, sampling_params=sp, return_logprob=True) for i, p in enumerate(prompts)]

    def embedded() -> int:
        return sum(len(o.output_ids) for o in engine.generate(requests))

    server = serve(engine)
    client = EngineClient(server.url)

    def http() -> int:
        counts = [0] * batch

        def one(i: int) -> None:
            counts[i] = len(client.generate(prompts[i], sampling_params={"max_new_tokens": new_tokens, "ignore_eos": True}).output_ids)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    fns = {"plain_tok_s": plain, "engine_tok_s": embedded, "http_tok_s": http}
    stop_serve = None
    if serve_path:
        serve_fns, stop_serve = _serve_path(prompts, new_tokens, max_batch=max(16, batch))
        fns.update(serve_fns)
    rates: dict[str, list[float]] = {k: [] for k in fns}
    try:
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(repeats):  # interleaved, so load drift hits all three alike
            for key, fn in fns.items():
                t0 = time.perf_counter()
                tokens = fn()
                rates[key].append(tokens / (time.perf_counter() - t0))
    finally:
        client.close()
        server.close()
        engine.close()
        if stop_serve is not None:
            stop_serve()
    result: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens}
    result.update({k: statistics.median(v) for k, v in rates.items()})
    result["engine_over_plain"] = result["engine_tok_s"] / result["plain_tok_s"]
    result["http_over_plain"] = result["http_tok_s"] / result["plain_tok_s"]
    result["http_over_engine"] = result["http_tok_s"] / result["engine_tok_s"]
    for key in ("serve_tok_s", "serve_single_tok_s"):
        if key in result:
            result[key.replace("_tok_s", "_over_engine")] = result[key] / result["engine_tok_s"]
            result[key.replace("_tok_s", "_over_plain")] = result[key] / result["plain_tok_s"]
    return result


def _serve_path(prompts: list[list[int]], new_tokens: int, *, max_batch: int) -> tuple[dict[str, Any], Any]:
    """The inference role as a Serve deployment and the env workers' client in this process: ``{name: fn}`` and
    a function that tears it down."""
    import asyncio

    import ray
    from ray import serve

    from relax_gym.trainer.async_engine.roles.inference import InferenceRole
    from relax_gym.trainer.engines.serve_client import HandleEngineClient
    from relax_gym.trainer.policy.model import PolicyConfig

    from relax_gym.trainer.cluster.local_ray import start_local_ray

    start_local_ray(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    serve.start(proxy_location="Disabled")
    deployment = serve.deployment(InferenceRole, name="bench-inference", num_replicas=1, max_ongoing_requests=1000,
                                  ray_actor_options={"num_cpus": 0})
    handle = serve.run(deployment.bind(PolicyConfig().model_dump(mode="json"), {"max_batch": max_batch},
                                       torch_threads=torch.get_num_threads()), name="bench-inference", route_prefix=None)
    loop = asyncio.new_event_loop()
    clients = {"serve_tok_s": HandleEngineClient(handle, max_batch=max_batch),
               "serve_single_tok_s": HandleEngineClient(handle, coalesce=False)}
    sampling = {"max_new_tokens": new_tokens, "ignore_eos": True}

    def through(client: HandleEngineClient) -> Any:
        async def episodes() -> int:  # one concurrent call per prompt, as the episodes of an env worker make them
            outs = await asyncio.gather(*(client.generate(p, sampling_params=sampling) for p in prompts))
            return sum(len(o.output_ids) for o in outs)

        return lambda: loop.run_until_complete(episodes())

    def stop() -> None:
        loop.close()
        serve.shutdown()
        ray.shutdown()

    return {key: through(client) for key, client in clients.items()}, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help="also the async engine's path (a Ray Serve inference role)")
    args = parser.parse_args()
    r = run(args.batch, args.new_tokens, args.repeats, serve_path=args.serve)
    print(f"batch {r['batch']} x {r['new_tokens']} new tokens (median of {args.repeats}):")
    print(f"  model.generate          {r['plain_tok_s']:9.0f} tok/s")
    print(f"  EmbeddedEngine.generate {r['engine_tok_s']:9.0f} tok/s  ({r['engine_over_plain']:.2f}x)")
    print(f"  {r['batch']} HTTP clients          {r['http_tok_s']:9.0f} tok/s  ({r['http_over_plain']:.2f}x; "
          f"{r['http_over_engine']:.2f}x of EmbeddedEngine.generate)")
    if "serve_tok_s" in r:
        print(f"  {r['batch']} clients via Serve     {r['serve_tok_s']:9.0f} tok/s  ({r['serve_over_plain']:.2f}x; "
              f"{r['serve_over_engine']:.2f}x of EmbeddedEngine.generate)  [async path, coalesced]")
        print(f"  {r['batch']} clients via Serve     {r['serve_single_tok_s']:9.0f} tok/s  ({r['serve_single_over_plain']:.2f}x; "
              f"{r['serve_single_over_engine']:.2f}x of EmbeddedEngine.generate)  [one handle call per request]")


if __name__ == "__main__":
    main()
