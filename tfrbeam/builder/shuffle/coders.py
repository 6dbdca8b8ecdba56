"""Beam coders of the shuffle's elements: a header and raw arrays, one copy per element, never a call per record."""

from __future__ import annotations

import struct
import typing

import apache_beam as beam
import numpy as np

from tfrbeam.builder.shuffle.packed import PackedFrames
from tfrbeam.builder.shuffle.pieces import PIECE_STORES, SPILL, KeyedRecords, Piece, PieceRef
from tfrbeam.builder.shuffle.stores import is_registered, registered_piece

__all__ = ["KeyedRecordsCoder", "PieceCoder"]

_KEYED_HEADER = struct.Struct("<QQ?")
# records, frame bytes, offset, location bytes, frames kind, wide offsets, split runs, footers
_PIECE_HEADER = struct.Struct("<QQQIB?I?")
_NO_FRAMES, _RAW, _PACKED = 0, 1, 2  # the frames an element carries: none, as they are, compressed in blocks
_PACKED_HEADER = struct.Struct("<IQQ")  # blocks, skip, size
_WHOLE, _REGISTERED, _STUB = b"\x00", b"\x01", b"\x02"
_NAME_SIZES = struct.Struct("<II")
_STUB_HEADER = struct.Struct("<QQQQI")  # records of the spilled piece, first, end, its first frame's offset, location bytes
_STORE_CODES = {name: code for code, name in enumerate(PIECE_STORES)}


def _raw(array: np.ndarray, dtype: str) -> np.ndarray:
    """An array's bytes in a fixed layout, as a uint8 view (no copy when it already has that layout)."""
    return np.ascontiguousarray(array, dtype=dtype).view(np.uint8)


class _ArrayReader:
    """Reads consecutive fixed-layout arrays out of one encoded element (views, no copies)."""

    def __init__(self, encoded: bytes, position: int):
        self.encoded, self.position = encoded, position

    def take(self, dtype: str, count: int) -> np.ndarray:
        array = np.frombuffer(self.encoded, dtype=dtype, count=count, offset=self.position)
        self.position += array.nbytes
        return array


class KeyedRecordsCoder(beam.coders.Coder):
    """Encodes KeyedRecords as a header and raw arrays: one copy per element, not a coder call per record."""

    def encode(self, value: KeyedRecords) -> bytes:
        count, data, has_crcs = len(value.key), _raw(value.data, "u1"), value.crcs is not None
        return b"".join((  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
            _KEYED_HEADER.pack(count, len(data), has_crcs), _raw(value.split, "<u2"), _raw(value.key, "<u8"),
            _raw(value.offsets, "<i8"), _raw(value.crcs, "<u4") if value.crcs is not None else b"", data,
        ))

    def estimate_size(self, value: KeyedRecords) -> int:
        """The encoded size, computed: Beam samples element sizes, and the default encodes a whole piece to measure it."""
        count = len(value.key)
        return _KEYED_HEADER.size + 18 * count + 8 + (0 if value.crcs is None else 4 * count) + np.asarray(value.data).nbytes

    def decode(self, encoded: bytes) -> KeyedRecords:
        count, size, has_crcs = _KEYED_HEADER.unpack_from(encoded)
        reader = _ArrayReader(encoded, _KEYED_HEADER.size)
        split, key, offsets = reader.take("<u2", count), reader.take("<u8", count), reader.take("<i8", count + 1)
        crcs = reader.take("<u4", count) if has_crcs else None
        return KeyedRecords(split, key, offsets, reader.take("u1", size), crcs)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return KeyedRecords


class PieceCoder(beam.coders.Coder):
    """Encodes a Piece as a header, its reference and raw arrays (its frames too when it carries them).

    A piece a memory store made (held or spilled) is encoded as its run and location only: its
    keys are in this process's memory, where decoding finds the same piece again. A spill store's
    stub (``Piece.stub``) is its location and record range: its keys are in a file beside its frames.
    """

    def encode(self, value: Piece) -> bytes:
        ref = value.ref
        if ref.run and is_registered(value):
            run, location = ref.run.encode("utf-8"), ref.location.encode("utf-8")
            return b"".join((_REGISTERED, _NAME_SIZES.pack(len(run), len(location)), run, location))
        if ref.keys_on_disk is not None:
            location = ref.location.encode("utf-8")
            return b"".join((_STUB, _STUB_HEADER.pack(*ref.keys_on_disk, ref.offset, len(location)), location))
        count, location = len(value.key), ref.location.encode("utf-8")
        frames, tables = _frames_and_tables(ref)
        wide = _wide_offsets(value.offsets)
        split_values, split_counts = _split_runs(value.split)
        header = _PIECE_HEADER.pack(count, len(frames), ref.offset, len(location), _frames_kind(ref), wide,
                                    len(split_values), value.footers is not None)
        parts: list[typing.Any] = [  # bytes and ndarrays: an ndarray is a buffer, numpy types it so only for 3.12+
            _WHOLE, header, bytes([_STORE_CODES[ref.store]]), location, _raw(split_values, "<u2"),
            _raw(split_counts, "<u4"), _raw(value.key, "<u8"), _raw(value.offsets, "<i8" if wide else "<u4"),
            _raw(value.footers, "<u4") if value.footers is not None else b"", *tables, frames,
        ]
        return b"".join(parts)

    def estimate_size(self, value: Piece) -> int:
        ref = value.ref
        if ref.run and is_registered(value):
            return 1 + _NAME_SIZES.size + len(ref.run) + len(ref.location)
        if ref.keys_on_disk is not None:
            return 1 + _STUB_HEADER.size + len(ref.location.encode("utf-8"))
        if ref.packed is not None:
            frames = _PACKED_HEADER.size + 12 * len(ref.packed.raw_sizes) + ref.packed.nbytes
        else:
            frames = 0 if ref.data is None else np.asarray(ref.data).nbytes
        offsets = (len(value.key) + 1) * (8 if _wide_offsets(value.offsets) else 4)
        footers = 0 if value.footers is None else 4 * len(value.key)
        return (1 + _PIECE_HEADER.size + 1 + len(ref.location.encode("utf-8")) + 6 * _count_runs(value.split)
                + 8 * len(value.key) + offsets + footers + frames)

    def decode(self, encoded: bytes) -> Piece:
        if encoded[:1] == _REGISTERED:
            run_size, location_size = _NAME_SIZES.unpack_from(encoded, 1)
            position = 1 + _NAME_SIZES.size
            run = bytes(encoded[position:position + run_size]).decode("utf-8")
            location = bytes(encoded[position + run_size:position + run_size + location_size]).decode("utf-8")
            return registered_piece(run, location)
        if encoded[:1] == _STUB:
            count, first, end, offset, location_size = _STUB_HEADER.unpack_from(encoded, 1)
            position = 1 + _STUB_HEADER.size
            location = bytes(encoded[position:position + location_size]).decode("utf-8")
            return Piece.stub(PieceRef(SPILL, location=location, offset=offset), count, first, end)
        count, size, offset, location_size, kind, wide, runs, has_footers = _PIECE_HEADER.unpack_from(encoded, 1)
        position = 1 + _PIECE_HEADER.size
        store = PIECE_STORES[encoded[position]]
        location = bytes(encoded[position + 1:position + 1 + location_size]).decode("utf-8")
        reader = _ArrayReader(encoded, position + 1 + location_size)
        split = np.repeat(reader.take("<u2", runs), reader.take("<u4", runs))
        key = reader.take("<u8", count)
        offsets = reader.take("<i8", count + 1) if wide else reader.take("<u4", count + 1).astype(np.int64)
        footers = reader.take("<u4", count) if has_footers else None
        if kind == _PACKED:
            blocks, skip, packed_size = _PACKED_HEADER.unpack_from(encoded, reader.position)
            reader.position += _PACKED_HEADER.size
            raw_sizes, stored_sizes, raw_crcs = (reader.take("<u4", blocks) for _ in range(3))
            packed = PackedFrames(reader.take("u1", size), stored_sizes, raw_sizes, raw_crcs, skip, packed_size)
            return Piece(split, key, offsets, PieceRef(store, None, location, offset, packed=packed), footers)
        data = reader.take("u1", size) if kind == _RAW else None
        return Piece(split, key, offsets, PieceRef(store, data, location, offset), footers)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return Piece


def _frames_kind(ref: PieceRef) -> int:
    return _PACKED if ref.packed is not None else _RAW if ref.data is not None else _NO_FRAMES


def _frames_and_tables(ref: PieceRef) -> tuple[np.ndarray | bytes, tuple[bytes | np.ndarray, ...]]:
    """The frame bytes an element carries, and what comes before them (a packed piece's block tables)."""
    if ref.packed is not None:
        packed = ref.packed
        header = _PACKED_HEADER.pack(len(packed.raw_sizes), packed.skip, packed.size)
        tables = (header, _raw(packed.raw_sizes, "<u4"), _raw(packed.stored_sizes, "<u4"), _raw(packed.raw_crcs, "<u4"))
        return _raw(packed.stored, "u1"), tables
    return (_raw(ref.data, "u1") if ref.data is not None else b""), ()


def _wide_offsets(offsets: np.ndarray) -> bool:
    """Whether a piece's frame offsets need 8 bytes (a piece past 4 GiB; pieces are cut at 32 MiB, so hardly ever)."""
    return bool(len(offsets)) and int(offsets[-1]) > 0xFFFFFFFF


def _count_runs(split: np.ndarray) -> int:
    """How many runs ``_split_runs`` gives, counted without building them (``estimate_size`` is called per element)."""
    return int(np.count_nonzero(split[1:] != split[:-1])) + 1 if len(split) else 0


def _split_runs(split: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A piece's split indices as runs (value, count): a piece is sorted by split, so 6 bytes a split, not 2 a record."""
    starts = np.flatnonzero(np.r_[True, split[1:] != split[:-1]]) if len(split) else np.zeros(0, np.int64)
    return np.asarray(split)[starts], np.diff(np.r_[starts, len(split)])


beam.coders.registry.register_coder(KeyedRecords, KeyedRecordsCoder)
beam.coders.registry.register_coder(Piece, PieceCoder)
