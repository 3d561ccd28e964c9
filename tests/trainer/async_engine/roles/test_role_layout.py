"""DESIGN.md's rule for the async engine: a role module never imports another role module; and a role that holds no
model starts without the model's code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROLES = Path(__file__).resolve().parents[4] / "relax_gym" / "trainer" / "async_engine" / "roles"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_roles_do_not_import_each_other():
    modules = sorted(p for p in ROLES.glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in modules} >= {"env_worker", "inference", "reference", "advantages", "actor"}
    for path in modules:
        others = {f"relax_gym.trainer.async_engine.roles.{p.stem}" for p in modules if p != path}
        bad = imported_modules(path) & (others | {"relax_gym.trainer.async_engine.roles"})
        assert not bad, f"{path.name} imports another role: {sorted(bad)}"


# Every replica of a role imports its module in a fresh Ray worker, once per start and again after each restart: the
# roles that hold no model must not pay for transformers' modelling code (~2.5 s of CPU, half of such a replica's
# start on this machine).
MODEL_CODE = ("transformers.modeling_utils", "relax_gym.trainer.policy.model", "relax_gym.trainer.actors.hf")


# what the role's __init__ does beyond the import: the env worker builds the policy's processor to render prompts
BUILDS = {"env_worker": "from relax_gym.trainer.async_engine.replica import build_processor_only; "
                        "from relax_gym.trainer.policy.config import PolicyConfig; build_processor_only(PolicyConfig()); ",
          "advantages": ""}


@pytest.mark.parametrize("role", ["env_worker", "advantages"])
def test_roles_without_a_model_do_not_import_the_model_code(role):
    child = (f"import sys, relax_gym.trainer.async_engine.roles.{role}; {BUILDS[role]}"
             f"print(','.join(m for m in {MODEL_CODE!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "", f"the {role} role (import and set-up) loads {out.stdout.strip()}"


def test_the_policy_package_loads_its_parts_on_use():
    child = ("import sys, relax_gym.trainer.policy as p; before = 'relax_gym.trainer.policy.model' in sys.modules; "
             "p.build_policy; print(before, 'relax_gym.trainer.policy.model' in sys.modules, p.PolicyConfig().family)")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["False", "True", "qwen2_5_omni"]
