from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from relax_gym.trainer.config_loader import ConfigError, load_config, parse_override


class Trainer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(default=10, ge=1)
    mode: Literal["colocate", "async"] = "colocate"
    tags: list[str] = Field(default_factory=list)


class Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trainer: Trainer = Field(default_factory=Trainer)
    seed: int = 0


def write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_yaml_then_overrides(tmp_path):
    p = write(tmp_path, "trainer:\n  steps: 5\n  mode: async\nseed: 3\n")
    cfg = load_config(p, ["trainer.steps=50", "trainer.tags=[a, b]", "seed=7"], Root)
    assert (cfg.trainer.steps, cfg.trainer.mode, cfg.trainer.tags, cfg.seed) == (50, "async", ["a", "b"], 7)
    assert load_config(None, [], Root) == Root()


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ("trainer:\n  stepz: 5\n", [], "r.yaml: unknown key 'trainer.stepz' (did you mean 'trainer.steps'?)"),
        ("trainer:\n  steps: 0\n", [], "r.yaml: trainer.steps: Input should be greater than or equal to 1 (got 0)"),
        ("", ["trainer.mode=sync"], "override 'trainer.mode=sync': trainer.mode: Input should be 'colocate' or 'async' (got 'sync')"),
        ("", ["trainer.steps=many"], "override 'trainer.steps=many': trainer.steps: Input should be a valid integer"),
        ("", ["traner.steps=3"], "override 'traner.steps=3': unknown key 'traner' (did you mean 'trainer'?)"),
        ("trainer: [1, 2]\n", [], "r.yaml: trainer: Input should be a valid dictionary"),
        ("trainer:\n  steps: 5\n   mode: x\n", [], "r.yaml line 3 column"),
        ("- just\n- a list\n", [], "a recipe must be a mapping"),
        ("seed: 1\n", ["seed.value=2"], "seed is a value, not a section"),
        ("", ["steps"], "must look like section.key=value"),
    ],
)
def test_errors_name_the_key_and_the_source(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), overrides, Root)
    assert message in str(err.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: recipe file not found"):
        load_config("nope.yaml", [], Root)


def test_override_value_parsing():
    assert parse_override("a.b=1.5") == ("a.b", 1.5)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=null") == ("a", None)
    assert parse_override("a=text with: colon") == ("a", "text with: colon")
