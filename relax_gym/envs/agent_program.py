"""Agent-program environments: the episode is a program that talks to "the model" over OpenAI's chat API.

Users bring agents they did not write for a trainer: a script on the ``openai`` client, an agent SDK, a coding
agent. Such an env describes a task (files for the agent's working directory, the command that starts it, a
scorer for what it leaves behind) and never sees a turn. Two ways to play it:

- **black box** (the trainer): :meth:`AgentProgramEnv.run_program` draws the task for ``seed``, starts the
  program with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing at an endpoint the caller serves (the
  trainer's gateway, which records every call's token ids), waits for it to end and scores the outcome. The
  trainer builds the training sequence from the recorded calls, not from anything the env returns.
- **turn by turn** (gymnasium: ``check_env``, ``envs play``, warm-up demonstrations): ``reset`` starts the
  program against the env's own :class:`~relax_gym.envs.turn_proxy.TurnProxy`; each call the program makes
  becomes an observation (the new messages since the last call) and the next ``step(action)`` is the model's
  reply to it. When the program exits, the step that ended it carries the score. ``info["gold"]`` is the reply
  a perfect model gives to each call, so the gold plan earns the maximum reward through the real program.

Where the program runs (``runner``): ``"sandbox"`` (default) runs it in the episode's sandbox (docker or bwrap,
no network: it reaches the endpoint through a Unix socket bind-mounted into the sandbox and a forwarder on the
sandbox's own loopback, see :mod:`relax_gym.sandbox.bridge`; the ``python_packages`` it imports are mounted
read-only from a copy of this environment's installed distributions); ``"local"`` runs it as a child process
here with this interpreter (only for programs you trust: model-written code it executes runs on the host).

Subclasses implement :meth:`_make_task` (a :class:`ProgramTask`) and :meth:`_score` (reward and breakdown from
a :class:`ProgramRun`).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from relax_gym.envs.agent_run import AgentEndpoint, ProgramRun
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.episode_sandbox import EpisodeSandbox, PoolHold
from relax_gym.envs.turn_proxy import HistoryRewritten, ProgramExit, TurnProxy
from relax_gym.omni import Message, TextPart
from relax_gym.sandbox.exit_order import exiting
from relax_gym.sandbox.spec import SandboxSpec
from relax_gym.watchdog import guard

log = logging.getLogger(__name__)

PYTHON = "{python}"  # in a task's argv: this interpreter when local, python3 in a sandbox
MAX_LOG_CHARS = 4_000
ENV_FILE = ".relax-agent.env"  # in the sandbox's workdir: the endpoint and key, read (and deleted) by the forwarder
# Agent SDKs' own telemetry, off in every agent program: no key or trace leaves the machine (the Agents SDK's tracing
# would upload with the episode's key; in a sandbox the attempt only fails, slowly). The OpenAI Agents SDK's tracing,
# LangSmith's, Hugging Face's, and the common opt-outs other libraries read.
TELEMETRY_OFF = {"OPENAI_AGENTS_DISABLE_TRACING": "1", "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",
                 "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "ANONYMIZED_TELEMETRY": "False"}


@dataclass
class ProgramTask:
    """One episode's task. ``argv``: the command (``{python}`` is replaced by the interpreter), run in a working
    directory holding ``files``; ``gold_replies``: a perfect model's reply to each call, in order;
    ``outputs``: files the scorer reads back after the run; ``prompt``: what the task asks, for display."""

    prompt: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    gold_replies: list[str] = field(default_factory=list)
    outputs: tuple[str, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProgramOutcome:
    """:meth:`AgentProgramEnv.run_program`'s answer. ``status``: ``ok``, ``truncated`` (the program ran out of
    time) or ``env_error`` (it could not be started or its sandbox failed: the trainer masks the episode)."""

    reward: float
    reward_breakdown: dict[str, float]
    status: str
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class AgentProgramEnv(AgentEnv):
    """Base class of agent-program envs (see the module doc). ``program_timeout_s``: wall-clock limit of one run;
    ``max_turns``: model calls allowed when played turn by turn; ``python_packages``: distributions the program
    imports (mounted into the sandbox); ``python_venv``: a venv they come from instead of this environment (an
    agent SDK whose pins are not ours, e.g. one :func:`relax_gym.envs.interop.venvs.client_venv` made)."""

    agent_program = True  # the trainer's episode runners look for this
    media_kinds = ()

    def __init__(self, *, runner: Literal["sandbox", "local"] = "sandbox", sandbox: SandboxSpec | dict[str, Any] | None = None,
                 backend: str | None = None, program_timeout_s: float = 120.0, max_turns: int = 8,
                 python_packages: tuple[str, ...] | list[str] = ("openai",), python_venv: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        if runner not in ("sandbox", "local"):
            raise ValueError(f"runner must be 'sandbox' or 'local', got {runner!r}")
        if program_timeout_s <= 0:
            raise ValueError(f"program_timeout_s must be > 0, got {program_timeout_s}")
        self.runner = runner
        self.sandbox_spec = sandbox if isinstance(sandbox, SandboxSpec) else SandboxSpec.model_validate(sandbox or {})
        self.backend = backend
        self.program_timeout_s = float(program_timeout_s)
        self.python_packages = tuple(python_packages)
        # a venv whose packages the program imports (an agent SDK whose pins are not ours): its interpreter runs the
        # program locally, and the sandbox gets its packages copied from it
        self.python_venv = python_venv
        if python_venv is not None and not self._venv_python().is_file():
            raise ValueError(f"python_venv {python_venv!r} has no bin/python")
        self.task: ProgramTask | None = None
        self._proxy: TurnProxy | None = None
        self._thread: threading.Thread | None = None
        self._replies = 0
        self._last_exit: ProgramRun | None = None
        self.last_run: ProgramRun | None = None  # the last turn-by-turn episode's run, once its program ended
        self.last_refusal: str | None = None  # and the first request of it the endpoint refused
        # the shared sandbox pools stay open (warm between episodes) until this env closes
        self._pool_hold = PoolHold() if runner == "sandbox" else None

    def _venv_python(self) -> Path:
        venv = Path(str(self.python_venv)).expanduser()
        return venv if venv.name.startswith("python") else venv / "bin" / "python"

    # -- subclass hooks -----------------------------------------------------------------------------------

    def _make_task(self, options: dict[str, Any]) -> ProgramTask:
        raise NotImplementedError

    def _score(self, run: ProgramRun) -> tuple[float, dict[str, float]]:
        """Reward and its breakdown for a finished run of ``self.task``."""
        raise NotImplementedError

    # -- black box ----------------------------------------------------------------------------------------

    def run_program(self, *, seed: int | None, endpoint: AgentEndpoint, options: dict[str, Any] | None = None) -> ProgramOutcome:
        """Draw the task for ``seed``, run the program against ``endpoint`` to its end, score it. Never raises for
        what the program or its sandbox does: a failure is an ``env_error`` outcome."""
        self._stop_program()
        super(AgentEnv, self).reset(seed=seed)  # gymnasium's seeding only: no turn-by-turn episode starts
        self._done = True
        try:
            self.task = self._make_task(dict(options or {}))
        except Exception as exc:  # noqa: BLE001 - a broken task is this episode's failure
            return ProgramOutcome(0.0, {}, "env_error", f"{type(exc).__name__}: {exc}")
        run = self._run(self.task, endpoint)
        outcome = self._outcome(run)
        outcome.info.update(agent_seconds=round(run.duration_s, 3), agent_stderr_tail=run.stderr[-MAX_LOG_CHARS:])
        return outcome

    def _outcome(self, run: ProgramRun) -> ProgramOutcome:
        info = {**run.summary, **{k: v for k, v in (self.task.info if self.task else {}).items() if k != "question"}}
        if run.launch_error:
            return ProgramOutcome(0.0, {}, "env_error", run.launch_error, info)
        try:
            reward, breakdown = self._score(run)
        except Exception as exc:  # noqa: BLE001 - the scorer failed, not the agent
            return ProgramOutcome(0.0, {}, "env_error", f"scoring failed: {type(exc).__name__}: {exc}", info)
        return ProgramOutcome(float(reward), dict(breakdown), "truncated" if run.timed_out else "ok", "", info)

    # -- running the program ------------------------------------------------------------------------------

    def _run(self, task: ProgramTask, endpoint: AgentEndpoint) -> ProgramRun:
        try:
            if self.runner == "local":
                return self._run_local(task, endpoint)
            return self._run_sandboxed(task, endpoint)
        except Exception as exc:  # noqa: BLE001 - reported as a launch failure (env_error)
            # at interpreter exit its sandbox is closed under it: expected, not worth a warning
            (log.debug if exiting() else log.warning)("agent program failed to run: %r", exc)
            return ProgramRun(None, "", "", False, 0.0, launch_error=f"{type(exc).__name__}: {exc}")

    def _run_local(self, task: ProgramTask, endpoint: AgentEndpoint) -> ProgramRun:
        python = str(self._venv_python()) if self.python_venv else sys.executable
        argv = [python if a == PYTHON else a for a in task.argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8", **TELEMETRY_OFF,
               **_openai_env(endpoint)}
        with tempfile.TemporaryDirectory(prefix="relax-gym-agent-") as work:
            for name, data in task.files.items():
                target = _inside(Path(work), name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.encode() if isinstance(data, str) else data)
            start = time.monotonic()
            # its own session: on a timeout the whole group goes (the agent's tool processes included)
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            guard(proc)  # its group dies with this process, not only on a timeout
            try:
                out, err = proc.communicate(timeout=self.program_timeout_s)
                rc, timed_out = proc.returncode, False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
                rc, timed_out = None, True
            outputs = {}
            for name in task.outputs:
                path = _inside(Path(work), name)
                if path.is_file():
                    outputs[name] = path.read_text(errors="replace")
            return ProgramRun(rc, _text(out), _text(err), timed_out, time.monotonic() - start, outputs)

    def _run_sandboxed(self, task: ProgramTask, endpoint: AgentEndpoint) -> ProgramRun:
        from relax_gym.sandbox.bridge import (
            DEFAULT_LISTEN_PORT,
            bridge_mounts,
            bridged_command,
            shared_bridge,
        )
        from relax_gym.sandbox.pyruntime import (
            python_packages_dir,
            runtime_env,
            runtime_mount,
        )

        host, port = _loopback_target(endpoint.base_url)
        bridge = shared_bridge(host, port)
        mounts = list(bridge_mounts(bridge))
        env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", **TELEMETRY_OFF}
        if self.python_packages:
            site = python_packages_dir(list(self.python_packages),
                                       python=self._venv_python() if self.python_venv else None)
            mounts.append(runtime_mount(site))
            env.update(runtime_env(site))
        inner_url = endpoint.base_url.replace(f"{host}:{port}", f"127.0.0.1:{DEFAULT_LISTEN_PORT}", 1)
        secrets = _openai_env(AgentEndpoint(inner_url, endpoint.api_key, endpoint.model))
        # validated again: the mounts must not clash with the spec's workdir or its own mounts
        spec = SandboxSpec.model_validate({**self.sandbox_spec.model_dump(),
                                           "mounts": [*self.sandbox_spec.model_dump()["mounts"], *(m.model_dump() for m in mounts)]})
        sandbox = EpisodeSandbox(spec, backend=self.backend, episode_timeout_s=self.program_timeout_s + 60.0, hold=False)
        try:
            interfaces = _interfaces(sandbox)
            if not spec.network and interfaces != ("lo",):
                raise RuntimeError(f"the sandbox should have no network but shows interfaces {', '.join(interfaces)}")
            for name, data in task.files.items():
                sandbox.write_file(name, data)
            # the episode's key goes in a file the forwarder reads and deletes: a command line shows in the host's ps
            env_file = f"{spec.workdir}/{ENV_FILE}"
            sandbox.write_file(ENV_FILE, "".join(f"{k}={v}\n" for k, v in secrets.items()))
            program = ["python3" if a == PYTHON else a for a in task.argv]
            argv = bridged_command(program, env=env, env_file=env_file)  # the forwarder on DEFAULT_LISTEN_PORT
            result = sandbox.exec(shlex.join(argv), timeout=self.program_timeout_s)
            outputs = {}
            for name in task.outputs:
                got = sandbox.exec(f"cat {shlex.quote(name)}", timeout=30)
                if got.rc == 0:
                    outputs[name] = got.stdout
            return ProgramRun(None if result.timed_out else result.rc, result.stdout, result.stderr, bool(result.timed_out),
                              float(result.duration), outputs, interfaces=interfaces)
        finally:
            sandbox.release()

    # -- turn by turn (gymnasium) ---------------------------------------------------------------------------

    def _reset(self, options: dict[str, Any]) -> Opening:
        self._stop_program()
        self.task = self._make_task(options)
        if self._proxy is None:
            self._proxy = TurnProxy()
        endpoint = self._proxy.open_episode()
        task, self._replies, self._last_exit = self.task, 0, None
        self._thread = threading.Thread(target=self._play, args=(task, endpoint), name="agent-program", daemon=True)
        self._thread.start()
        self.last_run, self.last_refusal = None, None
        event = self._proxy.next_event(self.program_timeout_s + 30.0)
        if isinstance(event, ProgramExit):  # it ended without calling the model: the first step scores it
            self._last_exit = event.run
            return Opening([Message(role="user", content=(TextPart(task.prompt),))], self._gold_reply(), dict(task.info))
        return Opening(event.messages, self._gold_reply(), dict(task.info))

    def _play(self, task: ProgramTask, endpoint: AgentEndpoint) -> None:
        assert self._proxy is not None
        run = self._run(task, endpoint)
        self._proxy.program_exited(endpoint.api_key, run)

    def _step(self, action: str) -> Outcome:
        assert self._proxy is not None
        if self._last_exit is None:
            self._proxy.reply(action)
            self._replies += 1
            event = self._proxy.next_event(self.program_timeout_s + 30.0)
            if isinstance(event, HistoryRewritten):
                raise RuntimeError("the agent program rewrote its conversation history, which turn-by-turn play cannot "
                                   "follow (run_program, the trainer's path, trains such agents)")
            if not isinstance(event, ProgramExit):
                return Outcome(event.messages, 0.0, False, {}, gold=self._gold_reply())
            self._last_exit = event.run
        self.last_run, self.last_refusal = self._last_exit, self._proxy.first_error()
        outcome = self._outcome(self._last_exit)
        if outcome.status == "env_error":
            raise RuntimeError(outcome.error)
        if self._replies == 0 and self.last_refusal:  # it never got a reply: say what it tripped on
            outcome.info["agent_first_http_error"] = self.last_refusal
        return Outcome([], outcome.reward, True, outcome.reward_breakdown, info=outcome.info)

    def program_report(self) -> str | None:
        """What the last turn-by-turn episode's program said, for a person (``envs play`` / ``envs check``):
        its exit status, the first request it sent that was refused, the end of its stderr; None before one ended."""
        run = self.last_run
        if run is None:
            return None
        status = "ran out of time" if run.timed_out else f"exited with status {run.rc}"
        lines = [f"the agent program {status} after {self._replies} model call(s)"
                 + (f"; its first refused request: {self.last_refusal}" if self.last_refusal else "")]
        tail = run.stderr.strip().splitlines()[-8:]
        if tail:
            lines.append("its stderr ends:\n  " + "\n  ".join(tail))
        return "\n".join(lines)

    def _gold_reply(self) -> str:
        gold = self.task.gold_replies if self.task else []
        return gold[min(self._replies, len(gold) - 1)] if gold else "<answer></answer>"

    def _stop_program(self) -> None:
        """End the turn-by-turn episode in flight: its pending call is refused, so the program exits."""
        if self._proxy is not None:
            self._proxy.close_episode()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.program_timeout_s + 60.0)

    def close(self) -> None:
        self._stop_program()
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._pool_hold is not None:
            self._pool_hold.release()  # the last hold removes the pools' sandboxes
        super().close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _interfaces(sandbox: EpisodeSandbox) -> tuple[str, ...]:
    """The network interfaces the sandbox's processes see (``/proc/net/dev`` of its network namespace)."""
    got = sandbox.exec("cat /proc/net/dev", timeout=30)
    if got.rc != 0:
        raise RuntimeError(f"cannot list the sandbox's network interfaces: {got.stderr.strip()[:200]}")
    return tuple(sorted(line.split(":", 1)[0].strip() for line in got.stdout.splitlines()[2:] if ":" in line))


def _openai_env(endpoint: AgentEndpoint) -> dict[str, str]:
    return {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.api_key, "OPENAI_MODEL": endpoint.model}


def _loopback_target(base_url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"endpoint base_url {base_url!r} must be http://HOST:PORT/... with an explicit port")
    return parts.hostname, parts.port


def _inside(root: Path, name: str) -> Path:
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"task file {name!r} is outside the working directory")
    return path


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")
