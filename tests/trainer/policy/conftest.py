"""A tiny random Qwen2.5-Omni thinker and its processor, built once per session (no download)."""

from __future__ import annotations

import pytest

from relax_gym.trainer.policy.model import PolicyConfig, build_policy


@pytest.fixture(scope="session")
def policy():
    return build_policy(PolicyConfig())


@pytest.fixture(scope="session")
def model(policy):
    return policy[0]


@pytest.fixture(scope="session")
def processor(policy):
    return policy[1]


@pytest.fixture(scope="session")
def published_tokenizer(tmp_path_factory):
    """``published_tokenizer(name)``: the tokenizer of a published checkpoint as its stand-in writes it (Qwen's
    special tokens at their real ids, 151,643 regular tokens, the published tokenizer_config), loaded with
    AutoTokenizer; built once per name and session."""
    from transformers import AutoTokenizer

    from relax_gym.trainer.models.published import PUBLISHED
    from relax_gym.trainer.models.qwen_tokenizer import write_tokenizer_files

    built: dict = {}

    def get(name: str):
        if name not in built:
            model = PUBLISHED[name]
            out = write_tokenizer_files(tmp_path_factory.mktemp(f"tokenizer-{name}"), model.special_tokens,
                                        model.tokenizer_config, model.chat_template)
            built[name] = AutoTokenizer.from_pretrained(str(out))
        return built[name]

    return get
