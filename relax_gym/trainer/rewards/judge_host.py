"""Where a run's judge model comes from and where it runs.

``judge.model`` names a judge built in code (:mod:`relax_gym.trainer.rewards.judge_model`: built into the cache on
first use, then frozen) or is a checkpoint directory. :func:`resolve_judge` turns it into a checkpoint path once,
in the process that starts the run (so async replicas never build it); :func:`judge_policy` is the policy config
an engine loads it with. :class:`LocalJudge` is the colocate mode's judge: an engine in the trainer's process (the
embedded engine on its own thread, or a launched SGLang server) and a :class:`~relax_gym.trainer.rewards.judge.Judge`
over a coalescing client, so the episodes' judge calls batch together. The async mode serves the same model from
the ``genrm`` role instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax_gym.trainer.config import JudgeSection
from relax_gym.trainer.engines.coalesce import CoalescingClient
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.policy import PolicyConfig
from relax_gym.trainer.rewards.judge import Judge

__all__ = ["LocalJudge", "judge_policy", "judge_processor", "resolve_judge"]


def resolve_judge(section: JudgeSection) -> JudgeSection:
    """``section`` with ``model`` a checkpoint directory: a named judge is built into the cache first if needed."""
    path = Path(section.model).expanduser()
    if path.is_dir():
        return section.model_copy(update={"model": str(path.resolve())})
    from relax_gym.trainer.rewards.judge_model import JUDGES, ensure_judge

    if section.model not in JUDGES:
        raise ValueError(f"judge.model={section.model!r} is neither a checkpoint directory nor a named judge "
                         f"({', '.join(sorted(JUDGES))})")
    info = ensure_judge(section.model)
    return section.model_copy(update={"model": str(info.path)})


def judge_policy(section: JudgeSection) -> PolicyConfig:
    """The policy config that loads the (resolved) judge checkpoint."""
    if not Path(section.model).is_dir():
        raise ValueError(f"judge.model={section.model!r} is not resolved to a checkpoint directory (resolve_judge)")
    return PolicyConfig(path=section.model)


def judge_processor(section: JudgeSection) -> Any:
    from relax_gym.trainer.policy.processor import OmniProcessor

    return OmniProcessor.from_pretrained(judge_policy(section).path)


class LocalJudge:
    """The colocate mode's judge: its engine in this process. Make it, then :meth:`judge` inside the event loop."""

    def __init__(self, section: JudgeSection, *, log_dir: str | Path | None = None) -> None:
        self.section = section
        self.processor = judge_processor(section)
        self.host = start_engine(section.inference(), judge_policy(section), log_dir=log_dir)
        self._raw: Any = None
        self._judge: Judge | None = None

    def judge(self) -> Judge:
        """The judge over a coalescing client (made on first use, inside the running event loop)."""
        if self._judge is None:
            self._raw = self.host.async_client()
            client = CoalescingClient(self._raw, max_batch=self.section.max_batch)
            self._judge = Judge(client, self.processor, max_new_tokens=self.section.max_new_tokens,
                                timeout_s=self.section.timeout_s)
        return self._judge

    async def aclose(self) -> None:
        raw, self._raw, self._judge = self._raw, None, None
        if raw is not None:
            await raw.aclose()

    def close(self) -> None:
        self.host.close()
