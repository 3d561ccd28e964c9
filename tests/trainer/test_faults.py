"""Fault injection without Ray: the ``faults:`` section's validation, the schedule (when a fault fires, at most once
per step, remembered across a resume), the engine hook and the colocate trainer's step hook."""

from __future__ import annotations

import json
import re

import pytest

from relax_gym.trainer.config import ConfigError, load_recipe
from relax_gym.trainer.faults.hooks import EngineFaults, LocalFaults, SandboxHangs
from relax_gym.trainer.faults.schedule import FaultSchedule, FaultsSection, InjectedCrash, InjectedFault


def section(*inject: dict, seed: int = 0) -> FaultsSection:
    return FaultsSection.model_validate({"seed": seed, "inject": list(inject)})


@pytest.mark.parametrize("override, message", [
    ("faults.inject=[{kind: kill, role: actor}]", "exactly one of at_step or probability"),
    ("faults.inject=[{kind: kill, role: actor, at_step: 2, probability: 0.5}]", "exactly one of at_step or probability"),
    ("faults.inject=[{kind: kill, role: actr, at_step: 1}]", "faults.inject.0.kill.role"),
    ("faults.inject=[{kind: crash, at_step: 1}]", "does not match any of the expected tags"),
    ("faults.inject=[{kind: engine_error, at_step: 0}]", "faults.inject.0.engine_error.at_step"),
    ("faults.inject=[{kind: sandbox_hang, probability: 1.5}]", "faults.inject.0.sandbox_hang.probability"),
    ("faults.injekt=[]", "unknown key 'faults.injekt' (did you mean 'faults.inject'?)"),
    ("faults.inject=[{kind: kill, role: inference, rank: 1, at_step: 2}]", "names a rank of the actor's group, not of "
                                                                          "role 'inference'"),
])
def test_bad_fault_specs_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(None, [override])


def test_killing_an_actor_rank_that_does_not_exist_names_it(ray_session):
    from relax_gym.trainer.async_engine.recovery import RecoveryError, kill_rank

    with pytest.raises(RecoveryError, match=r"no actor rank named 'no-such-run-actor-rank3' to kill"):
        kill_rank("no-such-run-actor", 3)


def test_killing_a_reference_the_run_does_not_deploy_is_refused():
    with pytest.raises(ConfigError, match=r"faults.inject\[0\] kills the reference role"):
        load_recipe(None, ["trainer.mode=async", "faults.inject=[{kind: kill, role: reference, at_step: 1}]"])
    cfg = load_recipe(None, ["trainer.mode=async", "algorithm.kl_coef=0.1", "faults.inject=[{kind: kill, role: reference, at_step: 1}]"])
    assert cfg.faults.inject[0].role == "reference"


def test_a_fault_at_a_step_fires_once_and_not_again_after_a_resume(tmp_path):
    sched = FaultSchedule(section({"kind": "kill", "role": "inference", "at_step": 3},
                                  {"kind": "engine_error", "at_step": 3, "count": 2}), tmp_path)
    assert sched.due(2) == [] and [f.spec.kind for f in sched.due(3)] == ["kill", "engine_error"]
    kill = sched.due(3)[0]
    sched.record(kill, replica="r1")
    assert [f.spec.kind for f in sched.due(3)] == ["engine_error"]  # the kill fired; the other has not yet
    entry = json.loads((tmp_path / "faults.jsonl").read_text())
    assert (entry["step"], entry["kind"], entry["spec"]["role"], entry["replica"]) == (3, "kill", "inference", "r1")
    reloaded = FaultSchedule(sched.section, tmp_path)  # a resumed run replays step 3 without the kill
    assert [f.spec.kind for f in reloaded.due(3)] == ["engine_error"]
    assert reloaded.counts() == {"kill": 1, "kill:inference": 1}


def test_probabilistic_faults_follow_the_seed():
    def hits(seed: int) -> list[int]:
        sched = FaultSchedule(section({"kind": "kill", "role": "env_worker", "probability": 0.25}, seed=seed))
        return [k for k in range(1, 401) if sched.due(k)]

    assert hits(0) == hits(0) and hits(0) != hits(1)
    assert 70 <= len(hits(0)) <= 130  # 400 draws at p = 0.25: 100 expected


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def generate(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "out"


def test_an_armed_engine_raises_exactly_count_times():
    engine = FakeEngine()
    faults = EngineFaults(engine)
    assert engine.generate(1) == "out"
    faults.arm(2)
    for _ in range(2):
        with pytest.raises(InjectedFault):
            engine.generate(2)
    assert engine.generate(3, x=1) == "out" and faults.raised == 2
    assert engine.calls == [((1,), {}), ((3,), {"x": 1})]  # the failed calls never reached the engine
    with pytest.raises(TypeError, match="inference.engine=embedded"):
        EngineFaults(object())


def test_the_colocate_hook_crashes_on_a_kill_and_arms_the_others(tmp_path):
    engine = FakeEngine()
    sched = FaultSchedule(section({"kind": "engine_error", "at_step": 1}, {"kind": "sandbox_hang", "at_step": 1, "count": 3},
                                  {"kind": "kill", "role": "actor", "at_step": 2}), tmp_path)
    local = LocalFaults(sched, engine)
    hung = SandboxHangs.hung
    try:
        local.start_step(1)
        with pytest.raises(InjectedFault):
            engine.generate()
        assert [SandboxHangs._take() for _ in range(4)] == [True, True, True, False] and SandboxHangs.hung == hung + 3
    finally:
        SandboxHangs.disarm()
    with pytest.raises(InjectedCrash, match="actor killed at step 2.*--resume"):
        local.start_step(2)
    local.start_step(2)  # after the crash the kill is in the log: a resumed run goes on
    assert FaultSchedule(sched.section, tmp_path).counts() == {"engine_error": 1, "sandbox_hang": 1, "kill": 1, "kill:actor": 1}
