"""The genrm role: the LLM judge's engine (``judge:``), one per replica, scaled on its own (``roles.genrm``).

It serves the frozen judge model with SGLang's ``/generate`` over deployment-handle calls, exactly as the
inference role serves the policy (the embedded engine in the replica, or a launched SGLang server), but it never
takes weight pushes: the judge does not train. Env workers reach it with a
:class:`~relax_gym.trainer.engines.serve_client.HandleEngineClient` and run the judge's code
(:class:`~relax_gym.trainer.rewards.judge.Judge`: prompt rendering, verdict parsing, time limits) on their side,
per episode as it ends; the client coalesces the worker's concurrent judge calls into batch requests.

Recovery (level 1): the role holds no state, so a dead replica is simply replaced by Serve; calls that hit it are
resent by the workers' clients while the new one starts (``roles.replica_wait_s``), and a call that still fails is a
failed verdict (the episode is masked ``judge_error``, never lost).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from relax_gym.trainer.async_engine.replica import (
    announce_replica,
    replica_name,
    setup_replica,
)
from relax_gym.trainer.config import JudgeSection
from relax_gym.trainer.engines.client import EngineHTTPError
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.rewards.judge_host import judge_policy

__all__ = ["GenRMRole"]

log = logging.getLogger(__name__)


class GenRMRole:
    """``judge``: the run's ``judge:`` section (a dict) with ``model`` already a checkpoint directory."""

    def __init__(self, judge: dict[str, Any], *, torch_threads: int | None = None, registry: Any = None) -> None:
        setup_replica(torch_threads)
        section = JudgeSection.model_validate(judge)
        self.host = start_engine(section.inference(), judge_policy(section))
        self._threads = ThreadPoolExecutor(max_workers=max(64, 4 * section.max_batch), thread_name_prefix="genrm")
        self.name = replica_name()
        announce_replica(registry, "genrm")

    async def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        """One ``/generate`` body (a batch request for coalesced calls): ``(200, answer)``, or ``(status, message)``
        for a refused request or an engine failure — the replica never fails a call itself."""
        loop = asyncio.get_running_loop()
        try:
            return 200, await loop.run_in_executor(self._threads, self.host.generate, body)
        except EngineHTTPError as exc:
            return exc.status_code, exc.message
        except Exception as exc:  # noqa: BLE001 - an engine failure is a 500 answer
            log.warning("genrm replica %s: generate failed: %s: %s", self.name, type(exc).__name__, exc)
            return int(getattr(exc, "status_code", 500) or 500), f"{type(exc).__name__}: {exc}"

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine stopped is replaced."""
        if not self.host.alive:
            raise RuntimeError(f"genrm replica {self.name}: the {self.host.kind} judge engine is not running")

    def __del__(self) -> None:
        try:
            self.host.close()
            self._threads.shutdown(wait=False, cancel_futures=True)
        except Exception:
            log.debug("genrm replica teardown failed", exc_info=True)
