"""Compressed input files read to their end-of-stream marker, with every checksum checked.

Beam's CompressedFile stops quietly where a compressed stream stops, so a file cut short reads as
a shorter file. This reader decompresses the raw bytes itself with the codec's own decompressor
(gzip and deflate by zlib, bzip2, xz/lzma, zstd) and fails the file, naming it, the codec and the
compressed byte offset, when the stream ends before its end-of-stream marker or a checksum fails.
Concatenated members (gzip, bzip2, xz, zstd frames) are read one after another, as their tools do.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.base.bounded_read import open_regular
from tfrbeam.beam import filesystem
from tfrbeam.errors import CompressedInputError

__all__ = ["CheckedDecompressedFile", "codec_of", "open_checked"]

_CHUNK_BYTES = 1 << 16  # compressed bytes fed per call: an error is placed within this many, then exactly (zlib)
# The most decompressed bytes one call returns: a bomb's expansion (64 KiB of bzip2 can hold gigabytes of zeros)
# is handed out in pieces of this size, never buffered whole.
_OUTPUT_BYTES = 1 << 20
# zstd's decompressobj has no output limit, so it is fed a few bytes at a time instead: a zstd block expands to
# at most 128 KiB and takes at least 4 bytes (an RLE block), so 256 bytes give at most 8 MiB.
_ZSTD_FEED_BYTES = 256
_ZLIB_WBITS = {"gzip": 31, "deflate": 15}


def codec_of(path: str) -> str | None:
    """The codec a path's extension names (as Beam's AUTO detects it), or None for an uncompressed file."""
    detected = CompressionTypes.detect_compression_type(path)
    return {CompressionTypes.GZIP: "gzip", CompressionTypes.BZIP2: "bzip2", CompressionTypes.DEFLATE: "deflate",
            CompressionTypes.LZMA: "xz", CompressionTypes.ZSTD: "zstd"}.get(detected)


def _decompressor(codec: str) -> Any:
    """A fresh decompressor with decompress(), eof and unused_data for one member of the stream."""
    if codec in _ZLIB_WBITS:
        return zlib.decompressobj(_ZLIB_WBITS[codec])
    if codec == "bzip2":
        return bz2.BZ2Decompressor()
    if codec == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_AUTO)
    import zstandard  # Beam's own zstd dependency

    return zstandard.ZstdDecompressor().decompressobj()


def _truncated(path: str, codec: str, offset: int) -> CompressedInputError:
    return CompressedInputError(
        f"{path}: the {codec} stream ends at compressed byte {offset} before its end-of-stream marker, so the file "
        "was cut short (an interrupted copy, download or write); restore the whole file and build again")


def _corrupt(path: str, codec: str, where: str, error: BaseException) -> CompressedInputError:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CompressedInputError(
        f"{path}: the {codec} stream is corrupt {where} ({detail}); the file is damaged: restore it from a good copy")


class CheckedDecompressedFile:
    """A read-only file of the decompressed bytes of a compressed file, raising CompressedInputError on damage.

    Seeking works (backwards by reading again from the start), so every reader of the inputs can use it.
    """

    def __init__(self, opener: Callable[[], BinaryIO], path: str, codec: str):
        self._opener, self.path, self.codec = opener, path, codec
        self._raw: BinaryIO | None = None
        self._start()

    def _start(self) -> None:
        if self._raw is not None:
            self._raw.close()
        self._raw = self._opener()
        self._decoder: Any = _decompressor(self.codec)
        self._pending = b""  # decompressed bytes not handed out yet
        self._input = b""  # compressed bytes read; those from _fed on are not yet fed
        self._fed = 0
        self._consumed = 0  # compressed bytes fed to decompressors so far
        self._members = 0  # members ended so far
        self._done = False
        self.position = 0

    # --- file protocol

    def read(self, size: int = -1) -> bytes:
        """Up to size decompressed bytes (all the rest when size < 0); b"" only at the checked end."""
        if size is None or size < 0:
            parts = [self._pending]
            self._pending = b""
            while not self._done:
                parts.append(self._more())
            data = b"".join(parts)
        else:
            while not self._pending and not self._done and size:
                self._pending = self._more()
            data, self._pending = self._pending[:size], self._pending[size:]
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move to a decompressed offset (whence 0, 1 or 2, as io does)."""
        if whence == 1:
            offset += self.position
        elif whence == 2:
            self.read()
            offset += self.position
        if offset < self.position:
            self._start()
        while self.position < offset and self.read(min(offset - self.position, 1 << 20)):
            pass
        return self.position

    def tell(self) -> int:
        return self.position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._raw is None

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def __enter__(self) -> CheckedDecompressedFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- decompression

    def _more(self) -> bytes:
        """The next decompressed bytes (maybe b"" while a member's header is read); sets _done at a checked end."""
        if self._decoder is not None and _holds_output(self._decoder):
            return self._decompress(b"")
        if not self._unfed():
            assert self._raw is not None
            self._input, self._fed = bytes(self._raw.read(_CHUNK_BYTES) or b""), 0
            if not self._input:
                if self._decoder is None and self._members:
                    self._done = True
                    return b""
                raise _truncated(self.path, self.codec, self._consumed)
        if self._decoder is None:  # between members: padding, another member, or trailing garbage
            return self._next_member()
        return self._decompress(self._take(_ZSTD_FEED_BYTES if self.codec == "zstd" else _CHUNK_BYTES))

    def _unfed(self) -> int:
        return len(self._input) - self._fed

    def _take(self, size: int) -> bytes:
        """The next (up to) size compressed bytes read and not yet fed."""
        chunk = self._input[self._fed:self._fed + size]
        self._fed += len(chunk)
        return chunk

    def _give_back(self, rest: bytes) -> None:
        """Compressed bytes a decompressor did not use go back in front of those not yet fed."""
        if rest:
            self._input, self._fed = rest + self._input[self._fed:], 0

    def _decompress(self, chunk: bytes) -> bytes:
        """At most about _OUTPUT_BYTES decompressed from chunk (the rest of it given back, or held by the decoder)."""
        decoder = self._decoder
        before = decoder.copy() if hasattr(decoder, "copy") else None
        try:
            out = decoder.decompress(chunk) if self.codec == "zstd" else decoder.decompress(chunk, _OUTPUT_BYTES)
        except Exception as error:  # zlib.error, OSError (bz2, lzma), zstandard.ZstdError
            raise _corrupt(self.path, self.codec, self._where(before, chunk), error) from error
        if decoder.eof:  # unused_data is all that follows: zlib may leave the same bytes in unconsumed_tail too
            rest = decoder.unused_data
            self._members += 1
            self._decoder = None
        else:
            rest = getattr(decoder, "unconsumed_tail", b"")  # zlib keeps what it did not reach for the next call
        self._consumed += len(chunk) - len(rest)
        self._give_back(rest)
        return out

    def _next_member(self) -> bytes:
        """After an end-of-stream marker: zero padding is skipped; other bytes must start another member."""
        unfed = self._input[self._fed:]
        stripped = unfed.lstrip(b"\0") if self.codec in ("gzip", "xz") else unfed
        self._consumed += len(unfed) - len(stripped)
        self._input, self._fed = stripped, 0
        if not stripped:
            return b""
        if self.codec == "deflate":
            raise _corrupt(self.path, self.codec, f"at compressed byte {self._consumed}",
                           ValueError(f"{len(stripped)}+ bytes follow the end of the zlib stream"))
        self._decoder = _decompressor(self.codec)
        return b""

    def _where(self, before: Any, chunk: bytes) -> str:
        """Where in the compressed file the error is: exactly (zlib, fed again byte by byte), else the chunk's range."""
        if before is not None:
            for index in range(len(chunk)):
                try:
                    before.decompress(chunk[index:index + 1])
                except Exception:
                    return f"at compressed byte {self._consumed + index}"
        return f"in compressed bytes {self._consumed} to {self._consumed + len(chunk)}"


def _holds_output(decoder: Any) -> bool:
    """Whether a decoder (bz2, lzma) stopped at the output limit with output still to give for input it has."""
    return not getattr(decoder, "needs_input", True) and not decoder.eof


def open_checked(path: str) -> BinaryIO | CheckedDecompressedFile:
    """The file's bytes: decompressed and checked to the end when its extension names a codec, else as stored."""
    codec = codec_of(path)
    if codec is None:
        return _open_stored(path)
    return CheckedDecompressedFile(lambda: _open_stored(path), path, codec)


def _open_stored(path: str) -> BinaryIO:
    """An input file as stored: a local one proven a regular file first (a FIFO would hang the read, a device never
    end), a link followed; any other filesystem's through Beam."""
    if filesystem.scheme_of(path) is None:
        return open_regular(path, "input file", follow_links=True)
    return filesystem.open_read(path)
