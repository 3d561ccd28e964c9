"""An OpenAI chat endpoint for black-box agents, in front of any engine the trainer drives.

The embedded engine serves ``/v1/chat/completions`` itself (:mod:`~relax_gym.trainer.gateway.api`), but an
SGLang server's own endpoint records nothing, and in async mode the engine lives in another process. The gateway
runs the same :class:`~relax_gym.trainer.gateway.api.OpenAIAPI` where the episodes run (the colocate
trainer, an env-worker replica): it renders each call with the trainer's processor and generates through the
trainer's engine client (SGLang's ``/generate`` protocol, so the calls batch with every other rollout request), and
records every call's exact prompt ids, completion ids and log-probs under the episode's session.

``sampling``: the trainer's sampling settings. They replace what the agent asks for (temperature, top-p, top-k,
min-p; the agent's ``max_tokens`` is capped at the trainer's ``max_new_tokens``), so the recorded log-probs are
those of the distribution the trainer corrects for, whatever the agent's code says. Binds 127.0.0.1; an episode
reaches only its own session (per-episode keys).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relax_gym.omni.render import Rendered, extend, render
from relax_gym.trainer.engines.http_server import serve_openai
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.engines.protocol import GenerateResponse
from relax_gym.trainer.gateway.api import OpenAIAPI

__all__ = ["ClientEngine", "OpenAIGateway"]

# what the trainer's sampling imposes on every agent call, and the neutral value when the trainer sets none
FORCED = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


class ClientEngine:
    """:class:`OpenAIAPI`'s engine duck type over a processor and an async engine client on ``loop``. Called from
    the HTTP server's threads; the client's coroutines run on the loop (which must not be blocked meanwhile)."""

    def __init__(self, processor: Any, client: Any, loop: asyncio.AbstractEventLoop, *, sampling: Mapping[str, Any],
                 max_positions: int | None = None, model_path: str | None = None) -> None:
        self.processor = processor
        self.client = client
        self.loop = loop
        self.sampling = dict(sampling)
        self.max_positions = max_positions
        self.model_path = model_path
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between the server's threads

    def render(self, messages: Sequence[Any]) -> Rendered:
        with self._tokenizer_lock:
            return render(list(messages), self.processor, add_generation_prompt=True)

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str:
        with self._tokenizer_lock:
            return self.processor.decode(list(ids), **kwargs)

    def extend(self, rendered: Rendered, messages: Sequence[Any], assistant_token_ids: Sequence[int]) -> Rendered:
        with self._tokenizer_lock:
            return extend(rendered, list(messages), assistant_token_ids=list(assistant_token_ids),
                          add_generation_prompt=True, processor=self.processor)

    def generate_rendered(self, prompt_ids: Sequence[int], mm: Any, *, messages: Sequence[Any] = (),
                          sampling_params: Mapping[str, Any], return_logprob: bool = True, top_logprobs_num: int = 0,
                          rid: str | None = None, return_text_in_logprobs: bool = False,
                          on_token: Callable[[int], None] | None = None) -> GenerateResponse:
        """``on_token``: stream the request (each token id handed over as the engine samples it, from the loop's
        thread) where the client can (over HTTP; a Serve handle answers once)."""
        params = dict(sampling_params)  # OpenAIAPI already applied sampling_params(): what it records is what runs
        extra: dict[str, Any] = {"top_logprobs_num": int(top_logprobs_num)} if top_logprobs_num else {}
        if on_token is not None:
            extra["on_token"] = on_token
        coro = self.client.generate(list(prompt_ids), sampling_params=params, return_logprob=True, **extra,
                                    **media_data(list(messages)))
        out = asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        return GenerateResponse.model_validate({"text": out.text, "output_ids": out.output_ids,
                                                "meta_info": {"id": rid or out.rid or "gateway", **out.meta_info}})

    def sampling_params(self, requested: Mapping[str, Any]) -> dict[str, Any]:
        """The request's sampling params with the trainer's settings in force."""
        params = dict(requested)
        params.update({k: self.sampling.get(k, neutral) for k, neutral in FORCED.items()})
        cap = self.sampling.get("max_new_tokens")
        if cap is not None:
            params["max_new_tokens"] = min(int(params.get("max_new_tokens") or cap), int(cap))
        return params


class OpenAIGateway:
    """``/v1`` routes of an :class:`OpenAIAPI` over a :class:`ClientEngine`, served on 127.0.0.1 (a free port).

    :meth:`open_session` gives an episode a session and its key; :meth:`close_session` revokes the key and hands
    back the session's recorded calls."""

    def __init__(self, processor: Any, client: Any, loop: asyncio.AbstractEventLoop, *, sampling: Mapping[str, Any],
                 max_positions: int | None = None, model_name: str = "policy") -> None:
        self.model_name = model_name
        self.engine = ClientEngine(processor, client, loop, sampling=sampling, max_positions=max_positions)
        self.api = OpenAIAPI(self.engine, model_name=model_name,
                             default_max_tokens=int(sampling.get("max_new_tokens") or 512))
        # a token nobody holds: only episode keys (and in-process calls) get through, never an anonymous caller
        self.server = serve_openai(self.api, host="127.0.0.1", port=0, token=secrets.token_urlsafe(32))

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def open_session(self) -> tuple[str, str]:
        """A fresh session id and the key that reaches it (and nothing else)."""
        session = f"episode-{secrets.token_hex(12)}"
        return session, self.api.keys.issue(session)

    def close_session(self, session: str) -> tuple[list[Any], list[str]]:
        """Revoke the session's key and end the session: its recorded calls, in order (empty when the agent made
        none), and the calls that failed on the engine's side (their errors). A call still in flight is not kept."""
        self.api.keys.revoke(session)
        return self.api.recorder.close(session)

    def first_error(self, session: str) -> str | None:
        """The first request of the session's key the gateway refused (then forgotten), or None."""
        return self.api.first_error(session)

    def close(self) -> None:
        self.server.close()
