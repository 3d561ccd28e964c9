"""The environment registry. Ids live in gymnasium's registry under the ``relax`` namespace, versioned as gymnasium spells it
(``relax/nextqa-video-v1``; the bare id means the latest version), so both
``relax_gym.make("nextqa-video")`` and ``gymnasium.make("relax/nextqa-video")`` work (the latter once discovery
has run: after the first ``make`` / ``list_envs`` / ``spec``, or ``discover()``).

Three ways in:
1. ``relax_gym.register(id=..., entry_point="pkg.mod:Class", kwargs={...})`` in Python;
2. manifest folders (``env.toml``) in the built-in ``envs_registry/`` and in ``RELAX_GYM_ENV_PATH``
   (``os.pathsep``-separated; each entry is a manifest folder or a folder of them);
3. installed packages exposing entry points in the group ``relax_gym.envs``: the entry point's *name* is the
   env id and its *value* the env class (``my-env = "my_pkg.envs:MyEnv"``); nothing is imported until made.

A manifest with a rubric (``[[reward.parts]]``) registers :func:`~relax_gym.envs.rubric_env.make_with_rubric` as the
entry point: it builds the env from the manifest's own entry point and hands it the rubric (``envs show`` still
shows the env's entry point and kwargs).

A manifest with a ``[server]`` table registers a *served* env: ``make`` returns a client
(:class:`~relax_gym.envs.remote.client.RemoteEnv`) of a server that runs the env in another process, started on first
use when the table names an interpreter (docs/env-servers.md). ``make("remote:http://HOST:PORT/ID")`` connects to
any running server without a manifest.

Discovery runs once, lazily, on first use; problems (a malformed manifest, a duplicate id) are kept in
``discovery_errors()`` and reported by ``relax-gym envs list`` and in unknown-id errors, never half-registered.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium

from relax_gym.envs.env_ids import NAMESPACE, REMOTE_PREFIX
from relax_gym.envs.interop.frameworks import split_foreign_id
from relax_gym.envs.manifest import (
    MANIFEST_NAME,
    VERSIONED,
    EnvManifest,
    ManifestError,
    find_manifests,
    load_manifest,
)

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "relax_gym.envs"
ENV_PATH_VAR = "RELAX_GYM_ENV_PATH"
SERVED_ENTRY_POINT = "relax_gym.envs.remote.launcher:served_env"  # what gymnasium calls for a [server] manifest
RUBRIC_ENTRY_POINT = "relax_gym.envs.rubric_env:make_with_rubric"  # ... for a manifest with [[reward.parts]]


class UnknownEnvError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """What relax-gym knows of a registered env (gymnasium's own spec is ``gym_spec``)."""

    id: str
    entry_point: str
    kwargs: dict[str, Any]
    source: str  # "python", a manifest path, or "entry point <dist>"
    description: str = ""
    modalities: tuple[str, ...] = ()
    manifest: EnvManifest | None = field(default=None, repr=False)
    server: str = ""  # served envs: where the server is, or which interpreter starts it ("" = in this process)
    version: int | None = None  # None: an env registered without one (in code, by a package's entry point)

    @property
    def versioned_id(self) -> str:
        """The exact id: ``<id>-v<version>`` (what a run records), or ``id`` for an unversioned env."""
        return self.id if self.version is None else f"{self.id}-v{self.version}"

    @property
    def gym_id(self) -> str:
        return f"{NAMESPACE}/{self.versioned_id}"

    def resolved_modalities(self) -> tuple[str, ...]:
        """The declared modalities, or for an env registered without them (a pip entry point, ``register`` in code)
        the media kinds its class declares, plus text; () when the class cannot be imported here."""
        if self.modalities:
            return self.modalities
        try:
            module, _, name = self.entry_point.partition(":")
            target = importlib.import_module(module)
            for attr in name.split("."):
                target = getattr(target, attr)
        except Exception:  # noqa: BLE001 - listing envs must not fail on one that cannot be imported here
            return ()
        kinds = getattr(target, "media_kinds", None)
        return (*kinds, "text") if isinstance(kinds, tuple) else ()

    @property
    def gym_spec(self) -> gymnasium.envs.registration.EnvSpec:
        return gymnasium.spec(self.gym_id)


_specs: dict[str, EnvSpec] = {}  # bare id -> its latest version's spec
_versions: dict[str, dict[int, EnvSpec]] = {}  # bare id -> every registered version's spec
_noted: set[str] = set()  # bare ids whose resolution to their latest version was said (once a process)
_errors: list[str] = []
_discovered = False
_lock = threading.RLock()


def builtin_registry_dir() -> Path:
    """``envs_registry/`` beside the package (source checkout) or bundled in the wheel."""
    here = Path(__file__).resolve().parent.parent
    bundled = here / "_envs_registry"
    return bundled if bundled.is_dir() else here.parent / "envs_registry"


def register(
    id: str,
    entry_point: str | Any,
    kwargs: dict[str, Any] | None = None,
    *,
    description: str = "",
    modalities: tuple[str, ...] | list[str] = (),
    source: str = "python",
    manifest: EnvManifest | None = None,
    override: bool = False,
    version: int | None = None,
) -> EnvSpec:
    """Register an env under ``relax/<id>`` (``relax/<id>-v<version>`` when it has a version: given, or spelled in
    ``id`` as gymnasium does, ``name-vN``). Registering an id and version twice is an error unless
    ``override=True``; versions of one id live side by side, the bare id meaning the latest."""
    short = _short(id)
    if version is None and (m := VERSIONED.fullmatch(short)):
        short, version = m.group(1), int(m.group(2))
    with _lock:
        ep = entry_point if isinstance(entry_point, str) else f"{entry_point.__module__}:{entry_point.__qualname__}"
        known = _registered(short, version)
        if known is not None and not override:
            if known.entry_point == ep and known.kwargs == dict(kwargs or {}):
                return known  # the same env found twice (a package installed and also on PYTHONPATH): one env
            raise ValueError(
                f"env id {short!r} is already registered from {known.source} ({known.entry_point}); {source} registers "
                f"it again as {ep}. If both are one package found twice (installed with pip and also on PYTHONPATH or "
                f"RELAX_GYM_ENV_PATH), keep one of them; otherwise rename one, or pass override=True to replace it")
        spec_ = EnvSpec(id=short, entry_point=ep, kwargs=dict(kwargs or {}), source=source, description=description,
                        modalities=tuple(modalities), manifest=manifest, version=version)
        gym_id = spec_.gym_id
        if override and known is not None and (known.version is None) != (version is None):
            for old in [f"{NAMESPACE}/{short}", *(f"{NAMESPACE}/{short}-v{v}" for v in _versions.get(short, {}))]:
                gymnasium.registry.pop(old, None)  # the other kind goes: gymnasium keeps one kind per name
        previous = gymnasium.registry.pop(gym_id, None)
        try:
            gymnasium.register(id=gym_id, entry_point=entry_point, kwargs=dict(kwargs or {}), disable_env_checker=False)
        except gymnasium.error.Error as exc:  # e.g. "x-v1" next to an unversioned "x": gymnasium refuses the pair
            if previous is not None:
                gymnasium.registry[gym_id] = previous
            raise ValueError(f"env id {spec_.versioned_id!r} cannot be registered in gymnasium: {exc}") from None
        _store(spec_)
        return spec_


def _registered(short: str, version: int | None) -> EnvSpec | None:
    """What registering ``short`` at ``version`` (None: unversioned) meets: that version, or an env of the other
    kind under the same name (a versioned and an unversioned env of one name: gymnasium refuses the pair)."""
    if version is not None and version in _versions.get(short, {}):
        return _versions[short][version]
    other = _specs.get(short)
    return other if other is not None and (version is None or other.version is None) else None


def _store(spec_: EnvSpec) -> None:
    """Keep ``spec_`` among its id's versions; the bare id names the latest (caller holds the lock)."""
    if spec_.version is None:
        _versions.pop(spec_.id, None)
        _specs[spec_.id] = spec_
        return
    versions = _versions.setdefault(spec_.id, {})
    versions[spec_.version] = spec_
    _specs[spec_.id] = versions[max(versions)]


def versions(id: str) -> list[int]:
    """The registered versions of ``id`` (bare or versioned), oldest first; [] for an unversioned env."""
    discover()
    bare = _bare(_short(id))
    with _lock:
        return sorted(_versions.get(bare, {}))


def register_manifest(path: Path, *, override: bool = False, in_process: bool = False) -> EnvSpec:
    """Register one manifest. A ``[server]`` table makes it a served env unless ``in_process`` (what the server
    process itself does with the same manifest)."""
    m = load_manifest(path)
    path = Path(path) / MANIFEST_NAME if Path(path).is_dir() else Path(path)
    served = m.server is not None and not in_process
    rubric = m.rubric()
    if served:
        entry_point, kwargs = SERVED_ENTRY_POINT, {"relax_manifest": str(path)}
    elif rubric is not None:  # the server process (in_process) applies the rubric of a served env
        entry_point = RUBRIC_ENTRY_POINT
        kwargs = {"relax_env": m.resolved_entry_point(), "relax_rubric": rubric.model_dump(),
                  "relax_rubric_source": str(path), **m.constructor_kwargs()}
    else:
        entry_point, kwargs = m.resolved_entry_point(), m.constructor_kwargs()
    try:
        spec_ = register(
            m.id, entry_point, kwargs, description=m.description,
            modalities=m.modalities, source=str(path), manifest=m, override=override, version=m.version,
        )
    except ValueError as exc:
        raise ManifestError(path, str(exc), field="id") from None
    if rubric is not None and not served:  # what `envs show` tells: the env's own entry point and kwargs
        spec_ = dataclasses.replace(spec_, entry_point=m.resolved_entry_point(), kwargs=m.constructor_kwargs())
        with _lock:
            _store(spec_)
    if served:  # what `envs show` tells: the env's own entry point and kwargs, and where it runs
        where = m.server.url or f"started with {m.server.interpreter(path.parent)}"
        entry = m.entry_point or (m.resolved_entry_point() if m.dataset else "(the server's)")
        spec_ = dataclasses.replace(spec_, entry_point=entry, kwargs=m.constructor_kwargs(), server=where)
        with _lock:
            _store(spec_)
    return spec_


def make(id: str, **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make("relax/<id>", **kwargs)``: kwargs override the registered ones.
    ``make("remote:http://HOST:PORT/ID", **kwargs)``: a client of the env served there (docs/env-servers.md).
    ``make("gem:ID")``, ``make("skyrl-gym:ID", data_file=...)``: another framework's env, run in its own venv
    (docs/interop.md)."""
    if id.startswith(REMOTE_PREFIX):
        from relax_gym.envs.remote.client import make_remote

        return make_remote(id, **kwargs)
    foreign = split_foreign_id(id)
    if foreign is not None:  # another framework's env, served from its own venv (docs/interop.md)
        from relax_gym.envs.interop.serve import make_foreign

        return make_foreign(*foreign, **kwargs)
    return gymnasium.make(_resolved(id).gym_id, **kwargs)


def resolve_id(id: str) -> str:
    """The exact id ``id`` names (``nextqa-video`` -> ``nextqa-video-v1``, the latest version; a versioned or an
    unversioned id as it is; remote and foreign ids as they are), noted once (logged at INFO) when a bare id picked
    a version."""
    if id.startswith(REMOTE_PREFIX) or split_foreign_id(id) is not None:
        return id
    return _resolved(id).versioned_id


def _resolved(id: str) -> EnvSpec:
    """``spec(id)``, noting once (at INFO) which version a bare id picked."""
    found, asked = spec(id), _short(id)
    if found.version is None or asked == found.versioned_id:
        return found
    with _lock:
        if found.id in _noted:
            return found
        _noted.add(found.id)
    log.info("%r is %r, its latest version; name the version (%r) to pin it", asked, found.versioned_id,
             found.versioned_id)
    return found


def spec(id: str) -> EnvSpec:
    """The spec ``id`` names: a bare id its latest version, ``name-vN`` that version."""
    discover()
    short = _short(id)
    with _lock:
        found = _specs.get(short)
        if found is None and (m := VERSIONED.fullmatch(short)):
            name, version = m.group(1), int(m.group(2))
            found = _versions.get(name, {}).get(version)
            if found is None and name in _versions:
                raise UnknownEnvError(f"no version {version} of {name!r}: its versions are "
                                      f"{', '.join(f'{name}-v{v}' for v in sorted(_versions[name]))}")
    if found is None:
        raise UnknownEnvError(_unknown_message(short))
    return found


def list_envs() -> list[str]:
    discover()
    with _lock:
        return sorted(_specs)


def discovery_errors() -> list[str]:
    discover()
    with _lock:
        return list(_errors)


def discover(*, force: bool = False) -> None:
    """Register every manifest and entry point once (``force=True`` rescans, e.g. after changing the path)."""
    global _discovered
    with _lock:
        if _discovered and not force:
            return
        _discovered = True
        _errors.clear()
        dirs = [builtin_registry_dir()] + [Path(p) for p in os.environ.get(ENV_PATH_VAR, "").split(os.pathsep) if p]
        for directory in dirs:
            if not directory.is_dir():
                _errors.append(f"{ENV_PATH_VAR} entry {directory}: not a folder")
                continue
            for manifest in find_manifests(directory):
                _try_register(manifest)
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep.dist, "name", "?")
            _try(lambda ep=ep, dist=dist: _register_entry_point(ep, dist))


def _register_entry_point(ep: metadata.EntryPoint, dist: str) -> None:
    source = f"entry point {ep.name} = {ep.value} (package {dist})"
    short = _short(ep.name)
    known = _specs.get(short)
    if known is not None:
        if known.source == source:
            return
        raise ValueError(f"{source}: env id {short!r} is already registered from {known.source}")
    register(short, ep.value, source=source)


def _try_register(manifest: Path) -> None:
    def run() -> None:
        m = load_manifest(manifest)
        known = _registered(m.id, m.version)
        if known is not None and known.source != str(manifest):
            raise ManifestError(manifest, f"env id {m.id!r} is already registered from {known.source}", field="id")
        register_manifest(manifest, override=True)

    _try(run)


def _try(fn) -> None:
    try:
        fn()
    except (ManifestError, ValueError) as exc:
        _errors.append(str(exc))
        warnings.warn(f"relax-gym: skipped an environment: {exc}", stacklevel=3)


def _short(id: str) -> str:
    return id.split("/", 1)[1] if id.startswith(f"{NAMESPACE}/") else id


def _bare(short: str) -> str:
    """``short`` without a ``-vN`` version, when that names a versioned env."""
    m = VERSIONED.fullmatch(short)
    return m.group(1) if m and m.group(1) in _versions else short


def _unknown_message(short: str) -> str:
    known = sorted(_specs)
    close = difflib.get_close_matches(short, known, n=3, cutoff=0.5)
    msg = f"no environment {short!r}."
    msg += f" Did you mean: {', '.join(close)}?" if close else ""
    msg += f" Registered: {', '.join(known) or 'none'}."
    if _errors:
        msg += " Some environments failed to load: " + "; ".join(_errors)
    return msg

