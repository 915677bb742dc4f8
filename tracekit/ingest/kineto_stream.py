"""Streaming split of a Kineto JSON(.gz) file into chunks of whole events.

The whole decompressed text is never held. A plain file is mapped and cut at
event boundaries into chunks of about ``chunk_bytes``, handed out as views of the
page cache (no copy; a released chunk's pages leave this process). A gzip file is
inflated piece by piece (ISA-L, :func:`iter_text`) into blocks of one chunk each,
reused once their chunk is released; the text after a block's last event boundary
moves to the next block. Chunks are the events separated by commas, without the
array's brackets. The top-level keys around the array (``head`` before it,
``tail`` after it) are kept for the metadata. Anything unexpected raises
:class:`StreamFallback`; the caller then uses the whole-buffer reader, which
gives the same rows or a precise error.
"""

from __future__ import annotations

import mmap
import os
import re
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Generator, Iterator

import msgspec

#: the inflater: either module (same API)
_inflate: ModuleType
try:  # Intel ISA-L inflate: ~5x zlib's speed, same API and results (PyPI ``isal``)
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - platforms without an isal wheel
    _inflate = zlib
#: errors of either inflater
_INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, getattr(_inflate, "error", zlib.error))

from tracekit._errors import InputError  # noqa: E402 - after the optional inflater import

__all__ = ["StreamFallback", "EventStream", "iter_text", "bracketed"]

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_CLOSE = re.compile(rb"\]")
_HEAD_LIMIT = 64 << 20


class StreamFallback(Exception):
    """The streaming split cannot handle this file; read it whole instead."""


def iter_text(path: Path, piece: int = 4 << 20, tally: dict[str, int] | None = None) -> Generator[bytes, None, None]:
    """Decompressed text of ``path`` in pieces (gzip, multi-member gzip, or plain).

    Bytes after the last complete gzip member that do not start another member (zero padding, data
    appended to the file) end the text; their count goes to ``tally``
    (:func:`tracekit.ingest.kineto_checks.count_trailing`), never a "truncated" error."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from None
    with f:
        magic = f.read(2)
        f.seek(0)
        if magic != b"\x1f\x8b":
            while True:
                b = f.read(piece)
                if not b:
                    return
                yield b
        d = _inflate.decompressobj(31)
        try:
            while True:
                comp = f.read(1 << 20)
                if not comp:
                    out = d.flush()
                    if out:
                        yield out
                    if not d.eof:
                        raise InputError(f"{path}: truncated or corrupt gzip (unexpected end of data); re-copy the file from the capture host")
                    return
                out = d.decompress(comp)
                if out:
                    yield out
                while d.eof and d.unused_data:  # concatenated gzip members
                    rest = d.unused_data
                    if not rest.startswith(b"\x1f\x8b"[: len(rest)]) or len(rest) < 2 and not _more(f, rest):
                        _trailing(f, rest, tally)
                        return
                    d = _inflate.decompressobj(31)
                    out = d.decompress(rest)
                    if out:
                        yield out
        except _INFLATE_ERRORS as e:
            raise InputError(f"{path}: truncated or corrupt gzip ({e}); re-copy the file from the capture host") from None


def _more(f: BinaryIO, rest: bytes) -> bool:
    """Whether ``rest`` (1 byte of a possible gzip magic) continues into one: peeks the next byte."""
    pos = f.tell()
    nxt = f.read(1)
    f.seek(pos)
    return (rest + nxt).startswith(b"\x1f\x8b")


def _trailing(f: BinaryIO, rest: bytes, tally: dict[str, int] | None) -> None:
    """Count the bytes from ``rest`` to the end of the file as trailing data (read in pieces, bounded memory)."""
    from tracekit.ingest.kineto_checks import count_trailing

    zeros = not rest.strip(b"\x00")
    n = len(rest)
    while zeros and (b := f.read(1 << 20)):
        zeros = not b.strip(b"\x00")
        n += len(b)
    if not zeros:
        pos = f.tell()
        n += f.seek(0, 2) - pos
    if tally is not None:
        count_trailing(tally, n, zeros=zeros)


class _Pieces:
    """The pieces of :func:`iter_text`, copied into blocks (what does not fit waits for the next block)."""

    def __init__(self, it: Iterator[bytes]) -> None:
        self._it = it
        self._left = memoryview(b"")

    def fill(self, buf: bytearray, at: int) -> int:
        """Fill ``buf[at:]`` until it is full or the text ends; returns the bytes now in ``buf``."""
        while at < len(buf):
            if not len(self._left):
                piece = next(self._it, None)
                if piece is None:
                    break
                self._left = memoryview(piece)
            n = min(len(buf) - at, len(self._left))
            buf[at: at + n] = self._left[:n]
            self._left = self._left[n:]
            at += n
        return at


def _last_boundary(buf: bytearray, lo: int, hi: int) -> tuple[int, int] | None:
    """(start, end) of the last event boundary ``}\\s*,\\s*{`` in ``buf[lo:hi]``, or None."""
    last = None
    pos = lo
    while True:
        m = _BOUNDARY.search(buf, pos, hi)
        if m is None:
            return last
        last = (m.start(), m.end())
        pos = m.end() - 1


def _drop_pages(m: mmap.mmap, lo: int, hi: int) -> None:
    """Drop the whole pages of ``m[lo:hi]`` from this process (they stay in the page cache)."""
    page = mmap.PAGESIZE
    a, b = -(-lo // page) * page, (hi // page) * page
    if b > a and hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED, a, b - a)


def bracketed(chunk: bytes | bytearray | memoryview) -> bytearray:
    """``[`` + the chunk's events + ``]`` as a new mutable buffer (for the decoders that need the array)."""
    out = bytearray(len(chunk) + 2)
    out[0], out[-1] = 0x5B, 0x5D
    out[1:-1] = chunk
    return out


class _Block:
    """A buffer chunks are cut from; reused once every chunk cut from it is released."""

    __slots__ = ("buf", "out", "cut")

    def __init__(self, buf: bytearray) -> None:
        self.buf, self.out, self.cut = buf, 0, False


class EventStream:
    """Iterate :meth:`chunks` (hand each back with :meth:`release` once decoded); afterwards ``head``
    and ``tail`` hold the text around the array.

    A plain file is mapped (chunks are views of the page cache; a released chunk's pages leave this
    process). A gzip file is inflated into blocks of one chunk each, reused once their chunk is
    released, so the inflated text costs neither page faults nor memory beyond ``threads + 2`` chunks.
    """

    def __init__(self, path: Path, chunk_bytes: int = 16 << 20, top_decoder: msgspec.json.Decoder[Any] | None = None) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.head = b""
        self.tail = b""
        self._top = top_decoder or msgspec.json.Decoder()
        self._owner: dict[int, tuple[Any, int, int]] = {}
        #: counts for :func:`tracekit.ingest.kineto_checks.quality_of` (trailing bytes after the gzip data)
        self.tally: dict[str, int] = {}
        self._free: list[bytearray] = []

    def top_document(self) -> bytes:
        """The document with an empty ``traceEvents`` array (for the top-level keys)."""
        return self.head + b'"traceEvents": []' + self.tail

    def release(self, chunk: memoryview) -> None:
        """``chunk`` (from :meth:`chunks`) is decoded: its memory may be reused or dropped."""
        owner, lo, hi = self._owner.pop(id(chunk), (None, 0, 0))
        chunk.release()
        if isinstance(owner, _Block):
            owner.out -= 1
            if owner.out == 0 and owner.cut:
                self._free.append(owner.buf)
        elif owner is not None:
            _drop_pages(owner, lo, hi)

    def chunks(self) -> Generator[memoryview, None, None]:
        """Chunks of whole events (``{...}, {...}``, no brackets)."""
        try:
            with open(self.path, "rb") as f:
                magic = f.read(2)
                if magic != b"\x1f\x8b" and os.fstat(f.fileno()).st_size > 0:
                    yield from self._mapped(f)
                    return
        except OSError as e:
            raise InputError(f"{self.path}: cannot read ({e.strerror}); check the path and permissions") from None
        pieces = iter_text(self.path, tally=self.tally)
        try:
            yield from self._inflated(_Pieces(pieces))
        finally:
            pieces.close()

    def _hand(self, view: memoryview, owner: Any, lo: int, hi: int) -> memoryview:
        self._owner[id(view)] = (owner, lo, hi)
        return view

    def _mapped(self, f: BinaryIO) -> Iterator[memoryview]:
        """Chunks of a plain file, as views of its mapping."""
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            n = len(m)
            start = self._array_start(m, n)
            ch, margin = self.chunk_bytes, 1 << 20
            while start + ch < n - margin:
                hit = _BOUNDARY.search(m, start + ch, n - margin)
                if hit is None:
                    break
                yield self._hand(memoryview(m)[start: hit.start() + 1], m, start, hit.start() + 1)
                start = hit.end() - 1  # the next event's '{'
            rest = m[start:]
            yield from self._last(rest)
        finally:
            self._owner.clear()
            try:
                m.close()
            except BufferError:  # a view still referenced (an error's traceback): the mapping goes with it
                pass

    def _array_start(self, text: Any, n: int) -> int:
        m = _KEY.search(text, 0, min(n, _HEAD_LIMIT))
        if m is None:
            raise StreamFallback("no traceEvents key near the start")
        self.head = bytes(text[: m.start()])
        return m.end()

    def _block(self, size: int) -> bytearray:
        while self._free:
            b = self._free.pop()
            if len(b) >= size:
                return b
        return bytearray(size)

    def _inflated(self, g: _Pieces) -> Iterator[memoryview]:
        """Chunks of a gzip file: one block per chunk, the text after its last event boundary carried over."""
        size = self.chunk_bytes
        buf = bytearray(size)
        filled = g.fill(buf, 0)
        while True:  # the head: until the array's opening bracket
            km = _KEY.search(buf, 0, filled)
            if km is not None or filled < len(buf) or filled > _HEAD_LIMIT:
                break
            buf = buf + bytearray(len(buf))
            filled = g.fill(buf, filled)
        if km is None:
            raise StreamFallback("no traceEvents key near the start")
        self.head = bytes(buf[: km.start()])
        start = km.end()
        while filled == len(buf):  # more text follows: cut at the last boundary of the block
            cut = _last_boundary(buf, max(start, filled - (64 << 10)), filled) or _last_boundary(buf, start, filled)
            if cut is None:  # one event longer than the block: grow it
                buf = buf + bytearray(len(buf))
                filled = g.fill(buf, filled)
                continue
            blk = _Block(buf)
            blk.out += 1
            view = self._hand(memoryview(buf)[start: cut[0] + 1], blk, 0, 0)
            nxt = self._block(max(size, 2 * (filled - cut[1] + 1)))
            rest = filled - (cut[1] - 1)
            nxt[:rest] = memoryview(buf)[cut[1] - 1: filled]
            blk.cut = True
            yield view
            del view
            buf, start = nxt, 0
            filled = g.fill(buf, rest)
        yield from self._last(bytes(memoryview(buf)[start:filled]))

    def _last(self, rest: bytes) -> Iterator[memoryview]:
        """The events left at the end of the text, and the tail after the array's closing bracket."""
        # the array's closing bracket: the last ']' after which the remainder completes the document
        lo = max(0, len(rest) - (1 << 20))
        ends = [x.start() for x in _CLOSE.finditer(rest, lo)]
        for pos in reversed(ends[-64:]):
            tail = rest[pos + 1:]
            try:
                self._top.decode(self.head + b'"traceEvents": []' + tail)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                continue
            self.tail = tail
            body = rest[:pos].strip()
            if body:
                yield memoryview(body)
            return
        raise StreamFallback("end of traceEvents not found")
