"""Registry: Python registration, manifest folders, the pip entry-point group, and the errors users see."""

from __future__ import annotations

import textwrap
from pathlib import Path

import gymnasium
import pytest

import relax_gym
from relax_gym.envs import ManifestError, UnknownEnvError, discover, discovery_errors, load_manifest

from .test_core import Countdown


def write_manifest(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "env.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_builtins_are_registered_in_gymnasium_namespace():
    assert {"nextqa-video", "echo-ink"} <= set(relax_gym.list_envs())
    assert "relax/nextqa-video-v1" in gymnasium.registry and "relax/echo-ink-v1" in gymnasium.registry
    s = relax_gym.spec("relax/nextqa-video")
    assert s.id == "nextqa-video" and s.source.endswith("envs_registry/nextqa-video/env.toml")
    assert s.gym_spec.id == "relax/nextqa-video-v1" and s.versioned_id == "nextqa-video-v1"


def test_a_bare_id_is_its_latest_version_said_once_and_a_versioned_id_that_version(clean_registry, caplog):
    from relax_gym.envs import registry

    registry._noted.discard("nextqa-video")
    with caplog.at_level("INFO", logger="relax_gym.envs.registry"):
        bare, pinned = relax_gym.make("nextqa-video"), relax_gym.make("nextqa-video-v1")
        relax_gym.make("nextqa-video")
    assert bare.spec.id == pinned.spec.id == "relax/nextqa-video-v1"
    assert type(bare.unwrapped) is type(pinned.unwrapped)
    notes = [r.getMessage() for r in caplog.records if "latest version" in r.getMessage()]
    assert notes == ["'nextqa-video' is 'nextqa-video-v1', its latest version; name the version "
                     "('nextqa-video-v1') to pin it"]
    assert gymnasium.make("relax/nextqa-video").spec.id == "relax/nextqa-video-v1"  # gymnasium's own rule
    # a second version beside the first: the bare id moves to it, the first stays constructible
    relax_gym.register("countdown-v1", Countdown, {"max_turns": 3})
    relax_gym.register("countdown", Countdown, {"max_turns": 5}, version=2)
    assert relax_gym.make("countdown-v1").unwrapped.max_turns == 3
    assert relax_gym.make("countdown").unwrapped.max_turns == 5 and registry.versions("countdown") == [1, 2]
    assert registry.resolve_id("countdown") == "countdown-v2" and registry.resolve_id("countdown-v1") == "countdown-v1"
    with pytest.raises(UnknownEnvError, match="no version 3 of 'countdown': its versions are countdown-v1, countdown-v2"):
        relax_gym.make("countdown-v3")
    # an env registered in code without a version keeps its plain id
    relax_gym.register("plain-countdown", Countdown)
    assert registry.resolve_id("plain-countdown") == "plain-countdown" and relax_gym.spec("plain-countdown").version is None


def test_a_manifest_gives_its_version_in_its_own_field(tmp_path):
    path = write_manifest(tmp_path / "x", '''
        id = "my-env-v2"
        dataset = {format = "nextqa"}
    ''')
    with pytest.raises(ManifestError, match=r"'id': .*give the id without its version .*id = 'my-env', version = 2"):
        load_manifest(path)
    path = write_manifest(tmp_path / "y", '''
        id = "my-env"
        version = 3
        [dataset]
        format = "nextqa"
    ''')
    assert load_manifest(path).version == 3


def test_register_in_python_then_make_both_ways(clean_registry):
    relax_gym.register(id="countdown", entry_point=Countdown, kwargs={"max_turns": 3})
    env = relax_gym.make("countdown")
    assert isinstance(env.unwrapped, Countdown) and env.unwrapped.max_turns == 3
    env2 = gymnasium.make("relax/countdown", max_turns=5)  # make kwargs override registered ones
    assert env2.unwrapped.max_turns == 5
    with pytest.raises(ValueError, match="already registered"):
        relax_gym.register(id="countdown", entry_point=Countdown)
    relax_gym.register(id="countdown", entry_point="tests.envs.test_core:Countdown", override=True)
    assert relax_gym.spec("countdown").entry_point == "tests.envs.test_core:Countdown"


def test_unknown_id_lists_close_matches():
    with pytest.raises(UnknownEnvError) as err:
        relax_gym.make("nextqa-vidoe")
    assert "Did you mean: nextqa-video" in str(err.value)
    with pytest.raises(UnknownEnvError, match="Registered: .*echo-ink"):
        relax_gym.spec("zzz")


def test_manifest_folder_on_env_path(tmp_path, monkeypatch, clean_registry):
    write_manifest(tmp_path / "count", """
        id = "countdown-manifest"
        entry_point = "tests.envs.test_core:Countdown"
        modalities = ["text"]
        [kwargs]
        max_turns = 4
    """)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    assert relax_gym.spec("countdown-manifest").source == str(tmp_path / "count" / "env.toml")
    assert relax_gym.make("countdown-manifest").unwrapped.max_turns == 4
    assert discovery_errors() == []


def test_data_env_manifest_gets_the_multiple_choice_entry_point(tmp_path):
    m = load_manifest(write_manifest(tmp_path / "d", """
        id = "my-quiz"
        [dataset]
        format = "jsonl"
        file = "quiz.jsonl"
        [reward]
        accuracy = 1.0
        format = 0.0
    """))
    assert m.resolved_entry_point() == "relax_gym.envs.multiple_choice:MultipleChoiceEnv"
    assert m.constructor_kwargs()["dataset"]["file"] == "quiz.jsonl"


@pytest.mark.parametrize(
    "text, field, reason",
    [
        ('id = "x"\nentry_point = "a.b:C"\n[kwargs\n', None, "invalid TOML"),
        ('entry_point = "a.b:C"\n', "id", "Field required"),
        ('id = "Bad Id!"\nentry_point = "a.b:C"\n', "id", "not a valid env id"),
        ('id = "x"\nentry_point = "not an entry point"\n', "entry_point", "module.path:ClassName"),
        ('id = "x"\n', None, "give either entry_point or a [dataset] table"),
        ('id = "x"\nentry_point = "a.b:C"\ncolour = "red"\n', "colour", "Extra inputs"),
        ('id = "x"\n[dataset]\nformat = "parquet"\n', "dataset.format", "'nextqa', 'r1json' or 'jsonl'"),
        ('id = "x"\n[dataset]\nformat = "jsonl"\n[reward]\naccuracy = "high"\n', "reward.accuracy", "valid number"),
        ('id = "x"\nentry_point = "a.b:C"\nmodalities = ["smell"]\n', "modalities.0", "'text', 'image', 'video' or 'audio'"),
    ],
)
def test_malformed_manifest_names_file_and_field(tmp_path, text, field, reason):
    path = tmp_path / "env.toml"
    path.write_text(text)
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    assert str(path) in str(err.value) and reason in str(err.value)
    assert err.value.field == field
    if field:
        assert f"field {field!r}" in str(err.value)


def test_broken_manifest_on_path_is_reported_not_registered(tmp_path, monkeypatch, clean_registry):
    write_manifest(tmp_path / "broken", 'id = "broken"\n')
    write_manifest(tmp_path / "dupe", 'id = "nextqa-video"\nentry_point = "a.b:C"\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    with pytest.warns(UserWarning, match="skipped an environment"):
        discover(force=True)
    errors = discovery_errors()
    assert any("broken/env.toml" in e and "give either entry_point" in e for e in errors)
    assert any("dupe/env.toml" in e and "already registered" in e for e in errors)
    assert "broken" not in relax_gym.list_envs()
    assert relax_gym.spec("nextqa-video").source.endswith("envs_registry/nextqa-video/env.toml")
    with pytest.raises(UnknownEnvError, match="failed to load: .*broken/env.toml"):
        relax_gym.make("broken")


def test_entry_point_group_registers_installed_packages(tmp_path, monkeypatch, clean_registry):
    """A distribution on sys.path that declares `[relax_gym.envs] countdown-ep = module:Class` is found."""
    dist = tmp_path / "countdown_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: countdown-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[relax_gym.envs]\ncountdown-ep = tests.envs.test_core:Countdown\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    discover(force=True)
    s = relax_gym.spec("countdown-ep")
    assert "countdown-pkg" in s.source and s.entry_point == "tests.envs.test_core:Countdown"
    env = gymnasium.make("relax/countdown-ep")
    assert isinstance(env.unwrapped, Countdown)
