"""Weight updates of the embedded engine, mixed into :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`.

**Weights.** :meth:`load_state_dict` (named tensors), :meth:`update_from_disk` (a ``save_policy`` /
``save_pretrained`` directory or a ``.safetensors`` file; never pickles) and the distributed path
(:meth:`init_weights_update_group`, :meth:`update_weights_from_distributed`: gloo, or nccl with the model on
CUDA; one broadcast per tensor or SGLang's ``flattened_bucket`` format, one broadcast per call; or, ours, the
``socket`` backend when the receiver offers it: the DCS's plain TCP stream, read straight into the buffers the
tensors end up in, :attr:`weight_update_backends`). The group
itself is the DCS's code: the engine joins and receives through the ``weight_receiver`` it was given
(the DCS's ``GroupReceiver``, handed in by whoever composes engine and DCS); an engine
without one refuses distributed updates.
:meth:`weights_checksum` gives SHA-256 digests of the current weights (a push can be checked bit for bit).
Names are the model's
``state_dict`` keys or their checkpoint spellings (what ``save_pretrained`` writes, with or without the full
Qwen2.5-Omni model's ``thinker.`` prefix; ``talker.`` / ``token2wav.`` tensors are skipped). An update is
validated completely (names, shapes) before any tensor is copied, and applied between batches under the model
lock, so a batch never mixes weights. ``weight_version`` (a string) is reported in every response.

The mixin reads the engine's state: ``model``, ``_state`` (``state_dict(keep_vars=True)``), ``_names`` (accepted
name → state_dict key, built by :meth:`WeightUpdates._build_name_map`), ``_model_lock``, ``_groups`` /
``_groups_lock`` / ``_group_locks``, ``weight_receiver``, ``_device``, ``dist_timeout_s``, ``_cv`` / ``_stats``,
``_weight_version``, ``model_path``, ``_staging`` (a :class:`~relax_gym.trainer.engines.weight_staging.WeightStaging`)
and ``abort_all()``.

**Staged pushes** (our extension, :mod:`~relax_gym.trainer.engines.weight_staging`):
:meth:`stage_weights_from_distributed` receives a push's buckets while batches keep running (one request per call,
or :meth:`stage_weights` for all of them in one),
:meth:`apply_staged_weights` swaps them in (the engine paused for that alone), :meth:`discard_staged_weights`
drops a push that failed half way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from relax_gym.trainer.engines.admin_protocol import DEFAULT_GROUP_NAME, FLATTENED_BUCKET, deserialize_named_tensors, tensor_digest
from relax_gym.trainer.engines.errors import EngineRequestError
from relax_gym.trainer.engines.weight_staging import StagedCall, swap_in

logger = logging.getLogger(__name__)

_SKIPPED_PREFIXES = ("talker.", "token2wav.")


class WeightUpdates:
    """Load named tensors, safetensors checkpoints and distributed broadcasts into the engine's model."""

    def load_state_dict(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                        weight_version: str | None = None, *, abort_all_requests: bool = False) -> str:
        """Copy named tensors into the model (all validated first; applied between batches). Returns a message."""
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        plan = self._plan([(name, tuple(t.shape)) for name, t in items])
        if abort_all_requests:
            self.abort_all()
        by_name = dict(items)
        with self._model_lock, torch.no_grad():
            for name, key in plan:
                self._state[key].copy_(by_name[name])
            self._bump(weight_version)
        return f"Loaded {len(plan)} tensors (weight version {self._weight_version})."

    def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str], *, load_format: str | None = None,
                                   weight_version: str | None = None, abort_all_requests: bool = False) -> str:
        """SGLang's ``update_weights_from_tensor``: one payload per TP rank (exactly one here), each base64
        safetensors (:func:`~relax_gym.trainer.engines.admin_protocol.serialize_named_tensors`)."""
        if load_format not in (None, "safetensors", "auto"):
            raise EngineRequestError(f"load_format={load_format!r} is not supported (the payload is base64 safetensors)")
        if len(serialized_named_tensors) != 1:
            raise EngineRequestError(f"serialized_named_tensors needs one entry per tensor-parallel rank; the embedded "
                                     f"engine has 1, got {len(serialized_named_tensors)}")
        try:
            tensors = deserialize_named_tensors(serialized_named_tensors[0])
        except ValueError as exc:
            raise EngineRequestError(str(exc)) from None
        return self.load_state_dict(tensors, weight_version=weight_version, abort_all_requests=abort_all_requests)

    def update_from_disk(self, path: str | Path, *, load_format: str | None = None, weight_version: str | None = None,
                         abort_all_requests: bool = False) -> str:
        """Load the ``*.safetensors`` of a checkpoint directory (``save_policy`` / ``save_pretrained``, sharded
        or not) or one ``.safetensors`` file. Pickle checkpoints (``.bin`` / ``.pt``) are refused."""
        from safetensors import safe_open

        if load_format not in (None, "auto", "safetensors"):
            raise EngineRequestError(f"load_format={load_format!r} is not supported (safetensors checkpoints only)")
        root = Path(path)
        if root.is_file():
            files = [root] if root.suffix == ".safetensors" else []
        elif root.is_dir():
            files = sorted(root.glob("*.safetensors"))
        else:
            raise EngineRequestError(f"model_path {str(root)!r} does not exist")
        if not files:
            pickles = sorted(p.name for p in (root.glob("*") if root.is_dir() else [root]) if p.suffix in (".bin", ".pt", ".pth"))
            hint = f" (found {pickles}: pickle checkpoints are never loaded; save with safetensors)" if pickles else ""
            raise EngineRequestError(f"no .safetensors weights at {str(root)!r}{hint}")
        shapes: list[tuple[str, tuple[int, ...]]] = []
        where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    shapes.append((name, tuple(fh.get_slice(name).get_shape())))
                    where[name] = f
        plan = self._plan(shapes)
        if not plan:
            raise EngineRequestError(f"no tensor of {str(root)!r} belongs to this model")
        if abort_all_requests:
            self.abort_all()
        with self._model_lock, torch.no_grad():
            by_file: dict[Path, list[tuple[str, str]]] = {}
            for name, key in plan:
                by_file.setdefault(where[name], []).append((name, key))
            for f, entries in by_file.items():
                with safe_open(str(f), framework="pt") as fh:
                    for name, key in entries:
                        self._state[key].copy_(fh.get_tensor(name))
            self._bump(weight_version)
            self.model_path = str(root)
        return f"Loaded {len(plan)} tensors from {str(root)!r} (weight version {self._weight_version})."

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo") -> str:
        """Join the trainer's weight-update group as rank ``rank_offset`` (blocks until all ranks meet).
        ``backend``: ``"gloo"``, ``"nccl"`` when the model is on a CUDA device (tensors arrive on it), or another of
        :attr:`weight_update_backends` (``"socket"``: connect to the DCS's weight stream at ``master_address:
        master_port``). Groups whose other end is gone (a stream the actor closed) are left first."""
        if backend == "nccl" and self._device.type != "cuda":
            raise EngineRequestError(f"backend 'nccl' needs the model on a CUDA device; this engine runs on "
                                     f"{self._device} (use 'gloo')")
        if backend not in ("gloo", "nccl", *self.weight_update_backends):
            raise EngineRequestError(f"backend {backend!r} is not available in the embedded engine; use 'gloo' "
                                     "(or 'nccl' with the model on CUDA)")
        if self.weight_receiver is None:
            raise EngineRequestError("this engine was started without a weight receiver: distributed weight updates "
                                     "are not available (use update_weights_from_tensor / update_weights_from_disk)")
        with self._groups_lock:
            if group_name in self._groups:
                raise EngineRequestError(f"weight update group {group_name!r} already exists (destroy it first)")
            self._group_locks.setdefault(group_name, threading.Lock())
            # groups whose other end is gone (a socket stream the actor closed or whose actor died) are left here
            gone = [(n, g) for n, g in self._groups.items() if not getattr(g, "alive", True)]
            for name, _ in gone:
                del self._groups[name]
        for _, stale in gone:
            self.weight_receiver.leave(stale)
        try:
            group = self.weight_receiver.join(master_address, master_port, rank_offset, world_size,
                                              group_name=group_name, backend=backend, timeout_s=self.dist_timeout_s,
                                              device=self._device)
        except (ValueError, RuntimeError) as exc:
            raise EngineRequestError(f"could not join weight update group {group_name!r}: {exc}") from None
        with self._groups_lock:
            self._groups[group_name] = group
        return f"Joined weight update group {group_name!r} as rank {rank_offset} of {world_size}."

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                                        group_name: str = DEFAULT_GROUP_NAME, *, weight_version: str | None = None,
                                        abort_all_requests: bool = False, load_format: str | None = None) -> str:
        """Receive the announced tensors from rank 0, then apply them like :meth:`load_state_dict`. By default
        one broadcast per tensor (in order, with the announced dtypes / shapes); with
        ``load_format="flattened_bucket"`` (SGLang's name) one broadcast of a ``uint8`` tensor holding all their
        bytes back to back (received by the ``weight_receiver``). Everything
        announced is received even when a name turns out to be wrong (so the group stays in step); the error is
        raised after."""
        if not len(names) == len(dtypes) == len(shapes):
            raise EngineRequestError("names, dtypes and shapes need the same length")
        if load_format not in (None, "auto", *self.weight_update_load_formats):
            raise EngineRequestError(f"load_format={load_format!r} is not supported for distributed updates "
                                     f"(null for one broadcast per tensor, or {FLATTENED_BUCKET!r})")
        with self._groups_lock:
            group = self._groups.get(group_name)
            lock = self._group_locks.get(group_name)
        if group is None or lock is None:
            raise EngineRequestError(f"no weight update group {group_name!r} (call init_weights_update_group first)")
        with lock:  # one update per group at a time: the receiver reuses its buffer
            try:
                tensors = self.weight_receiver.receive(group, dtypes, shapes, None if load_format == "auto" else load_format)
            except ValueError as exc:
                raise EngineRequestError(f"dtypes: {exc}") from None
            return self.load_state_dict(list(zip(names, tensors)), weight_version=weight_version,
                                        abort_all_requests=abort_all_requests)

    def stage_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                                       group_name: str = DEFAULT_GROUP_NAME, *, stage_id: str, seq: int,
                                       load_format: str | None = None) -> str:
        """Call ``seq`` of a staged push (:mod:`~relax_gym.trainer.engines.weight_staging`): receive the announced
        tensors like :meth:`update_weights_from_distributed`, but into the staging area, leaving the model and
        its version alone (batches keep running); :meth:`apply_staged_weights` swaps them in. Calls are received
        in ``seq`` order whatever order they arrive in. As there, everything announced is received even when a
        name is wrong (the group stays in step); the error is raised after, and the stage is then failed."""
        if not len(names) == len(dtypes) == len(shapes):
            raise EngineRequestError("names, dtypes and shapes need the same length")
        group, lock = self._staging_group(group_name, load_format)
        staging = self._staging
        staging.wait_turn(stage_id, seq)
        try:
            plan, refused = self._plan([(n, tuple(s)) for n, s in zip(names, shapes)]), None
        except EngineRequestError as exc:
            plan, refused = [], exc
        flattened = load_format == FLATTENED_BUCKET
        buffer = None
        with lock:  # one receive per group at a time
            try:
                if flattened:
                    buffer = staging.buffer(_nbytes(dtypes, shapes), group.device)
                tensors = self.weight_receiver.receive(group, dtypes, shapes, FLATTENED_BUCKET if flattened else None,
                                                       out=buffer, stage=(stage_id, seq))
            except Exception as exc:
                staging.fail(stage_id, f"receiving call {seq}: {exc}", buffer)
                if isinstance(exc, ValueError):
                    raise EngineRequestError(f"dtypes: {exc}") from None
                raise
        if refused is not None:
            staging.fail(stage_id, f"call {seq} was refused: {refused}", buffer)
            raise refused
        by_name = dict(zip(names, tensors))
        staging.add(stage_id, seq, StagedCall([key for _, key in plan], [by_name[name] for name, _ in plan], buffer))
        return f"Staged {len(plan)} tensors as call {seq} of weight stage {stage_id!r}."

    def stage_weights(self, calls: Sequence[tuple[Sequence[str], Sequence[str], Sequence[Sequence[int]]]],
                      group_name: str = DEFAULT_GROUP_NAME, *, stage_id: str, load_format: str | None = None) -> str:
        """Every call of staged push ``stage_id`` in one request (``calls``: ``(names, dtypes, shapes)`` each, in
        ``seq`` order, starting a new stage), received as :meth:`stage_weights_from_distributed` receives one but
        all at once: with a receiver that has ``receive_calls`` (the DCS's, over its socket streams) every call's
        staging buffer is taken first and the bytes then arrive back to back, with no request, answer or thread
        hand-over between calls. As there, everything announced is received even when a name is wrong (the
        stream stays in step); the error is raised after, and the stage is then failed."""
        for names, dtypes, shapes in calls:
            if not len(names) == len(dtypes) == len(shapes):
                raise EngineRequestError("names, dtypes and shapes need the same length")
        receive_calls = getattr(self.weight_receiver, "receive_calls", None)
        if receive_calls is None:  # a receiver without it: one call after the other
            for seq, (names, dtypes, shapes) in enumerate(calls):
                self.stage_weights_from_distributed(names, dtypes, shapes, group_name, stage_id=stage_id, seq=seq,
                                                    load_format=load_format)
            return f"Staged {sum(len(c[0]) for c in calls)} tensors in {len(calls)} call(s) of weight stage {stage_id!r}."
        group, lock = self._staging_group(group_name, load_format)
        staging = self._staging
        staging.wait_turn(stage_id, 0)
        plans, refused = [], None
        for names, _, shapes in calls:
            try:
                plans.append(self._plan([(n, tuple(s)) for n, s in zip(names, shapes)]))
            except EngineRequestError as exc:
                plans.append([])
                refused = refused or exc
        flattened = load_format == FLATTENED_BUCKET
        buffers: list[torch.Tensor | None] = []
        try:
            with lock:  # one receive per group at a time
                if flattened:
                    buffers = [staging.buffer(_nbytes(dtypes, shapes), group.device) for _, dtypes, shapes in calls]
                received = receive_calls(group, [(dtypes, shapes, buffers[k] if flattened else None)
                                                 for k, (_, dtypes, shapes) in enumerate(calls)],
                                         FLATTENED_BUCKET if flattened else None, stage_id=stage_id, first_seq=0)
        except Exception as exc:
            self._fail_stage(stage_id, f"receiving calls 0..{len(calls) - 1}: {exc}", buffers)
            if isinstance(exc, ValueError):
                raise EngineRequestError(f"dtypes: {exc}") from None
            raise
        if refused is not None:
            self._fail_stage(stage_id, f"a call was refused: {refused}", buffers)
            raise refused
        for seq, ((names, _, _), plan, tensors) in enumerate(zip(calls, plans, received)):
            by_name = dict(zip(names, tensors))
            staging.add(stage_id, seq, StagedCall([key for _, key in plan], [by_name[name] for name, _ in plan],
                                                  buffers[seq] if flattened else None))
        return f"Staged {sum(len(p) for p in plans)} tensors in {len(calls)} call(s) of weight stage {stage_id!r}."

    def _staging_group(self, group_name: str, load_format: str | None) -> tuple[object, threading.Lock]:
        """The group a staged call reads from, and its lock; :class:`EngineRequestError` when it cannot be staged."""
        if load_format not in (None, "auto", *self.weight_update_load_formats):
            raise EngineRequestError(f"load_format={load_format!r} is not supported for distributed updates "
                                     f"(null for one broadcast per tensor, or {FLATTENED_BUCKET!r})")
        if not self.weight_update_staging:
            raise EngineRequestError("this engine's weight receiver cannot stage updates (use update_weights_from_distributed)")
        with self._groups_lock:
            group = self._groups.get(group_name)
            lock = self._group_locks.get(group_name)
        if group is None or lock is None:
            raise EngineRequestError(f"no weight update group {group_name!r} (call init_weights_update_group first)")
        return group, lock

    def _fail_stage(self, stage_id: str, reason: str, buffers: Sequence[torch.Tensor | None]) -> None:
        """Fail ``stage_id`` and hand ``buffers`` back to the staging area's spares."""
        self._staging.fail(stage_id, reason, None)
        for buffer in buffers:
            if buffer is not None:
                self._staging.fail(stage_id, reason, buffer)

    def apply_staged_weights(self, stage_id: str, calls: int, weight_version: str | None = None) -> str:
        """Put the ``calls`` received calls of ``stage_id`` into the model at once (between batches, under the
        model lock) and take ``weight_version``: each tensor is pointed at its received buffer where it can be,
        copied otherwise (:func:`~relax_gym.trainer.engines.weight_staging.swap_in`). Refused, with nothing
        changed, when the stage is incomplete, failed or unknown."""
        staged = self._staging.take(stage_id, calls)
        swapped = copied = 0
        with self._model_lock, torch.no_grad():
            for call in staged:
                for key, tensor in zip(call.keys, call.tensors):
                    if swap_in(self._state[key], tensor):
                        swapped += 1
                    else:
                        copied += 1
            self._bump(weight_version)
            live = {t.untyped_storage().data_ptr() for t in self._state.values()}
        self._staging.settle([c.buffer for c in staged if c.buffer is not None], live)
        return (f"Applied weight stage {stage_id!r}: {swapped + copied} tensors ({swapped} swapped in, {copied} copied; "
                f"weight version {self._weight_version}).")

    def discard_staged_weights(self, stage_id: str | None = None) -> str:
        """Drop a stage that will not be applied (``stage_id``, or whichever is current); its buffers are kept
        for the next one."""
        dropped = self._staging.discard(stage_id)
        return f"Weight stage {stage_id or '(current)'} {'discarded' if dropped else 'was not staged'}."

    @property
    def weight_update_staging(self) -> bool:
        """Whether distributed updates can be staged (:meth:`stage_weights_from_distributed`): the receiver can
        receive into buffers it is given."""
        return bool(getattr(self.weight_receiver, "receives_into", False))

    @property
    def weight_update_backends(self) -> tuple[str, ...]:
        """What ``/init_weights_update_group`` takes as ``backend``: ``gloo``, ``nccl`` with the model on CUDA, and
        what else the receiver joins (the DCS's ``GroupReceiver``: ``socket``, a plain TCP stream the bytes are
        read from straight into the staging buffers)."""
        base = ("gloo", "nccl") if self._device.type == "cuda" else ("gloo",)
        extra = getattr(self.weight_receiver, "backends", ()) if self.weight_receiver is not None else ()
        return base + tuple(b for b in extra if b not in ("gloo", "nccl"))

    @property
    def weight_update_load_formats(self) -> tuple[str, ...]:
        """The distributed load formats beyond one broadcast per tensor (``flattened_bucket``), as the receiver
        supports them; none without a receiver."""
        return tuple(getattr(self.weight_receiver, "load_formats", ())) if self.weight_receiver is not None else ()

    def weights_checksum(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """SHA-256 digests (:func:`~relax_gym.trainer.engines.admin_protocol.tensor_digest`) of the current
        weights, by the names given (state_dict keys or checkpoint spellings) or of every state_dict key.
        Taken under the model lock (never mid-update). Unknown names are an :class:`EngineRequestError`."""
        if names is None:
            wanted = [(k, k) for k in self._state]
        else:
            unknown = [n for n in names if n not in self._names]
            if unknown:
                raise EngineRequestError(f"{len(unknown)} unknown tensor name(s): {list(unknown)[:5]}")
            wanted = [(n, self._names[n]) for n in names]
        with self._model_lock:
            return {name: tensor_digest(self._state[key]) for name, key in wanted}

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> str:
        with self._groups_lock:
            group = self._groups.pop(group_name, None)
        if group is None:
            raise EngineRequestError(f"no weight update group {group_name!r}")
        self.weight_receiver.leave(group)
        return f"Destroyed weight update group {group_name!r}."

    # ------------------------------------------------------------------------------------------ weights: internals

    def _build_name_map(self) -> dict[str, str]:
        """Accepted tensor name → state_dict key: the keys themselves, their checkpoint spellings (what
        ``save_pretrained`` writes, via transformers' reverse key mapping) and those with a ``thinker.`` prefix."""
        names = {k: k for k in self._state}
        try:
            from transformers.core_model_loading import revert_weight_conversion

            plain = self.model.state_dict()
            key_of = {id(v): k for k, v in plain.items()}
            for ckpt_name, tensor in revert_weight_conversion(self.model, dict(plain)).items():
                key = key_of.get(id(tensor))
                if key is not None:
                    names.setdefault(ckpt_name, key)
        except Exception:  # noqa: BLE001 - older / newer transformers: runtime names still work
            logger.debug("no checkpoint key mapping available; only state_dict names are accepted", exc_info=True)
        for name, key in list(names.items()):
            names.setdefault(f"thinker.{name}", key)
        return names

    def _plan(self, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> list[tuple[str, str]]:
        """Validate names and shapes; ``[(given name, state_dict key)]``; skipped: talker / token2wav tensors."""
        plan, unknown, wrong = [], [], []
        for name, shape in shapes:
            if name.startswith(_SKIPPED_PREFIXES):
                continue
            key = self._names.get(name)
            if key is None:
                unknown.append(name)
                continue
            want = tuple(self._state[key].shape)
            if tuple(shape) != want:
                wrong.append(f"{name}: got {list(shape)}, the model has {list(want)}")
                continue
            plan.append((name, key))
        if unknown or wrong:
            parts = []
            if unknown:
                parts.append(f"{len(unknown)} unknown tensor name(s): {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
            if wrong:
                parts.append(f"{len(wrong)} shape mismatch(es): {wrong[:5]}{' ...' if len(wrong) > 5 else ''}")
            raise EngineRequestError("weight update refused, nothing was loaded: " + "; ".join(parts))
        return plan

    def _bump(self, weight_version: str | None) -> None:
        if weight_version is not None:
            self._weight_version = str(weight_version)
        clear = getattr(self, "_clear_prefix", None)  # the prefix cache's KV came from the old weights
        if clear is not None:
            clear()
        with self._cv:
            self._stats["weight_updates"] += 1



def _nbytes(dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> int:
    """Bytes of the announced tensors back to back (``ValueError`` for an unknown dtype)."""
    total = 0
    for name, shape in zip(dtypes, shapes):
        dtype = getattr(torch, str(name).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")  # noqa: TRY004 - a bad value in a request, not a type error
        total += torch.Size([int(x) for x in shape]).numel() * torch.empty((), dtype=dtype).element_size()
    return total
