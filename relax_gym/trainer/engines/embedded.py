"""An in-process rollout engine with SGLang's semantics, on a transformers model (our Qwen2.5-Omni thinker).

:class:`EmbeddedEngine` is what :mod:`~relax_gym.trainer.engines.http_server` serves: a thread-safe engine core with

**Batching.** ``generate`` may be called from many threads at once. Each call validates its requests and
decodes / encodes their media *in the calling thread*, then queues them; one scheduler thread runs them.
By default (``continuous=True``, every dense model) the batch is **continuous**
(:mod:`~relax_gym.trainer.engines.continuous`): queued requests are prefilled and join the running batch between
two decoding steps, and a row that ends is answered and leaves at once -- on multi-turn workloads, where turns arrive
one by one as tools return, this halved the time of an engine call (docs/benchmarks.md). An idle engine first
gathers a wave of arrivals (up to ``max_batch``; the wave closes once ``batch_window_s`` passes without a new
arrival, at most ``8 * batch_window_s`` after the first); a round prefills at most ``max_prefill_tokens`` tokens of
distinct prompts (8,192: SGLang's chunked-prefill size), the rest of the wave waits for the next round. With
``continuous=False`` (MoE policies, whose routing record is cut from one forward) each scheduler round is
**static**: the wave is split into groups whose logits warpers are identical (greedy, or the same ``temperature`` /
``top_p`` / ``top_k`` / ``min_p``), each group is left-padded with the processor's ``collate`` and runs **one**
``model.generate``; a request that arrives meanwhile
waits for the next round. In both, everything else is per request: ``max_new_tokens``, stop token ids, stop
strings, ``ignore_eos``, ``skip_special_tokens``, ``no_stop_trim``, log-prob options. No paged KV cache; identical
prompts of one wave are prefilled once (``shared_prefill``), and with continuous batching a request that continues
an answered one (an episode's next turn: its prompt, the answer, the tool's reply) reuses that request's KV and
prefills only the rest (``prefix_cache``, ``prefix_cache_tokens``; emptied by ``flush_cache`` and every weight
update).

**Media.** A request's ``image_data`` / ``video_data`` / ``audio_data`` items (see
:mod:`~relax_gym.trainer.engines.protocol`) are decoded through relax_gym.omni parts built from the URL and the
relax sampling spec, and encoded with ``processor.encode_media`` -- the same path ``render`` takes, so the media
tensors equal the rendered ones. ``input_ids`` must already hold each item's expanded pad tokens: the number of
``<|IMAGE|>`` / ``<|VIDEO|>`` / ``<|AUDIO|>`` ids must equal what the items expand to, else the request is refused
(:class:`EngineRequestError`, HTTP 400) naming it. ``text`` prompts may instead hold one placeholder per item,
which is expanded.

**Sampling and log-probs.** ``temperature == 0`` is greedy (argmax); otherwise multinomial sampling after
temperature, top-k, top-p and min-p (transformers' warpers). The processor's control and media tokens are never
sampled (they are set to ``-inf`` before anything else). The log-prob returned for each sampled token is under
the *sampling distribution before truncation*: ``log_softmax(masked_logits / T)`` gathered at the token, with
``masked_logits`` the model's logits with the control tokens at ``-inf`` and ``T`` the request's temperature
(``T = 1`` for greedy requests, whose sampler is an argmax). It is what
``token_logprobs(training_logits.masked_fill(control, -inf), ids, temperature=T)`` gives on a training forward of
the same weights (a test checks 1e-4), i.e. the behaviour-policy log-prob an RL loss wants; top-k / top-p / min-p
truncation is *not* renormalised into it (SGLang's default logprobs are likewise pre-truncation).

**Routed experts** (MoE models; SGLang's ``return_routed_experts``). A batch with such a request runs its
``model.generate`` under a :class:`~relax_gym.trainer.policy.routers.RoutingRecorder` (forward hooks on the routers,
removed after the call), and each such row gets the top-k expert ids of every MoE layer for its prompt tokens and
every generated token but the last (the tokens that were forwarded), base64-encoded in ``meta_info`` as SGLang
sends them (:mod:`relax_gym.trainer.policy.routing`). A dense model refuses the flag.

**Finish reasons** follow SGLang's order: ``{"type": "length", "length": max_new_tokens}`` once
``max_new_tokens`` tokens exist (checked first, even if the last one is EOS), else
``{"type": "stop", "matched": token_id}`` for EOS (unless ``ignore_eos``) or a ``stop_token_ids`` id, else
``{"type": "stop", "matched": "<str>"}`` for a stop string found in the decoded completion (the tail of the
last tokens is decoded after every step). ``output_ids`` keep the matched token; ``text`` drops the matched stop
token / everything from the stop string on, unless ``no_stop_trim``. ``{"type": "abort", ...}`` for aborted
requests (their tokens so far are returned).

**Weights** (:class:`~relax_gym.trainer.engines.weight_updates.WeightUpdates`, which the engine mixes in):
named tensors, safetensors checkpoints and the distributed path; applied between decoding steps (continuous) or
between batches (static) under the model lock.

**Pause.** :meth:`pause` stops the scheduler: requests queue until :meth:`resume`. ``mode="abort"`` first aborts
the running rows (at the next decode step; their requests finish with ``finish_reason.type == "abort"`` and the
tokens so far) and every queued request. Continuous batching: ``"in_place"`` and ``"retract"`` freeze the running
rows between two steps with their KV cache, and they go on after :meth:`resume` on the new weights (SGLang's
``in_place``; ``retract`` would recompute their cache on the new weights -- deviation: the cache is kept); each
answer reports the version it was admitted under, the oldest that produced its tokens. Static rounds: ``in_place``
and ``retract`` let the running batch finish on the old weights. In every mode ``pause`` returns once no step or
batch runs, so weights can be swapped safely. :meth:`flush_cache` empties the prefix cache.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from relax_gym.omni.render import concat_media
from relax_gym.trainer.engines.protocol import EngineRequest, FinishReason, GenerateReqInput, GenerateResponse, MetaInfo, SamplingParams
from relax_gym.trainer.engines.validation import parse_request
from relax_gym.trainer.engines.continuous import ContinuousBatch
from relax_gym.trainer.engines.shared_prefill import plan_sharing, prefill, prompt_key
from relax_gym.trainer.policy.routers import RoutingRecorder, moe_routers
from relax_gym.trainer.policy.routing import encode_routed_experts

from relax_gym.trainer.engines.errors import EngineClosedError, EngineRequestError
from relax_gym.trainer.engines.generation_hooks import ABORT_MESSAGE, LogprobRecorder, PendingRequest, PromptRow, RowStopper, finite_or_none
from relax_gym.trainer.engines.weight_staging import WeightStaging
from relax_gym.trainer.engines.weight_updates import WeightUpdates

__all__ = ["EmbeddedEngine", "EngineClosedError", "EngineRequestError"]

logger = logging.getLogger(__name__)

_PAD_NAMES = {"image": "<|IMAGE|>", "video": "<|VIDEO|>", "audio": "<|AUDIO|>"}


# ---------------------------------------------------------------------------------------------- engine


class EmbeddedEngine(WeightUpdates):
    """The engine core (see the module doc). ``model``: a transformers generative model (the policy's thinker);
    ``processor``: its :class:`~relax_gym.trainer.policy.OmniProcessor` (or anything with the same
    ``collate`` / ``encode_media`` / ``encode_text`` / ``decode`` / ``media_token_ids`` / ``control_token_ids`` /
    ``eos_token_id`` / ``pad_token_id``). The engine uses the model in place: updates change ``model``'s weights."""

    def __init__(self, model: Any, processor: Any, *, max_batch: int = 16, batch_window_s: float = 0.005,
                 weight_version: str = "0", model_path: str | None = None, decode_cache: Any = "default",
                 dist_timeout_s: float = 120.0, share_prefill: bool = True, weight_receiver: Any = None,
                 continuous: bool | None = None, prefix_cache_tokens: int = 1 << 16,
                 max_prefill_tokens: int = 8192) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        from relax_gym.omni import default_cache

        self.model = model
        self.processor = processor
        self.max_batch = int(max_batch)
        self.max_prefill_tokens = int(max_prefill_tokens)  # distinct prompt tokens one prefill takes (_take_locked)
        self.batch_window_s = float(batch_window_s)
        self.model_path = model_path
        self.dist_timeout_s = float(dist_timeout_s)
        self.share_prefill = bool(share_prefill)  # prefill identical prompts of a batch once (shared_prefill.py)
        self.weight_receiver = weight_receiver  # joins weight-update groups and receives their broadcasts
        self._cache = default_cache if decode_cache == "default" else decode_cache
        self._weight_version = str(weight_version)
        model.eval()
        self._device = next(model.parameters()).device
        gen = getattr(model, "generation_config", None)
        control = set(int(i) for i in processor.control_token_ids) | set(int(i) for i in (getattr(gen, "suppress_tokens", None) or []))
        eos = {int(processor.eos_token_id)}
        gen_eos = getattr(gen, "eos_token_id", None)
        eos |= {int(i) for i in ([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))}
        self.eos_token_ids = frozenset(eos - control)
        self.control_token_ids = sorted(control - eos)
        self._control = torch.tensor(self.control_token_ids, dtype=torch.long)
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        self.max_positions = int(getattr(text_config, "max_position_embeddings", 0) or 0) or None
        self._neutral_generation = GenerationConfig(
            pad_token_id=int(processor.pad_token_id), eos_token_id=None, bos_token_id=None,
            suppress_tokens=self.control_token_ids, do_sample=False, repetition_penalty=1.0, num_beams=1,
        )
        self._state = model.state_dict(keep_vars=True)
        self._names = self._build_name_map()
        self.moe = bool(moe_routers(model))  # routed experts can be recorded (return_routed_experts)
        # continuous batching (continuous.py); an MoE policy's routing record is cut from one generate's forward:
        # those run in static rounds
        self.continuous = (not self.moe) if continuous is None else bool(continuous)
        self.prefix_cache_tokens = int(prefix_cache_tokens)  # continuous batching: ended rows' KV kept (prefix_cache.py)
        if self.continuous and self.moe:
            raise ValueError("continuous batching cannot record an MoE policy's routed experts: use continuous=False")
        self._batch = ContinuousBatch(self) if self.continuous else None

        self._cv = threading.Condition()
        self._queue: deque[PendingRequest] = deque()
        self._paused = False
        self._running = False
        self._closed = False
        self._abort_event = threading.Event()
        self._model_lock = threading.RLock()
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between threads
        self._groups: dict[str, Any] = {}
        self._group_locks: dict[str, threading.Lock] = {}
        self._groups_lock = threading.Lock()
        self._staging = WeightStaging(timeout_s=self.dist_timeout_s)  # buckets of staged pushes, until applied
        self._stats = {"requests": 0, "batches": 0, "generate_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                       "aborted": 0, "max_batch_seen": 0, "generate_seconds": 0.0, "weight_updates": 0,
                       "shared_prefill_rows": 0, "prefix_cache_hits": 0, "prefix_cached_tokens": 0}
        self._thread = threading.Thread(target=self._loop, name="embedded-engine-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ public: generate

    def generate(self, request: GenerateReqInput | Mapping[str, Any] | EngineRequest | Sequence[EngineRequest], *,
                 timeout: float | None = None,
                 on_token: Callable[[int], None] | None = None) -> GenerateResponse | list[GenerateResponse]:
        """Run requests (blocking, thread-safe). ``request``: a :class:`GenerateReqInput` or its JSON dict (single
        → one :class:`GenerateResponse`, batch → a list), an :class:`EngineRequest`, or a list of them (→ a list).
        Raises :class:`EngineRequestError` for a refused request (nothing of the call runs). ``on_token`` (one
        request only): called with each token id as it is sampled, from the scheduler thread (it must not block);
        with ``continuous=False`` the tokens come only with the answer."""
        single = False
        if isinstance(request, Mapping):
            try:
                request = parse_request(GenerateReqInput, dict(request))
            except ValueError as exc:
                raise EngineRequestError(str(exc)) from None
        if isinstance(request, GenerateReqInput):
            single = not request.is_batch
            try:
                reqs = request.split()
            except ValueError as exc:
                raise EngineRequestError(str(exc)) from None
        elif isinstance(request, EngineRequest):
            single, reqs = True, [request]
        else:
            reqs = list(request)
        pending = [self._prepare(r) for r in reqs]
        if on_token is not None:
            if len(pending) != 1:
                raise EngineRequestError(f"on_token streams one request, not {len(pending)}")
            pending[0].on_token = on_token
        self._submit(pending)
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for p in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(p.future.result(timeout=left))
        return out[0] if single else out

    def render(self, messages: Sequence[Any]) -> Any:
        """Render a conversation (:class:`~relax_gym.omni.Message` list) with the engine's processor and media
        cache, ending with the generation prompt (:func:`relax_gym.omni.render.render`). Media are decoded
        first, outside the tokenizer lock; tokenisation runs under it."""
        from relax_gym.omni.render import render

        self._predecode(messages)
        with self._tokenizer_lock:
            return render(list(messages), self.processor, cache=self._cache)

    def extend(self, rendered: Any, messages: Sequence[Any], assistant_token_ids: Sequence[int] | None = None) -> Any:
        """Continue a :meth:`render` result token-in-token-out (:func:`relax_gym.omni.render.extend` with the
        engine's processor and media cache): ``assistant_token_ids`` (the ids sampled for the open generation
        prompt) appended as they are, then ``messages`` and the next generation prompt."""
        from relax_gym.omni.render import extend

        self._predecode(messages)
        with self._tokenizer_lock:
            return extend(rendered, list(messages), assistant_token_ids=assistant_token_ids, add_generation_prompt=True,
                          processor=self.processor, cache=self._cache)

    def _predecode(self, messages: Sequence[Any]) -> None:
        """Decode the messages' media into the cache, outside the tokenizer lock."""
        if self._cache is not None:
            for message in messages:
                for part in message.media():
                    part.decode(self._cache)

    def generate_rendered(self, input_ids: Sequence[int], mm: Mapping[str, torch.Tensor] | None = None, *,
                          sampling_params: SamplingParams | Mapping[str, Any] | None = None, return_logprob: bool = True,
                          top_logprobs_num: int = 0, return_text_in_logprobs: bool = False, rid: str | None = None,
                          timeout: float | None = None, messages: Sequence[Any] | None = None,
                          on_token: Callable[[int], None] | None = None) -> GenerateResponse:
        """One request whose media are already encoded: ``input_ids`` with each item's pad tokens expanded and
        ``mm`` the concatenated media tensors, as :meth:`render` returns them (so nothing is decoded twice).
        Same checks, batching and response as :meth:`generate`. ``messages`` (the conversation that was rendered,
        which the OpenAI layer passes for engines that want it) is ignored: the ids say everything. ``on_token``
        as for :meth:`generate`."""
        try:
            sp = sampling_params if isinstance(sampling_params, SamplingParams) else SamplingParams.model_validate(dict(sampling_params or {}))
        except ValueError as exc:
            raise EngineRequestError(f"sampling_params: {exc}") from None
        ids = [int(t) for t in input_ids]
        req = EngineRequest(rid=rid or uuid.uuid4().hex, input_ids=ids, sampling_params=sp,
                            return_logprob=return_logprob, top_logprobs_num=int(top_logprobs_num),
                            return_text_in_logprobs=return_text_in_logprobs)
        self._check_ids(req.where, ids)
        pending = self._pending(req, ids, dict(mm or {}))
        pending.on_token = on_token
        self._submit([pending])
        return pending.future.result(timeout=timeout)

    def health_check(self, timeout: float = 20.0) -> bool:
        """A 1-token greedy generate (what SGLang's ``/health_generate`` runs). While paused it only checks that
        the scheduler thread is alive (a generate would wait for ``resume``)."""
        if self._closed or not self._thread.is_alive():
            return False
        if self._paused:
            return True
        req = EngineRequest(rid=f"HEALTH_CHECK_{time.time()}", input_ids=[int(self.processor.eos_token_id)],
                            sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0))
        try:
            self.generate(req, timeout=timeout)
            return True
        except Exception:  # noqa: BLE001 - any failure is "unhealthy"
            logger.exception("health check generate failed")
            return False

    # ------------------------------------------------------------------------------------------ public: control

    def pause(self, mode: str = "abort") -> None:
        """Stop starting batches (see the module doc); returns once no batch runs."""
        if mode not in ("abort", "retract", "in_place"):
            raise EngineRequestError(f"mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        with self._cv:
            self._paused = True
            if mode == "abort":
                self._abort_all_locked()
            while self._running:
                self._cv.wait()

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def alive(self) -> bool:
        """The engine is open and its scheduler thread runs."""
        return not self._closed and self._thread.is_alive()

    def abort_all(self) -> int:
        """Abort the running batch (at its next step) and every queued request; returns how many were queued."""
        with self._cv:
            return self._abort_all_locked()

    def flush_cache(self) -> bool:
        """Empty the prefix cache (the running rows keep theirs); always succeeds."""
        self._clear_prefix()
        return True

    def _clear_prefix(self) -> None:
        if self._batch is not None and self._batch.prefix is not None:
            self._batch.prefix.clear()

    @property
    def device(self) -> torch.device:
        """Where the model's weights live."""
        return self._device

    @property
    def weight_version(self) -> str:
        return self._weight_version

    def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> None:
        if abort_all_requests:
            self.abort_all()
        with self._model_lock:
            self._weight_version = str(new_version)
            self._clear_prefix()  # its entries were computed by the old weights (they would not match anyway)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {**self._stats, "queued": len(self._queue), "running": self._running, "paused": self._paused,
                    "weight_version": self._weight_version}

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._abort_all_locked()
            self._cv.notify_all()
        self._thread.join(timeout)
        with self._groups_lock:
            for group in self._groups.values():
                self.weight_receiver.leave(group)
            self._groups.clear()

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ requests: internals

    def _prepare(self, req: EngineRequest) -> PendingRequest:
        """Validate one request and resolve its media (caller's thread). Raises :class:`EngineRequestError`."""
        where = req.where
        from_text = req.input_ids is None
        ids = self._encode_text(req.text or "") if from_text else list(req.input_ids or [])
        self._check_ids(where, ids)
        items: list[dict[str, torch.Tensor]] = []
        for kind in ("image", "video", "audio"):
            given = req.media.get(kind, [])
            pad = int(self.processor.media_token_ids[kind])
            encodings = [self._encode_item(kind, i, item, where) for i, item in enumerate(given)]
            expanded = sum(len(e.token_ids) for e in encodings)
            count = ids.count(pad)
            if from_text and count == len(encodings) and count != expanded:
                ids = self._expand(ids, pad, encodings)
                count = expanded
            if count != expanded:
                token = _PAD_NAMES.get(kind, kind)
                raise EngineRequestError(
                    f"{where}: input_ids hold {count} {token} pad token(s) but {kind}_data gives {len(encodings)} "
                    f"item(s) that expand to {expanded}: the media does not match the prompt")
            items.extend(dict(e.tensors) for e in encodings)
        return self._pending(req, ids, concat_media(items))

    def _check_ids(self, where: str, ids: Sequence[int]) -> None:
        if not ids:
            raise EngineRequestError(f"{where}: the prompt is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"{where}: input_ids hold ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")

    def _pending(self, req: EngineRequest, ids: list[int], mm: dict[str, torch.Tensor]) -> PendingRequest:
        """The checks every request passes once its prompt and media tensors are known (lengths, stop ids)."""
        where, sp = req.where, req.sampling_params
        if self.max_positions is not None and len(ids) + sp.max_new_tokens > self.max_positions:
            raise EngineRequestError(f"{where}: prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds "
                                     f"the model's {self.max_positions} positions")
        bad_stop = [t for t in sp.stop_token_ids or [] if not 0 <= t < self.vocab_size]
        if bad_stop:
            raise EngineRequestError(f"{where}: sampling_params.stop_token_ids outside the vocabulary: {bad_stop[:5]}")
        if req.return_routed_experts and not self.moe:
            raise EngineRequestError(f"{where}: return_routed_experts needs a mixture-of-experts model; "
                                     f"{type(self.model).__name__} has no MoE layers")
        stop_ids = frozenset(int(t) for t in sp.stop_token_ids or []) | (frozenset() if sp.ignore_eos else self.eos_token_ids)
        return PendingRequest(req=req, input_ids=ids, mm=mm, stop_ids=stop_ids, stop_strs=sp.stop_strings,
                        submitted=time.monotonic())

    def _encode_text(self, text: str) -> list[int]:
        with self._tokenizer_lock:
            return [int(t) for t in self.processor.encode_text(text)]

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str:
        """``ids`` as text (the processor's ``decode``; thread-safe): what a stream of this engine's tokens says."""
        return self._decode(ids, **kwargs)

    def _decode(self, ids: Sequence[int], **kwargs: Any) -> str:
        with self._tokenizer_lock:
            return self.processor.decode(list(ids), **kwargs)

    def _encode_item(self, kind: str, i: int, item: Any, where: str) -> Any:
        from relax_gym.omni import from_openai

        key = f"{kind}_url"
        js = {"type": key, key: {"url": item.url}}
        if item.sampling is not None:
            js["sampling"] = item.sampling
        try:
            (part,) = from_openai([{"role": "user", "content": [js]}])[0].content
            decoded = part.decode(self._cache)
            return self.processor.encode_media(kind, decoded)
        except (ValueError, OSError, TypeError) as exc:  # ConversationFormatError, MediaError are ValueErrors
            raise EngineRequestError(f"{where}: {kind}_data[{i}] ({item.url[:120]}): {exc}") from None

    @staticmethod
    def _expand(ids: list[int], pad: int, encodings: Sequence[Any]) -> list[int]:
        out: list[int] = []
        queue = list(encodings)
        for t in ids:
            if t == pad:
                out.extend(int(x) for x in queue.pop(0).token_ids)
            else:
                out.append(t)
        return out

    def _submit(self, pending: Sequence[PendingRequest]) -> None:
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            self._queue.extend(pending)
            self._cv.notify_all()

    def _abort_all_locked(self) -> int:
        if self._running:
            self._abort_event.set()
        elif self._batch is not None and len(self._batch):  # between steps (the cv is held): answer them now
            self._batch.abort(FinishReason(type="abort", message=ABORT_MESSAGE))
        n = len(self._queue)
        while self._queue:
            p = self._queue.popleft()
            self._resolve(p, [], None, FinishReason(type="abort", message=ABORT_MESSAGE), self._weight_version)
        return n

    # ------------------------------------------------------------------------------------------ scheduler

    def _count(self, key: str, n: float) -> None:
        with self._cv:
            self._stats[key] += n

    def _gather_wave_locked(self) -> bool:
        """With the cv held and requests queued: wait until the wave of arrivals ends -- a quiet
        ``batch_window_s`` without a new request (at most 8 windows) or ``max_batch`` queued. False when the engine
        closed or paused meanwhile, or the queue emptied (aborted)."""
        first = time.monotonic()
        deadline, seen = first + self.batch_window_s, len(self._queue)
        while len(self._queue) < self.max_batch and not self._closed and not self._paused:
            now = time.monotonic()
            if len(self._queue) > seen:
                seen = len(self._queue)
                deadline = min(now + self.batch_window_s, first + 8 * self.batch_window_s)
            if now >= deadline:
                break
            self._cv.wait(deadline - now)
        return not self._closed and not self._paused and bool(self._queue)

    def _take_locked(self, room: int) -> list[PendingRequest]:
        """With the cv held: up to ``room`` queued requests, in arrival order, whose distinct prompts hold at most
        ``max_prefill_tokens`` tokens together (always at least one); the rest wait for the next round (SGLang's
        ``--max-prefill-tokens`` / ``--chunked-prefill-size``). A prefill's activations grow with its prompt tokens: at
        Qwen2.5-Omni-3B's width a NExT-QA clip of 8 frames is ~650 tokens and ~90 MB of them (the vision tower's MLP
        over its 2,304 patches, mostly), so a wave of 64 distinct eval prompts prefilled at once took 6 GB beside the
        weights, 128 rollouts 12 GB; 8,192 tokens is ~1.1 GB. Identical prompts (a GRPO group: same ids, same media)
        count once, as they are prefilled once (shared_prefill)."""
        taken: list[PendingRequest] = []
        seen: set[tuple] = set()
        tokens = 0
        while self._queue and len(taken) < room:
            p = self._queue[0]
            key = prompt_key(p.input_ids, p.mm)
            cost = 0 if key in seen else len(p.input_ids)
            if taken and tokens + cost > self.max_prefill_tokens:
                break
            taken.append(self._queue.popleft())
            seen.add(key)
            tokens += cost
        return taken

    def _loop(self) -> None:
        if self._batch is not None:
            self._loop_continuous(self._batch)
            return
        while True:
            with self._cv:
                while not self._closed and (self._paused or not self._queue):
                    self._cv.wait()
                if self._closed:
                    return
                if not self._gather_wave_locked():
                    if self._closed:
                        return
                    continue
                batch = self._take_locked(self.max_batch)
                self._running = True
                self._abort_event = threading.Event()
                abort = self._abort_event
                self._stats["batches"] += 1
                self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(batch))
            try:
                self._run_batch(batch, abort)
            except BaseException as exc:  # noqa: BLE001 - never let the scheduler die
                logger.exception("embedded engine batch failed")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            finally:
                with self._cv:
                    self._running = False
                    self._cv.notify_all()

    def _loop_continuous(self, batch: ContinuousBatch) -> None:
        """The continuous scheduler: each round admits the queued requests (room permitting) or runs one decoding
        step of the running rows. An idle engine first waits for a wave of arrivals (the batch window)."""
        while True:
            with self._cv:
                while not self._closed and (self._paused or (not self._queue and not len(batch))):
                    self._cv.wait()
                if self._closed:
                    return
                if not len(batch) and not self._gather_wave_locked():
                    if self._closed:
                        return
                    continue
                admitted = self._take_locked(self.max_batch - len(batch))
                self._running = True
                self._abort_event = threading.Event()
                abort = self._abort_event
                if admitted:
                    self._stats["batches"] += 1
            t0 = time.monotonic()
            try:
                with self._model_lock:
                    if admitted:
                        batch.admit(admitted, self._weight_version)
                    else:
                        batch.step()
                    if abort.is_set():
                        batch.abort(FinishReason(type="abort", message=ABORT_MESSAGE))
            except BaseException as exc:  # noqa: BLE001 - never let the scheduler die: fail what was running
                logger.exception("embedded engine step failed")
                failed = [r.p for r in batch.drop_all()] + admitted
                for p in failed:
                    if not p.future.done():
                        p.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            finally:
                with self._cv:
                    self._stats["generate_calls"] += 1
                    self._stats["generate_seconds"] += time.monotonic() - t0
                    self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(batch))
                    self._running = False
                    self._cv.notify_all()

    def _run_batch(self, batch: list[PendingRequest], abort: threading.Event) -> None:
        groups: dict[tuple, list[PendingRequest]] = {}
        for p in batch:
            groups.setdefault(p.sp.warper_key(), []).append(p)
        with self._model_lock:
            version = self._weight_version
            for rows in groups.values():
                if abort.is_set():
                    for p in rows:
                        self._resolve(p, [], None, FinishReason(type="abort", message=ABORT_MESSAGE), version)
                    continue
                try:
                    self._run_group(rows, abort, version)
                except Exception as exc:  # noqa: BLE001 - fail this group's requests, keep the others
                    logger.exception("embedded engine generate failed")
                    for p in rows:
                        if not p.future.done():
                            p.future.set_exception(exc)

    def _run_group(self, rows: list[PendingRequest], abort: threading.Event, version: str) -> None:
        for p in [p for p in rows if p.sp.max_new_tokens == 0]:
            self._resolve(p, [], [] if p.req.return_logprob else None, FinishReason(type="length", length=0), version)
        active = [p for p in rows if p.sp.max_new_tokens > 0]
        if not active:
            return
        sp = active[0].sp
        greedy = sp.greedy
        temperature = 1.0 if greedy else sp.temperature
        wants_routing = any(p.req.return_routed_experts for p in active)
        # identical prompts (a GRPO group) are prefilled once (a routing record's prefill rows are copied the same way)
        plan = None if not self.share_prefill else plan_sharing(
            [(p.input_ids, p.mm) for p in active], set(self.processor.media_token_ids.values()))
        rows_in = active if plan is None else [active[u] for u in plan.unique]
        batch = self.processor.collate([PromptRow(p.input_ids, [0] * len(p.input_ids), p.mm) for p in rows_in], padding_side="left")
        batch.pop("loss_mask", None)
        batch = {k: v.to(self._device) for k, v in batch.items()}
        prompt_len = int(batch["input_ids"].shape[1])
        top_n = max((p.req.top_logprobs_num for p in active if p.req.return_logprob), default=0)
        recorder = LogprobRecorder(temperature, self._control, prompt_len, top_n)
        stopper = RowStopper(active, prompt_len, lambda ids: self._decode(ids, skip_special_tokens=False), abort)
        warpers: dict[str, Any] = {} if greedy else {
            "temperature": temperature, "top_p": sp.top_p, "top_k": sp.top_k if sp.top_k > 0 else 0,
            "min_p": sp.min_p if sp.min_p > 0 else None}
        config = GenerationConfig(
            do_sample=not greedy, max_new_tokens=max(p.sp.max_new_tokens for p in active),
            pad_token_id=int(self.processor.pad_token_id), eos_token_id=None, bos_token_id=None,
            suppress_tokens=self.control_token_ids, num_beams=1, repetition_penalty=1.0, **warpers,
        )
        t0 = time.monotonic()
        saved = getattr(self.model, "generation_config", None)
        self.model.generation_config = self._neutral_generation  # nothing of the checkpoint's config leaks in
        routing = RoutingRecorder(self.model, len(active)) if wants_routing else None
        try:
            with torch.inference_mode(), (routing if routing is not None else contextlib.nullcontext()):
                if plan is None:
                    inputs = batch
                else:
                    if routing is not None:
                        routing.batch = len(plan.unique)  # the prefill forward runs on the distinct prompts
                    inputs = prefill(self.model, batch, plan.index)
                    if routing is not None:
                        routing.spread(plan.index)  # its records go to every row that shares them, like the cache
                        routing.batch = len(active)
                sequences = self.model.generate(**inputs, generation_config=config,
                                                logits_processor=LogitsProcessorList([recorder]),
                                                stopping_criteria=StoppingCriteriaList([stopper]))
        finally:
            self.model.generation_config = saved
        elapsed = time.monotonic() - t0
        if not isinstance(sequences, torch.Tensor):
            sequences = sequences.sequences
        recorder.finish(sequences)
        sequences = sequences.cpu()
        generated = sequences.shape[1] - prompt_len
        with self._cv:
            self._stats["generate_calls"] += 1
            self._stats["generate_seconds"] += elapsed
            self._stats["shared_prefill_rows"] += plan.saved_rows if plan is not None else 0
        ends = [e if e is not None else generated for e in stopper.ends]
        routed = None
        if routing is not None:  # row b: its prompt (left-padded) and every generated token but the last
            routed = routing.rows([prompt_len - len(p.input_ids) for p in active],
                                  [len(p.input_ids) + e - 1 for p, e in zip(active, ends)])
        for b, p in enumerate(active):
            end, reason = stopper.ends[b], stopper.reasons[b]
            if end is None:  # the loop ended without our criterion (e.g. a model max length)
                end, reason = generated, FinishReason(type="length", length=generated)
            ids = sequences[b, prompt_len:prompt_len + end].tolist()
            logprobs = recorder.row(b, len(ids)) if p.req.return_logprob else None
            top = recorder.top_row(b, len(ids)) if (p.req.return_logprob and p.req.top_logprobs_num) else None
            if top is not None:
                top = [entry[: p.req.top_logprobs_num] for entry in top]
            experts = routed[b] if routed is not None and p.req.return_routed_experts else None
            self._resolve(p, ids, logprobs, reason, version, top=top, routed_experts=experts)

    def _resolve(self, p: PendingRequest, ids: list[int], logprobs: list[float] | None, reason: FinishReason | None,
                 version: str, *, top: list[list[tuple[float, int]]] | None = None,
                 routed_experts: torch.Tensor | None = None) -> None:
        sp, req = p.sp, p.req
        text_ids = ids
        if reason is not None and reason.type == "stop" and isinstance(reason.matched, int) and not sp.no_stop_trim and ids:
            text_ids = ids[:-1]
        text = self._decode(text_ids, skip_special_tokens=sp.skip_special_tokens) if text_ids else ""
        if reason is not None and reason.type == "stop" and isinstance(reason.matched, str) and not sp.no_stop_trim:
            cut = text.find(reason.matched)
            if cut >= 0:
                text = text[:cut]
        token_text = (lambda t: self._decode([t], skip_special_tokens=False)) if req.return_text_in_logprobs else (lambda t: None)
        meta = MetaInfo(
            id=req.rid, finish_reason=reason, prompt_tokens=len(p.input_ids), completion_tokens=len(ids),
            cached_tokens=0, weight_version=version, e2e_latency=time.monotonic() - p.submitted,
        )
        if req.return_logprob:
            meta.output_token_logprobs = [(finite_or_none(lp), t, token_text(t)) for lp, t in zip(logprobs or [], ids)]
            meta.input_token_logprobs = []
            if req.top_logprobs_num:
                meta.output_top_logprobs = [[(finite_or_none(v), i, token_text(i)) for v, i in step] for step in (top or [])]
                meta.input_top_logprobs = []
        if routed_experts is not None:
            meta.routed_experts, meta.routed_experts_dtype = encode_routed_experts(routed_experts)
        with self._cv:
            self._stats["requests"] += 1
            self._stats["prompt_tokens"] += len(p.input_ids)
            self._stats["completion_tokens"] += len(ids)
            if reason is not None and reason.type == "abort":
                self._stats["aborted"] += 1
        if not p.future.done():
            p.future.set_result(GenerateResponse(text=text, output_ids=ids, meta_info=meta))
