"""``env.toml`` manifests: one folder per environment, found in ``envs_registry/`` and ``RELAX_GYM_ENV_PATH``.

Either ``entry_point`` names an ``AgentEnv`` subclass (``"my_pkg.envs:MyEnv"``), or a pure data environment
gives ``[dataset]`` (+ optional ``[reward]``) and uses the built-in multiple-choice env. ``[kwargs]`` are passed to
the constructor. A malformed file raises :class:`ManifestError` naming the file and the field.

``[reward]`` is either the accuracy/format weights (``accuracy = 0.9``, ``format = 0.1``: a data env's multiple-choice
reward, or a code env's ``accuracy_weight`` / ``format_weight`` constructor arguments, as tool envs take) or, for any
env, a rubric: ``[[reward.parts]]`` tables (``name``, ``kind``, ``rule``, ``weight``, ``template``, ...; see
:class:`~relax_gym.envs.rubric.RubricPart` and docs/rubrics.md) that replace the env's own terminal reward.

A ``[server]`` table serves the env from another process (docs/env-servers.md): ``url`` connects to a running
``relax-gym envs serve`` server; ``python`` (an interpreter) or ``venv`` (a virtual environment: its
``bin/python``), relative to the manifest's folder or absolute, makes ``relax_gym.make(id)`` start that server itself.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from relax_gym.envs.datasets import DatasetSpec
from relax_gym.envs.multiple_choice_reward import MultipleChoiceReward
from relax_gym.envs.rubric import Rubric, RubricPart, check_parts
from relax_gym.sandbox.spec import SandboxSpec

MANIFEST_NAME = "env.toml"
DATA_ENV_ENTRY_POINT = "relax_gym.envs.multiple_choice:MultipleChoiceEnv"
_ID = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
VERSIONED = re.compile(r"^(.+)-v(\d+)$")  # gymnasium's versioned id: name-vN


class ManifestError(ValueError):
    def __init__(self, file: Path | str, reason: str, field: str | None = None) -> None:
        self.file, self.field, self.reason = str(file), field, reason
        super().__init__(f"{file}: " + (f"field {field!r}: " if field else "") + reason)


class ServerSpec(BaseModel):
    """``[server]``: where the env runs when it is not made in this process. Exactly one of ``url``, ``python`` or
    ``venv``."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None  # a running server: http://HOST:PORT
    env_id: str | None = None  # url: the id that server serves (default: this manifest's id)
    python: str | None = None  # start the server with this interpreter (relative to the manifest folder, or absolute)
    venv: str | None = None  # ... with <venv>/bin/python
    media: Literal["auto", "ref", "inline"] = "auto"  # auto: by reference for a loopback server, inline otherwise
    token_env: str = "RELAX_GYM_ENV_TOKEN"  # url: the environment variable that holds the server's token
    startup_timeout_s: float = Field(default=120.0, gt=0)  # python / venv: until the started server is ready

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            parts = urlsplit(v)
            if parts.scheme != "http" or not parts.hostname or parts.query:
                raise ValueError(f"{v!r} is not http://HOST:PORT")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> ServerSpec:
        given = [k for k in ("url", "python", "venv") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of url, python or venv" + (f" (got {', '.join(given)})" if given else ""))
        return self

    def interpreter(self, manifest_dir: Path) -> Path | None:
        """The interpreter that runs the server (None for ``url``); symlinks kept (a venv's python is one)."""
        if self.python:
            path = Path(self.python).expanduser()
        elif self.venv:
            venv = Path(self.venv).expanduser()
            path = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        else:
            return None
        return Path(os.path.abspath(path if path.is_absolute() else manifest_dir / path))


class RewardTable(BaseModel):
    """``[reward]``: the weights of the multiple-choice reward (``accuracy``, ``format``: data envs), or a rubric
    (``[[reward.parts]]``: any env)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accuracy: float | None = Field(default=None, ge=0.0)
    format: float | None = Field(default=None, ge=0.0)
    parts: list[RubricPart] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> RewardTable:
        weights = self.accuracy is not None or self.format is not None
        if weights and self.parts is not None:
            raise ValueError("give either the accuracy/format weights or [[reward.parts]] tables, not both")
        if self.parts is not None:
            check_parts(self.parts)
        elif not weights:
            raise ValueError("give the accuracy/format weights or [[reward.parts]] tables")
        else:
            self.weights_reward()  # a zero sum fails here
        return self

    def weights_reward(self) -> MultipleChoiceReward | None:
        """The multiple-choice reward of the weights form (unset weights keep their defaults); None for a rubric."""
        if self.parts is not None:
            return None
        return MultipleChoiceReward(**{k: v for k, v in (("accuracy", self.accuracy), ("format", self.format)) if v is not None})

    def rubric(self) -> Rubric:
        """Either form as a rubric."""
        mcq = self.weights_reward()
        return mcq.rubric if mcq is not None else Rubric(parts=list(self.parts or ()))


class EnvManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    # the env's version: any change to its observation, action parsing or reward is a new one (docs/catalog.md);
    # registered as ``<id>-v<version>`` (gymnasium's spelling), and the bare id means the latest version
    version: int = Field(default=1, ge=1)
    description: str = ""
    entry_point: str | None = None
    tools: list[str] = Field(default_factory=list)  # the tools the env gives the agent, by name (the catalog's column)
    dataset: DatasetSpec | None = None
    reward: RewardTable | None = None
    modalities: list[Literal["text", "image", "video", "audio"]] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    sandbox: SandboxSpec | None = None  # passed to the env as kwargs['sandbox']
    tags: list[str] = Field(default_factory=list)
    server: ServerSpec | None = None  # served from another process (see ServerSpec)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid env id (lowercase letters, digits, '-', '_', '.')")
        if VERSIONED.fullmatch(v):
            raise ValueError(f"{v!r}: give the id without its version and the version in 'version' "
                             f"(id = {VERSIONED.fullmatch(v).group(1)!r}, version = {VERSIONED.fullmatch(v).group(2)})")
        return v

    @field_validator("entry_point")
    @classmethod
    def _entry_point(cls, v: str | None) -> str | None:
        if v is not None and not _ENTRY_POINT.fullmatch(v):
            raise ValueError(f"{v!r} is not 'module.path:ClassName'")
        return v

    @model_validator(mode="after")
    def _kind(self) -> EnvManifest:
        if self.entry_point is None and self.dataset is None and not (self.server and self.server.url):
            raise ValueError("give either entry_point or a [dataset] table")
        if self.reward is not None and self.reward.parts is None and self.dataset is None and self.entry_point is None:
            raise ValueError("[reward] accuracy/format weights apply to data environments (those with a [dataset] "
                             "table) and to code envs (entry_point) whose constructor takes accuracy_weight / "
                             "format_weight; give any other env a rubric: [[reward.parts]] tables (docs/rubrics.md)")
        if self.reward is not None and self.server is not None and self.server.url:
            raise ValueError("[reward] cannot score an env served at a url: its server applies its own manifest")
        return self

    def resolved_entry_point(self) -> str:
        return self.entry_point or DATA_ENV_ENTRY_POINT

    def rubric(self) -> Rubric | None:
        """The ``[[reward.parts]]`` rubric that scores this env in place of its own reward (None: no rubric)."""
        return self.reward.rubric() if self.reward is not None and self.reward.parts is not None else None

    def constructor_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.kwargs)
        if self.dataset is not None:
            kwargs["dataset"] = self.dataset.model_dump()
        mcq = self.reward.weights_reward() if self.reward is not None else None
        if mcq is not None and self.dataset is not None:
            kwargs["reward"] = mcq.model_dump()
        elif self.reward is not None and self.reward.parts is None:  # a code env: its constructor's weight arguments
            for name in ("accuracy", "format"):
                if getattr(self.reward, name) is not None:
                    kwargs[f"{name}_weight"] = getattr(self.reward, name)
        if self.sandbox is not None:
            kwargs["sandbox"] = self.sandbox.model_dump()
        return kwargs


def load_manifest(path: Path) -> EnvManifest:
    """Read and validate one ``env.toml`` (or the ``env.toml`` inside a folder)."""
    path = Path(path)
    if path.is_dir() and path.name != MANIFEST_NAME:  # a folder called env.toml is a broken manifest, not a folder
        path = path / MANIFEST_NAME
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(path, "file not found") from None
    except OSError as exc:  # a folder where the file should be, no permission, ...
        raise ManifestError(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(path, f"not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(path, f"invalid TOML: {exc}") from None
    except RecursionError:
        raise ManifestError(path, "invalid TOML: arrays or tables nested too deeply") from None
    try:
        return EnvManifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        extra = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise ManifestError(path, err["msg"] + extra, field=field) from None


def find_manifests(directory: Path) -> list[Path]:
    """``directory/env.toml`` if the folder is itself a manifest folder, else ``directory/*/env.toml``."""
    directory = Path(directory)
    if (directory / MANIFEST_NAME).is_file():
        return [directory / MANIFEST_NAME]
    return sorted(directory.glob(f"*/{MANIFEST_NAME}"))
