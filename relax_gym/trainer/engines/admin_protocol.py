"""SGLang's weight and admin requests (``/update_weights_from_disk``, ``/update_weights_from_tensor``,
``/init_weights_update_group``, ``/update_weights_from_distributed``, pause / continue / flush, checksums) as
pydantic models, and our tensor codec (:mod:`relax_gym.trainer.engines.protocol` explains the wire format)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_GROUP_NAME = "weight_update_group"
FLATTENED_BUCKET = "flattened_bucket"  # SGLang's load_format for one broadcast per update_weights_from_distributed call


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UpdateWeightFromDiskReqInput(_Req):
    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    # accepted, no effect on a CPU engine
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    manifest: dict[str, Any] | None = None


class UpdateWeightsFromTensorReqInput(_Req):
    """``serialized_named_tensors``: one string per tensor-parallel rank (the embedded engine has one rank).
    Each string is base64 of safetensors bytes here (see the module doc), never a pickle."""

    serialized_named_tensors: list[str] = Field(min_length=1)
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    disable_draft_model: bool | None = None
    torch_empty_cache: bool = False


class InitWeightsUpdateGroupReqInput(_Req):
    master_address: str
    master_port: int = Field(gt=0, lt=65536)
    rank_offset: int = Field(ge=0)
    world_size: int = Field(ge=2)
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"  # SGLang's default; the CPU embedded engine takes "gloo" only

    @model_validator(mode="after")
    def _rank(self) -> InitWeightsUpdateGroupReqInput:
        if not 0 < self.rank_offset < self.world_size:
            raise ValueError(f"rank_offset must be in [1, world_size) (rank 0 is the trainer), got {self.rank_offset} of {self.world_size}")
        return self


class UpdateWeightsFromDistributedReqInput(_Req):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP_NAME
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    torch_empty_cache: bool = False
    # ours: call ``seq`` of a staged push (received while generating, applied by /apply_staged_weights)
    stage_id: str | None = Field(default=None, min_length=1, max_length=128)
    seq: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _lengths(self) -> UpdateWeightsFromDistributedReqInput:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(f"names, dtypes and shapes need the same length, got {len(self.names)}, {len(self.dtypes)}, {len(self.shapes)}")
        if (self.stage_id is None) != (self.seq is None):
            raise ValueError("stage_id and seq go together (a staged call names its stage and its place in it)")
        return self


class StagedCallSpec(_Req):
    """One call of :class:`StageWeightsReqInput`: the tensors it carries, in order."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]

    @model_validator(mode="after")
    def _lengths(self) -> StagedCallSpec:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(f"names, dtypes and shapes need the same length, got {len(self.names)}, {len(self.dtypes)}, {len(self.shapes)}")
        return self


class StageWeightsReqInput(_Req):
    """Ours (``/stage_weights_from_distributed``): every call of staged push ``stage_id`` in one request, received
    off ``group_name`` in order (calls ``0 .. len(calls) - 1``); answered once the last one is in."""

    group_name: str = DEFAULT_GROUP_NAME
    stage_id: str = Field(min_length=1, max_length=128)
    calls: list[StagedCallSpec] = Field(min_length=1)
    load_format: str | None = None


class ApplyStagedWeightsReqInput(_Req):
    """Ours: apply the ``calls`` staged calls of ``stage_id`` and take ``weight_version``."""

    stage_id: str = Field(min_length=1, max_length=128)
    calls: int = Field(ge=1)
    weight_version: str | None = None


class DiscardStagedWeightsReqInput(_Req):
    """Ours: drop the staged calls of ``stage_id`` (null: whichever stage is current)."""

    stage_id: str | None = None


class DestroyWeightsUpdateGroupReqInput(_Req):
    group_name: str = DEFAULT_GROUP_NAME


class WeightsChecksumReqInput(_Req):
    """Our ``/get_weights_checksum`` body: digests of these tensors (null: every state_dict tensor)."""

    names: list[str] | None = None


class UpdateWeightVersionReqInput(_Req):
    new_version: str
    abort_all_requests: bool = True


class PauseGenerationReqInput(_Req):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationReqInput(_Req):
    torch_empty_cache: bool = True  # accepted, no effect on CPU


class FlushCacheReqInput(_Req):
    timeout_s: float | None = None


class SuccessResponse(BaseModel):
    """``{"success": bool, "message": str}`` (``num_paused_requests`` for ``update_weights_from_disk``)."""

    model_config = ConfigDict(extra="allow")

    success: bool
    message: str = ""


# ------------------------------------------------------------------------------------------------ tensor codec


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and raw bytes (what ``/get_weights_checksum`` answers per name):
    equal digests mean bit-identical tensors."""
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def serialize_named_tensors(named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """Named tensors → base64 of a safetensors file (our ``serialized_named_tensors`` entry). Tensors are copied
    to contiguous CPU memory first (tied weights share storage, which safetensors refuses)."""
    from safetensors.torch import save

    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        tensors[str(name)] = tensor.detach().to("cpu").contiguous().clone()
    return base64.b64encode(save(tensors)).decode("ascii")


def deserialize_named_tensors(payload: str | bytes) -> dict[str, torch.Tensor]:
    """Inverse of :func:`serialize_named_tensors`. Raises ``ValueError`` for anything that is not base64 of a
    safetensors file (e.g. SGLang's pickled ``MultiprocessingSerializer`` payload, which is never unpickled)."""
    from safetensors.torch import load

    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"serialized_named_tensors entry is not valid base64 ({exc})") from None
    try:
        return dict(load(raw))
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise ValueError("serialized_named_tensors entry is not a safetensors payload (the embedded engine takes base64 "
                         f"safetensors bytes; SGLang's pickled MultiprocessingSerializer format is never unpickled): {exc}") from None
