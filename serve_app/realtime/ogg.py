"""One Ogg Opus stream for a whole session, from the Ogg Opus streams of its segments.

Each segment of a WebSocket session is encoded by its own encoder in the Vocoder stage (one
``Vocoder.stream`` call per segment, as for an HTTP request), so each arrives as a complete Ogg
Opus stream of its own: OpusHead and OpusTags pages, audio pages, an end-of-stream page with a
trimmed granule position. Concatenated, that is a chain of logical streams, which many players
and Media Source buffers do not follow. ``OggOpusJoiner`` re-pages them into ONE logical stream:
the first segment's header pages open it, later segments' header pages are dropped, every page
gets the session's serial number, the next page sequence number and a granule position that
counts every decoded sample so far (from the packets' TOC bytes), and only the session's last
page carries end-of-stream (an empty page, sent by ``finish``: until then nobody knows which
segment is the last). A later segment's encoder priming (a few ms of near silence) and the
previous segment's final-frame padding play as part of the gap between sentences.

Plain Python: the Ingress, where sessions live, never loads PyAV.
"""

from __future__ import annotations

import random
import struct
from typing import Optional

_HEADER = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, sequence, crc, segments
_CONTINUED, _BOS, _EOS = 0x01, 0x02, 0x04
_NO_GRANULE = -1  # a page on which no packet ends


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else r << 1
        table.append(r & 0xFFFFFFFF)
    return table


_CRC = _crc_table()


def ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, zero initial value)."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC[(crc >> 24) ^ b]
    return crc


def opus_packet_samples(packet: bytes) -> int:
    """Samples at 48 kHz that an Opus packet decodes to (RFC 6716, 3.1: its TOC byte)."""
    toc = packet[0]
    config = toc >> 3
    if config < 12:  # SILK: 10, 20, 40, 60 ms
        frame = (480, 960, 1920, 2880)[config & 3]
    elif config < 16:  # hybrid: 10, 20 ms
        frame = (480, 960)[config & 1]
    else:  # CELT: 2.5, 5, 10, 20 ms
        frame = (120, 240, 480, 960)[config & 3]
    code = toc & 3
    frames = 1 if code == 0 else 2 if code in (1, 2) else packet[1] & 0x3F
    return frame * frames


def build_page(flags: int, granule: int, serial: int, sequence: int, lacing: bytes, body: bytes) -> bytes:
    page = bytearray(_HEADER.pack(b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing)) + lacing + body)
    struct.pack_into("<I", page, 22, ogg_crc(page))
    return bytes(page)


class OggOpusJoiner:
    """Feed each segment's Ogg Opus bytes in order (``feed``), call ``end_segment`` after each
    segment (also after a segment cut short), and ``finish`` once at the end of the session."""

    def __init__(self, serial: Optional[int] = None) -> None:
        self._serial = random.getrandbits(32) if serial is None else serial
        self._buf = bytearray()
        self._sequence = 0
        self._granule = 0  # 48 kHz samples of every packet completed so far, pre-skip included
        self._packet_head = b""  # the first bytes (TOC) of a packet that goes on on the next page
        self._sent_headers: set[bytes] = set()

    def feed(self, data: bytes) -> bytes:
        """The complete pages of the current segment so far, re-paged into the session's stream."""
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            if self._buf[:4] != b"OggS":
                raise ValueError("not an Ogg page")
            lacing_end = _HEADER.size + self._buf[26]
            if len(self._buf) < lacing_end:
                break
            lacing = bytes(self._buf[_HEADER.size : lacing_end])
            end = lacing_end + sum(lacing)
            if len(self._buf) < end:
                break
            flags = self._buf[5]
            body = bytes(self._buf[lacing_end:end])
            del self._buf[:end]
            out.append(self._page(flags, lacing, body))
        return b"".join(out)

    def _page(self, flags: int, lacing: bytes, body: bytes) -> bytes:
        magic = body[:8]
        if not flags & _CONTINUED and magic in (b"OpusHead", b"OpusTags"):
            if magic in self._sent_headers:
                return b""  # a later segment's header: the session's stream has it
            self._sent_headers.add(magic)
            return self._emit(_BOS if magic == b"OpusHead" else 0, 0, lacing, body)
        if b"OpusHead" not in self._sent_headers:
            raise ValueError("Ogg Opus audio before its OpusHead page")
        ended = False
        pos = 0
        for size in lacing:
            if len(self._packet_head) < 2:  # a packet's TOC, and its frame count byte
                self._packet_head += body[pos : pos + 2 - len(self._packet_head)]
            pos += size
            if size < 255:  # the packet ends on this page
                if self._packet_head:
                    self._granule += opus_packet_samples(self._packet_head)
                self._packet_head = b""
                ended = True
        return self._emit(flags & _CONTINUED, self._granule if ended else _NO_GRANULE, lacing, body)

    def _emit(self, flags: int, granule: int, lacing: bytes, body: bytes) -> bytes:
        page = build_page(flags, granule, self._serial, self._sequence, lacing, body)
        self._sequence += 1
        return page

    def end_segment(self) -> None:
        """The current segment is over (whole or cut short): drop what is left of its bytes."""
        self._buf.clear()
        self._packet_head = b""

    def finish(self) -> bytes:
        """The session's end-of-stream page (empty: no packet ends on it); b"" without audio."""
        if b"OpusHead" not in self._sent_headers or self._sequence < 0:
            return b""
        page = build_page(_EOS, self._granule, self._serial, self._sequence, b"", b"")
        self._sequence = -1  # finished
        return page
