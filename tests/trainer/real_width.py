"""Real-width weights for the tests that move them (conversion to Megatron and back, DCS pushes), without building
the HF thinker: its names and shapes come from the model class built on the meta device (nothing allocated) from
the published config (:func:`~relax_gym.trainer.models.published.published_config`, depth cut), and the tensors are
filled with random bits in bf16.

Random bits, not a distribution: the tests only copy, slice, send and compare these tensors, so what matters is
that every element is a different-looking finite number (a misplaced row, head or expert then shows) and that
filling a gigabyte is cheap. Each tensor is drawn as int64 words from a generator seeded by ``(seed, name)`` (the
same call gives the same bytes), the exponent's top bit cleared (every value finite, ``|x| < 2``), and viewed as
bf16: ~0.7 s per 311 M values (the 151,936 x 2048 embedding), against ~2.3 s for ``randn``. Processes that need
the same weights draw them each (same seed, same bytes) rather than receive them.
"""

from __future__ import annotations

import math
import resource
import zlib
from typing import Any

import torch
import transformers

from relax_gym.trainer.models.published import PUBLISHED, published_config

__all__ = ["DECODER_PREFIX", "HEAD", "decoder_layout", "draw_state", "meta_thinker", "peak_rss_mib", "random_bits",
           "same_bits", "state_layout", "thinker_config", "thinker_state"]

DECODER_PREFIX = "model.language_model."  # the thinker's text decoder, in its state_dict
HEAD = "lm_head.weight"
_CLASSES = {"qwen2_5_omni": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniThinkerForConditionalGeneration"),
            "qwen3_omni_moe": ("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoeThinkerForConditionalGeneration")}
_EXPONENT_TOP_BIT = 0x4000  # of a bf16 (and of an int16 viewing it): cleared, no value is inf / nan


def thinker_config(name: str, layers: int) -> Any:
    """The thinker config of published model ``name`` with every stack cut to ``layers`` (the stand-in's)."""
    config_cls, _ = _CLASSES[PUBLISHED[name].family]
    return getattr(transformers, config_cls)(**published_config(name, layers)["thinker_config"])


def meta_thinker(name: str, layers: int) -> torch.nn.Module:
    """The thinker of ``name`` at real widths on the meta device: its state dict's names, shapes and tying."""
    _, model_cls = _CLASSES[PUBLISHED[name].family]
    config = thinker_config(name, layers)
    with torch.device("meta"):
        return getattr(transformers, model_cls)(config)


def random_bits(name: str, shape: tuple[int, ...], *, seed: int = 0) -> torch.Tensor:
    """A bf16 tensor of ``shape`` with random finite values, the same for the same ``(seed, name)``."""
    numel = math.prod(shape)
    raw = torch.empty(-(-numel // 4), dtype=torch.int64)  # four bf16 per int64 word
    # both in the low 32 bits: torch's CPU generator (mt19937) keeps only those of a seed
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    raw.random_(generator=gen)
    bits = raw.view(torch.int16)[:numel]
    bits.bitwise_and_(~_EXPONENT_TOP_BIT)
    return bits.view(torch.bfloat16).view(shape)


Layout = list[tuple[str, tuple[int, ...], str]]  # (name, shape, the first name of the same tensor)


def state_layout(model: torch.nn.Module, keep: Any = None) -> Layout:
    """The names and shapes of ``model``'s state dict (a meta thinker's), tied tensors pointing at the first name
    that holds them; ``keep(name)``: which names (all by default). Small and picklable: what a process needs to
    draw the same state as another one, without building the model."""
    first: dict[int, str] = {}
    out = []
    for name, meta in model.state_dict(keep_vars=True).items():
        if keep is None or keep(name):
            out.append((name, tuple(meta.shape), first.setdefault(id(meta), name)))
    return out


def draw_state(layout: Layout, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict of :func:`random_bits` laid out as ``layout``; tied names share one tensor, as in the model's
    own state dict."""
    out: dict[str, torch.Tensor] = {}
    for name, shape, owner in layout:
        out[name] = out[owner] if owner in out else random_bits(name, shape, seed=seed)
    return out


def decoder_layout(model: torch.nn.Module) -> Layout:
    """The text decoder's and the head's part of :func:`state_layout` (what the Megatron conversion moves)."""
    return state_layout(model, keep=lambda name: name.startswith(DECODER_PREFIX) or name == HEAD)


def thinker_state(model: torch.nn.Module, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """``model``'s whole state dict (a meta thinker's names and shapes) filled with :func:`random_bits`."""
    return draw_state(state_layout(model), seed=seed)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical: same dtype, shape and bytes (``torch.equal`` on values would call -0.0 and 0.0 equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 2:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
