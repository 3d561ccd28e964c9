"""The ``inference:`` section of a recipe: which engine a run hosts and how it samples (``SGLangSection``: how an
SGLang server launches). The engines own it (:mod:`.factory` starts what it names); the config tree
(:mod:`relax_gym.trainer.config`) holds it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relax_gym.trainer.engines.sglang import OWNED_FLAGS

__all__ = ["InferenceSection", "SGLangSection"]


class SGLangSection(BaseModel):
    """``inference.engine: sglang``: how each inference replica launches ``python -m sglang.launch_server``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str | None = None  # the Hugging Face checkpoint SGLang serves (None: model.path)
    python: str | None = None  # the interpreter that has sglang (None: this one); e.g. a second environment's
    tp_size: int = Field(default=1, ge=1)  # --tp-size: GPUs per server
    port: int = Field(default=0, ge=0, le=65535)  # 0: a free port on inference.host (loopback by default)
    mem_fraction_static: float = Field(default=0.7, gt=0, lt=1)  # --mem-fraction-static: GPU share for weights + KV
    extra_args: tuple[str, ...] = ()  # further launch_server flags, passed verbatim (not the ones above)
    startup_timeout_s: float = Field(default=900.0, gt=0)  # until /health_generate answers 200
    weight_sync: Literal["nccl", "disk"] = "nccl"  # nccl falls back to disk when NCCL cannot be used
    disk_dir: str | None = None  # disk pushes: a directory the actor and the servers both see (None: a temp dir)

    @field_validator("extra_args")
    @classmethod
    def _not_owned(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        clash = sorted({a.split("=", 1)[0] for a in v if a.split("=", 1)[0] in OWNED_FLAGS})
        if clash:
            raise ValueError(f"repeats {clash}, which the launcher sets from model_path / inference.host / port / "
                             "tp_size / mem_fraction_static")
        return v


class InferenceSection(BaseModel):
    """``inference:``: the rollout engine (embedded, or an SGLang server per replica) and its sampling settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    engine: Literal["embedded", "sglang"] = "embedded"  # sglang: a real SGLang server per replica (GPU)
    sglang: SGLangSection = Field(default_factory=SGLangSection)  # used when engine is sglang
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_batch: int = Field(default=128, ge=1)  # requests per engine batch (and per coalesced HTTP request)
    host: str = "127.0.0.1"  # the engine's HTTP server binds loopback unless told otherwise
