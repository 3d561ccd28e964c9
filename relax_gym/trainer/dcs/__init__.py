"""DCS, the weight-sync service between the actor and the inference engines.

- :mod:`~relax_gym.trainer.dcs.coordinator`: :class:`DCSCoordinator` (topology, weight metadata, versions, bucket
  plans), plain picklable Python that can be wrapped as a Ray actor;
- :mod:`~relax_gym.trainer.dcs.client`: :class:`DCSClient` (``push(state_dict, version) -> PushReport``) and
  :class:`EngineLink`, the engine-side steps (pause → load → flush → continue) over SGLang's HTTP protocol;
- :mod:`~relax_gym.trainer.dcs.transports`: ``tcp`` (gloo), ``nccl`` (CUDA) and ``disk`` (safetensors);
- :mod:`~relax_gym.trainer.dcs.names`: the checkpoint names engines load.
"""

from __future__ import annotations

from relax_gym.trainer.dcs.client import DCSClient, DCSEngineError, DCSError, DCSPushError, EngineLink, PushReport
from relax_gym.trainer.dcs.coordinator import (
    Bucket,
    DCSCoordinator,
    EngineInfo,
    PushPlan,
    TensorMeta,
    WeightMetadata,
    plan_buckets,
)
from relax_gym.trainer.dcs.names import checkpoint_names
from relax_gym.trainer.dcs.transports import TRANSPORTS, DiskTransport, NcclTransport, TcpTransport, Transport, make_transport

__all__ = [
    "TRANSPORTS", "Bucket", "DCSClient", "DCSCoordinator", "DCSEngineError", "DCSError", "DCSPushError", "DiskTransport",
    "EngineInfo", "EngineLink", "NcclTransport", "PushPlan", "PushReport", "TcpTransport", "TensorMeta", "Transport",
    "WeightMetadata", "checkpoint_names", "make_transport", "plan_buckets",
]
