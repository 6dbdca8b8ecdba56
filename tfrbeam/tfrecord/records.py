"""TFRecord framing: write and read length-prefixed, CRC-checked records, exactly as TensorFlow does.

A record is ``uint64 length (LE) | uint32 masked_crc32c(length bytes) | payload |
uint32 masked_crc32c(payload)``. Files may be uncompressed, GZIP or ZLIB (the only codecs
TensorFlow reads); this module is the one place that resolves a compression argument (its
spellings, "auto" by a file's name or first bytes, a dataset's codec from its manifest). It
has no Beam imports: the Beam source and sink build on it.

Integrity rules (stricter than TensorFlow and Beam, on purpose):
- A partial record at end of file is an error. TensorFlow treats a partial *header* (1-11 bytes)
  as a clean end of file; ``tf_compatible_eof=True`` does the same.
- A GZIP or ZLIB stream that ends early or lacks its trailer is an error (Beam silently drops the
  records there; TensorFlow accepts a missing gzip trailer).
- ``skip_corrupt=True`` resynchronises after a bad record instead of raising, and reports every
  skipped byte range (logged, and passed to ``on_skip``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import os
import struct
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, BinaryIO, Protocol, Union, cast

import crc32c as _crc32c
import numpy as np

from tfrbeam.base import fileops
from tfrbeam.base.fileops import partial_path
from tfrbeam.base.object_store import open_to_read
from tfrbeam.errors import (
    ConfigError,
    CorruptRecordError,
    RecordError,
    RecordTooLargeError,
    TruncatedRecordError,
    UnsupportedCompressionError,
)

_LOG = logging.getLogger(__name__)

HEADER_SIZE = 12  # uint64 length + uint32 masked crc of the length
FOOTER_SIZE = 4  # uint32 masked crc of the payload
RECORD_OVERHEAD = HEADER_SIZE + FOOTER_SIZE
MAX_PAYLOAD_SIZE = 2**31 - 1
COMPRESSIONS = (None, "gzip", "zlib")  # the codecs TensorFlow reads
AUTO_COMPRESSION = "auto"  # by the file's name, or a local file's first bytes
_MASK_DELTA = 0xA282EAD8
_READ_CHUNK = 1 << 20
# A file object may allocate the whole size asked for, so a damaged length never asks for more.
_MAX_READ_CALL = 64 << 20
_SCAN_WINDOW = 1 << 16  # offsets whose lengths find_record_start checks at once
# TensorFlow's ZlibCompressionOptions: level Z_DEFAULT_COMPRESSION, window 15, mem_level 9.
_TF_ZLIB_LEVEL = 6
_TF_ZLIB_MEM_LEVEL = 9



class Readable(Protocol):
    """What the readers need of a file object: ``read(size)``, which may return short or ``None``."""

    def read(self, size: int, /) -> bytes | None: ...


class ReadableFile(Readable, Protocol):
    """A file object ``RecordReader`` reads: any binary file, or a wrapper with ``read`` and ``close``."""

    def close(self) -> None: ...


class WritableFile(Protocol):
    """A file object ``RecordWriter`` writes: any binary file, or a wrapper with these three methods."""

    def write(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


ReadSource = Union[str, "os.PathLike[str]", ReadableFile]
WriteTarget = Union[str, "os.PathLike[str]", WritableFile]

_crc = _crc32c.crc32c
_second = operator.itemgetter(1)
_pack_header = struct.Struct("<QI").pack
_unpack_header = struct.Struct("<QI").unpack_from  # a record header: uint64 length, uint32 masked CRC of those 8 bytes
_pack_length = struct.Struct("<Q").pack
_unpack_length = struct.Struct("<Q").unpack_from
_pack_crc = struct.Struct("<I").pack
_unpack_crc = struct.Struct("<I").unpack_from


def _warn_if_software_crc() -> None:
    """Warn loudly once when crc32c has no hardware support: every record would be ~10x slower."""
    if not _crc32c.hardware_based:
        message = (
            "tfrbeam: the crc32c package found no hardware CRC32C support on this CPU and falls back "
            "to software; reading and writing TFRecords will be several times slower."
        )
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        _LOG.warning(message)


_warn_if_software_crc()


def mask_crc(crc: int) -> int:
    """Apply TFRecord's CRC mask: rotate right by 15 bits and add a constant, mod 2^32."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def mask_crcs(crcs: np.ndarray) -> np.ndarray:
    """TFRecord's CRC mask over an array of CRC32C values (rotate right by 15 bits, add a constant), as uint32."""
    crcs = np.asarray(crcs).astype(np.uint64)
    return ((((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype("<u4")


def unmask_crcs(masked: np.ndarray) -> np.ndarray:
    """The CRC32C values behind an array of masked CRCs, as uint32 (the inverse of ``mask_crcs``)."""
    rotated = (np.asarray(masked).astype(np.uint32) - np.uint32(_MASK_DELTA)).astype(np.uint32)
    return ((rotated >> np.uint32(17)) | (rotated << np.uint32(15))).astype("<u4")


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """Masked CRC32C of ``data`` as stored in TFRecord headers and footers."""
    crc = _crc(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class _LengthHeaders(dict):
    """Cache of 12-byte headers by payload length: datasets repeat the same few lengths."""

    def __missing__(self, length: int) -> bytes:
        encoded = _pack_length(length)
        header = encoded + _pack_crc(masked_crc32c(encoded))
        if len(self) < 65536:
            self[length] = header
        return header


_HEADERS = _LengthHeaders()


def _too_large(length: int) -> RecordTooLargeError:
    return RecordTooLargeError(
        f"a record payload of {length} bytes exceeds the TFRecord limit of {MAX_PAYLOAD_SIZE} bytes "
        "(2 GiB - 1); split the value across several records or features"
    )


def _too_large_detail(length: int) -> str:
    return f"the header claims {length} bytes; a payload is at most {MAX_PAYLOAD_SIZE} bytes (2 GiB - 1)"


def frame_record(payload: bytes | bytearray | memoryview) -> bytes:
    """One framed record: header, payload and footer."""
    length = len(payload)
    if length > MAX_PAYLOAD_SIZE:
        raise _too_large(length)
    return b"".join((_HEADERS[length], payload, _pack_crc(masked_crc32c(payload))))


def frame_records(payloads: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """Frame many records into one buffer, ready for a single write call."""
    headers = _HEADERS
    parts: list[bytes | bytearray | memoryview] = []
    append = parts.append
    for payload in payloads:
        length = len(payload)
        if length > MAX_PAYLOAD_SIZE:
            raise _too_large(length)
        append(headers[length])
        append(payload)
        crc = _crc(payload)
        append(_pack_crc((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF))
    return b"".join(parts)


def frame_buffer(data: bytes | bytearray | memoryview, offsets: Iterable[int]) -> bytes:
    """Frame records given as one contiguous buffer plus n+1 offsets (the columnar codec's output)."""
    view = memoryview(data)
    bounds = [int(offset) for offset in offsets]
    return frame_records(view[start:end] for start, end in zip(bounds, bounds[1:]))


# Compression: the one place that says what a compression argument means. Every entry point (the readers, the Beam
# source and sink, stats, export, the builder) resolves through it, so one spelling is one codec everywhere.

# Every accepted spelling, compared stripped and lower-cased: ours, TensorFlow's ('' | 'GZIP' | 'ZLIB') and Beam's
# CompressionTypes. Beam's DEFLATE is zlib.compressobj() with a 15-bit window: a zlib (RFC 1950) stream, byte for
# byte what TensorFlow calls ZLIB.
_COMPRESSION_NAMES: dict[str, str | None] = {
    "": None, "none": None, "uncompressed": None,
    "gzip": "gzip", "gz": "gzip",
    "zlib": "zlib", "zz": "zlib", "deflate": "zlib",
    AUTO_COMPRESSION: AUTO_COMPRESSION,
}
# Codecs Beam reads and writes but TensorFlow cannot: refused by name and by file suffix.
_REFUSED_COMPRESSIONS = {"bzip2": "BZIP2", "bz2": "BZIP2", "zstd": "ZSTD", "zst": "ZSTD", "lzma": "LZMA", "xz": "LZMA"}
# The suffix tfrbeam writes after the name of a file of each codec (a build's shards): "auto" reads each back as it.
COMPRESSION_SUFFIX: Mapping[str | None, str] = MappingProxyType({None: "", "gzip": ".gz", "zlib": ".zlib"})
# "auto" by name: Beam's suffixes (.gz, .deflate) and the names TensorFlow users give such files (.gzip, .zlib, .zz).
_COMPRESSION_SUFFIXES = {COMPRESSION_SUFFIX["gzip"]: "gzip", ".gzip": "gzip", COMPRESSION_SUFFIX["zlib"]: "zlib",
                         ".zz": "zlib", ".deflate": "zlib"}


def refused_compression(codec: str, where: str) -> UnsupportedCompressionError:
    """The one-line refusal of a codec TensorFlow cannot read, naming where it was asked for."""
    beams = " (apache_beam's tfrecordio would; tfrbeam does not, on purpose)" if codec in _REFUSED_COMPRESSIONS.values() else ""
    return UnsupportedCompressionError(
        f"{where}: {codec} compression is refused: TensorFlow reads TFRecord files only uncompressed, GZIP or ZLIB "
        "(TFRecordDataset(compression_type='' | 'GZIP' | 'ZLIB')), so a TFRecord file compressed with "
        f"{codec} could not be read by it{beams}. Use compression=None, 'gzip' or 'zlib' (Beam's "
        "CompressionTypes.UNCOMPRESSED, GZIP or DEFLATE)."
    )


def canonical_compression(compression: str | None) -> str | None:
    """Any accepted spelling as None, "gzip", "zlib" or "auto"; anything else is refused."""
    if compression is None:
        return None
    key = str(compression).strip().lower()
    if key in _COMPRESSION_NAMES:
        return _COMPRESSION_NAMES[key]
    raise refused_compression(_REFUSED_COMPRESSIONS.get(key, repr(compression)), f"compression {compression!r}")


def normalize_compression(compression: str | None, name: str = "", *, reading: bool = True) -> str | None:
    """The codec of the file ``name``: None, "gzip" or "zlib"; "auto" is ``compression_from_name(name, reading)``."""
    codec = canonical_compression(compression)
    return compression_from_name(name, look_inside=reading) if codec == AUTO_COMPRESSION else codec


def compression_suffix(compression: str | None) -> str:
    """The suffix of a file written with ``compression`` (any spelling): "", ".gz" or ".zlib"; "auto" is refused."""
    codec = canonical_compression(compression)
    if codec == AUTO_COMPRESSION:
        raise ConfigError("a file's suffix follows its codec: give none, gzip or zlib, not 'auto'")
    return COMPRESSION_SUFFIX[codec]


def combine_compressions(compression_type: str | None, compression: str | None) -> str | None:
    """Beam's ``compression_type`` and our ``compression`` as one: "auto" yields to the other; two set ones must
    agree. Beam's CompressionTypes are plain strings ("gzip", "deflate", ...), resolved as any other spelling."""
    one, other = canonical_compression(compression_type), canonical_compression(compression)
    if one == AUTO_COMPRESSION:
        return other
    if other not in (AUTO_COMPRESSION, one):
        raise ConfigError(f"compression_type={compression_type!r} and compression={compression!r} disagree; "
                          "give only one of them")
    return one


def compression_from_name(name: str, look_inside: bool = True) -> str | None:
    """The codec "auto" gives a file: by its suffix (``.gz``/``.gzip`` gzip, ``.zlib``/``.zz``/``.deflate`` zlib;
    ``.bz2``/``.zst``/``.zstd``/``.xz``/``.lzma`` refused), else, for a local file to read, by its first bytes.

    TensorFlow writes GZIP files under any name (``TFRecordWriter("x.tfrecord", "GZIP")``), so a local file whose
    name implies none is looked inside (unless ``look_inside`` is False, as for a file about to be written): gzip's
    magic bytes 1f 8b, or a zlib header, make it compressed, unless its first 12 bytes are a valid TFRecord header.
    """
    path = os.fspath(name)
    lower = path.lower()
    for suffix, codec in _COMPRESSION_SUFFIXES.items():
        if lower.endswith(suffix):
            return codec
    extension = lower[lower.rfind(".") + 1:] if "." in lower.rsplit("/", 1)[-1] else ""
    if extension in _REFUSED_COMPRESSIONS:
        raise refused_compression(_REFUSED_COMPRESSIONS[extension], f"{path} (compression 'auto' goes by its extension)")
    return _compression_of_first_bytes(path) if look_inside else None


def _compression_of_first_bytes(path: str) -> str | None:
    """gzip or zlib when a local file starts like one and not like a TFRecord file; None otherwise (or when unreadable)."""
    if not os.path.isfile(path):  # a remote path or a stream's label: its name decides
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEADER_SIZE)
    except OSError:
        return None  # the reader that follows reports why it cannot read the file
    if sound_header(head):
        return None  # a valid length header: an uncompressed TFRecord file (a chance match is 1 in 2^32)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    # RFC 1950: method 8 (deflate), a window of at most 32 KiB, and the two header bytes a multiple of 31.
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def manifest_compression(manifest: Mapping[str, Any]) -> str | None:
    """A dataset's codec: what its manifest's ``compression`` says (missing or "none": uncompressed)."""
    codec = canonical_compression(manifest.get("compression"))
    if codec == AUTO_COMPRESSION:
        raise ConfigError("a dataset manifest's compression is none, gzip or zlib, never 'auto'")
    return codec


def dataset_compression(manifest: Mapping[str, Any], compression: str | None = AUTO_COMPRESSION) -> str | None:
    """The codec to read a dataset's shards with: ``compression`` when given, for "auto" the manifest's (never a guess
    from a shard's name)."""
    codec = canonical_compression(compression)
    return manifest_compression(manifest) if codec == AUTO_COMPRESSION else codec


def _name_of(target: object) -> str:
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target)
    name = getattr(target, "name", None)
    return name if isinstance(name, str) else "<stream>"


class RecordWriter:
    """Writes TFRecord files that TensorFlow reads, optionally GZIP or ZLIB compressed.

    Output is byte-identical to ``tf.io.TFRecordWriter`` (compressed output uses TensorFlow's zlib
    settings: level 6, window 15, memory level 9). ``bytes_written`` is the uncompressed offset of
    the next record, which the Beam sink uses to build its read index.
    """

    def __init__(self, target: WriteTarget, compression: str | None = None):
        self.name = _name_of(target)
        self.compression = normalize_compression(compression, self.name, reading=False)
        self._owns_file = isinstance(target, (str, os.PathLike))
        # A path is written under a hidden temporary name beside it and renamed on close, so a
        # crash or a full disk never leaves a partial file at the final path.
        self._temp_path: str | None
        self._file: WritableFile
        if isinstance(target, (str, os.PathLike)):
            self._temp_path = _partial_path(os.fspath(target))
            self._file = self._open_temp(self._temp_path)
        else:
            self._temp_path = None
            self._file = target
        self._compressor = _make_compressor(self.compression)
        self.records_written = 0
        self.bytes_written = 0
        self._closed = False

    def _open_temp(self, temp_path: str) -> BinaryIO:
        try:
            return fileops.create(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # a fresh random name
        except OSError as error:
            raise OSError(error.errno, f"{error.strerror} (creating {self.name})", temp_path) from error

    def write(self, payload: bytes | bytearray | memoryview) -> None:
        """Frame and write one record."""
        self._write_framed(frame_record(payload), 1)

    def write_many(self, payloads: Iterable[bytes | bytearray | memoryview]) -> None:
        """Frame many records into one buffer and write it with one call."""
        batch = payloads if isinstance(payloads, (list, tuple)) else list(payloads)
        self._write_framed(frame_records(batch), len(batch))

    def write_framed(self, framed: bytes | bytearray | memoryview, num_records: int) -> None:
        """Write bytes that are already framed records (e.g. from ``frame_buffer``)."""
        self._write_framed(framed, num_records)

    def _write_framed(self, framed: bytes | bytearray | memoryview, num_records: int) -> None:
        if self._closed:
            raise ValueError(f"{self.name}: write to a closed RecordWriter")
        try:
            self._file.write(self._compressor.compress(framed) if self._compressor else framed)
        except OSError as error:
            raise OSError(error.errno, f"{error.strerror} (writing {self.name})", self.name) from error
        self.records_written += num_records
        self.bytes_written += len(framed)

    def flush(self) -> None:
        """Flush compressed data (with a full flush point) and the underlying file."""
        if self._compressor:
            self._file.write(self._compressor.flush(zlib.Z_FULL_FLUSH))
        self._file.flush()

    def close(self) -> None:
        """Finish the compressed stream; a file this writer opened is closed and renamed to its final path."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._compressor:
                self._file.write(self._compressor.flush(zlib.Z_FINISH))
            if not self._owns_file:
                self._file.flush()
                return
            self._file.close()
            fileops.replace(self._temp_path, self.name)  # type: ignore[arg-type]
        except OSError as error:
            self._discard()
            message = f"{error.strerror} (finishing {self.name}; nothing was left at that path)"
            raise OSError(error.errno, message, self.name) from error

    def abort(self) -> None:
        """Stop without publishing: a file this writer opened is deleted, the final path is left untouched."""
        if self._closed:
            return
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        """Close and delete the partial file; best effort, so the error that got us here is the one raised."""
        if not self._owns_file:
            return
        with contextlib.suppress(OSError):  # a full disk can fail the close too
            self._file.close()
        with contextlib.suppress(OSError):  # already gone, or not creatable in the first place
            fileops.remove(self._temp_path)  # type: ignore[arg-type]

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def _partial_path(path: str) -> str:
    return partial_path(path, uuid.uuid4().hex[:12])


def _make_compressor(compression: str | None):
    if compression is None:
        return None
    wbits = 31 if compression == "gzip" else 15
    return zlib.compressobj(_TF_ZLIB_LEVEL, zlib.DEFLATED, wbits, _TF_ZLIB_MEM_LEVEL)


@dataclasses.dataclass(frozen=True)
class SkippedRegion:
    """A byte range that ``skip_corrupt=True`` passed over, and why."""

    path: str
    offset: int
    length: int
    reason: str


@dataclasses.dataclass
class ReadStats:
    """What a reader has read so far: records, payload bytes and skipped regions."""

    records: int = 0
    payload_bytes: int = 0
    skipped: list[SkippedRegion] = dataclasses.field(default_factory=list)

    @property
    def skipped_bytes(self) -> int:
        return sum(region.length for region in self.skipped)


class _Decompressor:
    """A file-like ``read(n)`` over a GZIP or ZLIB stream that raises on truncation or corruption."""

    def __init__(self, raw: Readable, compression: str, path: str):
        self._raw = raw
        self._wbits = 31 if compression == "gzip" else 15
        self._gzip = compression == "gzip"
        self._path = path
        self._decoder = zlib.decompressobj(self._wbits)
        self._pending = b""
        self.position = 0  # decompressed bytes handed out so far
        self._done = False

    def read(self, size: int) -> bytes:
        while not self._pending and not self._done:
            self._pending = self._decompress_more()
        chunk, self._pending = self._pending[:size], self._pending[size:]
        self.position += len(chunk)
        return chunk

    def _decompress_more(self) -> bytes:
        if self._decoder.eof:  # a member ended inside the last call: what follows it comes first
            return self._next_member()
        data = self._decoder.unconsumed_tail or _read_some(self._raw, _READ_CHUNK)
        if not data:
            if not self._decoder.eof:
                raise TruncatedRecordError(
                    self._path, self.position, "truncated_stream",
                    "the compressed data stops before its end-of-stream marker and trailer, so the file "
                    "was cut short, e.g. by an interrupted copy or write", compressed=True,
                )
            self._done = True
            return b""
        try:
            out = self._decoder.decompress(data, _READ_CHUNK)
        except zlib.error as exc:
            raise CorruptRecordError(
                self._path, self.position, "compressed_stream", f"zlib: {exc}", compressed=True
            ) from exc
        if self._decoder.eof:
            out += self._next_member()
        return out

    def _next_member(self) -> bytes:
        """Handle what follows an end-of-stream marker: another gzip member, or nothing."""
        rest = self._decoder.unused_data
        while not rest:
            rest = _read_some(self._raw, _READ_CHUNK)
            if not rest:
                self._done = True
                return b""
        if not self._gzip:
            raise CorruptRecordError(
                self._path, self.position, "compressed_stream",
                f"{len(rest)}+ bytes of trailing data after the end of the ZLIB stream", compressed=True,
            )
        self._decoder = zlib.decompressobj(self._wbits)
        try:
            return self._decoder.decompress(rest, _READ_CHUNK)
        except zlib.error as exc:
            raise CorruptRecordError(
                self._path, self.position, "compressed_stream",
                f"data after a gzip member is not another gzip member: zlib: {exc}", compressed=True,
            ) from exc


def _read_some(fileobj: Readable, size: int) -> bytes:
    data = fileobj.read(size)
    return b"" if data is None else bytes(data)


class RecordReader:
    """Reads framed records from a file or stream, checking every CRC.

    ``start_offset`` is where reading starts in an uncompressed seekable file (the Beam source
    reads byte ranges); offsets reported in errors, in ``SkippedRegion`` and by
    ``records_with_offsets`` are absolute positions in the (decompressed) stream.
    """

    def __init__(
        self,
        source: ReadSource,
        compression: str | None = "auto",
        *,
        verify: bool = True,
        tf_compatible_eof: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[SkippedRegion], None] | None = None,
        start_offset: int = 0,
        name: str | None = None,
    ):
        self.path = name or _name_of(source)
        self.compression = normalize_compression(compression, self.path)
        self.verify = verify
        self.tf_compatible_eof = tf_compatible_eof
        self.skip_corrupt = skip_corrupt
        self.on_skip = on_skip
        self.stats = ReadStats()
        self._owns_file = isinstance(source, (str, os.PathLike))
        raw: ReadableFile = open_to_read(os.fspath(source), prefetch=True) if isinstance(source, (str, os.PathLike)) else source
        self._raw = raw
        if start_offset and self.compression is not None:
            raise ValueError(f"{self.path}: a compressed file can only be read from offset 0")
        if start_offset:
            cast(BinaryIO, raw).seek(start_offset)  # a start offset is only for seekable files
        self._stream = _Decompressor(raw, self.compression, self.path) if self.compression else raw
        self._size = None if self.compression else _size_of(raw)
        self._buffer = b""
        self._pos = 0  # index into self._buffer of the next unread byte
        self._base = start_offset  # absolute stream offset of self._buffer[0]
        self._eof = False

    def __iter__(self) -> Iterator[bytes]:
        return map(_second, self.records_with_offsets())

    def close(self) -> None:
        if self._owns_file:
            self._raw.close()

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def offset(self) -> int:
        """Absolute offset of the next record to be read."""
        return self._base + self._pos

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available from ``self._pos``; False when the stream ends first."""
        available = len(self._buffer) - self._pos
        if available >= need:
            return True
        if self._eof:
            return False
        parts = [self._buffer[self._pos:]]
        self._base += self._pos
        self._pos = 0
        while available < need:
            chunk = self._read_stream(min(max(_READ_CHUNK, need - available), _MAX_READ_CALL))
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            available += len(chunk)
        self._buffer = b"".join(parts)
        return available >= need

    def _read_stream(self, size: int) -> bytes:
        """Read from the (decompressing) stream; a broken compressed stream is reported at the current record."""
        try:
            return _read_some(self._stream, size)
        except RecordError as exc:
            error = type(exc)(
                self.path, self.offset, exc.check,
                f"{exc.detail}; the decompressed data ends at offset {exc.offset}", compressed=True,
            )
            if not self.skip_corrupt:
                raise error from exc
            self._report_skip(SkippedRegion(self.path, exc.offset, 0, exc.check), "records after it are lost")
            return b""

    def records_with_offsets(self) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, payload)`` for each record, raising or skipping on damage."""
        crc = _crc
        headers = _HEADERS
        unpack_length = _unpack_length
        unpack_crc = _unpack_crc
        verify = self.verify
        stats = self.stats
        while True:
            buffer, pos = self._buffer, self._pos
            if len(buffer) - pos < HEADER_SIZE and not self._fill(HEADER_SIZE):
                if self._handle_short_header():
                    return
                continue
            buffer, pos = self._buffer, self._pos
            length = unpack_length(buffer, pos)[0]
            # Datasets repeat a few lengths: comparing with the cached header replaces a CRC call. The length is
            # checked before a byte is buffered for it: a bomb's header claims 2^40.
            if (verify and buffer[pos:pos + HEADER_SIZE] != headers[length]) or length > MAX_PAYLOAD_SIZE:
                self._fail(self._header_error(self._size, verify))
                continue
            end = pos + HEADER_SIZE + length + FOOTER_SIZE
            if end > len(buffer):
                if self._size is not None and self.offset + RECORD_OVERHEAD + length > self._size:  # known unread
                    self._fail(self._header_error(self._size, verify))
                    continue
                if not self._fill(HEADER_SIZE + length + FOOTER_SIZE):  # the stream ends in this record
                    self._fail(self._header_error(self.offset + len(self._buffer) - self._pos, verify))
                    continue
                buffer, pos = self._buffer, self._pos
                end = pos + HEADER_SIZE + length + FOOTER_SIZE
            payload = buffer[pos + HEADER_SIZE:end - FOOTER_SIZE]
            if verify:
                c = crc(payload)
                stored = unpack_crc(buffer, end - FOOTER_SIZE)[0]
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != stored:
                    detail = f"payload of {length} bytes"
                    self._fail(CorruptRecordError(self.path, self.offset, "data_crc", detail, self._compressed))
                    continue
            offset = self._base + pos
            self._pos = end
            stats.records += 1
            stats.payload_bytes += length
            yield offset, payload

    @property
    def _compressed(self) -> bool:
        return self.compression is not None

    def _handle_short_header(self) -> bool:
        """At end of stream with fewer than 12 bytes left; True when reading is over."""
        remaining = len(self._buffer) - self._pos
        if remaining == 0:
            return True
        if self.tf_compatible_eof:
            _LOG.info("%s: ignoring a partial %d-byte header at end of file (tf_compatible_eof)", self.path, remaining)
            return True
        self._fail(self._header_error(self.offset + remaining, self.verify))
        return False

    def _header_error(self, size: int | None, verify: bool) -> RecordError:
        """What ``header_problem`` finds in the header at the cursor (the caller knows it finds something)."""
        problem = header_problem(self._buffer[self._pos:self._pos + HEADER_SIZE], self.path, self.offset, size,
                                 compressed=self._compressed, verify=verify)
        assert problem is not None, "the reader and header_problem disagree about a header"
        return problem

    def _fail(self, error: RecordError) -> None:
        """Raise ``error``, or with skip_corrupt resynchronise past it and report the skipped range."""
        if not self.skip_corrupt:
            raise error
        start = self.offset
        found = self._scan_for_record(start + 1)
        self._report_skip(
            SkippedRegion(self.path, start, self.offset - start, error.check),
            f"resumed at offset {self.offset}" if found else "no valid record follows",
        )

    def _report_skip(self, skipped: SkippedRegion, outcome: str) -> None:
        self.stats.skipped.append(skipped)
        _LOG.warning(
            "%s: skip_corrupt skipped %d bytes at offset %d (%s); %s",
            skipped.path, skipped.length, skipped.offset, skipped.reason, outcome,
        )
        if self.on_skip is not None:
            self.on_skip(skipped)

    def _scan_for_record(self, offset: int) -> bool:
        """Move to the first offset >= ``offset`` where a whole valid record starts; False at EOF."""
        self._pos += offset - self.offset
        while True:
            if not self._fill(HEADER_SIZE):
                self._pos = len(self._buffer)
                return False
            if self._valid_record_here():
                return True
            self._pos += 1

    def _valid_record_here(self) -> bool:
        """Whether the bytes at the cursor hold a record whose length CRC and data CRC both validate."""
        buffer, pos = self._buffer, self._pos
        # The first 8 bytes of an 8-byte payload pass the length CRC (its data CRC follows them),
        # so a candidate's length must also fit what is left of the file.
        if not sound_header(buffer[pos:pos + HEADER_SIZE], None if self._size is None else self._size - self.offset):
            return False
        length = _unpack_length(buffer, pos)[0]
        if not self._fill(HEADER_SIZE + length + FOOTER_SIZE):
            return False
        buffer, pos = self._buffer, self._pos
        end = pos + HEADER_SIZE + length
        return masked_crc32c(buffer[pos + HEADER_SIZE:end]) == _unpack_crc(buffer, end)[0]


def _size_of(fileobj: Any) -> int | None:
    """Total size of a seekable file object, or None for a stream."""
    try:
        if not fileobj.seekable():
            return None
        position = fileobj.tell()
        size = fileobj.seek(0, os.SEEK_END)
        fileobj.seek(position)
        return size
    except (AttributeError, OSError, ValueError):
        return None


# A record header, the one place it is checked one at a time (the block readers check many at once with numpy, by
# the same rule: tests hold them to sound_header). It is sound when it has 12 bytes, its masked CRC matches its
# 8 length bytes, the length is at most MAX_PAYLOAD_SIZE and, when the file's size is known, the record fits.


def sound_header(header: bytes | bytearray | memoryview, room: int | None = None) -> bool:
    """Whether ``header`` is a sound record header (see above); ``room`` is the bytes from it to the end of the file.

    The cheap yes or no of resynchronising scans, which try offset after offset; ``header_problem`` says why not.
    """
    if len(header) < HEADER_SIZE:
        return False
    length, length_crc = _unpack_header(header)
    return (masked_crc32c(header[:8]) == length_crc and length <= MAX_PAYLOAD_SIZE
            and (room is None or RECORD_OVERHEAD + length <= room))


def header_problem(header: bytes | bytearray | memoryview, path: str, offset: int, size: int | None = None, *,
                   compressed: bool = False, verify: bool = True, hint: str = "") -> RecordError | None:
    """Why the record whose header (12 bytes, fewer at end of file) is at ``offset`` of ``path`` cannot be read.

    The error names the file, the offset and the failed check: truncated_header, length_crc (not checked when
    ``verify`` is False), length_too_large, and, when the file's ``size`` is known, truncated_payload or
    truncated_footer. ``hint`` is added to a length_crc error's detail (what led the reader there). None: sound.
    """
    if len(header) < HEADER_SIZE:
        return TruncatedRecordError(path, offset, "truncated_header",
                                    f"only {len(header)} of 12 header bytes before the end of the file", compressed)
    length, stored = _unpack_header(header)
    computed = masked_crc32c(header[:8])
    if verify and computed != stored:
        detail = f"stored {stored:#010x}, computed {computed:#010x} for length bytes {bytes(header[:8]).hex()}"
        return CorruptRecordError(path, offset, "length_crc", f"{detail}; {hint}" if hint else detail, compressed)
    if length > MAX_PAYLOAD_SIZE:
        return CorruptRecordError(path, offset, "length_too_large", _too_large_detail(length), compressed)
    remaining = None if size is None else size - offset
    if remaining is None or RECORD_OVERHEAD + length <= remaining:
        return None
    if remaining < HEADER_SIZE + length:
        return TruncatedRecordError(path, offset, "truncated_payload",
                                    f"the header announces {length} payload bytes, {remaining - HEADER_SIZE} are present",
                                    compressed)
    return TruncatedRecordError(path, offset, "truncated_footer",
                                f"{remaining - HEADER_SIZE - length} of 4 footer bytes are present", compressed)


def record_length(header: bytes | bytearray | memoryview, path: str, offset: int, size: int | None = None, *,
                  compressed: bool = False, hint: str = "") -> int:
    """The payload length a sound record header announces; raises ``header_problem``'s error for any other."""
    problem = header_problem(header, path, offset, size, compressed=compressed, hint=hint)
    if problem is not None:
        raise problem
    return _unpack_length(header)[0]


def read_records(
    source: ReadSource,
    compression: str | None = "auto",
    verify: bool = True,
    *,
    tf_compatible_eof: bool = False,
    skip_corrupt: bool = False,
    on_skip: Callable[[SkippedRegion], None] | None = None,
) -> Iterator[bytes]:
    """Yield the payload of every record in a TFRecord file (a path or a binary file object).

    ``compression="auto"`` picks by extension (.gz gzip, .zlib/.zz/.deflate zlib), else by the file's first bytes
    (``compression_from_name``). Damage raises ``CorruptRecordError`` / ``TruncatedRecordError`` with the path and
    byte offset, unless ``skip_corrupt=True``, which skips bad records, logs each skipped range and calls ``on_skip``.
    """
    reader = RecordReader(
        source, compression, verify=verify, tf_compatible_eof=tf_compatible_eof,
        skip_corrupt=skip_corrupt, on_skip=on_skip,
    )
    with reader:
        yield from reader


def find_record_start(
    fileobj: BinaryIO, offset: int, limit: int | None = None, name: str | None = None, size: int | None = None
) -> int | None:
    """The first offset >= ``offset`` (and < ``limit``) of an uncompressed file where a whole valid record starts.

    A candidate needs a length that fits the rest of the file (checked for a window of offsets at
    once with numpy), a valid length CRC and a valid data CRC: the rule ``skip_corrupt``
    resynchronises by, so a split reader and a skipping reader agree. Used to split files that
    carry no record index; payloads that themselves embed TFRecord framing can fool it (the
    embedded record validates too). ``size`` defaults to the file's size.
    """
    size = _size_of(fileobj) if size is None else size
    if size is None:
        raise ValueError(f"{name or _name_of(fileobj)}: find_record_start needs a seekable file")
    end = size - RECORD_OVERHEAD + 1 if limit is None else min(limit, size - RECORD_OVERHEAD + 1)
    position = offset
    while position < end:
        fileobj.seek(position)
        window = _read_some(fileobj, min(_SCAN_WINDOW, end - position) + HEADER_SIZE - 1)
        count = len(window) - HEADER_SIZE + 1
        if count <= 0:
            return None
        lengths = np.ndarray((count,), dtype="<u8", buffer=window, strides=(1,))
        room = (size - RECORD_OVERHEAD - position - np.arange(count, dtype=np.int64)).astype(np.uint64)
        for candidate in np.flatnonzero(lengths <= room).tolist():
            if _whole_record_at(fileobj, position + candidate, window[candidate:candidate + HEADER_SIZE]):
                return position + candidate
        position += count
    return None


def _whole_record_at(fileobj: BinaryIO, offset: int, header: bytes) -> bool:
    """Whether a record with valid length and data CRCs starts at ``offset`` (its length is known to fit)."""
    if not sound_header(header):
        return False
    length = _unpack_length(header)[0]
    fileobj.seek(offset + HEADER_SIZE)
    body = _read_exactly(fileobj, length + FOOTER_SIZE)
    return len(body) == length + FOOTER_SIZE and masked_crc32c(memoryview(body)[:length]) == _unpack_crc(body, length)[0]


def _read_exactly(fileobj: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes, looping over short reads; fewer only at end of file."""
    parts, remaining = [], size
    while remaining > 0:
        chunk = _read_some(fileobj, min(remaining, _MAX_READ_CALL))
        if not chunk:
            break
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)
