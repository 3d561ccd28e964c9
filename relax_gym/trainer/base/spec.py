"""What a base model is made of: a named recipe of caption corpora, steps and optimiser (no torch, no envs here, so
the config can check a recipe's ``model.base`` against :data:`BASES` when it loads)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["BASES", "BaseSpec", "describe_prompt"]


class BaseSpec(BaseModel):
    """A base stage: supervised captioning of the ``corpora`` (sample name -> share of each batch), ``steps`` batches
    of ``batch_size`` at ``lr`` (AdamW), from a random thinker drawn with ``seed``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpora: dict[str, float]
    steps: int = Field(gt=0)
    batch_size: int = Field(default=32, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    seed: int = 0
    video_frames: int = Field(default=8, gt=0)  # frames per clip, sampled at 4 fps from the 8 fps clips
    about: str = ""  # one line for `relax-gym base list`

    @field_validator("corpora")
    @classmethod
    def _shares(cls, v: dict[str, float]) -> dict[str, float]:
        from relax_gym.envs.synth_captions import CAPTION_SAMPLES

        unknown = sorted(set(v) - set(CAPTION_SAMPLES))
        if unknown or not v or any(s <= 0 for s in v.values()):
            raise ValueError(f"corpora must map caption samples ({', '.join(CAPTION_SAMPLES)}) to positive shares; got {v}")
        return v


#: The named bases a recipe can ask for with ``model.base``.
BASES: dict[str, BaseSpec] = {
    "tiny-omni": BaseSpec(
        corpora={"video-captions": 0.8, "audio-image-captions": 0.2}, steps=400,
        about="captions of synthetic clips (motion, counts), pictures (red circles) and sounds (beeps, tones)"),
}


def describe_prompt(kinds: Iterable[str]) -> str:
    """The instruction a base learned to describe media of these kinds with (the warm-up asks it again)."""
    k = set(kinds)
    if "video" in k:
        return "describe the video ."
    if k == {"image", "audio"}:
        return "describe the picture and the sound ."
    if "image" in k:
        return "describe the picture ."
    if "audio" in k:
        return "describe the sound ."
    raise ValueError(f"nothing to describe: no media among {sorted(k)}")
