"""The ``relax-gym`` command line (typer + rich)."""

from __future__ import annotations

import contextlib
import json
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from relax_gym.trainer.models.cli import model_app
from relax_gym.trainer.plan.cli import plan_app

app = typer.Typer(help="relax-gym: omni-modal agentic RL environments and trainer.", no_args_is_help=True, pretty_exceptions_enable=False)
envs_app = typer.Typer(help="List, inspect, check and play environments.", no_args_is_help=True)
app.add_typer(envs_app, name="envs")
sandbox_app = typer.Typer(help="Sandboxes for tool code: build the base image, diagnose backends.", no_args_is_help=True)
base_app = typer.Typer(help="Base models: what a run starts from before RL (model.base), built once and cached.", no_args_is_help=True)
app.add_typer(base_app, name="base")
judge_app = typer.Typer(help="Judge models (judge.model): LLM judges built in code for rubrics' judge parts, cached.",
                        no_args_is_help=True)
app.add_typer(judge_app, name="judge")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(plan_app, name="plan")  # relax_gym/trainer/plan/cli.py: imports only typer; the planner loads per command
app.add_typer(model_app, name="model")  # relax_gym/trainer/models/cli.py: imports only typer


class _Console(Console):
    """A rich console that wraps text only on a terminal: sent to a pipe or a log, a line stays one line (a long
    path in an error message must not be split where a reader, or a grep, would miss it)."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        super().print(*objects, soft_wrap=(not self.is_terminal) if soft_wrap is None else soft_wrap, **kwargs)


console = _Console(highlight=False)
err_console = _Console(stderr=True, highlight=False)


class Policy(StrEnum):
    gold = "gold"
    random = "random"
    stdin = "stdin"


def _registry():
    from relax_gym.envs import registry

    return registry


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print("[bold red]error:[/] " + escape(message))  # messages name [reward], [dataset], ...: not markup
    return typer.Exit(code)


@contextlib.contextmanager
def _working(what: str):
    """Say what is under way: a spinner with ``what`` in a terminal (gone when done), a line in a log."""
    if console.is_terminal:
        with console.status(escape(what)):
            yield
    else:
        console.print(escape(what))
        yield


def _make(env_id: str, kwargs: dict[str, Any]):
    registry = _registry()
    from relax_gym.envs import DatasetError, ManifestError, UnknownEnvError
    from relax_gym.omni import MediaError

    try:
        return registry.make(env_id, **kwargs)
    except (UnknownEnvError, DatasetError, ManifestError, MediaError) as exc:
        raise _fail(str(exc)) from None


@envs_app.command("list")
def envs_list() -> None:
    """List registered environments (and manifests that failed to load)."""
    registry = _registry()
    specs = [registry.spec(env_id) for env_id in registry.list_envs()]
    rows = [(s.id, ",".join(s.resolved_modalities()), _short_path(s.source)) for s in specs]
    if console.is_terminal:
        table = Table("id", "modalities", "source", box=None)
        for row in rows:
            table.add_row(*row)
        table.columns[2].overflow = "fold"  # a long path wraps within its column instead of being cut
        console.print(table)
    else:  # a pipe or a log (any width): aligned columns, nothing cut
        widths = [max(len(r[i]) for r in [("id", "modalities", "source"), *rows]) for i in range(2)]
        for row in [("id", "modalities", "source"), *rows]:
            console.print(escape(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}"), soft_wrap=True)
    errors = registry.discovery_errors()
    for e in errors:
        err_console.print("[red]failed to load:[/] " + escape(e))
    if errors:
        raise typer.Exit(1)


def _short_path(source: str) -> str:
    try:
        return str(Path(source).relative_to(Path.cwd()))
    except ValueError:
        return source


@envs_app.command("show")
def envs_show(env_id: str) -> None:
    """Show an environment's spec: entry point, kwargs, source."""
    registry = _registry()
    from relax_gym.envs import UnknownEnvError

    try:
        s = registry.spec(env_id)
    except UnknownEnvError as exc:
        raise _fail(str(exc)) from None
    console.print(f"[bold]{s.id}[/]  (gymnasium id {s.gym_id})")
    console.print(f"entry point: {s.entry_point}\nsource: {s.source}\nmodalities: {', '.join(s.modalities) or '-'}")
    if s.description:
        console.print(f"description: {s.description}")
    console.print("kwargs: " + json.dumps(s.kwargs, indent=2, default=str))
    rubric = s.manifest.rubric() if s.manifest is not None else None
    if rubric is not None:
        console.print("reward (rubric): " + escape(", ".join(
            f"{p.name} ({p.rule if p.kind == 'rule' else 'judge'}, weight {p.weight:g})" for p in rubric.parts)))


@envs_app.command("check")
def envs_check(
    env_id: Annotated[str | None, typer.Argument(help="env id; omit with --all")] = None,
    all_: Annotated[bool, typer.Option("--all", help="check every registered env")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="real dataset folder")] = None,
) -> None:
    """Run gymnasium's env checker plus relax rules; exit 1 on the first failing env."""
    from relax_gym.envs import EnvCheckError, RubricError, check_env
    from relax_gym.sandbox import SandboxError

    registry = _registry()
    if all_ == (env_id is not None):
        raise _fail("give an env id or --all", 2)
    ids = registry.list_envs() if all_ else [env_id]
    failed = []
    for i, one in enumerate(ids, 1):
        with _working(f"checking {one} ({i}/{len(ids)})"):  # some take tens of seconds (sandboxes, agent programs)
            env = _make(one, {"data_dir": str(data_dir)} if data_dir else {})
            try:
                report = check_env(env)
            except (EnvCheckError, SandboxError, RubricError) as exc:
                report = None
                console.print(f"[red]FAIL[/] {one}: " + escape(str(exc)))
                said = getattr(env.unwrapped, "program_report", lambda: None)()
                if said:  # an agent program: what it said is usually why
                    console.print(escape(said))
                failed.append(one)
            finally:
                env.close()
        if report is not None:
            console.print(f"[green]ok[/]   {one}: " + "; ".join(report.passed))
    if failed:
        raise typer.Exit(1)


WHO_ANSWERS = {  # the first line `envs play` prints: who chooses the assistant's text
    Policy.gold: "answered by the gold policy: each action is the env's correct answer (info['gold']), so the reward "
                 "is the best the env gives; --policy stdin to answer yourself, --policy random for random answers",
    Policy.random: "answered by the random policy: a random option or tool call each turn",
    Policy.stdin: "answered by you: type the assistant's text, one line per turn",
}


@envs_app.command("play")
def envs_play(
    env_id: str,
    policy: Annotated[Policy, typer.Option(help="who answers: the gold action, random text, or you (stdin)")] = Policy.gold,
    episodes: Annotated[int, typer.Option(min=1)] = 1,
    seed: int = 0,
    data_dir: Annotated[Path | None, typer.Option(help="real dataset folder")] = None,
    split: Annotated[str | None, typer.Option(help="dataset split")] = None,
    media_dir: Annotated[Path | None, typer.Option(help="also save every image, clip (WebM) and sound (WAV) shown "
                                                        "here as files to open, and print their paths")] = None,
) -> None:
    """Play episodes and print the conversation (media summarised: shape, duration, fps) and rewards."""
    from relax_gym.envs import RubricError

    kwargs: dict[str, Any] = {}
    if data_dir is not None:
        kwargs["data_dir"] = str(data_dir)
    if split is not None:
        kwargs["split"] = split
    import numpy as np

    from relax_gym.envs.random_policy import RandomPolicy

    env = _make(env_id, kwargs)
    console.print(escape(WHO_ANSWERS[policy]))
    try:
        env.action_space.seed(seed)
        randomly = RandomPolicy(np.random.default_rng(seed))
        media = None
        if media_dir is not None:
            from relax_gym.trainer.run.rollout_records import MediaStore

            media = MediaStore(media_dir, budget_bytes=1 << 40)
        # one text stream for the whole command: wrapping stdin again per answer would drop what the previous wrapper
        # had buffered (piped answers after the first line)
        stdin = typer.get_text_stream("stdin") if policy is Policy.stdin else None
        total = 0.0
        for episode in range(episodes):
            obs, info = env.reset(seed=seed + episode)
            origin = f", {info['origin']}" if info.get("origin") else ""
            console.rule(escape(f"{env_id} episode {episode} (seed {seed + episode}{origin})"))
            _print_messages(obs, media)
            conversation = list(obs)
            done, ret = False, 0.0
            while not done:
                action = _choose(policy, env, info, conversation, randomly, stdin)
                console.print("[bold cyan]assistant:[/] " + escape(action))
                try:
                    obs, reward, terminated, truncated, info = env.step(action)
                except RubricError as exc:
                    raise _fail(str(exc)) from None
                _print_messages(obs, media)
                _print_tool_results(obs)
                conversation += obs
                if info.get("tool_traceback"):  # a tool raised: the env author's bug, shown with its traceback
                    console.print("[red]a tool raised:[/]\n" + escape(info["tool_traceback"]))
                ret += reward
                done = terminated or truncated
                console.print(f"reward {reward:.3f}  breakdown {info.get('reward_breakdown')}  status {info['status']}"
                              + (f" ({escape(str(info.get('status_detail') or info.get('error')))})" if info["status"] not in ("ok",) else ""))
                if info.get("judge_requests"):
                    console.print("pending judge parts (counted 0 here): " + ", ".join(r["part"] for r in info["judge_requests"]))
            said = getattr(env.unwrapped, "program_report", lambda: None)()
            if said:  # an agent program's exit status, first refused request and stderr
                console.print("[dim]" + escape(said) + "[/]")
            total += ret
        console.rule()
        console.print(f"mean return over {episodes} episode(s): {total / episodes:.3f}")
    finally:
        env.close()  # its sandboxes go with it


@envs_app.command("prepare")
def envs_prepare(
    frameworks: Annotated[list[str] | None, typer.Argument(help="framework schemes (gem, skyrl-gym); all when omitted",
                                                           show_default=False)] = None,
) -> None:
    """Make the venv each foreign env framework runs in (pip, from the package index; kept in the cache), as the
    first make of one of its envs would (docs/interop.md)."""
    from relax_gym.envs.interop.frameworks import FRAMEWORKS, UnknownFrameworkError, framework
    from relax_gym.envs.interop.venvs import FrameworkVenvError, ensure_venv

    try:
        chosen = [framework(name) for name in (frameworks or sorted(FRAMEWORKS))]
    except UnknownFrameworkError as exc:
        raise _fail(str(exc), 2) from None
    for fw in chosen:
        if not fw.requirements:
            console.print(f"ok   {fw.scheme}: nothing to install (its protocol is spoken from this process)")
            continue
        console.print(f"{fw.scheme}: {', '.join(fw.requirements)} ...")
        try:
            python = ensure_venv(fw)
        except FrameworkVenvError as exc:
            raise _fail(str(exc), 1) from None
        console.print(f"ok   {fw.scheme}: {python.parent.parent}")


@envs_app.command("serve")
def envs_serve(
    env_id: str,
    host: Annotated[str, typer.Option(help="address to bind; anything but loopback needs --token")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: a free port (the URL printed says which)")] = 0,
    token: Annotated[str | None, typer.Option(envvar="RELAX_GYM_ENV_TOKEN", show_default=False,
                                              help="every request must carry 'Authorization: Bearer <token>'")] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="env instances open at once")] = 1024,
    idle_timeout: Annotated[float, typer.Option(min=1, help="seconds after which an unused session is closed")] = 3600.0,
    kwargs: Annotated[str | None, typer.Option("--kwargs", show_default=False,
                                               help='constructor kwargs of every session, a JSON object, e.g. \'{"split": "val"}\'')] = None,
    allow_kwarg: Annotated[list[str] | None, typer.Option("--allow-kwarg", show_default=False,
                                                          help="a constructor kwarg clients may send (repeatable; none by "
                                                               "default; never runner, sandbox, backend, dataset, *dir, *path, "
                                                               "*root, *file(s))")] = None,
    protocol: Annotated[str, typer.Option(help="relax: ours (docs/env-servers.md); openenv: OpenEnv's server and "
                                               "clients, from the OpenEnv venv; nemo-gym: a NeMo-Gym resources server "
                                               "(docs/interop.md)")] = "relax",
    rows: Annotated[Path | None, typer.Option(show_default=False, help="nemo-gym: write this many task rows "
                                                                       "(--episodes) to this JSONL file first")] = None,
    episodes: Annotated[int, typer.Option(min=1, help="nemo-gym: task rows to write with --rows (seeds 0..N-1)")] = 16,
) -> None:
    """Serve an environment over HTTP until interrupted: clients make it with
    relax_gym.make("remote:URL/ENV_ID") or a manifest's [server] url (docs/env-servers.md); with --protocol openenv,
    OpenEnv's clients connect to it; with --protocol nemo-gym, NeMo-Gym's agents (docs/interop.md)."""
    from relax_gym.envs import DatasetError, ManifestError, UnknownEnvError
    from relax_gym.envs.remote.server import EnvServer, ServeError

    fixed: Any = {}
    if kwargs:
        try:
            fixed = json.loads(kwargs)
        except ValueError as exc:
            raise _fail(f"--kwargs is not JSON: {exc}", 2) from None
        if not isinstance(fixed, dict):
            raise _fail("--kwargs must be a JSON object", 2)
    if protocol not in ("relax", "openenv", "nemo-gym"):
        raise _fail(f"--protocol must be relax, openenv or nemo-gym, got {protocol!r}", 2)
    if protocol == "openenv":
        _serve_openenv(env_id, host, port, fixed, max_sessions)
        return
    if protocol == "nemo-gym":
        _serve_nemo_gym(env_id, host, port, fixed, max_sessions, rows, episodes)
        return
    try:
        server = EnvServer(env_id, host=host, port=port, token=token, max_sessions=max_sessions, idle_timeout_s=idle_timeout,
                           kwargs=fixed, allow_kwargs=allow_kwarg or ())
    except ServeError as exc:
        raise _fail(str(exc), 2) from None
    except (UnknownEnvError, DatasetError, ManifestError, OSError) as exc:
        raise _fail(str(exc)) from None
    console.print(f"serving {server.env_id} at {server.url}  (relax_gym.make(\"remote:{server.url}/{server.env_id}\"); "
                  f"{'token required' if token else 'no token'}; Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def _serve_nemo_gym(env_id: str, host: str, port: int, kwargs: dict[str, Any], max_sessions: int, rows: Path | None,
                    episodes: int) -> None:
    import socket

    import uvicorn

    from relax_gym.envs import DatasetError, UnknownEnvError
    from relax_gym.envs.interop.nemo_gym_serve import build_app, task_rows, write_rows
    from relax_gym.envs.remote.access import is_loopback

    if not is_loopback(host):
        raise _fail("--protocol nemo-gym serves loopback only (a resources server has no token)", 2)
    try:
        app = build_app(env_id, kwargs, max_sessions)
        if rows is not None:
            write_rows(str(rows), task_rows(env_id, episodes, kwargs=kwargs))
    except (UnknownEnvError, DatasetError, OSError) as exc:
        raise _fail(str(exc)) from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}"
    console.print(f"serving {env_id} to NeMo-Gym agents at {url}  (a resources server: /seed_session, one route a tool, "
                  f"/verify{f'; {episodes} task rows in {rows}' if rows else ''}; Ctrl-C stops)")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass


def _serve_openenv(env_id: str, host: str, port: int, kwargs: dict[str, Any], max_sessions: int) -> None:
    from relax_gym.envs import UnknownEnvError, spec
    from relax_gym.envs.interop.serve import start_openenv_server
    from relax_gym.envs.interop.venvs import FrameworkVenvError
    from relax_gym.envs.remote.access import is_loopback
    from relax_gym.envs.remote.launcher import ServerStartError

    if not is_loopback(host):
        raise _fail("--protocol openenv serves loopback only (OpenEnv's server has no token)", 2)
    try:
        spec(env_id)
        process, url = start_openenv_server(env_id, host=host, port=port, kwargs=kwargs, max_sessions=max_sessions)
    except (UnknownEnvError, FrameworkVenvError, ServerStartError) as exc:
        raise _fail(str(exc)) from None
    console.print(f"serving {env_id} to OpenEnv clients at {url}  (GenericEnvClient(base_url=\"{url}\"); Ctrl-C stops)")
    try:
        process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        process.terminate()
        process.wait()


def _choose(policy: Policy, env, info: dict[str, Any], conversation: list, random_policy, stdin) -> str:
    if policy is Policy.gold:
        return info["gold"]
    if policy is Policy.random:
        return random_policy.act(env, conversation)
    console.print("[dim]your answer (one line):[/] ", end="")
    line = stdin.readline()
    if not line:
        raise _fail("stdin ended before the episode did", 1)
    return line.rstrip("\n")


def _print_tool_results(messages) -> None:
    """One table row per tool call of the turn: the call, whether it worked, and the media it returned (kind and
    size, plus the span for video and audio). Media a tool sent in a following user message count as its own."""
    rows: list[list[str]] = []
    for m in messages:
        if m.role == "tool":
            body = m.text.removeprefix("<tool_response>").strip()
            status = "[red]error[/]" if body.startswith("Error:") else "[green]ok[/]"
            rows.append([escape(m.name or "?"), status, escape(body.splitlines()[0] if body else ""), ""])
        if rows and m.role in ("tool", "user"):
            rows[-1][3] = "\n".join(filter(None, [rows[-1][3], *(_media_brief(p) for p in m.media())]))
    if not rows:
        return
    table = Table(box=None, title="tool calls", title_justify="left")
    table.add_column("tool", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("said", ratio=1)
    table.add_column("media returned", no_wrap=True)
    for row in rows:
        table.add_row(*row[:3], row[3] or "-")
    console.print(table)


def _media_brief(part) -> str:
    """A media part in a few words: kind, size, span."""
    if part.kind == "image":
        h, w, _ = part.decode().shape
        return f"image {w}x{h}"
    if part.kind == "video":
        v = part.decode()
        return f"video {len(v.frames)} frames {v.frames.shape[2]}x{v.frames.shape[1]}, {v.timestamps[0]:.2f}-{v.timestamps[-1]:.2f} s of {v.duration_s:.2f} s"
    a = part.decode()
    start = part.sampling.start_s
    return f"audio {start:.2f}-{start + a.duration_s:.2f} s ({a.duration_s:.2f} s @ {a.sample_rate} Hz)"


def _print_messages(messages, media=None) -> None:
    """Each message's parts: text as it is, media summarised (size, frames, span); with ``media`` (a MediaStore,
    ``envs play --media-dir``) each media part is also saved as a file you can open, and its path printed."""
    for m in messages:
        console.print(f"[bold]{m.role}:[/]")
        for part in m.content:
            text = part.summary() if part.kind != "text" else part.text.replace("\n", "\n  ")
            if media is not None and part.kind != "text":
                entry = media.put(part)
                text += f" -> {media.run_dir / entry['url']}" if "url" in entry else f" ({entry['omitted']})"
            console.print("  " + text, markup=False)


@sandbox_app.command("doctor")
def sandbox_doctor() -> None:
    """Which sandbox backends work on this machine, and why not; exit 1 when none does."""
    from relax_gym.sandbox.backends import ENV_VAR, doctor, select_backend
    from relax_gym.sandbox.base import SandboxUnavailable

    for name, problem in doctor().items():
        if problem is None:
            console.print(f"[green]ok[/]      {name}")
        else:
            console.print(f"[red]missing[/] {name}: " + escape(problem))
    try:
        chosen = select_backend().name
    except SandboxUnavailable as exc:
        raise _fail(str(exc)) from None
    console.print(f"selected: {chosen} ({ENV_VAR}={__import__('os').environ.get(ENV_VAR, 'auto')})")


@sandbox_app.command("gc")
def sandbox_gc(
    all_owners: Annotated[bool, typer.Option("--all", help="also remove sandboxes of processes that are still running "
                                             "(their runs lose them)")] = False,
) -> None:
    """Remove the sandboxes (containers, bwrap cgroups and directories) that processes which died without closing
    them left on this machine; those of live processes stay unless --all. Each backend that works here is swept."""
    from relax_gym.sandbox.backends import backend_names, get_backend

    swept = 0
    for name in backend_names():
        backend = get_backend(name)
        problem = backend.check()
        if problem is not None:
            console.print(f"{name}: skipped ({escape(problem)})")
            continue
        removed = backend.reap(all_owners=all_owners)
        left = len(backend.every())
        swept += 1
        note = "" if all_owners or not left else " (owned by running processes; --all removes them)"
        console.print(f"{name}: removed {removed}, {left} left{note}")
    if not swept:
        raise _fail("no sandbox backend works on this machine (relax-gym sandbox doctor says why)")


@sandbox_app.command("build-image")
def sandbox_build_image(
    tag: Annotated[str | None, typer.Option(help="image tag (default: the SandboxSpec default image)")] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if the tag exists")] = False,
) -> None:
    """Build the base sandbox image (python3, bash, busybox) with `docker import`: no registry needed."""
    from relax_gym.sandbox.base import SandboxError
    from relax_gym.sandbox.image import build_base_image
    from relax_gym.sandbox.spec import DEFAULT_IMAGE

    try:
        image_id = build_base_image(tag or DEFAULT_IMAGE, force=force)
    except SandboxError as exc:
        raise _fail(str(exc)) from None
    console.print(f"built {tag or DEFAULT_IMAGE} ({image_id})")


@base_app.command("list")
def base_list() -> None:
    """The named bases a recipe can start from (model.base) and whether each is built for the default sizes."""
    from relax_gym.trainer.base.spec import BASES

    table = Table("base", "steps", "corpora (share of a batch)", "about", box=None)
    for name, spec in sorted(BASES.items()):
        table.add_row(name, str(spec.steps), ", ".join(f"{c} {w:.0%}" for c, w in spec.corpora.items()), spec.about)
    console.print(table)


@contextlib.contextmanager
def _sft_progress(label: str, step_event: str):
    """A progress bar for an SFT build (a base, a judge): yields the ``progress(event, data)`` callback that moves it
    on ``step_event`` events (``step``, ``of``, ``sft_nll``)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as progress:
        task = progress.add_task(label, total=None, info="")

        def on_event(event: str, data: dict) -> None:
            if event == step_event:
                progress.update(task, total=data["of"], completed=data["step"], info=f"nll {data['sft_nll']:.3f}")

        yield on_event


@judge_app.command("list")
def judge_list() -> None:
    """The named judges a recipe's judge.model can ask for, and whether each is built."""
    from relax_gym.trainer.rewards.judge_model import JUDGES, judge_key, judges_root

    table = Table("judge", "steps", "built", "about", box=None)
    for name, spec in sorted(JUDGES.items()):
        built = (judges_root() / f"{name}-{judge_key(spec)}" / "judge.json").is_file()
        table.add_row(name, str(spec.steps), "yes" if built else "no", spec.about)
    console.print(table)


@judge_app.command("build")
def judge_build(name: Annotated[str, typer.Argument(help="a named judge (relax-gym judge list)")] = "describe-judge") -> None:
    """Build a named judge into the cache now (a run would build it on first use) and print its held-out agreement
    with the rule verdict, its time and its path. A second call finds it in the cache."""
    from relax_gym.trainer.rewards.judge_model import JUDGES, ensure_judge

    if name not in JUDGES:
        raise _fail(f"no judge {name!r}; known: {', '.join(sorted(JUDGES))}", 2)
    with _sft_progress(f"judge {name}", "judge_step") as on_event:
        info = ensure_judge(name, progress=on_event)
    held = info.report.get("held_out", {})
    console.print(f"judge {name}: {'built' if info.built else 'found in the cache'} at {escape(str(info.path))}")
    console.print(f"held-out agreement with the rule verdict: {held.get('overall')} on {held.get('n')} pairs "
                  f"(rule yes: {held.get('yes_rule')}, rule no: {held.get('no_rule')}, malformed: {held.get('malformed')}); "
                  f"built in {info.report.get('seconds', {}).get('total')} s")


@base_app.command("build", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def base_build(
    recipe: Annotated[Path | None, typer.Argument(help="YAML recipe whose model section names the base and its sizes")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. model.base=tiny-omni", show_default=False)] = None,
) -> None:
    """Build the recipe's model.base into the cache now (a run would build it on first use) and print its time,
    its held-out caption accuracy and its path. A second call finds it in the cache."""
    import time

    from relax_gym.trainer.base.build import ensure_base
    from relax_gym.trainer.config import ConfigError, load_recipe

    try:
        cfg = load_recipe(recipe, list(overrides or []))
    except ConfigError as exc:
        raise _fail(str(exc), 2) from None
    if cfg.model.base is None:
        raise _fail(f"{recipe or 'the default recipe'} names no model.base; pass model.base=NAME "
                    "(relax-gym base list shows the names)", 2)
    start = time.perf_counter()
    with _sft_progress(f"base {cfg.model.base}", "base_step") as on_event:
        info = ensure_base(cfg.model.base, cfg.model, progress=on_event)
    console.print(_base_line({"name": info.name, "path": str(info.path), "built": info.built, "report": info.report}))
    console.print(f"{time.perf_counter() - start:.1f} s in this call")


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    recipe: Annotated[Path | None, typer.Argument(help="YAML recipe (default: recipes/cpu-nextqa.yaml settings)")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. trainer.steps=50", show_default=False)] = None,
    run_dir: Annotated[Path | None, typer.Option(help="where metrics, config and checkpoints go (default runs/<time>)")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue this run directory from its latest checkpoint, with its "
                                                     "own config.json (overrides still apply)", show_default=False)] = None,
) -> None:
    """Train a policy with RL on an environment: trainer.mode=colocate (one process, embedded engine over HTTP, the
    synchronous baseline) or trainer.mode=async (roles as Ray Serve deployments, trainer.max_staleness=S).
    `relax-gym train --resume RUN_DIR [overrides]` continues an interrupted run where its last checkpoint left it."""
    import time

    from relax_gym.trainer.config import ConfigError, load_recipe
    from relax_gym.trainer.train import build_trainer

    overrides = list(overrides or [])
    if resume is not None:
        if recipe is not None and "=" in str(recipe) and not recipe.is_file():
            overrides.insert(0, str(recipe))  # `--resume DIR key=value`: the first override landed in RECIPE
        elif recipe is not None:
            raise _fail(f"--resume {resume} continues that run with its own config.json; pass overrides only, not the "
                        f"recipe {recipe}", 2)
        if run_dir is not None and run_dir.resolve() != resume.resolve():
            raise _fail(f"--resume {resume} writes into that run directory; drop --run-dir {run_dir}", 2)
        recipe, run_dir = resume / "config.json", resume
        if not recipe.is_file():
            raise _fail(f"--resume {resume}: no config.json there, so not a relax-gym run directory", 2)
    try:
        cfg = load_recipe(recipe, overrides)
    except ConfigError as exc:
        raise _fail(str(exc), 2) from None
    run_dir = run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    from relax_gym.cli_progress import TrainProgress

    shown = TrainProgress(console, steps=cfg.trainer.steps, sft_steps=cfg.trainer.sft_warmup_steps,
                          budget_s=cfg.trainer.time_budget_s, eval_every=cfg.trainer.eval_every,
                          base_name=cfg.model.base)
    with shown:

        def on_event(event: str, data: dict) -> None:
            if event == "base":
                console.print(_base_line(data))
            else:
                shown.on_event(event, data)

        from relax_gym.trainer.faults.schedule import InjectedCrash
        from relax_gym.trainer.run.checkpoint import CheckpointError

        try:
            trainer = build_trainer(cfg, run_dir, progress=on_event, resume=resume is not None)
        except CheckpointError as exc:
            raise _fail(str(exc), 2) from None
        try:
            summary = trainer.run()
        except InjectedCrash as exc:
            raise _fail(f"{exc}\nrun dir: {run_dir}") from None
        finally:
            trainer.close()
    console.print(f"run dir: {run_dir}")
    console.print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))


def _base_line(data: dict) -> str:
    r = data["report"]
    acc = " ".join(f"{k} {v:.2f}" for k, v in r.get("held_caption_accuracy", {}).items())
    how = f"built in {r['seconds']['total']:.0f} s" if data["built"] else "from the cache"
    return f"base {data['name']}: {how} (held-out caption accuracy: {acc}) at {data['path']}"


@app.command("plot")
def plot(run_dir: Path) -> None:
    """Draw reward and timing curves of a run (PNG files in the run directory)."""
    from relax_gym.trainer.run.plot import plot_run

    try:
        written = plot_run(run_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from None
    for path in written:
        console.print(f"wrote {path}")


@app.command("view")
def view(
    run_dir: Annotated[Path, typer.Argument(help="a run directory (relax-gym train --run-dir), finished or still going")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: any free port (the URL printed says which)")] = 8787,
    host: Annotated[str, typer.Option(help="address to bind; the page has no login, so keep it on loopback")] = "127.0.0.1",
) -> None:
    """Open a run in the browser: curves from metrics.jsonl, the steps' rollouts as conversations with their video,
    audio and pictures, tool calls set apart, filters, two steps side by side; it refreshes while the run goes on
    (docs/viewer.md). Serves until Ctrl-C."""
    import ipaddress

    from relax_gym.viewer import serve

    if not run_dir.is_dir():
        raise _fail(f"{run_dir} is not a directory (give a run directory: relax-gym train --run-dir DIR)", 2)
    if not any((run_dir / name).exists() for name in ("metrics.jsonl", "config.json", "rollouts")):
        err_console.print(f"[yellow]note:[/] {escape(str(run_dir))} has no metrics.jsonl, config.json or rollouts/ yet; "
                          "the page shows them once the run writes them")
    with contextlib.suppress(ValueError):
        if not ipaddress.ip_address(host).is_loopback:
            err_console.print(f"[yellow]warning:[/] serving on {escape(host)}: anyone who reaches it can read this run")
    try:
        serve(run_dir, host=host, port=port, announce=lambda url: console.print(f"viewing {escape(str(run_dir))} at {url}  "
                                                                                 "(Ctrl-C stops)"))
    except OSError as exc:
        raise _fail(f"cannot listen on {host}:{port}: {exc}") from None
    except KeyboardInterrupt:
        pass


@app.command("bench")
def bench(
    names: Annotated[list[str] | None, typer.Argument(help="benchmarks to run: file names in benchmarks/ without .py",
                                                       show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="run every benchmark")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="each benchmark's quick mode (--all in a few minutes)")] = False,
    list_: Annotated[bool, typer.Option("--list", help="list the benchmarks and exit")] = False,
    docs: Annotated[bool | None, typer.Option("--docs/--no-docs", help="rewrite the generated section of "
                                              "docs/benchmarks.md and its charts (default: with --all)",
                                              show_default=False)] = None,
    docs_file: Annotated[Path | None, typer.Option(help="the markdown file to write (default docs/benchmarks.md)")] = None,
    out: Annotated[Path | None, typer.Option(help="folder for logs, results.json and charts (default runs/bench/<time>)")] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds per benchmark (default: 900 with --quick, none otherwise)")] = None,
    bench_dir: Annotated[Path | None, typer.Option(help="where the benchmark scripts are (default ./benchmarks)")] = None,
) -> None:
    """Run the scripts in benchmarks/ (each in its own process) and print their figures and ratios in one table.
    A benchmark that cannot run here is reported as skipped with the reason; exit 1 when one failed."""
    from relax_gym.bench import BenchError
    from relax_gym.bench.command import BenchOptions, list_benchmarks, run_bench
    from relax_gym.bench.report import DocsMarkerError

    try:
        if list_:
            list_benchmarks(bench_dir, console)
            return
        opts = BenchOptions(list(names or []), all_=all_, quick=quick, docs=docs, docs_file=docs_file, out_dir=out,
                            bench_dir=bench_dir, timeout_s=timeout)
        results = run_bench(opts, console)
    except BenchError as exc:
        raise _fail(str(exc), 2) from None
    except DocsMarkerError as exc:
        raise _fail(str(exc)) from None
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)


def main() -> None:
    from relax_gym.terminate import exit_on_sigterm

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    exit_on_sigterm()  # a SIGTERMed run unwinds: its sandboxes, servers and Ray go before it exits
    app()


if __name__ == "__main__":
    main()
