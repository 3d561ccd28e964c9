"""The DCS client: the actor pushes its weights to every engine; each engine goes through pause → load → flush →
continue.

Actor side::

    coordinator = DCSCoordinator(["http://10.0.0.5:30000", "http://10.0.0.6:30000"], bucket_mb=256, transport="tcp")
    dcs = DCSClient(coordinator, names=checkpoint_names(model))
    report = dcs.push(actor.state_dict(), version=step)       # PushReport(bytes, seconds, buckets, transport, ...)
    dcs.close()

Engine side, :class:`~relax_gym.trainer.dcs.link.EngineLink` drives one engine through SGLang's HTTP protocol (so a real SGLang server and
the embedded engine are handled alike): the transport's staging (done while the engines generate: the disk
transport's shards; over ``tcp`` / ``nccl`` the group, and on engines that stage, every bucket), then
``/pause_generation`` (``pause_mode``, ``"retract"`` by default: no request runs on a half-loaded model and SGLang
can then flush its cache), the transport's loading calls (``/apply_staged_weights`` on staging engines,
``/update_weights_from_distributed`` bucket by bucket or ``/update_weights_from_disk`` otherwise; the last one
carries the new ``weight_version``), ``/flush_cache``, ``/continue_generation``, and a ``/get_weight_version``
check that the engine reports the pushed version. :attr:`PushReport.paused_seconds` is how long the engines were
paused (from the pause call to the last engine's resume).

Failure rules: a push either completes on every engine and :meth:`DCSCoordinator.commit
<relax_gym.trainer.dcs.coordinator.DCSCoordinator.commit>` records the version, or it raises one
:class:`DCSPushError` naming the engine that failed and the step, and the coordinator's version stays as it was.
If the failure came while staging (a bucket that an engine refused or that did not arrive), no engine was paused
and none changed its weights or version: the engines go on generating with the weights they had. If the failure
came before any weights moved (an engine that cannot be reached is found at the pause step), the engines that had
been paused are resumed. If it came while loading, the engines may hold a mix of old and new
tensors: they are left paused, so nothing is generated from mixed weights, until a later push completes (or the
caller resumes them with :meth:`DCSClient.resume`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import torch

from relax_gym.trainer.dcs.coordinator import (
    DCSCoordinator,
    EngineInfo,
    PushPlan,
    TensorMeta,
    Version,
    WeightMetadata,
    renamer,
)
from relax_gym.trainer.dcs.errors import (
    DCSEngineError,
    DCSError,
    DCSPushError,
    PushReport,
)
from relax_gym.trainer.dcs.group import dtype_name
from relax_gym.trainer.dcs.link import EngineLink
from relax_gym.trainer.dcs.transports import Transport, make_transport

__all__ = ["DCSClient", "DCSEngineError", "DCSError", "DCSPushError", "EngineLink", "PushReport"]


class DCSClient:
    """The actor's side of the DCS (see the module doc).

    ``coordinator``: a :class:`DCSCoordinator` or anything with its ``push_plan`` / ``set_weights`` / ``commit``
    methods. ``transport``: a name (default: the coordinator's) or a :class:`Transport`. ``names``: state_dict
    key → the name engines load (:func:`~relax_gym.trainer.dcs.names.checkpoint_names`); ``bucket_mb``
    overrides the coordinator's bucket size; ``flatten`` / ``master_address`` / ``disk_dir`` configure the
    transport, ``staged`` whether ``tcp`` / ``nccl`` engines receive while they generate (None: those that
    advertise it) and ``wire`` what ``tcp``'s bytes travel over (``"socket"`` / ``"gloo"``; None: the socket
    stream where every engine takes it); see :mod:`~relax_gym.trainer.dcs.transports`."""

    def __init__(self, coordinator: DCSCoordinator | Any, *, transport: str | Transport | None = None,
                 names: Mapping[str, str] | Callable[[str], str] | None = None, bucket_mb: float | None = None,
                 pause_mode: str = "retract", flatten: bool | None = None, master_address: str | None = None,
                 disk_dir: str | None = None, timeout_s: float = 300.0, group_timeout_s: float = 120.0,
                 staged: bool | None = None, wire: str | None = None) -> None:
        self.coordinator = coordinator
        self.names = names
        self.bucket_mb = bucket_mb
        self.pause_mode = pause_mode
        self.timeout_s = float(timeout_s)
        if isinstance(transport, Transport):
            self.transport = transport
        else:
            name = transport or self.coordinator.push_plan().transport
            self.transport = make_transport(name, disk_dir=disk_dir, flatten=flatten, master_address=master_address,
                                            group_timeout_s=group_timeout_s, staged=staged, wire=wire)
        self._links: dict[str, EngineLink] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dcs")
        self._pool_size = 8

    # ------------------------------------------------------------------------------------------ push

    def push(self, state_dict: Mapping[str, torch.Tensor], version: Version) -> PushReport:
        """Send ``state_dict`` to every engine as ``version`` (pause → load → flush → continue on each).
        Returns a :class:`PushReport`; raises :class:`DCSPushError` naming the failing engine (the
        coordinator's version then stays unchanged) or :class:`DCSError` for a state dict that does not match
        the registered weights."""
        t0 = time.perf_counter()
        plan = self._plan(state_dict)
        if not plan.engines:
            raise DCSError("no engines registered with the DCS coordinator: nothing to push to")
        items = self._items(state_dict, plan.weights)
        links = self._sync_links(plan.engines)
        self._size_pool(len(links))
        phases: dict[str, float] = {}

        mark = time.perf_counter()
        staged = self._stage(links, items, plan, version)
        phases["stage"] = time.perf_counter() - mark
        try:
            mark = paused_at = time.perf_counter()
            self._pause_all(links, version)
            phases["pause"] = time.perf_counter() - mark

            mark = time.perf_counter()
            try:
                nbytes = self.transport.load(links, items, plan.buckets, version, staged, epoch=plan.epoch, pool=self._pool)
            except DCSEngineError as exc:
                if exc.step in _BEFORE_LOADING:  # nothing was sent: the engines may go on with their weights
                    self._each(links, lambda link: link.resume())
                    self._fail(exc, version, paused=[], loading=False, untouched=True,
                               tail="; no weights were sent and the engines were resumed")
                self._fail(exc, version, paused=[link.url for link in links], loading=True)
            except Exception as exc:  # the actor's side failed (memory, a tensor that cannot be moved, ...)
                urls = [link.url for link in links]
                raise DCSPushError(f"push of weight version {version!r} failed on the actor while loading: "
                                   f"{type(exc).__name__}: {exc}; engines {urls} may hold a partial update and stay "
                                   "paused until a push completes (DCSClient.resume() continues them anyway)",
                                   url=None, step="load", version=version, paused=urls) from exc
            phases["load"] = time.perf_counter() - mark

            mark = time.perf_counter()
            self._finish_all(links, version)
            phases["resume"] = time.perf_counter() - mark
        except BaseException:
            self.transport.discard(staged)
            raise
        paused = time.perf_counter() - paused_at
        self.transport.committed(staged)
        self.coordinator.commit(version, [link.url for link in links])
        return PushReport(bytes=nbytes, seconds=time.perf_counter() - t0, buckets=len(plan.buckets),
                          transport=self.transport.name, version=version, engines=len(links), phases=phases,
                          paused_seconds=paused)

    def resume(self, urls: Sequence[str] | None = None) -> None:
        """Continue generation on engines a failed push left paused (default: every known engine)."""
        links = [link for url, link in self._links.items() if urls is None or url in urls]
        errors = self._each(links, lambda link: link.resume())
        if errors:
            url, exc = next(iter(errors.items()))
            raise DCSPushError(str(exc), url=url, step="continue_generation", version=self._version())

    def close(self) -> None:
        """Leave the weight-update group on the engines, close the HTTP clients."""
        links = list(self._links.values())
        try:
            self.transport.close(links)
        finally:
            for link in links:
                link.close()
            self._links.clear()
            self._pool.shutdown(wait=False)

    def __enter__(self) -> DCSClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ internals

    def _stage(self, links: Sequence[EngineLink], items: list[tuple[TensorMeta, torch.Tensor]], plan: PushPlan,
               version: Version) -> Any:
        """The transport's stage; a failure there is raised as a :class:`DCSPushError` saying that no engine was
        paused or changed."""
        try:
            return self.transport.stage(links, items, plan.buckets, version, epoch=plan.epoch, pool=self._pool)
        except DCSEngineError as exc:
            what = "no weights were sent" if exc.step in _BEFORE_LOADING else "no engine loaded anything"
            self._fail(exc, version, paused=[], loading=False, untouched=True,
                       tail=f"; {what} and no engine was paused: they go on with the weights they had")
        except Exception as exc:  # the actor's side failed (memory, a file that cannot be written, ...)
            raise DCSPushError(f"push of weight version {version!r} failed on the actor while staging: "
                               f"{type(exc).__name__}: {exc}; no engine was paused or loaded anything",
                               url=None, step="stage", version=version, untouched=True) from exc

    def _plan(self, state_dict: Mapping[str, torch.Tensor]) -> PushPlan:
        plan = self.coordinator.push_plan(self.bucket_mb)
        if plan.weights is None:
            self.coordinator.set_weights(WeightMetadata.from_state_dict(state_dict, self.names))
            plan = self.coordinator.push_plan(self.bucket_mb)
        return plan

    def _items(self, state_dict: Mapping[str, torch.Tensor], meta: WeightMetadata) -> list[tuple[TensorMeta, torch.Tensor]]:
        """The state dict's tensors in the metadata's order, checked against it (names, shapes, dtypes)."""
        rename = renamer(self.names)
        expected = meta.by_name()
        by_name: dict[str, torch.Tensor] = {}
        for key, tensor in state_dict.items():
            name = rename(key)
            if name in meta.aliases:
                continue
            want = expected.get(name)
            if want is None:
                raise DCSError(f"tensor {name!r} is not in the registered weight metadata (did the model change?)")
            if tuple(tensor.shape) != want.shape or dtype_name(tensor.dtype) != want.dtype:
                raise DCSError(f"tensor {name!r} is {dtype_name(tensor.dtype)}{list(tensor.shape)}, the registered "
                               f"metadata says {want.dtype}{list(want.shape)}")
            by_name[name] = tensor
        missing = [t.name for t in meta.tensors if t.name not in by_name]
        if missing:
            raise DCSError(f"the state dict lacks {len(missing)} registered tensor(s): {missing[:5]}")
        return [(t, by_name[t.name]) for t in meta.tensors]

    def _size_pool(self, engines: int) -> None:
        """Every engine's call of a broadcast must run at once (each waits for the others), and a staged push
        keeps up to three calls open per engine: three threads each."""
        if 3 * engines + 2 > self._pool_size:
            self._pool.shutdown(wait=False)
            self._pool_size = 3 * engines + 2
            self._pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="dcs")

    def _sync_links(self, engines: Sequence[EngineInfo]) -> list[EngineLink]:
        wanted = {e.url: e for e in engines}
        for url in [u for u in self._links if u not in wanted or self._links[u].info != wanted[u]]:
            self._links.pop(url).close()
        for url, info in wanted.items():
            if url not in self._links:
                self._links[url] = EngineLink(info, timeout_s=self.timeout_s)
        return [self._links[e.url] for e in engines]

    def _each(self, links: Sequence[EngineLink], fn: Callable[[EngineLink], Any]) -> dict[str, BaseException]:
        """Run ``fn`` on every link in parallel (one link: in this thread, sparing two thread hand-overs per call);
        the failures by URL (in link order)."""
        if len(links) == 1:
            try:
                fn(links[0])
            except Exception as exc:  # noqa: BLE001 - returned, as a future would hold it
                return {links[0].url: exc}
            return {}
        futures = [(link, self._pool.submit(fn, link)) for link in links]
        errors: dict[str, BaseException] = {}
        for link, future in futures:
            exc = future.exception()
            if exc is not None:
                errors[link.url] = exc
        return errors

    def _pause_all(self, links: Sequence[EngineLink], version: Version) -> None:
        errors = self._each(links, lambda link: link.pause(self.pause_mode))
        if not errors:
            return
        paused = [link for link in links if link.url not in errors]
        self._each(paused, lambda link: link.resume())
        url, exc = next(iter(errors.items()))
        others = f" ({len(errors) - 1} more engine(s) failed too: {list(errors)[1:]})" if len(errors) > 1 else ""
        raise DCSPushError(f"push of weight version {version!r} failed at engine {url}: {_cause(exc)}{others}; "
                           "no weights were sent and the other engines were resumed",
                           url=url, step="pause_generation", version=version, untouched=True)

    def _finish_all(self, links: Sequence[EngineLink], version: Version) -> None:
        def finish(link: EngineLink) -> None:
            link.flush()
            link.resume()
            reported = link.weight_version()
            if reported != str(version):
                raise DCSEngineError(link.url, "get_weight_version", f"reports {reported!r} after loading version {str(version)!r}")

        errors = self._each(links, finish)
        if errors:
            url, exc = next(iter(errors.items()))
            still_paused = [u for u, e in errors.items() if getattr(e, "step", "") != "get_weight_version"]
            self._fail(exc, version, paused=still_paused, loading=False)

    def _fail(self, exc: BaseException, version: Version, *, paused: Sequence[str], loading: bool, tail: str = "",
              untouched: bool = False) -> NoReturn:
        url = getattr(exc, "url", "?")
        step = getattr(exc, "step", "load")
        if not tail and loading:
            tail = (f"; engines {list(paused)} may hold a partial update and stay paused until a push completes "
                    "(DCSClient.resume() continues them anyway)")
        elif not tail and paused:
            tail = f"; the weights were loaded but engines {list(paused)} may still be paused"
        raise DCSPushError(f"push of weight version {version!r} failed at engine {url}: {_cause(exc)}{tail}",
                           url=url, step=step, version=version, paused=paused, untouched=untouched) from exc

    def _version(self) -> Version:
        return self.coordinator.push_plan().version


# steps of a transport that come before any tensor moves
_BEFORE_LOADING = frozenset({"init_weights_update_group", "get_server_info"})


def _cause(exc: BaseException) -> str:
    """The message of a DCSEngineError without its ``engine <url>:`` prefix (the push error names the engine)."""
    if isinstance(exc, DCSEngineError):
        return f"{exc.step} failed: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
