"""TransferQueue's side of the bus: starting its controller, storage units and the shared ledger actor on a chosen
address with no CPU reservation, and connecting a client to them (:mod:`relax_gym.trainer.databus.tq` explains
why the bus needs each piece)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from contextlib import contextmanager
from typing import Any

from relax_gym.trainer.databus.ledger import DeliveryLedger
from relax_gym.trainer.databus.protocol import DataBusError

log = logging.getLogger(__name__)

TQ_NAMESPACE = "transfer_queue"  # where TransferQueue looks up its controller; the ledger sits next to it
CONTROLLER_NAME = "TransferQueueController"
LEDGER_NAME = "relax_gym.databus.ledger"
LOOPBACK = "127.0.0.1"


def _cap_tq_threads() -> None:
    """TransferQueue reads TQ_NUM_THREADS at import and warns on every call when it exceeds the cores."""
    cores = os.cpu_count() or 1
    wanted = int(os.environ.get("TQ_NUM_THREADS", cores))
    os.environ["TQ_NUM_THREADS"] = str(max(1, min(wanted, cores)))


@contextmanager
def _node_ip(ip: str | None):
    """Within the block, TransferQueue's servers bind ``ip`` (they ask ``ray.util.get_node_ip_address``)."""
    if ip is None:
        yield
        return
    import ray.util

    original = ray.util.get_node_ip_address
    ray.util.get_node_ip_address = lambda *args, **kwargs: ip
    try:
        yield
    finally:
        ray.util.get_node_ip_address = original


@functools.cache
def _server_classes() -> tuple[type, type]:
    """TransferQueue's controller and storage unit, constructed on a chosen address."""
    _cap_tq_threads()
    from transfer_queue.controller import TransferQueueController
    from transfer_queue.storage.simple_storage import SimpleStorageUnit

    class Controller(TransferQueueController.__ray_metadata__.modified_class):  # type: ignore[name-defined]
        def __init__(self, *args: Any, bind_ip: str | None = None, **kwargs: Any):
            with _node_ip(bind_ip):
                super().__init__(*args, **kwargs)

    class StorageUnit(SimpleStorageUnit.__ray_metadata__.modified_class):  # type: ignore[name-defined]
        def __init__(self, *args: Any, bind_ip: str | None = None, **kwargs: Any):
            with _node_ip(bind_ip):
                super().__init__(*args, **kwargs)

    return Controller, StorageUnit


# the ledger calls after which a waiting fetch may find something new (the twin notifies on the same events): a
# partition declared, rows whose data has landed (``bind`` after a put, ``touch`` after a put_fields), a seal, rows
# given back, a partition dropped. ``register`` and ``add_fields`` come before the data, ``ack`` frees nothing.
_WAKES = frozenset({"open", "bind", "touch", "seal", "give_back", "release_task", "drop"})


class LedgerHost:
    """Body of the ledger actor: one :class:`DeliveryLedger` per bus scope. Bus errors travel back as values so that
    callers re-raise them with their own type and message (not wrapped in a Ray task error).

    It also wakes waiting fetches. Each (scope, partition) has a change counter, bumped by the calls that may make
    rows fetchable (:data:`_WAKES`): a put binds its rows after their data is in TransferQueue, ``touch`` follows a
    ``put_fields``, and opens, seals, give-backs, releases and drops change what a fetch may take. A fetch reads the counter before it reads
    TransferQueue's production status, and when it gets nothing it awaits :meth:`wait_change` with that value,
    which returns at once if anything changed in between. It is an asyncio actor: its methods run one at a time on
    its event loop, so each ledger call stays atomic."""

    def __init__(self) -> None:
        self._ledgers: dict[str, DeliveryLedger] = {}
        self._counters: dict[tuple[str, int], int] = {}
        self._events: dict[tuple[str, int], asyncio.Event] = {}

    async def ping(self) -> bool:
        return True

    async def call(self, scope: str, lease_timeout: float | None, method: str, args: tuple, kwargs: dict) -> tuple:
        try:
            ledger = self._ledgers.get(scope)
            if ledger is None:
                ledger = self._ledgers[scope] = DeliveryLedger(lease_timeout)
            result = None if method == "touch" else getattr(ledger, method)(*args, **kwargs)
        except DataBusError as exc:
            return ("err", type(exc).__name__, str(exc))
        if method in _WAKES:
            self._bump(scope, _partition_named(method, args, kwargs))
        return ("ok", result)

    async def wait_change(self, scope: str, partition: int, seen: int, timeout: float | None) -> int:
        """The partition's change counter, once it differs from ``seen`` or after ``timeout`` seconds — or when the
        scope's next lease runs out (its rows become fetchable without any call)."""
        key = (scope, partition)
        ledger = self._ledgers.get(scope)
        left = ledger.seconds_to_next_deadline() if ledger is not None else None
        if left is not None:
            timeout = left if timeout is None else min(timeout, left)
        if self._counters.get(key, 0) == seen:
            event = self._events.setdefault(key, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self._counters.get(key, 0)

    def _bump(self, scope: str, partition: int | None) -> None:
        keys = [(scope, partition)] if partition is not None else [k for k in self._counters if k[0] == scope]
        for key in keys:
            self._counters[key] = self._counters.get(key, 0) + 1
            event = self._events.pop(key, None)
            if event is not None:
                event.set()


def _partition_named(method: str, args: tuple, kwargs: dict) -> int | None:
    """The partition a ledger call is about (None: every partition of the scope, e.g. a task released everywhere)."""
    if method == "give_back":  # (lease_id, partition, task)
        return args[1] if len(args) > 1 else kwargs.get("partition")
    if method == "release_task":  # (task, partition=None)
        return args[1] if len(args) > 1 else kwargs.get("partition")
    return args[0] if args else kwargs.get("partition")


class System:
    """Handles of the actors a ``TransferQueueBus.start`` created (and will stop)."""

    def __init__(self, controller: Any, storage: dict[str, Any], ledger: Any):
        self.controller, self.storage, self.ledger = controller, storage, ledger

    def stop(self) -> None:
        import ray

        try:
            ray.get([unit.shutdown.remote() for unit in self.storage.values()], timeout=15)
        except Exception as exc:  # noqa: BLE001 - a unit that is already gone is fine
            log.warning("TransferQueue storage did not shut down cleanly: %s", exc)
        for handle in [*self.storage.values(), self.controller, self.ledger]:
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 - already dead
                pass


class _QuietNestedFallback(logging.Filter):
    """TransferQueue logs a warning on every read of a tensor column with more than one ragged dimension (its
    jagged packing fails before the strided one works). That is expected for e.g. per-row (T, H, W) tensors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to pack nested tensor with jagged layout")


def connect_client() -> tuple[Any, Any]:
    """A TransferQueue client for this process and the ledger actor."""
    import ray

    client = tq_client()
    return client, ray.get_actor(LEDGER_NAME, namespace=TQ_NAMESPACE)


def tq_client() -> Any:
    """A raw ``AsyncTransferQueueClient`` connected to the TransferQueue that :meth:`TransferQueueBus.start` launched
    (blocking; for tools and benchmarks that want TransferQueue itself). Close it with ``client.close()``."""
    import ray

    if not ray.is_initialized():
        raise DataBusError("the TransferQueue bus needs a Ray session in this process (ray.init)")
    try:
        controller = ray.get_actor(CONTROLLER_NAME, namespace=TQ_NAMESPACE)
        ray.get_actor(LEDGER_NAME, namespace=TQ_NAMESPACE)
    except ValueError:
        raise DataBusError("no data bus is running in this Ray session; start one with TransferQueueBus.start() "
                           "(make_bus('transferqueue', start=True)) in the driver") from None
    conf = None
    for _ in range(100):
        conf = ray.get(controller.get_config.remote())
        if conf is not None:
            break
        time.sleep(0.1)  # the starter stores the config right after the storage units are up
    if conf is None:
        raise DataBusError("the TransferQueue controller never received its config")
    _cap_tq_threads()
    from transfer_queue.client import AsyncTransferQueueClient

    logging.getLogger("transfer_queue.storage.managers.simple_storage_manager").addFilter(_QuietNestedFallback())
    client = AsyncTransferQueueClient(f"relax-gym-bus-{os.getpid()}-{uuid.uuid4().hex[:6]}", conf.controller.zmq_info,
                                      zmq_io_threads=1)
    backend = conf.backend.storage_backend
    client.initialize_storage_manager(manager_type=backend, config=conf.backend[backend])
    return client


def start_system(storage_units: int, loopback: bool | None, storage_capacity: int | None) -> System:
    """Launch the controller, the storage units and the ledger (all ``num_cpus=0``) and hand the config over."""
    import ray

    _cap_tq_threads()
    from importlib import resources

    from omegaconf import OmegaConf
    from transfer_queue.sampler import SequentialSampler
    from transfer_queue.utils.common import get_node_round_robin_scheduling_strategies
    from transfer_queue.utils.zmq_utils import process_zmq_server_info

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if loopback is None:
        loopback = len(alive) == 1
    if loopback and len(alive) != 1:
        raise DataBusError(f"loopback binding needs a single-node Ray cluster; this one has {len(alive)} nodes")
    bind_ip = LOOPBACK if loopback else None
    env = {"env_vars": {"TQ_NUM_THREADS": os.environ["TQ_NUM_THREADS"]}}

    conf = OmegaConf.merge(OmegaConf.create({}, flags={"allow_objects": True}),
                           OmegaConf.load(resources.files("transfer_queue") / "config.yaml"))
    conf.controller.polling_mode = True
    conf.backend.storage_backend = "SimpleStorage"
    conf.backend.SimpleStorage.num_data_storage_units = storage_units
    conf.backend.SimpleStorage.total_storage_size = storage_capacity

    controller_cls, unit_cls = _server_classes()
    ledger = ray.remote(LedgerHost).options(name=LEDGER_NAME, namespace=TQ_NAMESPACE, num_cpus=0,
                                             get_if_exists=True).remote()
    controller = ray.remote(controller_cls).options(name=CONTROLLER_NAME, namespace=TQ_NAMESPACE, num_cpus=0,
                                                    runtime_env=env).remote(sampler=SequentialSampler(),
                                                                            polling_mode=True, bind_ip=bind_ip)
    conf.controller.zmq_info = process_zmq_server_info(controller)
    unit_conf = dict(conf.backend.SimpleStorage)
    unit_conf["_run_id"] = uuid.uuid4().hex
    placement = get_node_round_robin_scheduling_strategies(storage_units)
    storage = {}
    for rank in range(storage_units):
        name = f"TransferQueueStorageUnit#{rank}"
        storage[name] = ray.remote(unit_cls).options(name=name, namespace=TQ_NAMESPACE, num_cpus=0, runtime_env=env,
                                                     scheduling_strategy=placement[rank]).remote(
            config=unit_conf, bind_ip=bind_ip)
    conf.backend.SimpleStorage.zmq_info = process_zmq_server_info(storage)
    ray.get(controller.store_config.remote(conf))
    ray.get(ledger.ping.remote())
    log.info("TransferQueue started: controller %s, %d storage unit(s), bound to %s", conf.controller.zmq_info.ip,
             storage_units, bind_ip or "the node address")
    return System(controller, storage, ledger)
