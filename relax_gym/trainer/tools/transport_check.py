"""A DCS push between two processes, checked bit for bit; one JSON line out, exit status 1 on failure.

    python -m relax_gym.trainer.tools.transport_check --device cuda     # nccl transport (scripts/gpu_check.sh)
    python -m relax_gym.trainer.tools.transport_check --device cpu      # tcp (gloo) transport: the dry run

This process is the actor; a spawned child serves an embedded engine (tiny policy, seed 0) on ``--device`` behind
its loopback HTTP server. Two pushes of other weights (seed 1, then seed 1 perturbed) go through
:class:`~relax_gym.trainer.dcs.client.DCSClient` with small buckets; after each, the engine's SHA-256 digest of
every tensor must equal the actor's and the engine must report the pushed version. A second, smaller part checks
that our end of a weight-update group meets an end built the way SGLang builds its own (torch's ``rendezvous`` +
``PrefixStore(group_name)`` + ``_new_process_group_helper`` with backend ``nccl``; ``cpu:gloo`` in the dry run):
one broadcast, compared bit for bit.

One GPU: NCCL refuses two ranks on the same device ("Duplicate GPU detected"), so with a single visible GPU the
two processes declare distinct ``NCCL_HOSTID`` values and NCCL connects them through its socket transport on
loopback (``NCCL_IB_DISABLE=1``, ``NCCL_SOCKET_IFNAME=lo``). That checks our NCCL code path end to end, not
NVLink bandwidth; with two GPUs the engine uses the second one and no such setting is made. The JSON says which.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from typing import Any

__all__ = ["main", "run_check", "sglang_layout_check"]

BUCKET_MB = 1.0
ENGINE_SEED, ACTOR_SEED = 0, 1


def _importable(fn: Any) -> Any:
    """``fn`` as an attribute of this module imported by its package name: a spawned child can unpickle it even
    when this file runs as ``__main__`` (``python -m ...``)."""
    import importlib

    return getattr(importlib.import_module("relax_gym.trainer.tools.transport_check"), fn.__name__)


def _nccl_env(role: str, single_gpu: bool) -> None:
    """Environment a process needs before NCCL starts (see the module doc)."""
    if single_gpu:
        os.environ["NCCL_HOSTID"] = f"relax-dcs-check-{role}"
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def _engine_child(device: str, single_gpu: bool, conn: Any) -> None:
    """Serve the seed-0 tiny policy on ``device`` until the parent says stop (or goes away)."""
    try:
        import torch

        torch.set_num_threads(2)
        if device.startswith("cuda"):
            _nccl_env("engine", single_gpu)
            torch.cuda.set_device(torch.device(device))
        from relax_gym.trainer.dcs.group import GroupReceiver
        from relax_gym.trainer.engines.embedded import EmbeddedEngine
        from relax_gym.trainer.engines.http_server import serve
        from relax_gym.trainer.policy import PolicyConfig, build_policy

        model, processor = build_policy(PolicyConfig(seed=ENGINE_SEED))
        engine = EmbeddedEngine(model.to(device), processor, max_batch=4, weight_receiver=GroupReceiver())
        server = serve(engine, close_engine=True)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("url", server.url))
    try:
        conn.recv()
    except (EOFError, OSError):
        pass
    finally:
        server.close()


def _digests(model: Any, names: dict[str, str]) -> dict[str, str]:
    from relax_gym.trainer.dcs.group import tensor_digest

    return {names[k]: tensor_digest(v) for k, v in model.state_dict().items()}


def run_check(device: str = "cpu", *, timeout_s: float = 300.0) -> dict[str, Any]:
    """The push check (see the module doc) as a dict; ``ok`` says whether everything held."""
    import torch

    from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, checkpoint_names
    from relax_gym.trainer.engines.client import EngineClient
    from relax_gym.trainer.policy import PolicyConfig, build_policy

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda.is_available() is False on this machine")
    gpus = torch.cuda.device_count() if cuda else 0
    single_gpu = cuda and gpus < 2
    actor_device = "cuda:0" if cuda else "cpu"
    engine_device = ("cuda:0" if single_gpu else "cuda:1") if cuda else "cpu"
    transport = "nccl" if cuda else "tcp"
    result: dict[str, Any] = {"check": "dcs_transport", "device": device, "transport": transport,
                              "actor_device": actor_device, "engine_device": engine_device,
                              "nccl_hostid_split": single_gpu, "ok": False, "pushes": []}
    if cuda:
        _nccl_env("actor", single_gpu)
        torch.cuda.set_device(0)
    ctx = mp.get_context("spawn")
    parent, child_conn = ctx.Pipe()
    child = ctx.Process(target=_importable(_engine_child), args=(engine_device, single_gpu, child_conn), daemon=True,
                        name="relax-dcs-check-engine")
    child.start()
    child_conn.close()
    try:
        if not parent.poll(timeout_s):
            raise TimeoutError(f"the engine process did not serve within {timeout_s:g} s")
        kind, value = parent.recv()
        if kind == "error":
            raise RuntimeError(f"the engine process failed to start: {value}")
        url = value
        model = build_policy(PolicyConfig(seed=ACTOR_SEED))[0].to(actor_device)
        names = checkpoint_names(model)
        coordinator = DCSCoordinator([url], bucket_mb=BUCKET_MB, transport=transport)
        with DCSClient(coordinator, names=names, group_timeout_s=timeout_s) as dcs, EngineClient(url, timeout=timeout_s) as client:
            for version in (1, 2):
                if version == 2:  # other values, same shapes: the second push reuses the group
                    gen = torch.Generator(device="cpu").manual_seed(version)
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn(p.shape, generator=gen).to(p.device, p.dtype) * 0.01)
                if cuda:
                    torch.cuda.synchronize()
                report = dcs.push(model.state_dict(), version=version)
                local = _digests(model, names)
                remote = client.weights_checksum(list(local))
                mismatched = sorted(n for n in local if remote.get(n) != local[n])
                result["pushes"].append({"version": version, "bytes": report.bytes, "buckets": report.buckets,
                                         "seconds": round(report.seconds, 4), "mb_per_s": round(report.mb_per_s, 1),
                                         "load_s": round(report.phases.get("load", 0.0), 4),
                                         "tensors": len(local), "bit_identical": not mismatched,
                                         "mismatched": mismatched[:5], "transport": report.transport})
            result["engine_weight_version"] = client.get_weight_version()
        result["sglang_layout"] = sglang_layout_check(device, timeout_s=min(timeout_s, 120.0))
        result["ok"] = (all(p["bit_identical"] for p in result["pushes"]) and result["engine_weight_version"] == "2"
                        and result["sglang_layout"]["ok"])
    finally:
        try:
            parent.send("stop")
        except (OSError, BrokenPipeError):
            pass
        child.join(20)
        if child.is_alive():
            child.kill()
            child.join(5)
    return result


# ---------------------------------------------------------------------------------------------- SGLang's group layout


def _sglang_style_receiver(port: int, group_name: str, backend: str, device: str, single_gpu: bool, shape: tuple,
                           out: Any) -> None:
    """Rank 1 of a weight-update group built as SGLang's ``init_custom_process_group`` builds it."""
    try:
        import torch
        from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

        if device.startswith("cuda"):
            _nccl_env("sglang-end", single_gpu)
            torch.cuda.set_device(torch.device(device))
        else:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = datetime.timedelta(seconds=120)
        store, rank, world_size = next(rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, timeout=timeout))
        store.set_timeout(timeout)
        store = PrefixStore(group_name, store)
        pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                          backend_options=None, timeout=timeout)
        _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
        received = torch.empty(shape, dtype=torch.bfloat16, device=device)
        torch.distributed.broadcast(received, src=0, group=pg)
        out.put(("ok", received.cpu().view(torch.int16).flatten().tolist()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def sglang_layout_check(device: str = "cpu", *, timeout_s: float = 120.0) -> dict[str, Any]:
    """One bf16 broadcast from our :class:`~relax_gym.trainer.dcs.group.WeightUpdateGroup` (rank 0) to
    an end built like SGLang's (rank 1, a spawned child): ``{"ok", "backend", "bit_identical", "error"}``."""
    import torch

    from relax_gym.trainer.dcs.group import WeightUpdateGroup

    cuda = device == "cuda"
    single_gpu = cuda and torch.cuda.device_count() < 2
    backend, ours, theirs = ("nccl", "cuda:0", "cuda:0" if single_gpu else "cuda:1") if cuda else ("cpu:gloo", "cpu", "cpu")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name, shape = f"relax-sglang-layout-{os.getpid()}", (3, 257)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_importable(_sglang_style_receiver), args=(port, name, backend, theirs, single_gpu, shape, out),
                        daemon=True, name="relax-sglang-layout-end")
    child.start()
    result: dict[str, Any] = {"ok": False, "backend": backend, "bit_identical": False, "error": None}
    group = None
    try:
        if cuda:
            _nccl_env("actor", single_gpu)
        group = WeightUpdateGroup("127.0.0.1", port, 0, 2, group_name=name, backend="nccl" if cuda else "gloo",
                                  timeout_s=timeout_s, device=ours if cuda else None)
        sent = torch.randn(shape, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
        group.broadcast(sent.to(ours).contiguous(), src=0)
        if cuda:
            torch.cuda.synchronize()
        kind, value = out.get(timeout=timeout_s)
        if kind != "ok":
            result["error"] = value
        else:
            result["bit_identical"] = value == sent.view(torch.int16).flatten().tolist()
            result["ok"] = result["bit_identical"]
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if group is not None:
            group.destroy()
        child.join(20)
        if child.is_alive():
            child.kill()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.trainer.tools.transport_check", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: tcp (gloo); cuda: nccl")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        result = run_check(args.device, timeout_s=args.timeout_s)
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever happens
        result = {"check": "dcs_transport", "device": args.device, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=6)}
    result["wall_s"] = round(time.perf_counter() - start, 2)
    print(json.dumps(result), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
