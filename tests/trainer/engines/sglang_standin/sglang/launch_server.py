"""``python -m sglang.launch_server`` stand-in for CPU tests: relax-gym's embedded engine behind SGLang's launch flags.

Parses the flags the relax-gym launcher passes (and a few SGLang flags tests may add), refuses anything else with
argparse's exit status 2, serves ``--model-path`` (a relax-gym policy checkpoint) on ``--host:--port`` and stops
on SIGTERM / SIGINT. ``/get_weight_version`` answers 404 and ``/model_info`` exists, as in SGLang 0.5.23.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang.launch_server (relax-gym test stand-in)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--max-running-requests", type=int, default=16)
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.tp_size != 1:
        print(f"stand-in: --tp-size {args.tp_size} needs {args.tp_size} GPUs; this CPU stand-in serves tp 1 only",
              file=sys.stderr, flush=True)
        return 1
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        print(f"stand-in: --mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}", file=sys.stderr, flush=True)
        return 1
    import torch

    torch.set_num_threads(1)
    from relax_gym.trainer.engines.embedded import EmbeddedEngine
    from relax_gym.trainer.engines.http_server import EngineServer, _HTTPError, _json
    from relax_gym.trainer.policy import PolicyConfig, build_policy

    class Server(EngineServer):
        def dispatch(self, method, path, body, headers=None):  # type: ignore[override]
            if path == "/get_weight_version":
                raise _HTTPError(404, "Not Found")
            if path == "/model_info" and method == "GET":
                return _json({"model_path": args.model_path, "weight_version": self.engine.weight_version,
                              "is_generation": True})
            return super().dispatch(method, path, body, headers)

    model, processor = build_policy(PolicyConfig(path=args.model_path))
    from relax_gym.trainer.dcs.group import GroupReceiver  # a real SGLang server receives weight-update groups too

    engine = EmbeddedEngine(model, processor, max_batch=args.max_running_requests, weight_receiver=GroupReceiver())
    server = Server(engine, args.host, args.port, close_engine=True)
    print(f"stand-in SGLang server (embedded engine) serving {args.model_path} at {server.url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
