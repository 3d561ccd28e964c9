"""relax_gym.trainer.policy.requirements: an old transformers is refused by name before any model is built."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import transformers

from relax_gym.trainer.policy import model as policy_model
from relax_gym.trainer.policy.requirements import MIN_TRANSFORMERS, TransformersTooOld, require_transformers

REPO = Path(__file__).resolve().parents[3]


def test_a_release_before_the_floor_is_refused_with_both_versions_and_the_fix():
    with pytest.raises(TransformersTooOld) as err:
        require_transformers("5.17.0")  # the H200 machine's (docs/gpu-results.md)
    message = str(err.value)
    assert "transformers 5.17.0 is installed" in message
    assert f"pip install 'transformers>={MIN_TRANSFORMERS}'" in message


@pytest.mark.parametrize("version", [MIN_TRANSFORMERS, "5.25.0", "6.0.0.dev0"])
def test_the_floor_and_later_releases_pass(version):
    require_transformers(version)


def test_build_policy_refuses_an_old_transformers_before_building_anything(monkeypatch):
    built = []
    monkeypatch.setattr(transformers, "__version__", "5.20.2")  # before the thinker's language_model layout
    monkeypatch.setattr(policy_model, "build_processor", lambda cfg: built.append(cfg))
    with pytest.raises(TransformersTooOld, match="5.20.2"):
        policy_model.build_policy()
    assert built == []


def test_the_installed_transformers_passes_and_pyproject_pins_the_same_floor():
    require_transformers()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"transformers>={MIN_TRANSFORMERS.removesuffix('.0')}" in deps
