"""One micro-batch through the pipeline stages of a Megatron thinker, with megatron-core's own schedule.

The first stage runs what the thinker runs before its decoder -- the vision and audio towers, the merge of their
features into the token embeddings, the 3-D rope positions -- and its own decoder layers; every later stage
receives the hidden states of the stage before (``gpt.set_input_tensor``, done by the schedule), computes the
same rope positions from the token ids and media grid sizes (transformers' ``compute_3d_position_ids``: no tower
needed) and runs its layers; the last one adds the final norm, the output head and the loss. megatron-core's
``forward_backward_pipelining_without_interleaving`` moves activations forward and their gradients back
(``variable_seq_lengths``: each micro-batch's own length travels first).

Each call is one pipeline micro-batch: the trainer streams micro-batches as the data bus delivers them and takes
one optimiser step at the end, so there is no batch to interleave (1F1B over several micro-batches would overlap
stages; with one there is nothing to overlap -- the cost of pipeline parallel here is the bubble, see
docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from relax_gym.trainer.actors.hf import masked_logprobs

__all__ = ["pipeline_logprobs"]


def _positions(thinker: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The thinker's rope positions (3, B, T) for ``batch``, as its own forward computes them."""
    if batch.get("position_ids") is not None:
        return batch["position_ids"]
    features = batch.get("feature_attention_mask")
    return thinker.model.compute_3d_position_ids(
        input_ids=batch["input_ids"], image_grid_thw=batch.get("image_grid_thw"),
        video_grid_thw=batch.get("video_grid_thw"), inputs_embeds=None, attention_mask=batch["attention_mask"],
        cache=None, use_audio_in_video=batch.get("use_audio_in_video"),
        audio_feature_lengths=features.sum(dim=1) if features is not None else None,
        video_second_per_grid=batch.get("video_second_per_grid"))


def pipeline_logprobs(thinker: Any, batch: dict[str, Any], blocked: torch.Tensor, temperature: float,
                      loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
                      ) -> tuple[torch.Tensor | None, torch.Size]:
    """Run ``batch`` (a collated micro-batch with its ``loss_mask``) through every stage; with ``loss_of`` also
    backward. Returns the next-token log-probs (B, T-1) on the last stage (None on the others) and their shape. A
    collective over the pipeline group: every stage calls it with the same batch."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch = dict(batch)
    mask = batch.pop("loss_mask")[:, 1:]
    targets = batch["input_ids"][:, 1:]
    where = mask.bool()
    language = thinker.model.language_model
    gpt = language.gpt
    rows, length = batch["input_ids"].shape
    answer: dict[str, torch.Tensor] = {}

    def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Callable]:
        next(data_iterator)
        if gpt.pre_process:
            hidden = thinker.model(**batch, use_cache=False)[0].transpose(0, 1).contiguous()
        else:
            hidden = language.decode(None, batch["attention_mask"], _positions(thinker, batch), batch=rows, length=length)

        def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict]:
            logits = thinker.lm_head(output.transpose(0, 1)[:, :-1][where])
            lps = masked_logprobs(logits, targets, where, blocked, temperature)
            answer["lps"] = lps.detach()
            if loss_of is None:
                return lps.sum() * 0.0, {}
            return loss_of(lps, mask.to(lps.dtype)), {}

        return hidden, loss_func

    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([None]), model=gpt,
                                num_microbatches=1, seq_length=length, micro_batch_size=rows,
                                forward_only=loss_of is None)
    return answer.get("lps"), targets.shape

