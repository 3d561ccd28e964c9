"""The policy model: an in-code tokenizer, a torchvision-free Qwen2.5-Omni processor and a (tiny or loaded)
Qwen2.5-Omni thinker. Conversations are turned into model inputs by ``relax_gym.omni.render``.

    from relax_gym.trainer.policy import PolicyConfig, build_policy
    from relax_gym.omni.render import render
    model, processor = build_policy(PolicyConfig())
    batch = processor.collate([render(obs, processor)], padding_side="left")
"""

from relax_gym.trainer.policy.model import PolicyConfig, build_policy, save_policy
from relax_gym.trainer.policy.processor import MediaEncoding, OmniProcessor
from relax_gym.trainer.policy.tokenizer import build_tokenizer

__all__ = ["MediaEncoding", "OmniProcessor", "PolicyConfig", "build_policy", "build_tokenizer", "save_policy"]
