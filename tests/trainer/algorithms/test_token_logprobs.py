"""token_logprobs against a plain-Python log-softmax, with temperature, low precision and chunking."""

from __future__ import annotations

import math

import pytest
import torch

from relax_gym.trainer.algorithms import losses, token_logprobs


def python_logprob(row: list[float], target: int, temperature: float) -> float:
    scaled = [x / temperature for x in row]
    top = max(scaled)
    return scaled[target] - top - math.log(sum(math.exp(x - top) for x in scaled))


def test_hand_values():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    assert token_logprobs(logits, torch.tensor([[0]])).item() == pytest.approx(math.log(0.25))
    # temperature 2: logits become [0, log sqrt 3]
    r3 = math.sqrt(3.0)
    assert token_logprobs(logits, torch.tensor([[1]]), temperature=2.0).item() == pytest.approx(math.log(r3 / (1 + r3)))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_matches_python_log_softmax(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=gen) * 4
    targets = torch.randint(0, 7, (2, 3), generator=gen)
    out = token_logprobs(logits, targets, temperature)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    for b in range(2):
        for t in range(3):
            expected = python_logprob(logits[b, t].tolist(), int(targets[b, t]), temperature)
            assert out[b, t].item() == pytest.approx(expected, abs=1e-5)


def test_gradient_is_onehot_minus_softmax():
    logits = torch.tensor([[[1.0, 2.0, 0.5]]], dtype=torch.float64, requires_grad=True)
    token_logprobs(logits, torch.tensor([[1]])).sum().backward()
    z = sum(math.exp(x) for x in (1.0, 2.0, 0.5))
    expected = [-math.exp(1.0) / z, 1 - math.exp(2.0) / z, -math.exp(0.5) / z]
    assert logits.grad[0, 0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_upcast_in_chunks(dtype, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 5, 11, generator=gen) * 3).to(dtype).requires_grad_(True)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    monkeypatch.setattr(losses, "_UPCAST_BUDGET", 11 * 4)  # 4 rows per chunk -> 4 chunks for 15 rows
    out = token_logprobs(logits, targets, temperature=0.8)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    for b in range(3):
        for t in range(5):
            expected = python_logprob(logits[b, t].float().tolist(), int(targets[b, t]), 0.8)
            assert out[b, t].item() == pytest.approx(expected, abs=1e-5)
    out.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == dtype


def test_bad_arguments():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="target_ids"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
