"""What a sandbox is allowed to do. One frozen pydantic model shared by every backend."""

from __future__ import annotations

import os
import posixpath

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# the number changes with what the image holds (2: the stdlib's bytecode too), so an older local build is not reused
DEFAULT_IMAGE = "relax-gym/sandbox-base:2"

# A mount may not land on (or under) these: they hold the sandbox's own system, devices and scratch space.
SYSTEM_DIRS = ("/usr", "/proc", "/dev", "/etc", "/bin", "/sbin", "/sys", "/tmp", "/lib", "/lib32", "/lib64", "/libx32")


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _clean_path(value: str, what: str) -> str:
    """An absolute path without ``..``, normalised (no trailing or doubled slashes)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty absolute path")
    if "\0" in value:
        raise ValueError(f"{what} {value!r} contains a NUL byte")
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} must be an absolute path")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} must not contain '..'")
    return "/" + posixpath.normpath(value).lstrip("/")


class Mount(BaseModel):
    """A host path shown inside the sandbox: ``source`` (host) at ``target`` (sandbox), read-only by default.

    The source must exist when the sandbox is created. With the bwrap backend it must also be reachable by the
    sandbox uid (every directory above it searchable), since bwrap makes the mount after dropping to that uid.
    A read-write mount keeps what a command writes across pool leases (``reset`` only empties workdir and /tmp)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    target: str
    read_only: bool = True

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _clean_path(value, "source")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        path = _clean_path(value, "target")
        if path == "/":
            raise ValueError("target '/' would replace the sandbox's whole filesystem")
        for top in SYSTEM_DIRS:
            if _within(path, top):
                raise ValueError(f"target {path!r} would shadow the system directory {top}")
        return path


class SandboxSpec(BaseModel):
    """Limits and layout of one sandbox.

    Defaults are the safe ones: no network, non-root user, read-only root with a writable ``workdir`` and a tmpfs
    ``/tmp``. ``image`` is used by the docker backend; bwrap shows the host's ``/usr`` read-only instead.
    ``mounts`` adds host paths (read-only unless asked); they are part of :meth:`key`, so pools keep them apart.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = DEFAULT_IMAGE
    cpus: float = Field(default=1.0, gt=0, le=64)
    memory_mb: int = Field(default=512, ge=16)
    pids: int = Field(default=64, ge=8)
    network: bool = False
    workdir: str = "/workspace"
    tmpfs_mb: int = Field(default=64, ge=1)
    uid: int = Field(default=1000, ge=1)  # never root
    gid: int = Field(default=1000, ge=1)
    exec_timeout_s: float = Field(default=30.0, gt=0)  # default per-exec wall-clock limit
    lifetime_s: float = Field(default=900.0, gt=0)  # a sandbox older than this is destroyed, never reused
    max_output_bytes: int = Field(default=1 << 20, ge=1024)  # per stream; the rest is dropped with a marker
    env: dict[str, str] = Field(default_factory=dict)
    runtime: str | None = None  # docker runtime, e.g. "runsc" (gVisor) when installed
    mounts: tuple[Mount, ...] = ()

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, mounts: tuple[Mount, ...], info: ValidationInfo) -> tuple[Mount, ...]:
        workdir = info.data.get("workdir")
        seen: dict[str, int] = {}
        for i, m in enumerate(mounts):
            if workdir and (_within(m.target, workdir) or _within(workdir, m.target)):
                raise ValueError(f"mounts[{i}].target {m.target!r} would shadow or sit in the workdir {workdir!r}")
            if m.target in seen:
                raise ValueError(f"mounts[{i}].target {m.target!r} is also mounts[{seen[m.target]}].target")
            seen[m.target] = i
        return mounts

    def key(self) -> str:
        """Pools keep warm sandboxes per distinct spec."""
        return self.model_dump_json()

    def mounts_in_order(self) -> list[Mount]:
        """Mounts sorted so a parent target is mounted before one nested inside it."""
        return sorted(self.mounts, key=lambda m: (m.target.count("/"), m.target))

    def mount_source_problem(self) -> str | None:
        """None when every mount source exists on this host, else what is missing (field and path named)."""
        for i, m in enumerate(self.mounts):
            if not os.path.exists(m.source):
                return f"mounts[{i}].source {m.source!r} does not exist on the host"
        return None
