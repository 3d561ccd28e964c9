"""The ``judge:`` section: its engine settings, and the combinations refused with one error naming the keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relax_gym.trainer.async_engine.deploy import plan_roles
from relax_gym.trainer.config import RelaxConfig


def cfg(**sections):
    return RelaxConfig.model_validate(sections)


def test_the_judge_engine_takes_its_own_settings_and_the_genrm_role_is_planned_only_with_a_judge():
    c = cfg(judge={"model": "/ckpt", "max_new_tokens": 3, "max_batch": 7}, trainer={"mode": "async"})
    inf = c.judge.inference()
    assert (inf.engine, inf.max_new_tokens, inf.max_batch) == ("embedded", 3, 7)
    specs = {s.name: s for s in plan_roles(c, bus=None, coordinator=None, app_prefix="p")}
    assert specs["genrm"].args == (c.model_dump(mode="json")["judge"],)
    assert specs["env_worker"].kwargs["judge_app"] == "p-genrm"
    plain = {s.name: s for s in plan_roles(cfg(trainer={"mode": "async"}), bus=None, coordinator=None, app_prefix="p")}
    assert "genrm" not in plain and "judge_app" not in plain["env_worker"].kwargs


@pytest.mark.parametrize(("sections", "message"), [
    ({"judge": {"model": "/ckpt", "engine": "sglang", "sglang": {"model_path": "/other"}}}, "must be judge.model"),
    ({"judge": {"model": "/ckpt", "engine": "sglang", "sglang": {"port": 3100}}, "trainer": {"mode": "async"},
      "roles": {"genrm": {"replicas": 2}}}, "use port 0"),
    ({"judge": {"model": "/ckpt", "engine": "sglang", "sglang": {"port": 3100}},
      "inference": {"engine": "sglang", "sglang": {"port": 3100, "model_path": "/p"}}}, "cannot share a port"),
    ({"faults": {"inject": [{"kind": "kill", "role": "genrm", "at_step": 1}]}}, "only with a judge"),
    ({"judge": {"model": "/ckpt", "timeout_s": 0}}, "timeout_s"),
    ({"judge": {"model": "/ckpt", "temperature": 1.0}}, "temperature"),
])
def test_refused_judge_settings_name_the_keys(sections, message):
    with pytest.raises(ValidationError, match=message):
        cfg(**sections)
