"""recipes/cpu-openai-agent.yaml end to end: a black-box agent on the official openai client, inside a docker or
bubblewrap sandbox with no network, trained for 1 step in colocate mode on each and 1 in async mode (Docker); and
agents on five clients (the openai client on both APIs, the Agents SDK, Anthropic's, LangChain's) trained 3 steps
in docker sandboxes.

Checked: the runs reach their last step with no masked episode; the warm-up played the gold replies through the
real program; every sandbox showed only ``lo``; and (colocate, in process) every sequence the actor trained on is
exactly the token ids the gateway recorded for that episode's final call, prompt and completion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.docker import LABEL

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="trains a sandboxed OpenAI-client agent in both modes (Docker, bubblewrap, Ray Serve)"),
              pytest.mark.timeout(900)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-openai-agent.yaml"
P, G, STEPS = 2, 2, 2
TINY = ["trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", f"trainer.prompts_per_step={P}",
        f"trainer.group_size={G}", "trainer.eval_episodes=2", "trainer.eval_every=2", "inference.max_new_tokens=24",
        "metrics.tensorboard=false", "trainer.time_budget_s=null",
        # a hang guard, not a speed bound: on a busy machine a program's turns (container start, the SDK's import,
        # the policy's replies through the roles) outlast the env's default 120 s, and the episode would be masked
        "env.kwargs.program_timeout_s=900"]


def _need(backend: str) -> None:
    problem = get_backend(backend).check()
    if problem:
        pytest.skip(f"{backend} sandbox backend unavailable: {problem}")


@pytest.fixture(autouse=True)
def no_sandbox_left():
    """The in-process (colocate) runs lease their sandboxes from this process's pools: nothing may outlive a test."""
    yield
    for name in ("docker", "bwrap"):
        backend = get_backend(name)
        if backend.check() is None:
            sync.run(shared_pool(name).close())
            assert not backend.live(), f"{name} sandboxes left alive"


def _train(run_dir: Path, *overrides: str, steps: int = STEPS) -> list[dict]:
    args = ["train", str(RECIPE), *TINY, f"trainer.steps={steps}", *overrides, "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    assert all(r.get("episodes_masked", 0) == 0 and r.get("status_env_error", 0) == 0 for r in trained), trained
    assert all(r["agent_segments_mean"] == 1.0 and r["agent_untrained_tokens"] == 0 for r in trained)
    assert [r["step"] for r in rows if r["step"] < 0] == [-1], "the warm-up step (gold replies through the program)"
    assert "eval_reward" in rows[-1]
    return trained


class Recorder:
    """What a colocate run (in this process) recorded and trained: the gateway's final call of each episode (prompt +
    completion ids), the sequences handed to the actor's RL step, each episode's sandbox interfaces and client (the
    env's ``task_client``, where it has one)."""

    def __init__(self, monkeypatch) -> None:
        from relax_gym.envs.agent_program import AgentProgramEnv
        from relax_gym.trainer.actors.hf import HFActor
        from relax_gym.trainer.gateway.openai_gateway import OpenAIGateway

        self.recorded: list[list[int]] = []
        self.trained: list[list[int]] = []
        self.interfaces: list[list[str]] = []
        self.clients: list[tuple[str | None, int | None]] = []  # (client, seed) of each episode run
        close_session, rl_step, outcome = OpenAIGateway.close_session, HFActor.rl_step, AgentProgramEnv._outcome

        def keep_calls(gateway, session):
            calls, failures = close_session(gateway, session)
            assert not failures, failures
            if calls:
                self.recorded.append(list(calls[-1].prompt_ids) + list(calls[-1].completion_ids))
            return calls, failures

        def keep_items(actor, items, *args, **kwargs):
            self.trained.extend(list(t.input_ids) for t in items)
            return rl_step(actor, items, *args, **kwargs)

        def keep_outcome(env, run):
            self.interfaces.append(run.interfaces)
            self.clients.append((getattr(env, "task_client", None), getattr(env, "episode_seed", None)))
            return outcome(env, run)

        monkeypatch.setattr(OpenAIGateway, "close_session", keep_calls)
        monkeypatch.setattr(HFActor, "rl_step", keep_items)
        monkeypatch.setattr(AgentProgramEnv, "_outcome", keep_outcome)

    def assert_trained_on_recorded_ids_in_lo_only_sandboxes(self) -> None:
        assert self.trained and all(ids in self.recorded for ids in self.trained), \
            "a trained sequence differs from every recorded one"
        assert self.interfaces and all(tuple(i) == ("lo",) for i in self.interfaces), self.interfaces


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_colocate_trains_on_exactly_the_recorded_tokens(tmp_path, monkeypatch, backend):
    _need(backend)
    recorder = Recorder(monkeypatch)
    _train(tmp_path / "run", f"env.kwargs.backend={backend}", steps=1)
    recorder.assert_trained_on_recorded_ids_in_lo_only_sandboxes()


def test_agents_on_five_clients_train_three_steps_on_their_recorded_tokens(tmp_path, monkeypatch):
    """The notebook task (tests/envs/agent_clients.py) on the official openai client (Chat Completions and the
    Responses API), Anthropic's client (Messages), the OpenAI Agents SDK (its default Responses model, a function
    tool) and LangChain's ChatOpenAI (Chat Completions), from their own venv, in docker sandboxes whose only
    interface is lo; the episode's seed picks the client, so one run trains all five: 3 colocate steps (after the
    warm-up's gold replies through the programs), each trained sequence equal to the ids the gateway recorded for
    its episode."""
    _need("docker")
    import relax_gym
    from relax_gym.trainer.run.seeds import EVAL_SEED_BASE
    from tests.envs.agent_clients import CLIENTS, NotebookAgentEnv

    from ..registry_state import restored_registry

    recorder = Recorder(monkeypatch)
    with restored_registry():
        relax_gym.register("test-notebook-clients", NotebookAgentEnv, override=True)
        # one eval episode at the start and the end (each episode is a program in a container: ~2.5 s of CPU)
        _train(tmp_path / "run", "env.id=test-notebook-clients", "env.kwargs.backend=docker", "trainer.sft_batch_size=4",
               "trainer.eval_every=1000", "trainer.eval_episodes=1", steps=3)
    recorder.assert_trained_on_recorded_ids_in_lo_only_sandboxes()
    trained = {client for client, seed in recorder.clients if seed < EVAL_SEED_BASE}  # not the eval episodes
    assert trained == set(CLIENTS), recorder.clients


def test_async_mode_trains_the_agent_in_docker_and_leaves_no_container(ray_session, tmp_path):
    """Async, one step (the agent's colocate runs above train two), two env-worker replicas, one killed at step 1
    with ``ray.kill`` (forced: no ``__del__``, no atexit; its containers are orphans). The replacement's pool reaps
    containers whose owner died when it starts (the "next start"), and at the run's end every replica stops
    gracefully, its ``__del__`` closing its envs and sandbox pool. Counted with the Docker API by our label: none of
    the run's containers is left when ``relax-gym train`` returns, with no ``relax-gym sandbox gc``."""
    _need("docker")
    docker = get_backend("docker")
    before, since = set(docker.every()), int(time.time()) - 1
    run_dir = tmp_path / "run"
    _train(run_dir, "env.kwargs.backend=docker", "trainer.mode=async", "trainer.max_staleness=1",
           "roles.env_worker.replicas=2", "roles.health_check_period_s=2",
           "faults.inject=[{kind: kill, role: env_worker, at_step: 1}]", steps=1)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["faults_injected"] == {"kill": 1, "kill:env_worker": 1}
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    created = docker._api().events(since=since, until=int(time.time()) + 1, decode=True,
                                   filters={"type": "container", "event": "create", "label": LABEL})
    assert len(list(created)) >= 2, "the run's episodes should have run in containers"
    left = set(docker.every()) - before
    assert not left, f"containers of the run left after it returned: {sorted(left)}"
