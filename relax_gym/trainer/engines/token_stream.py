"""A completion as it is generated: the engine's tokens handed from its thread to one reader, and the text they
spell, given out only where it can no longer change.

:class:`TokenFeed` is what streams one request: the engine calls :meth:`TokenFeed.put` with each sampled token
(``on_token``: from its scheduler thread, never blocking), the call that runs the request ends the feed with the
answer or the error (:func:`start_streamed` runs it on a thread of its own), and the reader iterates the tokens
as they come, then reads :attr:`TokenFeed.answer` (or gets the error raised).

:class:`TextDeltas` turns those tokens into text pieces for a client: the ids are decoded whole each time (a
token may complete a character that began in the previous one) and only new text that is final is given out. Held
back: a trailing partial character (U+FFFD), a tail that may be the start of a stop string (the engine cuts the
answer there) or of a marker the caller names (e.g. ``<tool_call>``: from a marker on, text is not content), and,
when asked, whitespace at either end (content that is stripped at the end). :meth:`TextDeltas.rest` gives what the
final answer's text adds to what was given out, so the pieces always join to the answer the client would have got
without streaming.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["TextDeltas", "TokenFeed", "start_streamed"]

_END = object()  # the request ended
_NONE = object()  # nothing peeked


class TokenFeed:
    """The tokens of one streamed request, then its answer or its error. One writer (the engine), one reader."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = threading.Event()
        self.answer: Any = None
        self.error: BaseException | None = None
        self._peeked: Any = _NONE  # what first() took from the queue, for the iteration

    def put(self, token: int) -> None:
        """The engine's ``on_token``."""
        self._queue.put(int(token))

    def end(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer, self.error = answer, error
        self._done.set()
        self._queue.put(_END)

    def wait(self) -> Any:
        """Block until the request ended; its answer (or its error raised)."""
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.answer

    def first(self) -> int | None:
        """Block until the first token or the end; the token (kept for the iteration), or None at the end (the
        error, if any, raised: a refused request fails here, before anything was sent)."""
        item = self._peeked = self._queue.get()
        if item is _END:
            if self.error is not None:
                raise self.error
            return None
        return item

    def __iter__(self) -> Iterator[int]:
        """Each token as it comes; ends when the request ended (the error, if any, raised)."""
        item, self._peeked = self._peeked, _NONE
        if item is _NONE:
            item = self._queue.get()
        while item is not _END:
            yield item
            item = self._queue.get()
        if self.error is not None:
            raise self.error


def start_streamed(run: Callable[[Callable[[int], None]], Any], *, name: str = "stream") -> TokenFeed:
    """Run ``run(on_token)`` (the engine call) on a thread of its own; its tokens and result go to the feed."""
    feed = TokenFeed()

    def target() -> None:
        try:
            answer = run(feed.put)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            feed.end(error=exc)
        else:
            feed.end(answer)

    threading.Thread(target=target, name=name, daemon=True).start()
    return feed


class TextDeltas:
    """The text of a growing list of token ids, given out in final pieces.

    ``decode``: ids -> text (the engine's own decoding, special tokens skipped); ``stops``: stop strings (the answer
    is cut where one begins); ``markers``: strings from which on the text is not given out (e.g. ``<tool_call>``);
    ``strip``: hold leading and trailing whitespace back (for content the final answer strips)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], *, stops: Sequence[str] = (),
                 markers: Sequence[str] = (), strip: bool = False) -> None:
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.markers = [m for m in markers if m]
        self.strip = strip
        self.ids: list[int] = []
        self.given = ""  # the text given out so far
        self.closed = False  # a marker or a stop string was met: nothing more is given out until the end

    def push(self, token: int) -> str:
        """Add ``token``; the new final text ("" when none)."""
        self.ids.append(int(token))
        if self.closed:
            return ""
        text = self.decode(self.ids)
        cut = self._cut(text)
        if cut < len(text):
            self.closed = any(s in text for s in (*self.stops, *self.markers))
        safe = text[:cut].strip() if self.strip else text[:cut]
        return self._give(safe)

    def rest(self, final: str | None) -> str:
        """What ``final`` (the answer's text or content) adds to what was given out; "" when it does not continue
        it (the pieces already sent stay as they are)."""
        final = final or ""
        return final[len(self.given):] if final.startswith(self.given) else ""

    # ------------------------------------------------------------------------------------------ internals

    def _give(self, safe: str) -> str:
        if not safe.startswith(self.given) or len(safe) <= len(self.given):
            return ""  # the decoding changed text already given out, or nothing new: wait
        piece = safe[len(self.given):]
        self.given = safe
        return piece

    def _cut(self, text: str) -> int:
        """The length of ``text``'s final part: up to a partial character, a stop string or a marker (met or
        possibly beginning at the end)."""
        cut = len(text)
        if text.endswith("\ufffd"):
            cut = len(text.rstrip("\ufffd"))
        for s in (*self.stops, *self.markers):
            at = text.find(s)
            if at != -1:
                cut = min(cut, at)
                continue
            for k in range(min(len(s) - 1, len(text)), 0, -1):  # a tail that may begin s
                if text.endswith(s[:k]):
                    cut = min(cut, len(text) - k)
                    break
        return cut
