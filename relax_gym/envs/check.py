"""``check_env``: gymnasium's own checker plus the relax rules an RL trainer relies on."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import gymnasium
from gymnasium.utils.env_checker import check_env as gym_check_env

from relax_gym.envs.core import AgentEnv, Status
from relax_gym.envs.rubric import combine
from relax_gym.omni import dumps

GARBAGE_ACTIONS = ("", "   ", "no tags at all", "<answer>", "<answer>Z</answer>", "\x00\x01\ufffd", "x" * 70_000)


class EnvCheckError(AssertionError):
    """One broken rule: ``rule`` names it, the message says what broke (the part, action or seed at fault). Whatever
    an env raises while a rule runs (gymnasium's own asserts included) comes out as this, the original chained."""

    def __init__(self, message: str, *, rule: str = "") -> None:
        super().__init__(f"[{rule}] {message}" if rule else message)
        self.rule = rule


@contextmanager
def _rule(name: str) -> Iterator[None]:
    """Run one rule: an EnvCheckError gets the rule's name, any other exception becomes one."""
    try:
        yield
    except EnvCheckError as exc:
        if exc.rule:
            raise
        raise EnvCheckError(str(exc), rule=name) from exc.__cause__
    except Exception as exc:  # an env may raise anything; the checker reports it as the rule's failure
        raise EnvCheckError(f"{type(exc).__name__}: {exc}", rule=name) from exc


@dataclass
class CheckReport:
    env_id: str
    passed: list[str] = field(default_factory=list)
    gym_warnings: list[str] = field(default_factory=list)


def check_env(env: gymnasium.Env, *, seeds: tuple[int, ...] = (0, 1, 2), skip_gym: bool = False) -> CheckReport:
    """Raise :class:`EnvCheckError` on the first broken rule; return what passed.

    Rules: gymnasium's ``env_checker`` (spaces, seeding, determinism, passive checks); same seed ⇒ same
    episode (observation JSON and gold); observations serialise to JSON; the gold action earns the maximum
    reward; garbage actions (empty, no tags, wrong letter, control bytes, oversize) earn the minimum, with no
    exception. Judge parts a rubric leaves pending (``info["judge_requests"]``) count as a perfect verdict (1) for
    the gold actions and as 0 otherwise.
    """
    base = env.unwrapped
    if not isinstance(base, AgentEnv):
        raise EnvCheckError(f"{type(base).__name__} is not a relax_gym AgentEnv", rule="AgentEnv")
    report = CheckReport(env_id=getattr(env.spec, "id", type(base).__name__))
    if not skip_gym:
        with _rule("gymnasium env_checker"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                gym_check_env(base, skip_render_check=False, skip_close_check=False)
            except AssertionError as exc:  # e.g. "not within the observation space": say which part
                problem = _space_problem(base)
                raise EnvCheckError(problem or str(exc)) from exc
        report.gym_warnings = [str(w.message) for w in caught]
        report.passed.append("gymnasium env_checker")
    low, high = base.reward_bounds
    for seed in seeds:
        with _rule("same seed => same episode"):
            obs1, info1 = base.reset(seed=seed)
            text1 = _obs_json(obs1, f"reset(seed={seed})")
            obs2, info2 = base.reset(seed=seed)
            if _obs_json(obs2, f"reset(seed={seed})") != text1 or info1["gold"] != info2["gold"]:
                raise EnvCheckError(f"reset(seed={seed}) twice gave different episodes")
            for key in ("episode_id", "turn", "status", "gold"):
                if key not in info1:
                    raise EnvCheckError(f"reset info lacks {key!r}")
        with _rule("gold action => max reward"):
            total = _play_gold(base, seed)
            if abs(total - high) > 1e-6:
                raise EnvCheckError(f"seed {seed}: gold actions earned {total}, the maximum is {high}")
    report.passed += ["same seed => same episode", "observations serialise to JSON", "gold action => max reward"]
    for action in GARBAGE_ACTIONS:
        with _rule("garbage action => min reward, no exception"):
            base.reset(seed=seeds[0])
            try:
                _, reward, terminated, truncated, info = base.step(action)
            except Exception as exc:  # any exception here is the failure we report
                raise EnvCheckError(f"step({_short(action)}) raised {type(exc).__name__}: {exc}") from exc
            if reward > low + 1e-6:
                raise EnvCheckError(f"garbage action {_short(action)} earned {reward}, the minimum is {low}")
            if "reward_breakdown" not in info or info.get("status") not in {s.value for s in Status}:
                raise EnvCheckError(f"step({_short(action)}) info lacks reward_breakdown or a valid status")
    report.passed.append("garbage action => min reward, no exception")
    return report


def _space_problem(env: AgentEnv) -> str | None:
    """After gymnasium's checker refused an observation: which message and part of a fresh reset is outside the
    space (None when the reset's observation is fine, so the problem was elsewhere)."""
    try:
        obs, _ = env.reset(seed=0)
    except Exception as exc:  # noqa: BLE001 - reset itself explains (our AgentEnv names the part)
        return f"{type(exc).__name__}: {exc}"
    return env._observation_problem(obs)


def _play_gold(env: AgentEnv, seed: int) -> float:
    _, info = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(info["gold"])
        _obs_json(obs, f"step (seed {seed})")
        if info["status"] == Status.ENV_ERROR.value:
            raise EnvCheckError(f"seed {seed}: the gold action {_short(str(info['gold']))} ended in an env error: "
                                f"{info.get('error', '?')}{_tool_traceback(info)}")
        if info["status"] != Status.OK.value and not terminated:
            why = info.get("status_detail") or info.get("error") or ""
            raise EnvCheckError(f"seed {seed}: the gold action ended with status {info['status']}"
                                f"{': ' + why if why else ''}{_tool_traceback(info)}")
        if info.get("judge_requests"):  # a perfect judge approves the gold answer
            judged = {request["part"]: 1.0 for request in info["judge_requests"]}
            reward = combine(info["reward_weights"], {**info["reward_breakdown"], **judged})
        total += reward
        done = terminated or truncated
    return total


def _tool_traceback(info: dict) -> str:
    """The traceback of a tool that raised during the step, when the env put one in ``info`` (tool envs do)."""
    tb = info.get("tool_traceback")
    return f"\n{tb}" if tb else ""


def _obs_json(obs, where: str) -> str:
    try:
        text = dumps(obs, sort_keys=True)
        json.loads(text)
    except (TypeError, ValueError) as exc:
        raise EnvCheckError(f"{where}: observation does not serialise to JSON: {exc}") from exc
    return text


def _short(action: str) -> str:
    return repr(action if len(action) < 30 else action[:20] + f"...({len(action)} chars)")
