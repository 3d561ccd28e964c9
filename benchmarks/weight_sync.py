"""DCS push bandwidth against a loopback floor, measured in the same run.

An actor process (this one) pushes a random policy of ~140 MiB (``--quick``: ~55 MiB) to an embedded engine in a
child process with :class:`~relax_gym.trainer.dcs.DCSClient`, once per path:

- ``tcp (socket wire)``: what ``tcp`` picks for the embedded engine (it advertises the ``socket`` backend): a plain
  TCP stream, the actor ``sendmsg``-ing each call's tensors from their own memory and the engine ``recv_into``-ing
  them straight into its staging buffers, every call announced in one request; staged (the engine receives every
  bucket while it keeps generating, then is paused only to swap them in); ``tcp (socket wire, 2 streams)``: the
  same with each call's bytes cut in two ranges moved over two streams in parallel;
- ``tcp (gloo)``: the same staged push over a gloo group's broadcast, pipelined (the actor flattens bucket i+1 while
  bucket i is on the wire) -- what ``tcp`` was before the socket wire;
- ``tcp (gloo, unstaged)``: the gloo broadcast with the engine paused for every bucket (what an SGLang engine gets);
- ``disk``: safetensors shards written to a temporary directory, then ``/update_weights_from_disk``.

Each push is the whole sequence an RL step pays (stage, pause, load, flush, continue, version check). The first two
pushes per path are warm-ups, not counted: the first forms the process group, and a staging engine fills its two
sets of buffers once (they then take turns, push after push). After the pushes the engine's weights are checked
bit for bit (SHA-256 per tensor) against the actor's.

The floor is a raw socket: the same number of bytes sent over loopback TCP (one stream) to another process that
reads them into a preallocated buffer and acknowledges. ``vs floor`` is a push's bandwidth over the floor's: what
the protocol, the engine's handling and the HTTP round trips cost (the 2-stream row can move bytes faster than the
one-stream floor). The measurement runs
``rounds`` times (3); in each round every path times ``repeats`` pushes, each right after one floor transfer (one
receiver process serves every transfer), and ``vs floor`` is the median of the rounds' ratios (median floor over
median push; interleaving the two sides puts load that comes and goes on a shared machine on both alike). ``paused_s`` is how long the engine did not generate per push (pause call to
resume), the cost a push puts on rollouts.

Run: ``python benchmarks/weight_sync.py [--quick] [--repeats 3] [--rounds 3] [--bucket-mb 64]``;
``run(quick=False)`` returns the figures as a dict. ``seconds`` and each phase are medians taken separately, so
the phases need not add up to ``seconds`` exactly.
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

# The floor's receiver: connect, then per transfer read exactly N bytes into one buffer and answer one byte, until
# the sender closes between transfers.
_RECEIVER = """
import socket, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
buf = bytearray(size)
view = memoryview(buf)
with socket.create_connection(("127.0.0.1", port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        got = 0
        while got < size:
            n = s.recv_into(view[got:], size - got)
            if not n:
                sys.exit(0 if got == 0 else "sender closed mid-transfer")
            got += n
        s.sendall(b"k")
"""


class LoopbackFloor:
    """The floor: ``payload`` moved over loopback TCP to another process that reads it into a preallocated buffer
    and acknowledges. :meth:`transfer` times one transfer; the receiver lives until :meth:`close`."""

    def __init__(self, payload: memoryview) -> None:
        self.payload = payload
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            self._child = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(server.getsockname()[1]),
                                            str(len(payload))])
            server.settimeout(60)
            self._conn, _ = server.accept()
        self._conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def transfer(self) -> float:
        t0 = time.perf_counter()
        self._conn.sendall(self.payload)
        if self._conn.recv(1) != b"k":
            raise RuntimeError("the floor's receiver did not acknowledge")
        return time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()
        if self._child.wait(30) != 0:
            raise RuntimeError(f"the floor's receiver failed (exit code {self._child.returncode})")


def loopback_floor(payload: memoryview, rounds: int) -> list[float]:
    """Seconds per transfer of ``rounds`` transfers of ``payload`` to another process (see :class:`LoopbackFloor`)."""
    floor = LoopbackFloor(payload)
    try:
        return [floor.transfer() for _ in range(rounds)]
    finally:
        floor.close()


# key: (transport, staged, wire, streams per engine: None for the transport's default)
PATHS = {"tcp": ("tcp", None, None, None), "tcp_2streams": ("tcp", None, "socket", 2), "tcp_gloo": ("tcp", None, "gloo", None),
         "tcp_unstaged": ("tcp", False, "gloo", None), "disk": ("disk", None, None, None)}
LABELS = {"tcp": "DCS tcp (socket wire)", "tcp_2streams": "DCS tcp (socket wire, 2 streams)", "tcp_gloo": "DCS tcp (gloo)",
          "tcp_unstaged": "DCS tcp (gloo, unstaged)", "disk": "DCS disk"}
WARMUP = 2


def run(quick: bool = False, *, repeats: int | None = None, rounds: int = 3, bucket_mb: float = 64.0) -> dict[str, Any]:
    """Measure and return ``{"model_mib", "bytes", "bucket_mb", "repeats", "rounds", "floor": {...}, "tcp": {...},
    "tcp_2streams": {...}, "tcp_gloo": {...}, "tcp_unstaged": {...}, "disk": {...}}``. Each entry has ``seconds``
    (median), ``mib_per_s`` and, for the paths, ``vs_floor`` (median of the rounds' ratios), ``vs_floor_rounds``,
    ``paused_s`` (median seconds the engine was paused per push), ``buckets``, ``phases`` (median seconds per step)
    and ``verified`` (bit-identical weights after the pushes)."""
    from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, WeightMetadata, checkpoint_names
    from relax_gym.trainer.dcs.group import GroupReceiver, flatten_tensors, tensor_digest
    from relax_gym.trainer.dcs.transports import TcpTransport
    from relax_gym.trainer.engines.client import EngineClient
    from relax_gym.trainer.engines.process import spawn_engine
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    repeats = repeats or (2 if quick else 3)
    sizes = (dict(hidden_size=768, intermediate_size=2048, num_layers=2, num_heads=12, num_kv_heads=4) if quick else
             dict(hidden_size=1024, intermediate_size=2816, num_layers=3, num_heads=16, num_kv_heads=4))
    engine = spawn_engine(PolicyConfig(seed=0, **sizes), threads=1, weight_receiver=GroupReceiver())
    clients: dict[str, Any] = {}
    try:
        model, _ = build_policy(PolicyConfig(seed=1, **sizes))
        names = checkpoint_names(model)
        state = model.state_dict()
        coordinators = {key: DCSCoordinator([engine.url], bucket_mb=bucket_mb, transport=transport)
                        for key, (transport, _, _, _) in PATHS.items()}
        clients = {key: DCSClient(coordinators[key], names=names, staged=staged, wire=wire) if streams is None else
                   DCSClient(coordinators[key], names=names, transport=TcpTransport(staged=staged, wire=wire, streams=streams))
                   for key, (_, staged, wire, streams) in PATHS.items()}
        timed: dict[str, list[Any]] = {key: [] for key in PATHS}
        ratios: dict[str, list[float]] = {key: [] for key in PATHS}
        floors: list[float] = []
        verified = {key: True for key in PATHS}
        sent = _perturbed(state, 0)  # what a push sends (perturbed copies: tied tensors no longer share storage)
        by_name = {names.get(k, k): t for k, t in sent.items()}
        payload = flatten_tensors([by_name[n] for n in WeightMetadata.from_state_dict(sent, names).names]).numpy()
        floor_link = LoopbackFloor(memoryview(payload))
        try:
            for r in range(rounds):
                for key, dcs in clients.items():
                    warmup = WARMUP if r == 0 else 0
                    for k in range(warmup):
                        dcs.push(_perturbed(state, k), version=f"{key}-{r}-warm{k}")
                    # each push right after a floor transfer: load that comes and goes hits both sides alike
                    round_floors, reports = [], []
                    for k in range(warmup, warmup + repeats):
                        sent = _perturbed(state, k)
                        round_floors.append(floor_link.transfer())
                        reports.append(dcs.push(sent, version=f"{key}-{r}-{k}"))
                    floor = statistics.median(round_floors)
                    floors.append(floor)
                    timed[key].extend(reports)
                    ratios[key].append(floor / statistics.median(rep.seconds for rep in reports))
                    meta = coordinators[key].weights
                    pushed = {names.get(n, n): t for n, t in _perturbed(state, warmup + repeats - 1).items()}
                    with EngineClient(engine.url) as client:
                        remote = client.weights_checksum(meta.names)
                    verified[key] &= all(remote[n] == tensor_digest(pushed[n]) for n in meta.names)
        finally:
            floor_link.close()
        if payload.nbytes != coordinators["tcp"].weights.nbytes:
            raise RuntimeError(f"the floor moved {payload.nbytes} bytes, a push {coordinators['tcp'].weights.nbytes}")
        nbytes = coordinators["tcp"].weights.nbytes
        results: dict[str, Any] = {"bucket_mb": bucket_mb, "repeats": repeats, "rounds": rounds, "bytes": nbytes,
                                   "model_mib": nbytes / MIB}
        floor = statistics.median(floors)
        results["floor"] = {"seconds": floor, "mib_per_s": nbytes / MIB / floor, "rounds_s": floors}
        for key, reports in timed.items():
            seconds = statistics.median(rep.seconds for rep in reports)
            results[key] = {
                "seconds": seconds, "mib_per_s": nbytes / MIB / seconds, "buckets": reports[-1].buckets,
                "vs_floor": statistics.median(ratios[key]), "vs_floor_rounds": ratios[key],
                "paused_s": statistics.median(rep.paused_seconds for rep in reports),
                "phases": {p: statistics.median(rep.phases[p] for rep in reports) for p in reports[0].phases},
                "verified": verified[key],
            }
        return results
    finally:
        for dcs in clients.values():
            dcs.close()
        engine.stop()


def _perturbed(state: dict, k: int) -> dict:
    """The state dict with every floating tensor shifted by ``k * 1e-3`` (each push sends new values)."""
    return {name: (t + k * 1e-3 if t.is_floating_point() else t) for name, t in state.items()}


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"DCS push, {results['model_mib']:.1f} MiB, buckets of {results['bucket_mb']:g} MiB, "
                        f"median of {results['rounds']} rounds x {results['repeats']} pushes")
    for column in ("path", "seconds", "MiB/s", "vs floor", "vs floor per round", "paused s", "buckets",
                   "stage / pause / load / resume s", "bit-identical"):
        table.add_column(column, justify="left" if column == "path" else "right")
    floor = results["floor"]
    table.add_row("loopback socket (floor)", f"{floor['seconds']:.3f}", f"{floor['mib_per_s']:.0f}", "1.00", "-", "-", "-",
                  "-", "-")
    for key, label in LABELS.items():
        r = results[key]
        phases = r["phases"]
        table.add_row(label, f"{r['seconds']:.3f}", f"{r['mib_per_s']:.0f}", f"{r['vs_floor']:.2f}",
                      " ".join(f"{x:.2f}" for x in r["vs_floor_rounds"]), f"{r['paused_s']:.3f}", str(r["buckets"]),
                      " / ".join(f"{phases[p]:.3f}" for p in ("stage", "pause", "load", "resume")),
                      "yes" if r["verified"] else "NO")
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~55 MiB model and 2 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of pushes + floor; vs floor is their median")
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()
    print_table(run(args.quick, repeats=args.repeats, rounds=args.rounds, bucket_mb=args.bucket_mb))


if __name__ == "__main__":
    main()
