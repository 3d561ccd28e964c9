"""What a sandbox is allowed to do. One frozen pydantic model shared by every backend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_IMAGE = "relax-gym/sandbox-base:1"


class SandboxSpec(BaseModel):
    """Limits and layout of one sandbox.

    Defaults are the safe ones: no network, non-root user, read-only root with a writable ``workdir`` and a tmpfs
    ``/tmp``. ``image`` is used by the docker backend; bwrap shows the host's ``/usr`` read-only instead.
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

    def key(self) -> str:
        """Pools keep warm sandboxes per distinct spec."""
        return self.model_dump_json()
