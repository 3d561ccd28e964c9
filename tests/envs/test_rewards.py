from __future__ import annotations

import pytest
from pydantic import ValidationError

from relax_gym.envs.multiple_choice_reward import MultipleChoiceReward
from relax_gym.envs.rewards import (
    answer_letter,
    extract_answer,
    math_answer,
    multiple_choice,
    think_answer_format,
)

OPTIONS = ("left", "right", "up", "down", "it stays still")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>B</answer>", 1.0),
        ("<think>hmm</think><answer> (b) </answer>", 1.0),
        ("<answer>B. right</answer>", 1.0),
        ("<answer>right</answer>", 1.0),
        ("<answer>A</answer> then <answer>B</answer>", 1.0),  # the last answer counts
        ("<answer>C</answer>", 0.0),
        ("B", 0.0),  # no tag
        ("<answer>Z</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("<answer>Bright</answer>", 0.0),
    ],
)
def test_multiple_choice(text, expected):
    assert multiple_choice(text, "B", OPTIONS) == expected


def test_extract_and_letter():
    assert extract_answer("x <ANSWER>\n D \n</ANSWER>") == "D"
    assert extract_answer("no tags") is None
    assert answer_letter("it  stays STILL", OPTIONS) == "E"
    assert answer_letter("F", OPTIONS) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>a</think><answer>B</answer>", 1.0),
        ("  <think>\nmulti\nline</think>\n<answer>B</answer>\n", 1.0),
        ("<answer>B</answer>", 0.0),
        ("<think>a</think><answer>B</answer> trailing", 0.0),
        ("<think>a<answer>B</answer>", 0.0),
    ],
)
def test_format(text, expected):
    assert think_answer_format(text) == expected


def test_weights_normalise_to_one():
    fn = MultipleChoiceReward(accuracy=3, format=1)
    assert fn("<think>x</think><answer>B</answer>", "B", OPTIONS) == (1.0, {"accuracy": 1.0, "format": 1.0})
    assert fn("<think>x</think><answer>A</answer>", "B", OPTIONS)[0] == pytest.approx(0.25)
    assert fn("<answer>B</answer>", "B", OPTIONS)[0] == pytest.approx(0.75)
    with pytest.raises(ValidationError):
        MultipleChoiceReward(accuracy=0, format=0)
    with pytest.raises(ValidationError):
        MultipleChoiceReward(accuracy=-1)


def test_math_answer_uses_math_verify():
    assert math_answer("<answer>\\frac{1}{2}</answer>", "0.5") == 1.0
    assert math_answer("<answer>$x=2$</answer>", "2") == 1.0
    assert math_answer("<answer>3</answer>", "2") == 0.0
    assert math_answer("<answer>}}{{</answer>", "2") == 0.0


def test_math_answer_works_in_worker_threads():
    """math-verify's signal-based timeout fails outside the main thread; env workers run there."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda g: math_answer(f"<answer>{g}</answer>", str(g)), range(8)))
    assert results == [1.0] * 8
    assert math_answer("<answer>" + "1+" * 2000 + "1</answer>", "2001") == 0.0


def test_an_answer_that_computes_for_ever_is_wrong_not_a_hang():
    """``9^9^9`` makes sympy build a 370-million-digit integer in one C call (no alarm stops it, the GIL is held):
    the grader's worker is killed at its limit and the answer scores 0, from a worker thread too; the next
    answer gets a fresh worker."""
    from concurrent.futures import ThreadPoolExecutor

    from relax_gym.envs.math_grader import MathGrader

    grader = MathGrader(timeout_s=3.0)
    try:
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(grader.equivalent, "3", "9^9^9").result(timeout=60) is False
        assert grader.killed == 1
        assert grader.equivalent("0.5", "\\frac{1}{2}") is True and grader.killed == 1
    finally:
        grader.close()
