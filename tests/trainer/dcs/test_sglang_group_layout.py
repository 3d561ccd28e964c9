"""The weight-update group's store layout meets SGLang's end.

SGLang's engine joins a weight-update group through its ``init_custom_process_group``: torch's ``rendezvous`` for
``tcp://address:port``, the store wrapped in ``PrefixStore(group_name)``, then torch's private
``_new_process_group_helper``. :func:`sglang_layout_check` builds that end in a spawned child (backend
``cpu:gloo`` here instead of SGLang's ``nccl``, the only difference, so it runs on CPU) and broadcasts one bf16
tensor to it from a :class:`WeightUpdateGroup`. With mismatched store keys the group never forms.
``scripts/gpu_check.sh`` runs the same check with NCCL.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from relax_gym.trainer.tools.transport_check import sglang_layout_check
from relax_gym.trainer.dcs import group as weight_sync


@pytest.mark.timeout(120)
def test_weight_update_group_meets_an_end_built_like_sglangs():
    result = sglang_layout_check("cpu", timeout_s=60)
    assert result == {"ok": True, "backend": "cpu:gloo", "bit_identical": True, "error": None}


@pytest.mark.timeout(120)
def test_the_check_fails_when_the_layouts_differ(monkeypatch):
    monkeypatch.setattr(weight_sync, "group_store", lambda store, name, device: dist.PrefixStore(f"{name}/", store))
    result = sglang_layout_check("cpu", timeout_s=5)
    assert not result["ok"] and "timeout" in (result["error"] or "").lower()
