"""A tiny random Qwen2.5-Omni thinker served by the embedded engine over real loopback HTTP (with the agents' OpenAI
routes of relax_gym/trainer/gateway/ mounted on the same server)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from relax_gym.trainer.algorithms.losses import token_logprobs
from relax_gym.trainer.engines.client import EngineClient
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.gateway.mount import serve_with_agents
from relax_gym.trainer.policy.model import PolicyConfig, build_policy


@pytest.fixture(scope="package")
def policy():
    return build_policy(PolicyConfig())


def start(model, processor, **engine_kwargs) -> SimpleNamespace:
    from relax_gym.trainer.dcs.group import GroupReceiver  # the DCS's engine side, as the inference role hands it in

    engine_kwargs.setdefault("weight_receiver", GroupReceiver())
    engine = EmbeddedEngine(copy.deepcopy(model), processor, **engine_kwargs)
    server = serve_with_agents(engine)  # the engine's routes and the agents' (/v1) on one port
    client = EngineClient(server.url, timeout=60)
    return SimpleNamespace(engine=engine, server=server, client=client, model=model, processor=processor)


def stop(s: SimpleNamespace) -> None:
    s.client.close()
    s.server.close()
    s.engine.close()


@pytest.fixture(scope="module")
def served(policy):
    """Engine (on its own copy of the weights), server and client; ``model`` is the reference copy."""
    s = start(*policy)
    yield s
    stop(s)


def training_logprobs(model, processor, prompt_ids, mm, output_ids, temperature: float) -> torch.Tensor:
    """Log-probs of ``output_ids`` under a training forward (no cache) of prompt + output, control tokens at -inf."""
    ids = torch.tensor([list(prompt_ids) + list(output_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **mm, use_cache=False).logits
    logits = logits[0, len(prompt_ids) - 1:-1].clone()
    logits[:, processor.control_token_ids] = float("-inf")
    return token_logprobs(logits, torch.tensor(list(output_ids)), temperature=temperature)


def reference_greedy(model, processor, rendered_list, max_new_tokens: int) -> list[list[int]]:
    """Plain ``model.generate`` greedy completions (the policy's generation config: control tokens suppressed,
    stop at EOS), each cut after its EOS."""
    batch = processor.collate(rendered_list, padding_side="left")
    batch.pop("loss_mask")
    with torch.no_grad():
        seq = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens, temperature=None, top_k=None, top_p=None)
    out = []
    for row in seq[:, batch["input_ids"].shape[1]:].tolist():
        if processor.eos_token_id in row:
            row = row[: row.index(processor.eos_token_id) + 1]
        out.append(row)
    return out
