"""Tensor names as engines load them.

A transformers model's ``state_dict`` keys can differ from the names its checkpoint files hold (transformers 5
renames some modules at load time, e.g. the thinker's ``audio_tower.*`` lives at ``model.audio_tower.*``).
Engines -- SGLang's loaders and the embedded engine alike -- load checkpoint names, so the DCS sends those:
:func:`checkpoint_names` maps each ``state_dict`` key to its checkpoint spelling (the key itself where the two
agree, or where this transformers version offers no reverse mapping).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["checkpoint_names"]

logger = logging.getLogger(__name__)


def checkpoint_names(model: Any) -> dict[str, str]:
    """``state_dict`` key → the name ``save_pretrained`` writes for that tensor, for every key of ``model``."""
    state = model.state_dict()
    names = {key: key for key in state}
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: state_dict keys are the checkpoint names
        return names
    key_of = {id(v): k for k, v in state.items()}
    try:
        reverted = revert_weight_conversion(model, dict(state))
    except Exception:  # noqa: BLE001 - a model without conversion rules keeps its keys
        logger.debug("no reverse weight conversion for %s; sending state_dict keys", type(model).__name__, exc_info=True)
        return names
    for ckpt_name, tensor in reverted.items():
        key = key_of.get(id(tensor))
        if key is not None:
            names[key] = ckpt_name
    return names
