"""DCS, the weight-sync service between the actor and the inference engines.

- :mod:`~relax_gym.trainer.dcs.push`: the one interface every weight push goes through, ``make_pusher(inference,
  ...)`` → ``pusher.push(state_dict, version) -> PushReport`` (in-process tensors for a colocated embedded
  engine, the DCS otherwise), used by the colocate loop and the async actor role;
- :mod:`~relax_gym.trainer.dcs.coordinator`: :class:`DCSCoordinator` (topology, weight metadata, versions, bucket
  plans), plain picklable Python that can be wrapped as a Ray actor (:mod:`~relax_gym.trainer.dcs.service`);
- :mod:`~relax_gym.trainer.dcs.client`: :class:`DCSClient` (``push(state_dict, version) -> PushReport``);
- :mod:`~relax_gym.trainer.dcs.link`: :class:`EngineLink`, the engine-side steps (pause → load → flush →
  continue) over SGLang's HTTP protocol;
- :mod:`~relax_gym.trainer.dcs.transports`: ``tcp`` (gloo), ``nccl`` (CUDA) and ``disk`` (safetensors);
  :mod:`~relax_gym.trainer.dcs.fallback`: ``nccl`` falling back to ``disk``;
- :mod:`~relax_gym.trainer.dcs.group`: the weight-update process group (both ends; :class:`GroupReceiver` is
  what an engine is handed to receive with), flatten / unflatten, dtype names;
- :mod:`~relax_gym.trainer.dcs.names`: the checkpoint names engines load.

Imports go one way: errors ← coordinator ← link ← transports ← fallback ← client ← service ← push. This package
never imports the engines package (and the engines never import it).
"""

from __future__ import annotations

from relax_gym.trainer.dcs.client import DCSClient
from relax_gym.trainer.dcs.errors import DCSEngineError, DCSError, DCSPushError, PushReport
from relax_gym.trainer.dcs.group import GroupReceiver, WeightUpdateGroup
from relax_gym.trainer.dcs.link import EngineLink
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
from relax_gym.trainer.dcs.push import DCSPush, LocalPush, WeightPush, make_pusher
from relax_gym.trainer.dcs.transports import TRANSPORTS, DiskTransport, NcclTransport, TcpTransport, Transport, make_transport

__all__ = [
    "TRANSPORTS", "Bucket", "DCSClient", "DCSCoordinator", "DCSEngineError", "DCSError", "DCSPush", "DCSPushError",
    "DiskTransport", "EngineInfo", "EngineLink", "GroupReceiver", "LocalPush", "NcclTransport", "PushPlan", "PushReport",
    "TcpTransport", "TensorMeta", "Transport", "WeightMetadata", "WeightPush", "WeightUpdateGroup", "checkpoint_names",
    "make_pusher", "make_transport", "plan_buckets",
]
