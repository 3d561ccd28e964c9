"""Fuzzing tool-call parsing and dispatch: model output is untrusted text.

Properties: ``parse_tool_calls`` never raises, returns one entry per ``<tool_call>`` block (plus one for an unclosed
block at the end), and reads well-formed calls back exactly whatever surrounds them; ``ToolBox.run`` answers every
call -- good, malformed, unknown, badly typed -- with a ``ToolOutput`` and never raises.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relax_gym.envs.tools import BadToolCall, ToolBox, ToolCall, ToolError, ToolOutput, parse_tool_calls, tool

from .support import PARSE, TEXT_CHARS, deep_json_list, deep_json_object, json_values, long_int

pytestmark = pytest.mark.timeout(120)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
tag_soup = st.lists(st.one_of(st.text(TEXT_CHARS, max_size=5),
                             st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"', "<", ">"])),
                   max_size=16).map("".join)
filler = st.text(TEXT_CHARS, max_size=30).filter(lambda s: OPEN not in s and CLOSE not in s and "<tool_call" not in s)


@PARSE
@given(text=st.one_of(tag_soup, st.text(TEXT_CHARS, max_size=200)))
@example(text=f"{OPEN}{deep_json_list}{CLOSE}")
@example(text=f"{OPEN}{deep_json_object}{CLOSE}")
@example(text=f'{OPEN}{{"name": "add", "arguments": {{"a": {long_int}}}}}{CLOSE}')
@example(text=f'{OPEN}{{"name": "add", "arguments": "{deep_json_list}"}}{CLOSE}')
@example(text=f'{OPEN}{{"name": "add", "arguments": "{long_int}"}}{CLOSE}')
@example(text=f"{OPEN}{long_int}{CLOSE}")
def test_parse_never_raises_and_counts_blocks(text: str) -> None:
    calls = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall | BadToolCall) for c in calls)
    closed = 0
    rest = text
    while (i := rest.find(OPEN)) >= 0 and (j := rest.find(CLOSE, i + len(OPEN))) >= 0:
        closed += 1
        rest = rest[j + len(CLOSE):]
    unclosed = OPEN in (text[text.rfind(CLOSE) + len(CLOSE):] if CLOSE in text else text)
    assert len(calls) == closed + unclosed
    for c in calls:
        if isinstance(c, BadToolCall):
            assert c.error and len(c.raw) <= 200
        else:
            assert isinstance(c.name, str) and isinstance(c.arguments, dict)


# A call whose JSON holds "<tool_call>" or "</tool_call>" (in its name, a key or a value) cannot be told apart from
# the block's own tags: the text format cannot carry those strings, and hypothesis finds them (it draws on the
# literals of the code under test).
calls = st.tuples(st.text(TEXT_CHARS, max_size=12), st.dictionaries(st.text(TEXT_CHARS, max_size=8), json_values,
                                                                   max_size=4)).filter(
    lambda c: OPEN not in json.dumps(c, ensure_ascii=False) and CLOSE not in json.dumps(c, ensure_ascii=False))


@PARSE
@given(parts=st.lists(st.tuples(filler, calls, st.booleans()), min_size=1, max_size=4), tail=filler)
def test_well_formed_calls_read_back_exactly(parts, tail: str) -> None:
    text = ""
    for before, (name, args), args_as_string in parts:
        arguments = json.dumps(args) if args_as_string else args  # some models send arguments as a JSON string
        text += f"{before}{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"
    parsed = parse_tool_calls(text + tail)
    assert parsed == [ToolCall(name=name, arguments=args) for _, (name, args), _ in parts]


@tool
def add(a: int, b: int = 0) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


@tool
def shout(word: str) -> str:
    """Refuse empty words, upper-case the rest.

    Args:
        word: what to shout
    """
    if not word:
        raise ToolError("say something")
    return word.upper()


@tool
def crash(n: int) -> str:
    """A tool with a bug.

    Args:
        n: divisor
    """
    return str(1 // n)


BOX = ToolBox([add, shout, crash])


@PARSE
@given(name=st.one_of(st.sampled_from(["add", "shout", "crash", "nope", ""]), st.text(TEXT_CHARS, max_size=8)),
       arguments=st.one_of(st.dictionaries(st.sampled_from(["a", "b", "word", "n", "ctx", "zz"]), json_values, max_size=3),
                           json_values))
@example(name="add", arguments={"a": deep_json_list})
@example(name="crash", arguments={"n": 0})
def test_toolbox_answers_every_call_without_raising(name: str, arguments) -> None:
    text = f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"
    (call,) = parse_tool_calls(text)
    out = BOX.run(call)
    assert isinstance(out, ToolOutput)
    if out.is_error:
        assert out.text.startswith("Error:")
