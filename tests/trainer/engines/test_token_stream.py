"""relax_gym.trainer.engines.token_stream: the tokens of one request handed across threads, and the text they spell
given out only where it is final (pieces that always join to the answer's text)."""

from __future__ import annotations

import threading

import pytest

from relax_gym.trainer.engines.token_stream import TextDeltas, TokenFeed, start_streamed

# a toy vocabulary: id -> the bytes it stands for (a two-byte character split over two tokens)
VOCAB = {1: b"Hel", 2: b"lo", 3: b" w", 4: b"orld", 5: "\u00e9".encode()[:1], 6: "\u00e9".encode()[1:], 7: b"\n\n",
         8: b"<tool", 9: b"_call>", 10: b"{}", 11: b"  ", 12: b"END"}


def decode(ids):
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def given(deltas: TextDeltas, ids) -> list[str]:
    return [deltas.push(i) for i in ids]


def test_pieces_join_to_the_text_and_a_split_character_waits_for_its_second_token():
    d = TextDeltas(decode)
    assert given(d, [1, 2, 3, 5, 6, 4]) == ["Hel", "lo", " w", "", "\u00e9", "orld"]
    assert d.given == decode([1, 2, 3, 5, 6, 4]) and d.rest(d.given) == ""


def test_a_possible_stop_string_is_held_back_and_never_given_out_once_it_is_met():
    d = TextDeltas(decode, stops=["END"])
    pieces = given(d, [1, 2, 12, 3])
    assert "".join(pieces) == "Hello" and d.closed
    # the engine cuts the answer where the stop string begins: nothing more to add
    assert d.rest("Hello") == ""


def test_text_from_a_tool_call_marker_on_is_not_content_and_whitespace_is_held_for_stripped_content():
    d = TextDeltas(decode, markers=["<tool_call>"], strip=True)
    pieces = given(d, [11, 1, 2, 11, 8, 9, 10])
    assert pieces == ["", "Hel", "lo", "", "", "", ""] and d.closed
    assert d.rest("Hello") == ""  # split_reply's content: the text around the block, stripped
    assert TextDeltas(decode, markers=["<tool_call>"]).push(8) == ""  # "<tool" may begin the marker: held


def test_rest_adds_what_the_answer_holds_beyond_the_pieces_and_nothing_when_it_does_not_continue_them():
    d = TextDeltas(decode)
    given(d, [1, 2])
    assert d.rest("Hello world") == " world"
    assert d.rest("Goodbye") == "" and d.rest(None) == ""


def test_a_feed_hands_tokens_then_the_answer_across_threads():
    release = threading.Event()

    def run(on_token):
        on_token(1)
        assert release.wait(60), "the reader never took the first token"
        on_token(2)
        return "answer"

    feed = start_streamed(run)
    assert feed.first() == 1  # before the request ends: the run is still waiting for this
    release.set()
    assert list(feed) == [1, 2] and feed.wait() == "answer"


def test_a_failed_request_raises_for_the_reader_and_a_refused_one_already_at_first():
    def fails_after_one(on_token):
        on_token(7)
        raise RuntimeError("engine died")

    feed = start_streamed(fails_after_one)
    with pytest.raises(RuntimeError, match="engine died"):
        list(feed)

    def refused(on_token):
        raise ValueError("max_new_tokens too large")

    with pytest.raises(ValueError, match="max_new_tokens"):
        start_streamed(refused).first()
    plain = TokenFeed()
    plain.end("done")
    assert plain.first() is None and list(plain) == [] and plain.wait() == "done"
