"""Caption records -> conversations a base learns from: a user turn with the media and the describe instruction, an
assistant turn with the caption."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax_gym.envs.samples import ensure_sample
from relax_gym.omni import AudioPart, ImagePart, Message, TextPart, VideoPart
from relax_gym.trainer.base.spec import describe_prompt

__all__ = ["Captioned", "load_corpus"]


@dataclass(frozen=True)
class Captioned:
    corpus: str
    split: str  # train | held
    prompt: tuple[Message, ...]  # the user turn: media + describe instruction
    caption: str
    facts: dict[str, Any]

    def conversation(self) -> list[Message]:
        return [*self.prompt, Message(role="assistant", content=(TextPart(self.caption),))]


def _parts(root: Path, media: dict[str, str], video_frames: int) -> list[Any]:
    parts: list[Any] = []
    for kind, rel in media.items():
        path = str(root / rel)
        if kind == "video":
            parts.append(VideoPart.of(path, fps=4.0 * video_frames / 8, max_frames=video_frames, min_frames=video_frames))
        elif kind == "image":
            parts.append(ImagePart.of(path))
        elif kind == "audio":
            parts.append(AudioPart.of(path))
        else:
            raise ValueError(f"{root / 'captions.jsonl'}: unknown media kind {kind!r}")
    return parts


def load_corpus(name: str, *, video_frames: int = 8, root: Path | None = None) -> list[Captioned]:
    """Every record of caption sample ``name`` (generated into the cache on first use)."""
    folder = ensure_sample(name, root)
    out = []
    for line_no, line in enumerate((folder / "captions.jsonl").read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
            parts = _parts(folder, rec["media"], video_frames)
            prompt = (Message(role="user", content=(*parts, TextPart(describe_prompt(rec["media"])))),)
            out.append(Captioned(name, rec["split"], prompt, rec["caption"], rec.get("facts", {})))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{folder / 'captions.jsonl'}, line {line_no}: {exc}") from None
    return out
