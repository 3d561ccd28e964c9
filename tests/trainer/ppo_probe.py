"""A two-turn text env with a dense reward, for PPO runs that must see a learning signal from their first step."""

from __future__ import annotations

from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.omni import Message
from relax_gym.omni.parts import TextPart

ENV_ID = "test-ppo-two-turn-probe"


class TwoTurnProbe(AgentEnv):
    """Two text turns: the env answers the first with "Once more."; the second is rewarded, more for an A and for
    being short (so rewards vary from episode to episode from the first step on)."""

    media_kinds = ()

    def __init__(self, **kwargs) -> None:
        super().__init__(max_turns=2, **kwargs)

    def _reset(self, options):
        return Opening([Message(role="user", content=(TextPart("Say A twice, inside <answer></answer>."),))],
                       gold="<answer>A</answer>")

    def _step(self, action):
        if self._turn == 1:
            return Outcome([Message(role="user", content=(TextPart("Once more."),))], 0.0, False, {}, gold="<answer>A</answer>")
        correct = 1.0 if "A" in action else 0.0
        brevity = 1.0 / (1.0 + len(action) / 20.0)
        return Outcome([], 0.5 * correct + 0.5 * brevity, True, {"correct": correct, "brevity": brevity})
