"""Fuzzing ``env.toml`` manifests and manifest discovery.

Properties: ``load_manifest`` returns a valid :class:`EnvManifest` or raises one :class:`ManifestError` that starts
with the file's path (and names the dotted field when one is at fault); an accepted id or entry point really has
the documented shape. Discovery over a folder of good and bad manifests registers every good one in both
relax-gym's and gymnasium's registry, lists every bad one in ``discovery_errors()`` by file, and never leaves an id
in one registry but not the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from pathlib import Path

import gymnasium
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relax_gym.envs import registry as reg
from relax_gym.envs.manifest import EnvManifest, ManifestError, load_manifest

from .support import DEEP, PARSE, TEXT_CHARS, assert_names, failure_of, mutated, scratch

pytestmark = pytest.mark.timeout(120)

ID_SHAPE = re.compile(r"[a-z0-9][a-z0-9_.\-]*")
ENTRY_POINT_SHAPE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

GOOD_DATA_ENV = """\
id = "fuzz-data"
description = "a data env"
modalities = ["video", "text"]
tags = ["fuzz"]

[dataset]
format = "nextqa"
split = "val"
sample = "nextqa"

[reward]
accuracy = 1.0
format = 0.1

[kwargs]
max_turns = 1
"""

GOOD_CODE_ENV = """\
id = "fuzz-code"
entry_point = "tests.envs.test_core:Countdown"

[sandbox]
network = false
memory_mb = 256
"""


def toml_string(value: str) -> str:
    """A TOML basic string (JSON escapes minus the ones TOML lacks: DEL must be escaped too)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


FIELDS = ["id", "description", "entry_point", "dataset", "reward", "modalities", "kwargs", "sandbox", "tags", "bogus"]
toml_scalars = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(TEXT_CHARS, max_size=30),
                         st.sampled_from(["nextqa", "r1json", "jsonl", "val", "mod:Cls", "fuzz-x", "video", "x\n"]))
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["format", "split", "sample", "file", "accuracy", "network", "uid", "k"]), inner,
                    max_size=3)), max_leaves=8)


@st.composite
def manifest_texts(draw: st.DrawFn) -> bytes:
    """Structured manifests (real field names, values of any TOML type), mutations of good ones, raw bytes."""
    kind = draw(st.sampled_from(["structured", "mutated", "raw"]))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "mutated":
        return draw(mutated(draw(st.sampled_from([GOOD_DATA_ENV, GOOD_CODE_ENV])).encode()))
    table = draw(st.dictionaries(st.sampled_from(FIELDS), toml_values, max_size=6))
    if draw(st.booleans()):
        table["id"] = draw(st.one_of(st.from_regex(ID_SHAPE, fullmatch=True), st.text(TEXT_CHARS, max_size=12)))
    return "\n".join(f"{k} = {toml_value(v)}" for k, v in table.items()).encode()


@PARSE
@given(raw=manifest_texts())
@example(raw=b'id = "abc\\n"\nentry_point = "m:C"')  # an id that only matches with a trailing newline
@example(raw=b'id = "abc"\nentry_point = "m:C\\n"')
@example(raw=b"id = " + b"[" * DEEP + b"]" * DEEP)  # nesting deeper than the interpreter stack
@example(raw=b"a = " + b"{b = " * DEEP + b"1" + b"}" * DEEP)
@example(raw=b'id = "x"\xff')
def test_load_manifest_returns_a_valid_manifest_or_names_the_file(raw: bytes) -> None:
    with scratch() as root:
        path = root / "env.toml"
        path.write_bytes(raw)
        exc = failure_of(load_manifest, root, expected=ManifestError)
        if exc is None:
            manifest = load_manifest(path)
            assert isinstance(manifest, EnvManifest)
            assert ID_SHAPE.fullmatch(manifest.id), f"accepted a malformed id {manifest.id!r}"
            if manifest.entry_point is not None:
                assert ENTRY_POINT_SHAPE.fullmatch(manifest.entry_point), manifest.entry_point
            assert manifest.entry_point is not None or manifest.dataset is not None
            return
        assert type(exc) is ManifestError
        assert str(exc).startswith(f"{path}: "), str(exc)
        assert exc.file == str(path)
        if exc.field is not None:
            assert_names(exc, f"field {exc.field!r}")


def test_missing_and_unreadable_manifests_name_the_file() -> None:
    with scratch() as root:
        exc = failure_of(load_manifest, root / "nowhere", expected=ManifestError)
        assert exc is not None and exc.reason == "file not found"
        assert_names(exc, str(root / "nowhere"))
        (root / "env.toml").mkdir()  # a folder where the manifest file should be
        exc = failure_of(load_manifest, root, expected=ManifestError)
        assert exc is not None
        assert str(exc).startswith(f"{root / 'env.toml'}: ")


@st.composite
def manifest_folders(draw: st.DrawFn) -> list[tuple[str, bytes | None]]:
    """Several manifest folders: valid ones (some sharing an id, some versioned gymnasium-style) and broken ones
    (``None``: a folder named ``env.toml`` where the file should be)."""
    entries = []
    ids = st.sampled_from(["fuzz-a", "fuzz-a-v1", "fuzz-a-v2", "fuzz-b", "fuzz-b.c", "fuzz-c-v0"])
    for i in range(draw(st.integers(1, 6))):
        roll = draw(st.integers(0, 7))
        if roll == 0:
            body = None  # a folder called env.toml
        elif roll <= 2:
            body = draw(manifest_texts())
        else:
            env_id = draw(ids)
            body = f'id = "{env_id}"\nentry_point = "tests.envs.test_core:Countdown"\n[kwargs]\nmax_turns = {i + 1}\n'.encode()
        entries.append((f"m{i}", body))
    return entries


@contextlib.contextmanager
def isolated_registry(env_path: Path):
    """Point discovery at ``env_path`` and put both registries back as they were afterwards."""
    reg.discover()  # discovery is lazy: run it first, so what is saved and put back is the discovered registry
    saved_specs, saved_errors, saved_gym = dict(reg._specs), list(reg._errors), dict(gymnasium.registry)
    saved_var = os.environ.get(reg.ENV_PATH_VAR)
    os.environ[reg.ENV_PATH_VAR] = str(env_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 'skipped an environment' is the expected outcome for broken ones
            yield
    finally:
        if saved_var is None:
            os.environ.pop(reg.ENV_PATH_VAR, None)
        else:
            os.environ[reg.ENV_PATH_VAR] = saved_var
        reg._specs.clear()
        reg._specs.update(saved_specs)
        reg._errors[:] = saved_errors
        gymnasium.registry.clear()
        gymnasium.registry.update(saved_gym)


@PARSE
@given(folders=manifest_folders())
@example(folders=[("m0", b'id = "fuzz-z"\nentry_point = "a:B"\n'), ("m1", b'id = "fuzz-z-v1"\nentry_point = "a:B"\n')])
@example(folders=[("m0", None), ("m1", b'id = "fuzz-x"\nentry_point = "a:B"\n')])
@example(folders=[("m0", b'id = "fuzz-y-v3"\nentry_point = "a:B"\n'), ("m1", b'id = "fuzz-y"\nentry_point = "a:B"\n')])
def test_discovery_registers_each_manifest_fully_or_not_at_all(folders) -> None:
    with scratch() as root:
        for name, body in folders:
            (root / name).mkdir()
            if body is None:
                (root / name / "env.toml").mkdir()
            else:
                (root / name / "env.toml").write_bytes(body)
        with isolated_registry(root):
            before = set(reg._specs)
            gym_before = {k for k in gymnasium.registry if k.startswith("relax/")}
            reg.discover(force=True)  # must not raise, whatever the folder holds
            errors = reg.discovery_errors()
            added = set(reg._specs) - before
            for env_id in added:
                spec = reg._specs[env_id]
                assert spec.source.startswith(str(root)), spec.source
                gym = gymnasium.registry.get(spec.gym_id)  # relax/<id>-v<version>
                assert gym is not None, f"{env_id} is in relax-gym's registry but not gymnasium's"
                assert gym.kwargs == spec.kwargs
            gym_added = {k for k in gymnasium.registry if k.startswith("relax/")} - gym_before
            assert gym_added == {reg._specs[i].gym_id for i in added}, "the two registries disagree"
            for name, _ in folders:
                path = root / name / "env.toml"
                registered = any(s.source == str(path) for s in reg._specs.values())
                reported = any(e.startswith(f"{path}: ") for e in errors)
                assert registered or reported, f"{path} was neither registered nor reported: {errors}"
                assert not (registered and reported), f"{path} was registered and reported as broken"
