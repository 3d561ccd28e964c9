"""Fuzzing recipe loading: YAML files (mutations of the shipped recipes and arbitrary YAML) and dotted overrides.

Property: ``load_recipe`` returns a :class:`RelaxConfig` or raises one :class:`ConfigError` that names where the
problem came from -- the recipe file's path, or the override (``override 'k=v'``) -- and never lets a YAML
constructor error, a ``UnicodeDecodeError``, an ``OSError`` or a ``RecursionError`` through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from relax_gym.trainer.config import ConfigError, RelaxConfig, load_recipe

from .support import PARSE, TEXT_CHARS, json_values, long_int, mutated, scratch

pytestmark = pytest.mark.timeout(120)

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
KEYS = ["trainer.steps", "trainer.mode", "trainer.max_staleness", "algorithm.name", "algorithm.temperature",
        "inference.temperature", "inference.host", "actor.lr", "actor.betas", "env.id", "env.kwargs.split",
        "roles.actor.replicas", "roles.bus", "model.hidden_size", "trainer", "trainer.steps.deeper", "nope.key",
        "trainer.stepz", "metrics.tensorboard"]
VALUES = ["50", "-1", "true", "null", "[1, 2]", "{a: 1}", "a: b", "2001-13-45", "2001-02-30 25:61:00", "1e999",
          ".nan", "!!python/object:os.system ls", "&a [*a]", "'unclosed", "{", "0x1F", "1_000", "", long_int]

overrides = st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.one_of(st.sampled_from(VALUES),
                                                                         st.text(TEXT_CHARS, max_size=20))),
    st.text(TEXT_CHARS, max_size=20)), max_size=3)


@st.composite
def recipe_bytes(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["none", "shipped", "mutated", "yaml", "raw"]))
    if kind == "none":
        return None
    if kind == "raw":
        return draw(st.binary(max_size=120))
    if kind == "yaml":
        return yaml.safe_dump(draw(json_values), allow_unicode=True).encode()
    original = draw(st.sampled_from(RECIPES)).read_bytes()
    return original if kind == "shipped" else draw(mutated(original))


@PARSE
@given(recipe=recipe_bytes(), items=overrides)
@example(recipe=None, items=["trainer.steps=2001-13-45"])  # YAML reads it as a date that does not exist
@example(recipe=b"trainer:\n  steps: 2001-13-45\n", items=[])
@example(recipe=b"trainer: " + b"[" * 2_000 + b"]" * 2_000, items=[])  # deeper than the stack
@example(recipe=None, items=["trainer.steps=" + "[" * 2_000])
@example(recipe=b"trainer:\n  steps: \xff\n", items=[])  # not UTF-8
@example(recipe=b"!!python/object/apply:os.system [ls]", items=[])
@example(recipe=b"{[1]: 2}", items=[])
@example(recipe=b"? [a, b]\n: 1\n", items=[])
@example(recipe=b"a: &x [*x]\n", items=[])
@example(recipe=None, items=["trainer=5", "trainer.steps=3"])
def test_load_recipe_returns_config_or_names_the_culprit(recipe: bytes | None, items: list[str]) -> None:
    with scratch() as root:
        path = None
        if recipe is not None:
            path = root / "recipe.yaml"
            path.write_bytes(recipe)
        try:
            cfg = load_recipe(path, items)
        except ConfigError as exc:
            message = str(exc)
            culprits = [str(path)] if path is not None else []
            culprits += [f"override {item!r}" for item in items] + ["defaults:"]
            assert any(c in message for c in culprits), f"{message!r} names none of {culprits}"
            return
        assert isinstance(cfg, RelaxConfig)


def test_recipe_that_is_a_folder_or_missing_names_the_path() -> None:
    with scratch() as root:
        for path in (root, root / "missing.yaml"):
            with pytest.raises(ConfigError) as err:
                load_recipe(path, [])
            assert str(path) in str(err.value)
