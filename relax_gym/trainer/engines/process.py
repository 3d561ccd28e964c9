"""An embedded engine served from a child process: what an inference replica looks like from the actor.

    with spawn_engine(PolicyConfig(seed=1)) as proc:      # builds the policy in the child, serves on loopback
        client = EngineClient(proc.url)
        ...

The child (``multiprocessing`` spawn context: a fresh interpreter, no state inherited) builds the policy from
its :class:`~relax_gym.trainer.policy.PolicyConfig`, wraps it in an
:class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`, serves it with
:func:`~relax_gym.trainer.engines.http_server.serve` and reports its URL through a pipe. It shuts down when the
parent says so or when the pipe closes (the parent died), so it never outlives its parent. :meth:`EngineProcess.kill`
ends it abruptly (an engine that died).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from relax_gym.watchdog import guard

__all__ = ["EngineProcess", "spawn_engine"]


def _serve_child(config_json: str, engine_kwargs: dict[str, Any], host: str, threads: int | None, conn: Any) -> None:
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        from relax_gym.trainer.engines.embedded import EmbeddedEngine
        from relax_gym.trainer.engines.http_server import serve
        from relax_gym.trainer.policy.model import PolicyConfig, build_policy

        model, processor = build_policy(PolicyConfig.model_validate_json(config_json))
        engine = EmbeddedEngine(model, processor, **engine_kwargs)
        server = serve(engine, host=host, close_engine=True)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        conn.close()
        return
    conn.send(("url", server.url))
    try:
        conn.recv()  # "stop", or EOFError when the parent is gone
    except (EOFError, OSError):
        pass
    finally:
        server.close()


class EngineProcess:
    """A running engine child: ``.url``, ``.pid``, :meth:`stop` (clean), :meth:`kill` (abrupt); a context manager."""

    def __init__(self, process: Any, conn: Any, url: str) -> None:
        self.process, self._conn, self.url = process, conn, url

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, timeout: float = 20.0) -> None:
        """Ask the child to close its server and engine; kill it if it does not exit within ``timeout``."""
        try:
            self._conn.send("stop")
        except (OSError, BrokenPipeError):
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
        self._conn.close()

    def kill(self) -> None:
        """End the child at once (SIGKILL), as a crashed replica would."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def spawn_engine(config: Any = None, *, host: str = "127.0.0.1", threads: int | None = 1, timeout: float = 180.0,
                 **engine_kwargs: Any) -> EngineProcess:
    """Start an engine child for ``config`` (a :class:`~relax_gym.trainer.policy.PolicyConfig`; default the tiny
    random policy) and return once it serves. ``threads``: torch threads in the child; ``engine_kwargs`` go to
    :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`. ``RuntimeError`` with the child's error if it
    fails to start, ``TimeoutError`` if it takes longer than ``timeout``."""
    from relax_gym.trainer.policy.model import PolicyConfig

    config = config if config is not None else PolicyConfig()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve_child, args=(config.model_dump_json(), engine_kwargs, host, threads, child),
                          name="relax-engine", daemon=True)
    process.start()
    guard(process)  # ``daemon`` only covers a normal exit of this process
    child.close()
    if not parent.poll(timeout):
        process.kill()
        process.join(5)
        raise TimeoutError(f"the engine process did not start serving within {timeout} s")
    try:
        kind, value = parent.recv()
    except EOFError:
        process.join(5)
        raise RuntimeError(f"the engine process exited during start-up (exit code {process.exitcode})") from None
    if kind == "error":
        process.join(5)
        raise RuntimeError(f"the engine process failed to start: {value}")
    return EngineProcess(process, parent, value)
