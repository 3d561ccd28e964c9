"""Reading judge answers: labels and scores, and every malformed shape a small judge model produces."""

from __future__ import annotations

import pytest

from relax_gym.envs.verdict import parse_label, parse_score, parse_verdict

YES_NO = {"yes": 1.0, "no": 0.0}


@pytest.mark.parametrize(("text", "value"), [
    ("yes", 1.0), ("no", 0.0), ("Yes.", 1.0), ("  NO!! ", 0.0), ("verdict: yes", 1.0), ("the answer is no", 0.0),
])
def test_a_label_is_read_from_the_whole_answer_or_as_a_word(text, value):
    assert parse_label(text, YES_NO) == value


@pytest.mark.parametrize("text", ["", "   ", "maybe", "yes no", "no, yes", "yesno", "nope", "y", "<answer>", "…"])
def test_malformed_labels_are_none_never_a_guess(text):
    assert parse_label(text, YES_NO) is None


def test_custom_labels_multiword_and_nested_labels():
    labels = {"correct": 1.0, "partly correct": 0.5, "not correct": 0.0}
    assert parse_label("Partly correct.", labels) == 0.5
    assert parse_label("this is not correct", labels) == 0.0  # "correct" inside "not correct" is one statement
    assert parse_label("correct", labels) == 1.0
    assert parse_label("correct or not correct", labels) is None  # two different statements
    # two labels with the same value are one verdict
    assert parse_label("yes, right", {"yes": 1.0, "right": 1.0, "no": 0.0}) == 1.0
    with pytest.raises(ValueError, match="at least one label"):
        parse_label("yes", {})


@pytest.mark.parametrize(("text", "value"), [
    ("7", 0.7), ("7/10", 0.7), ("score: 7.5", 0.75), ("8 out of 10", 0.8), ("3/4", 0.75), ("0", 0.0), ("10", 1.0),
    ("score 7 (7/10)", 0.7),  # the same score said twice
])
def test_scores_are_divided_by_max_or_their_own_denominator(text, value):
    assert parse_score(text, 10.0) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "great", "11", "-1", "3 and 4", "8/0", "12/10", "v2.0.1", "nan", "1e9"])
def test_malformed_or_out_of_range_scores_are_none(text):
    assert parse_score(text, 10.0) is None


def test_parse_verdict_dispatches_and_refuses_unknown_kinds():
    assert parse_verdict("yes", "label") == 1.0  # default labels
    assert parse_verdict("pass", "label", labels={"pass": 1.0, "fail": 0.0}) == 1.0
    assert parse_verdict("4", "score", max_score=5) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="'label' or 'score'"):
        parse_verdict("yes", "stars")
    with pytest.raises(ValueError, match="max_score"):
        parse_score("1", 0)
