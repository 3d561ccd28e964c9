"""DCS push bandwidth against a loopback floor, measured in the same run.

An actor process (this one) pushes a random policy of ~140 MiB (``--quick``: ~55 MiB) to an embedded engine in a
child process with :class:`~relax_gym.trainer.dcs.DCSClient`, once per transport:

- ``tcp``: gloo broadcast bucket by bucket (``flattened_bucket``: one payload per bucket);
- ``disk``: safetensors shards written to a temporary directory, then ``/update_weights_from_disk``.

Each push is the whole sequence an RL step pays (stage, pause, load, flush, continue, version check); the first
push per transport is a warm-up (it forms the process group) and is not counted; the figure is the median of
the others. After the pushes the engine's weights are checked bit for bit (SHA-256 per tensor) against the actor's.

The floor is a raw socket: the same number of bytes sent over loopback TCP to another process that reads them
into a preallocated buffer and acknowledges (median of the same number of repeats). ``vs floor`` is the push's
bandwidth over the floor's: what the protocol, the engine's copy into its model and the HTTP round trips cost.

Run: ``python benchmarks/weight_sync.py [--quick] [--repeats 3] [--bucket-mb 64]``; ``run(quick=False)`` returns
the figures as a dict. ``seconds`` and each phase are medians taken separately, so the phases need not add up
to ``seconds`` exactly. On a shared machine the figures move with the load; the ratio to the floor, measured in
the same run, is the one to compare.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20

# The floor's receiver: connect, then per round read exactly N bytes into one buffer and answer one byte.
_RECEIVER = """
import socket, sys
port, size, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
buf = bytearray(size)
view = memoryview(buf)
with socket.create_connection(("127.0.0.1", port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(rounds):
        got = 0
        while got < size:
            n = s.recv_into(view[got:], size - got)
            if not n:
                sys.exit("sender closed early")
            got += n
        s.sendall(b"k")
"""


def loopback_floor(payload: memoryview, rounds: int) -> list[float]:
    """Seconds per round to move ``payload`` to another process over loopback TCP and hear it arrived."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(port), str(len(payload)), str(rounds)])
        try:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    conn.sendall(payload)
                    if conn.recv(1) != b"k":
                        raise RuntimeError("the floor's receiver did not acknowledge")
                    times.append(time.perf_counter() - t0)
        finally:
            if child.wait(30) != 0:
                raise RuntimeError(f"the floor's receiver failed (exit code {child.returncode})")
    return times


def run(quick: bool = False, *, repeats: int | None = None, bucket_mb: float = 64.0) -> dict[str, Any]:
    """Measure and return ``{"model_mib", "bytes", "bucket_mb", "repeats", "floor": {...}, "tcp": {...},
    "disk": {...}}``; each entry has ``seconds`` (median), ``mib_per_s`` and, for the transports, ``vs_floor``,
    ``buckets``, ``phases`` (median seconds per step) and ``verified`` (bit-identical weights after the push)."""
    from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, checkpoint_names
    from relax_gym.trainer.engines.client import EngineClient
    from relax_gym.trainer.engines.process import spawn_engine
    from relax_gym.trainer.dcs.group import GroupReceiver, flatten_tensors, tensor_digest
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    repeats = repeats or (2 if quick else 3)
    sizes = (dict(hidden_size=768, intermediate_size=2048, num_layers=2, num_heads=12, num_kv_heads=4) if quick else
             dict(hidden_size=1024, intermediate_size=2816, num_layers=3, num_heads=16, num_kv_heads=4))
    engine = spawn_engine(PolicyConfig(seed=0, **sizes), threads=1, weight_receiver=GroupReceiver())
    try:
        model, _ = build_policy(PolicyConfig(seed=1, **sizes))
        names = checkpoint_names(model)
        state = model.state_dict()
        results: dict[str, Any] = {"bucket_mb": bucket_mb, "repeats": repeats}
        for transport in ("tcp", "disk"):
            coordinator = DCSCoordinator([engine.url], bucket_mb=bucket_mb, transport=transport)
            with DCSClient(coordinator, names=names) as dcs:
                reports = [dcs.push(_perturbed(state, k), version=f"{transport}-{k}") for k in range(repeats + 1)]
            meta = coordinator.weights
            pushed = {names.get(k, k): t for k, t in _perturbed(state, repeats).items()}
            with EngineClient(engine.url) as client:
                remote = client.weights_checksum(meta.names)
            timed = reports[1:]  # the first push forms the group / warms the caches
            seconds = statistics.median(r.seconds for r in timed)
            results["bytes"] = meta.nbytes
            results[transport] = {
                "seconds": seconds, "mib_per_s": meta.nbytes / MIB / seconds, "buckets": reports[-1].buckets,
                "phases": {p: statistics.median(r.phases[p] for r in timed) for p in timed[0].phases},
                "verified": all(remote[n] == tensor_digest(pushed[n]) for n in meta.names),
            }
        results["model_mib"] = results["bytes"] / MIB
        payload = flatten_tensors([pushed[n] for n in meta.names]).numpy()
        floor = statistics.median(loopback_floor(memoryview(payload), repeats))
        results["floor"] = {"seconds": floor, "mib_per_s": results["bytes"] / MIB / floor}
        for transport in ("tcp", "disk"):
            results[transport]["vs_floor"] = results[transport]["mib_per_s"] / results["floor"]["mib_per_s"]
        return results
    finally:
        engine.stop()


def _perturbed(state: dict, k: int) -> dict:
    """The state dict with every floating tensor shifted by ``k * 1e-3`` (each push sends new values)."""
    return {name: (t + k * 1e-3 if t.is_floating_point() else t) for name, t in state.items()}


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"DCS push, {results['model_mib']:.1f} MiB, buckets of {results['bucket_mb']:g} MiB, "
                        f"median of {results['repeats']}")
    for column in ("path", "seconds", "MiB/s", "vs floor", "buckets", "stage / pause / load / resume s", "bit-identical"):
        table.add_column(column, justify="right" if column not in ("path",) else "left")
    floor = results["floor"]
    table.add_row("loopback socket (floor)", f"{floor['seconds']:.3f}", f"{floor['mib_per_s']:.0f}", "1.00", "-", "-", "-")
    for transport in ("tcp", "disk"):
        r = results[transport]
        phases = r["phases"]
        table.add_row(f"DCS {transport}", f"{r['seconds']:.3f}", f"{r['mib_per_s']:.0f}", f"{r['vs_floor']:.2f}",
                      str(r["buckets"]), " / ".join(f"{phases[p]:.3f}" for p in ("stage", "pause", "load", "resume")),
                      "yes" if r["verified"] else "NO")
    Console(width=140).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~55 MiB model and 2 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()
    print_table(run(args.quick, repeats=args.repeats, bucket_mb=args.bucket_mb))


if __name__ == "__main__":
    main()
