"""The controller's recovery parts without a cluster: the replica registry, the supervisor's retries and watch,
and what the topology plan hands each role for recovery."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError

from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.async_engine.controller import plan_roles
from relax_gym.trainer.async_engine.recovery import GlobalRestart, ReplacedActorError, ReplicaRegistry, Supervisor, sample_step
from relax_gym.trainer.async_engine.replica import retries_within
from relax_gym.trainer.rollout.samples import sample_id

from ..waiting import run_on_virtual_clock


class Remote:
    """``obj.method.remote(...)`` for a plain object, as a Ray actor handle answers (an awaitable)."""

    def __init__(self, obj) -> None:
        self.obj = obj

    def __getattr__(self, name):
        method = getattr(self.obj, name)

        class Call:
            @staticmethod
            def remote(*args, **kwargs):
                return method(*args, **kwargs)

        return Call


def test_the_registry_counts_replacements_beyond_each_roles_replicas():
    async def body():
        reg = ReplicaRegistry({"env_worker": 2, "actor": 1})
        assert [await reg.started("env_worker", n) for n in ("a", "b")] == [1, 2]
        assert await reg.started("actor", "x") == 1
        assert await reg.restarts() == {"env_worker": 0, "actor": 0}
        waiting = asyncio.ensure_future(reg.wait_change(3))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # no new start yet: the watch waits, it does not poll
        assert await reg.started("env_worker", "c") == 3
        assert await waiting == (4, {"env_worker": 1, "actor": 0})

    asyncio.run(body())


def test_the_watch_asks_for_a_global_restart_on_a_new_actor_or_an_exhausted_budget():
    async def watch(starts, budget=1):
        reg = ReplicaRegistry({"env_worker": 1, "actor": 1})
        sup = Supervisor(Remote(reg), budget=budget, wait_s=1)
        task = asyncio.ensure_future(sup.watch())
        for role in starts:
            await reg.started(role, "r")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        if not task.done():
            task.cancel()
            return None
        with pytest.raises(GlobalRestart) as err:
            task.result()
        return str(err.value)

    assert asyncio.run(watch(["env_worker", "actor", "env_worker"])) is None  # one replacement, within budget 1
    assert "the actor replica was replaced" in asyncio.run(watch(["actor", "actor"]))
    assert "env_worker role was replaced 2 times, more than roles.restart_budget=1" in asyncio.run(
        watch(["env_worker", "env_worker", "env_worker"]))


def test_calls_are_resent_while_a_replica_is_replaced_and_never_for_the_actor():
    async def body():
        sup = Supervisor(None, budget=3, wait_s=5)
        answers = iter([ActorDiedError(), ActorDiedError(), "done"])

        async def flaky():
            a = next(answers)
            if isinstance(a, Exception):
                raise a
            return a

        assert await sup.call("env_worker", flaky, "a group") == "done" and sup.failed_calls["env_worker"] == 2

        async def dead():
            raise ActorDiedError()

        with pytest.raises(GlobalRestart, match="the actor replica died during step 3"):
            await sup.call("actor", dead, "step 3")

        async def replacement():
            raise ReplacedActorError("fresh weights")

        with pytest.raises(GlobalRestart, match="reached a replacement actor replica"):
            await sup.call("actor", replacement, "a checkpoint")

        async def bug():
            raise ValueError("not a replica failure")

        with pytest.raises(ValueError):  # the role's own errors are not retried here
            await sup.call("advantages", bug, "step 1")
        with pytest.raises(GlobalRestart, match="stayed unreachable for 0.1 s"):
            await Supervisor(None, budget=3, wait_s=0.1).call("reference", dead, "step 2")

    asyncio.run(body())


def test_the_plan_wires_every_role_to_the_registry_and_the_actor_to_its_checkpoint():
    cfg = RelaxConfig.model_validate({"trainer": {"mode": "async"}, "algorithm": {"kl_coef": 0.1}})
    specs = {s.name: s for s in plan_roles(cfg, "BUS", "DCS", "run", registry="REG", resume_from="/ckpt")}
    assert set(specs) == {"env_worker", "inference", "reference", "advantages", "actor"}
    assert all(s.kwargs["registry"] == "REG" for s in specs.values())
    assert specs["inference"].kwargs["actor_app"] == "run-actor" and specs["actor"].kwargs["resume_from"] == "/ckpt"


def test_small_helpers():
    assert sample_step(sample_id(12, 3, 1)) == 12
    assert retries_within(1.0) == 3  # 0.2 + 0.4 + 0.8 s of backoff
    assert retries_within(120.0) == 28  # 0.2 .. 3.2 s, then 5 s each


def test_a_cancelled_call_cancels_its_request_in_the_replica():
    """The run ending (or restarting) cancels the controller's tasks; each role request they await is cancelled in its
    replica too, so a replica being stopped is not held by a request nobody waits for (its __del__ then runs)."""

    class Response:  # a DeploymentResponse that never answers
        cancelled = False

        def __await__(self):
            return asyncio.get_running_loop().create_future().__await__()

        def cancel(self):
            Response.cancelled = True

    async def body():
        supervisor = Supervisor(None, budget=1, wait_s=5)
        task = asyncio.ensure_future(supervisor.call("env_worker", Response, "step 1 group 0"))
        await asyncio.sleep(0.05)  # simulated time: the call is awaiting its response
        assert not Response.cancelled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert Response.cancelled

    run_on_virtual_clock(body())
