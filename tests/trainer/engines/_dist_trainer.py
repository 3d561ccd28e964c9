"""The trainer side of the distributed weight-update test, run as rank 0 in a spawned process (kept out of the
test module so the child imports only torch, httpx and the client)."""

from __future__ import annotations

import json
from pathlib import Path


def push_weights(url: str, port: int, weights_path: str, weight_version: str, result_path: str) -> None:
    from safetensors.torch import load_file

    from relax_gym.trainer.engines.client import EngineClient
    from relax_gym.trainer.dcs.group import init_weights_update_group_pair, push_weights_distributed

    tensors = load_file(weights_path)
    with EngineClient(url, timeout=60) as client:
        group = init_weights_update_group_pair(client, "127.0.0.1", port, world_size=2, rank_offset=1, timeout_s=60)
        try:
            response = push_weights_distributed(client, group, tensors, weight_version=weight_version)
            destroyed = client.destroy_weights_update_group()
        finally:
            group.destroy()
    Path(result_path).write_text(json.dumps({"update": response, "destroy": destroyed}))
