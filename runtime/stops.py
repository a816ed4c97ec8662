"""The text of a generation as its tokens arrive, cut at the first stop string.

The engine feeds every emitted token's bytes to one :class:`TextCutter`; what it returns is
final text (``Engine.stream`` yields it, ``Engine.generate`` joins it), so the streamed and the
whole text are the same string for every stop set. Text that could still be the start of a stop
string is held back until the next bytes decide; a stop string of any length, spanning any
number of tokens or ending inside one, is found, and none of its characters is ever returned.
"""

from __future__ import annotations

import codecs


class TextCutter:
    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self._starts = {s[0] for s in stops}
        # an incomplete UTF-8 sequence waits for the next token; invalid bytes become U+FFFD,
        # as bytes.decode(errors="replace") would make them in one go
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""
        self.stopped = False

    def feed(self, data: bytes) -> str:
        """The text that is final once ``data`` is appended ('' after a stop string was found:
        ``stopped`` is then True)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(data)
        if not self.stops:
            self._held = ""
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held, self.stopped = "", True
            return text[:cut]
        keep = self._undecided_from(text)
        self._held = text[keep:]
        return text[:keep]

    def _undecided_from(self, text: str) -> int:
        """Where the longest tail of ``text`` that begins some stop string starts (len: none)."""
        longest = max(len(s) for s in self.stops)
        for i in range(max(0, len(text) - longest + 1), len(text)):
            if text[i] in self._starts:
                tail = text[i:]
                if any(s.startswith(tail) for s in self.stops):
                    return i
        return len(text)

    def finish(self) -> str:
        """What is left once generation ended without a stop string: the held text and any
        incomplete UTF-8 sequence (replaced)."""
        if self.stopped:
            return ""
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return text
