"""A bound on JSON nesting, checked before any parser sees the text: Python's parser recurses per
level, so a few kilobytes of ``[[[[...`` raise ``RecursionError`` (a 500 with a traceback) instead
of a clean 400. The guard scans only structural characters, incrementally (a body arrives in
chunks), in time linear in the input."""

from __future__ import annotations

import re

from ..errors import APIError

MAX_JSON_DEPTH = 32  # every request shape of the API nests 3 levels at most
_STRUCTURAL = re.compile(rb'[\[\]{}"\\]')


class JsonDepthGuard:
    def __init__(self, max_depth: int = MAX_JSON_DEPTH):
        self.max_depth = max_depth
        self._depth = 0
        self._in_string = False
        self._escape_next = False  # a backslash ended the last piece: its first byte is escaped

    def feed(self, data: bytes) -> None:
        """Scan the next piece of the document; ``APIError`` 400 once it nests too deep."""
        skip_at = 0 if self._escape_next else -1
        self._escape_next = False
        for m in _STRUCTURAL.finditer(data):
            i = m.start()
            if i == skip_at:  # escaped by the backslash right before it
                continue
            ch = data[i]
            if ch == 0x5C:  # backslash: inside a string it escapes the next byte
                if self._in_string:
                    if i + 1 == len(data):
                        self._escape_next = True
                    else:
                        skip_at = i + 1
            elif ch == 0x22:  # quote
                self._in_string = not self._in_string
            elif not self._in_string:
                self._depth += 1 if ch in (0x5B, 0x7B) else -1
                if self._depth > self.max_depth:
                    raise APIError(400, f"JSON nests deeper than {self.max_depth} levels", code="invalid_json")


def check_json_depth(text: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    JsonDepthGuard(max_depth).feed(text.encode())
