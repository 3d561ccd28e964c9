"""The media store of a partition: tensors written once under a key and read back by key.

Rows of one GRPO group carry the same media (video frames, pixel values, audio features). A producer that names
each tensor by its content (the trainer's ``rollout/media.py``) puts it once with ``put(..., media={key: tensor})``
and leaves a reference in its rows; consumers read the tensors with ``get_media(partition, keys)``. The bus treats
keys as opaque strings and media as no rows at all: they have no sample id, do not count against
``expected_rows``, a seal or a group, are never handed out by ``fetch``, and go with ``drop_partition``. A key
already stored in the partition is not written again (the content is the same by construction).

This module holds what both buses share: the input check and the byte count behind the ``bytes_put`` and
``media_*`` counters of ``stats()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from relax_gym.trainer.databus.protocol import DataBusInputError

__all__ = ["check_media", "check_media_keys", "payload_bytes", "tensor_bytes"]


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def check_media(partition: int, media: Any) -> dict[str, torch.Tensor]:
    """Validate the media of a put: a mapping of non-empty string keys to dense tensors."""
    if media is None:
        return {}
    if not isinstance(media, Mapping):
        raise DataBusInputError(f"partition {partition}: media must be a dict of key -> tensor, got "
                                f"{type(media).__name__}")
    for key, tensor in media.items():
        if not isinstance(key, str) or not key:
            raise DataBusInputError(f"partition {partition}: media key {key!r} is not a non-empty string")
        if not isinstance(tensor, torch.Tensor) or tensor.is_nested or tensor.layout != torch.strided:
            raise DataBusInputError(f"partition {partition}: media {key!r} is a {type(tensor).__name__}, not a dense "
                                    f"tensor")
    return dict(media)


def check_media_keys(partition: int, keys: Any) -> list[str]:
    """Validate the keys of a ``get_media`` call (a list of non-empty strings; duplicates are read once)."""
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) and k for k in keys):
        raise DataBusInputError(f"partition {partition}: get_media takes a list of non-empty string keys, got "
                                f"{keys!r}")
    return list(dict.fromkeys(keys))


def payload_bytes(value: Any) -> int:
    """A value's bytes as the bus carries them: tensor and array buffers in full, 8 per number, strings by length,
    containers as the sum of their items. A nominal figure (framing and serialisation are not counted) for
    comparing what puts move, e.g. with and without shared media."""
    if isinstance(value, torch.Tensor):
        return tensor_bytes(value)
    if isinstance(value, (str, bytes)):
        return len(value)
    if hasattr(value, "nbytes"):  # numpy arrays
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return 8
