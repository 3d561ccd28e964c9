"""What a push reports and how it fails (shared by the client, the transports and the pushers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["DCSEngineError", "DCSError", "DCSPushError", "PushReport", "Version"]

Version = int | str


class DCSError(RuntimeError):
    """A DCS operation could not be done (bad input, no engines, ...)."""


class DCSEngineError(DCSError):
    """One engine failed one step; ``url`` names it, ``step`` the protocol call, ``cause`` what went wrong."""

    def __init__(self, url: str, step: str, cause: BaseException | str) -> None:
        self.url, self.step, self.cause = url, step, cause
        self.reason = str(cause).replace(url, "") or type(cause).__name__  # the URL is said once, up front
        super().__init__(f"engine {url}: {step} failed: {self.reason}")


class DCSPushError(DCSError):
    """A push did not complete. ``url`` / ``step``: the failing engine (None when the actor's side failed) and
    call; ``version``: the version that was being pushed; ``paused``: engines left paused; ``untouched``: no
    engine is paused or changed its weights (the push failed while staging or at the pause step), so trying
    the push again is safe."""

    def __init__(self, message: str, *, url: str | None, step: str, version: Version, paused: Sequence[str] = (),
                 untouched: bool = False) -> None:
        super().__init__(message)
        self.url, self.step, self.version, self.paused = url, step, version, tuple(paused)
        self.untouched = untouched


@dataclass(frozen=True)
class PushReport:
    """One completed push: ``bytes`` sent to each engine, wall ``seconds`` (stage + pause + load + resume),
    ``buckets`` planned, the ``transport`` used, the ``version`` now live and on how many ``engines``;
    ``phases``: seconds per step (``stage``, ``pause``, ``load``, ``resume``); ``paused_seconds``: how long the
    engines did not generate (from the pause call until every engine resumed and reported the version)."""

    bytes: int
    seconds: float
    buckets: int
    transport: str
    version: Version = 0
    engines: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    paused_seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / (1 << 20) / self.seconds if self.seconds > 0 else float("inf")
