"""Shared pieces of the input-fuzzing suite.

Every fuzz test states one property: a parser or decoder fed hostile input either returns a well-formed value or
raises exactly the error type it documents, with a message that points at the culprit (the file, the dotted field,
the line, the override). Anything else -- a ``TypeError``, a ``RecursionError``, a bare ``OSError`` from deep
inside a library -- escapes :func:`failure_of` untouched, so hypothesis reports it and shrinks the input.

Hangs are caught by ``pytest-timeout`` (the ``timeout`` marker on each module), which stops a test that never
returns. Hypothesis' per-example ``deadline`` is off: it measures wall time, so a busy machine (another job beside
the suite) failed examples that were merely slow (8.4 s against a 5 s deadline), and no test may depend on load.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

E = TypeVar("E", bound=BaseException)

# Modest budgets: the whole fuzz suite must stay well under a minute on two cores. RELAX_GYM_FUZZ_SCALE=20 (say)
# multiplies the number of examples for a longer hunt.
SCALE = float(os.environ.get("RELAX_GYM_FUZZ_SCALE", "1"))
PARSE = settings(max_examples=max(1, int(120 * SCALE)), deadline=None, database=None, derandomize=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
DECODE = settings(max_examples=max(1, int(60 * SCALE)), deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])

# Text without lone surrogates (they cannot be written to a UTF-8 file at all, so no real file holds them).
TEXT_CHARS = st.characters(exclude_categories=("Cs",))
text = st.text(TEXT_CHARS, max_size=40)

# Inputs that break naive parsers: nesting deep enough to exhaust the interpreter stack, and integers longer than
# CPython's int-from-string limit (4300 digits since 3.11).
DEEP = 100_000
deep_json_list = "[" * DEEP + "]" * DEEP
deep_json_object = '{"a":' * DEEP + "1" + "}" * DEEP
long_int = "7" * 5_000

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=12)


def failure_of(fn: Callable[..., Any], *args: Any, expected: type[E] | tuple[type[E], ...], **kwargs: Any) -> E | None:
    """Run ``fn``; return None when it returns, the exception when it raises ``expected``. Any other exception
    propagates (that is the bug the fuzzer is looking for)."""
    try:
        fn(*args, **kwargs)
    except expected as exc:  # noqa: PERF203 - one call
        return exc
    return None


def assert_names(exc: BaseException, *culprits: str) -> None:
    """The message of ``exc`` mentions every culprit (a path, a field, an override)."""
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} with an empty message"
    for culprit in culprits:
        assert culprit in message, f"{type(exc).__name__} does not name {culprit!r}: {message!r}"


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh real folder per hypothesis example (function-scoped fixtures are shared across examples)."""
    with tempfile.TemporaryDirectory(prefix="relax-fuzz-") as folder:
        yield Path(folder)


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` truncated, bit-flipped, overwritten in a span, spliced or left alone -- one or more of these."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["truncate", "flip", "overwrite", "zero", "splice", "keep"]))
        if not data:
            break
        if how == "truncate":
            del data[draw(st.integers(0, len(data) - 1)):]
        elif how == "flip":
            for _ in range(draw(st.integers(1, 16))):
                i = draw(st.integers(0, len(data) - 1))
                data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "overwrite":
            i = draw(st.integers(0, len(data) - 1))
            chunk = draw(st.binary(min_size=1, max_size=64))
            data[i : i + len(chunk)] = chunk
        elif how == "zero":
            i = draw(st.integers(0, len(data) - 1))
            n = draw(st.integers(1, 512))
            data[i : i + n] = bytes(min(n, len(data) - i))
        elif how == "splice":
            i, j = sorted(draw(st.lists(st.integers(0, len(data)), min_size=2, max_size=2)))
            del data[i:j]
    return bytes(data)
