"""Columnar decoder: many serialized tf.train.Example records -> one Arrow RecordBatch.

The read hot path. Records are parsed many at once with numpy ("lockstep"): one cursor per
record, advanced one Features map entry per step, so the number of Python-level steps is the
largest feature count, not the number of records. Each step reads two 8-byte windows per record
(entry header and name; value header), feature names are grouped by exact short keys or
verified hashes, and values are then gathered per feature straight from the record bytes (packed
floats viewed as float32, varints decoded SWAR-style or vectorised, bytes cut by offsets). The
batch is walked in chunks of records small enough to stay in cache between steps.

Records in the canonical form our encoders and protobuf's deterministic serializer write take that
path. Anything else protobuf accepts (unpacked or mixed packed/unpacked lists, duplicate keys,
a Feature holding two kinds, unknown fields, Features split into chunks, non-minimal varints) is
parsed by an exact per-record walker that follows Python protobuf (upb) field by field, down to
its quirk of dropping a map entry that carries an unknown field. Both walkers only *locate*
values; the same vectorised decoders turn those locations into values, so the two paths give
identical results (float bit patterns included: a signalling NaN is kept, where a round trip
through Python floats would quiet it).

Rules (also in docs/format.md):
- Without a schema every feature becomes a list column of its kind (``list<int64>``,
  ``list<float32>``, ``list<binary>``), columns sorted by name, null where a record lacks the
  feature. A Feature with no kind set (an empty Feature) is an empty list; a feature that has no
  kind in every record of the batch becomes ``list<null>`` (empty lists and nulls). Two kinds
  for one feature across records -> ArrowConversionError naming the feature and the records.
- With a schema the batch has exactly that schema. Integer, bool and temporal fields take
  int64_list features, float fields float_list, binary/string (large, view, fixed-size) fields
  bytes_list, dictionary fields their value type's; a Feature with no kind counts as zero values
  of the field's kind. Scalar fields take exactly one value per
  record (zero values or an absent feature -> null if the field is nullable, else an error);
  list, large_list and fixed_size_list fields take lists (fixed_size_list checks the length).
  Integer narrowing out of range, bool values other than 0/1 and invalid UTF-8 for string
  fields are errors, never a silent wrap. Features not in the schema are skipped: their Feature
  framing is checked, their values are not decoded or inspected.
- Round trip: for a batch ``b`` the columnar encoder accepts,
  ``examples_to_record_batch(record_batch_to_examples(b), schema=b.schema)`` equals ``b``
  except that float64 values come back as the float32 the Example holds.
- Malformed bytes -> ExampleDecodeError naming the record index (within the batch), the byte
  offset in the record and what was wrong.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.codec.kinds import (
    BYTES,
    FLOAT,
    INT64,
    KIND_ARROW_TYPES,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT64,
    KIND_NAMES,
    KIND_NONE,
    WIRE_TAGS,
    is_bytes,
)
from tfrbeam.codec.wire import (
    PAD,
    RecordBuffer,
    both_ok,
    bytes_list_values,
    decode_bytes,
    decode_floats,
    decode_varints,
    exclusive_cumsum,
    gather,
    packed_payloads,
    ranges,
    read_lengths,
    take,
    unaligned_u64,
    words_at,
)
from tfrbeam.errors import ArrowConversionError, ExampleDecodeError, RecordLimitError

__all__ = ["examples_to_record_batch"]

_MAX_ERROR_RECORDS = 5
# Records walked and decoded together. The walk revisits every record once per map entry, so a
# chunk's bytes should stay in cache between steps; larger chunks cut numpy call overhead.
_CHUNK_RECORDS = 8192

_U64 = np.uint64
_LOW_BYTES_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)
_CONTINUATION_BITS = np.uint64(0x8080808080808080)
# Name key from an entry's first window: the name-length byte and up to 4 name bytes.
_HEAD_KEY_MASK = np.array([((1 << (8 * (k + 1))) - 1) << 24 for k in range(5)] + [0] * 251, dtype=np.uint64)
# Entry window bytes 0..3: tag 0x0a, 1-byte entry length, key tag 0x0a, 1-byte name length.
_HEAD_MASK, _HEAD_EXPECTED = np.uint64(0x80FF80FF), np.uint64(0x000A000A)
# Feature field tag -> kind (0x0a bytes_list, 0x12 float_list, 0x1a int64_list); -1 otherwise.
_KIND_OF_TAG = np.full(256, -1, dtype=np.int8)
_KIND_OF_TAG[[WIRE_TAGS[BYTES], WIRE_TAGS[FLOAT], WIRE_TAGS[INT64]]] = [KIND_BYTES, KIND_FLOAT, KIND_INT64]
# Expected continuation bits of a k-byte varint seen through an 8-byte window (k = 1..10).
_EXPECTED_CONTINUATION = np.array(
    [0] + [((1 << (8 * (k - 1))) - 1) & 0x8080808080808080 for k in range(1, 9)] + [0x8080808080808080] * 2,
    dtype=np.uint64,
)


# Features one record may have (None: no limit). Every feature is a column: an Arrow column with its
# field costs about 1 KiB and microseconds however few its bytes, so a record of a million tiny
# features would take gigabytes and minutes. Such a record is refused, by name, unless raised.
DEFAULT_MAX_FEATURES = 100_000


def examples_to_record_batch(
    records: Any, schema: pa.Schema | None = None, *, max_features: int | None = DEFAULT_MAX_FEATURES
) -> pa.RecordBatch:
    """Decode serialized tf.train.Example records into one Arrow RecordBatch, row i = record i.

    ``records`` is a sequence of bytes-like records, or one contiguous buffer plus ``n + 1``
    int64 offsets (record i = ``buffer[offsets[i]:offsets[i + 1]]``), given as an object with
    ``.data`` and ``.offsets`` (like the encoder's EncodedExamples) or a ``(buffer, offsets)``
    tuple, or a ``(buffer, starts, ends)`` tuple (record i = ``buffer[starts[i]:ends[i]]``, other
    bytes ignored: a block of ``tfrbeam.tfrecord.blocks``, read in place). Without ``schema`` the
    columns are inferred; with it the batch has exactly that schema. A record with more than
    ``max_features`` features raises ``RecordLimitError`` naming it (pass a larger limit, or None).
    """
    return _to_record_batch(records, schema, max_features=max_features)


def _to_record_batch(
    records: Any, schema: pa.Schema | None, exact_only: bool = False, max_features: int | None = DEFAULT_MAX_FEATURES
) -> pa.RecordBatch:
    """examples_to_record_batch; ``exact_only`` sends every record through the exact walker (tests)."""
    batch = RecordBuffer.from_input(records)
    if max_features is not None:
        _check_feature_counts(batch, max_features)
    targets = None if schema is None else _targets_for_schema(schema)
    wanted = None if targets is None else {target.feature for target in targets}
    features = _decode_features(batch, wanted, exact_only)
    if targets is None:
        return _inferred_batch(features, batch.num_records)
    arrays = [_build_column(target, features.get(target.feature), batch.num_records) for target in targets]
    return _record_batch(arrays, schema, batch.num_records)


def _record_batch(arrays: list[pa.Array], schema: pa.Schema, num_records: int) -> pa.RecordBatch:
    """A RecordBatch of ``num_records`` rows, even with no columns (from_arrays would give 0 rows)."""
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    no_columns = pa.Array.from_buffers(pa.struct([]), num_records, [None], children=[])
    return pa.RecordBatch.from_struct_array(no_columns).replace_schema_metadata(schema.metadata)


def _check_feature_counts(batch: RecordBuffer, limit: int) -> None:
    """Raise RecordLimitError for the first record with more than ``limit`` features.

    A map entry takes at least 2 bytes, so only records over ``2 * limit`` bytes are counted.
    """
    for index in np.flatnonzero(batch.ends - batch.starts > 2 * limit).tolist():
        count = _count_entries(batch.buf, int(batch.starts[index]), int(batch.ends[index]), limit)
        if count > limit:
            raise RecordLimitError(
                f"record {index} of the batch ({int(batch.ends[index] - batch.starts[index])} bytes) has more than "
                f"{limit} features (max_features={limit}): each feature becomes a column, which costs about 1 KiB "
                "and some microseconds however small it is. Pass a larger max_features (or None) to decode it anyway",
                record=index, limit=limit,
            )


def _count_entries(buf: np.ndarray, start: int, end: int, limit: int) -> int:
    """Features map entries of the Example at ``buf[start:end]``, counted up to ``limit + 1`` (malformed: as far as valid)."""
    data = buf[start:end].tobytes()
    count, pos, size = 0, 0, len(data)
    try:
        while pos < size:
            field, wire_type, pos = _tag(data, pos, size)
            if field != 1 or wire_type != 2:
                pos = _skip(data, pos, size, field, wire_type)
                continue
            inner, stop = _delimited(data, pos, size)
            pos = stop
            while inner < stop:
                entry_field, entry_type, inner = _tag(data, inner, stop)
                count += entry_field == 1 and entry_type == 2
                inner = _skip(data, inner, stop, entry_field, entry_type)
                if count > limit:
                    return count
    except _Malformed:
        pass  # the decoder reports it, with its offset
    return count


# --------------------------------------------------------------------------- decoded features


@dataclasses.dataclass
class _Piece:
    """Decoded values of one feature, for a set of records, all of one kind.

    ``rec`` lists the records holding the feature (ascending), ``counts`` their number of
    values (both int32 in the fast path: a batch holds far fewer than 2**31 records). ``values`` is int64 or float32 for those
    kinds; for bytes it holds each value's
    length and ``data`` the values' bytes back to back.
    """

    kind: int
    rec: np.ndarray
    counts: np.ndarray
    values: np.ndarray
    data: np.ndarray | None = None

    @classmethod
    def empty(cls, kind: int, rec: np.ndarray) -> _Piece:
        values = np.zeros(0, dtype=np.float32 if kind == KIND_FLOAT else np.int64)
        data = np.zeros(0, dtype=np.uint8) if kind == KIND_BYTES else None
        return cls(kind, rec, np.zeros(len(rec), dtype=np.int32), values, data)

    def keep(self, mask: np.ndarray) -> _Piece:
        """The records of this piece where ``mask`` (one flag per record of the piece) is set."""
        value_mask = np.repeat(mask, self.counts)
        data = None if self.data is None else self.data[np.repeat(value_mask, self.values)]
        return _Piece(self.kind, self.rec[mask], self.counts[mask], self.values[value_mask], data)

    def as_kind(self, kind: int) -> _Piece:
        """A piece of no kind (empty Features) seen as zero values of ``kind``."""
        return self if self.kind == kind else _Piece.empty(kind, self.rec)


def _concat_ordered(pieces: list[_Piece]) -> _Piece:
    """One piece from pieces of one kind whose records ascend from piece to piece."""
    if len(pieces) == 1:
        return pieces[0]
    kind = pieces[0].kind
    data = None if kind != KIND_BYTES else np.concatenate([p.data for p in pieces])
    rec, counts, values = (np.concatenate([getattr(p, f) for p in pieces]) for f in ("rec", "counts", "values"))
    return _Piece(kind, rec, counts, values, data)


def _concat_pieces(pieces: list[_Piece]) -> _Piece:
    """One piece from pieces of one kind over disjoint record sets, in record order."""
    if len(pieces) == 1:
        return pieces[0]
    merged = _concat_ordered(pieces)
    kind, rec, counts, values, data = merged.kind, merged.rec, merged.counts, merged.values, merged.data
    order = np.argsort(rec, kind="stable")
    if (order == np.arange(len(order))).all():
        return _Piece(kind, rec, counts, values, data)
    value_index = ranges(exclusive_cumsum(counts)[order], counts[order])
    values_sorted = values[value_index]
    if data is not None:
        data = data[ranges(exclusive_cumsum(values)[value_index], values_sorted)]
    return _Piece(kind, rec[order], counts[order], values_sorted, data)


# ------------------------------------------------------------------------------- value decoders


def _single_varints(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """(value, ok) per run, ok where the run is exactly one varint (1..10 bytes).

    The common scalar case: one 8-byte window per value instead of per-byte work (one byte per
    value when every run is one byte long: flags, small counts).
    """
    if (lengths == 1).all():
        first = buf[starts]
        return first.astype(np.int64), first < 0x80
    window = unaligned_u64(buf)[starts] & _LOW_BYTES_MASK[np.minimum(lengths, 8)]
    ok = (window & _CONTINUATION_BITS) == _EXPECTED_CONTINUATION[np.minimum(lengths, 10)]
    ok &= (lengths >= 1) & (lengths <= 10)
    # Squeeze out the continuation bits: 7-bit groups -> 14-bit -> 28-bit -> 56-bit lanes.
    values = window & _U64(0x7F7F7F7F7F7F7F7F)
    values = (values & _U64(0x007F007F007F007F)) | ((values & _U64(0x7F007F007F007F00)) >> _U64(1))
    values = (values & _U64(0x00003FFF00003FFF)) | ((values & _U64(0x3FFF00003FFF0000)) >> _U64(2))
    values = (values & _U64(0x000000000FFFFFFF)) | ((values & _U64(0x0FFFFFFF00000000)) >> _U64(4))
    long = np.flatnonzero((lengths > 8) & (lengths <= 10))
    if long.size:
        ten = lengths[long] == 10
        ninth = buf[starts[long] + 8].astype(np.uint64)
        tenth = np.where(ten, buf[starts[long] + 9], 0).astype(np.uint64)
        ok[long] &= ((ninth >= 0x80) == ten) & (tenth < 0x80)
        values[long] |= ((ninth & _U64(0x7F)) << _U64(56)) | (tenth << _U64(63))
    return values.view(np.int64), ok


# --------------------------------------------------------------------------- the lockstep walk


@dataclasses.dataclass
class _Entries:
    """Canonical map entries found by the walk for one feature (one per record holding it),
    in chunks: one per uniform step that met the feature, one for all the mixed steps."""

    chunks: list[tuple[np.ndarray, ...]] = dataclasses.field(default_factory=list)
    in_record_order: bool = True

    def columns(self) -> tuple[np.ndarray, ...]:
        """(record, kind, list start, list end, single-run payload length or -1), all chunks."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        return tuple(np.concatenate(parts) for parts in zip(*self.chunks))


@dataclasses.dataclass
class _StepEntries:
    """One map entry per active record, as located by one step of the walk."""

    ok: np.ndarray
    entry_end: np.ndarray
    name_start: np.ndarray
    name_len: np.ndarray
    kind: np.ndarray
    list_start: np.ndarray
    # Length of the list's only field-1 run when its header is 2 bytes (0x0a, length) and it
    # fills the list; -1 otherwise. Then the run starts at list_start + 2.
    single_len: np.ndarray

    @classmethod
    def located(cls, ok, entry_end, name_start, name_len, kind, empty, list_start, single_len) -> _StepEntries:
        """Entries as located; an empty Feature has no kind (its list start is never used)."""
        return cls(ok, entry_end, name_start, name_len, np.where(empty, KIND_NONE, kind).astype(np.int8),
                   list_start, single_len)

    def patch(self, where: np.ndarray, other: _StepEntries) -> None:
        for field in dataclasses.fields(self):
            getattr(self, field.name)[where] = getattr(other, field.name)

    def select(self, keep: np.ndarray | slice) -> _StepEntries:
        return _StepEntries(*(getattr(self, field.name)[keep] for field in dataclasses.fields(self)))

    @classmethod
    def concat(cls, parts: list[_StepEntries]) -> _StepEntries:
        return cls(*(np.concatenate([getattr(p, field.name) for p in parts]) for field in dataclasses.fields(cls)))


class _Walk:
    """Lockstep parse of every canonical record of a batch down to each feature's list message."""

    def __init__(self, batch: RecordBuffer, wanted: set[bytes] | None):
        self.batch = batch
        self.buf = batch.buf
        self.u64 = unaligned_u64(batch.buf)
        self.wanted = wanted
        self.fallback = np.zeros(batch.num_records, dtype=bool)
        self.names: list[bytes] = []
        self.by_name: dict[bytes, int] = {}
        self.invalid_names: set[bytes] = set()
        self.entries: dict[int, _Entries] = {}
        # Steps whose entries have several names (sparse or ragged records), grouped at the end.
        self.mixed: list[tuple[np.ndarray, np.ndarray, _StepEntries]] = []

    def run(self) -> None:
        rec, pos, end = self._features_spans()
        while rec.size:
            rec, pos, end = self._step(rec, pos, end)
        if self.mixed:
            rec, keys, found = (np.concatenate([m[0] for m in self.mixed]), np.concatenate([m[1] for m in self.mixed]),
                                _StepEntries.concat([m[2] for m in self.mixed]))
            self._file_by_key(rec, keys, found)

    def _features_spans(self):
        """Records whose Example is one canonical ``features`` field: (records, start, end)."""
        batch, buf = self.batch, self.buf
        rec = np.flatnonzero(batch.ends > batch.starts)
        start, end = batch.starts[rec], batch.ends[rec]
        length, pos, ok = read_lengths(buf, start + 1)
        ok = both_ok((take(buf, start) == 0x0A) & (pos + length == end), ok)
        if not ok.all():
            self.fallback[rec[~ok]] = True
            rec, pos, end = rec[ok], pos[ok], end[ok]
        more = pos < end
        # Positions fit int32 in any buffer under 2 GiB; int32 arithmetic is twice as fast.
        position_type = np.int32 if buf.size < 2**31 - 2 * PAD else np.int64
        return rec[more].astype(position_type), pos[more].astype(position_type), end[more].astype(position_type)

    def _step(self, rec, pos, fend):
        """Parse one map entry of every active record; returns the records with more entries."""
        head = self.u64[pos]
        found = self._entries_framed_alike(head, pos, fend)
        if found is not None:
            self._file_by_key(rec, None, found)
            return self._with_more(rec, found.entry_end, fend)
        found = self._entries_from_windows(head, pos, fend)
        slow = None
        if not found.ok.all():
            slow = np.flatnonzero(~found.ok)
            found.patch(slow, self._entries_generic(pos[slow], fend[slow]))
            if not found.ok.all():
                self.fallback[rec[~found.ok]] = True
                keep = found.ok
                rec, fend, head, found = rec[keep], fend[keep], head[keep], found.select(keep)
        if rec.size:
            if slow is None and (found.name_len <= 4).all():
                keys = head & _HEAD_KEY_MASK[found.name_len]  # exact: the length and name bytes
                uniform = bool((keys == keys[0]).all())
            else:
                keys = None
                uniform = self._all_named_as_first(found.name_start, found.name_len)
            if uniform:
                self._file_by_key(rec, None, found)
            else:
                keys = self._name_keys(found.name_start, found.name_len) if keys is None else keys
                self.mixed.append((rec, keys, found))
        return self._with_more(rec, found.entry_end, fend)

    @staticmethod
    def _with_more(rec, entry_end, fend):
        more = entry_end < fend
        if more.all():
            return rec, entry_end, fend
        return rec[more], entry_end[more], fend[more]

    def _entries_framed_alike(self, head: np.ndarray, pos: np.ndarray, fend: np.ndarray) -> _StepEntries | None:
        """Entries whose framing bytes are all those of the first: one name (up to 4 bytes) and one
        value size, as for a scalar float, a fixed-size float vector or a small int in every record.

        Then one comparison per window replaces the per-field checks, which are done once, on the
        first entry. None when the entries differ or are framed otherwise (the general path decides).
        """
        first = int(head[0]).to_bytes(8, "little")  # 0x0a, entry length, 0x0a, name length, name (<= 4 bytes)
        entry_len, name_len = first[1], first[3]
        if first[0] != 0x0A or first[2] != 0x0A or entry_len >= 0x80 or name_len > 4:
            return None
        if not (head == head[0]).all():  # names of 4 bytes or less lie wholly inside the window
            return None
        value_offset = 4 + name_len
        value = self.u64[pos + value_offset]  # 0x12, feature length, kind tag, list length, 0x0a, run length
        framing = int(value[0]) & 0xFFFFFFFFFFFF
        tag, feature_len, kind_tag, list_len, run_tag, run_len = framing.to_bytes(6, "little")
        kind = int(_KIND_OF_TAG[kind_tag])
        if not (tag == 0x12 and kind > 0 and run_tag == 0x0A and run_len < 0x80
                and list_len == run_len + 2 and feature_len == list_len + 2 and entry_len == value_offset + feature_len):
            return None
        if not ((value & _U64(0xFFFFFFFFFFFF)) == _U64(framing)).all():
            return None
        entry_end = pos + (2 + entry_len)
        if not (entry_end <= fend).all():
            return None
        count = len(pos)
        return _StepEntries(
            np.ones(count, dtype=bool), entry_end, pos + 4, np.full(count, name_len, dtype=pos.dtype),
            np.full(count, kind, dtype=np.int8), pos + (value_offset + 4), np.full(count, run_len, dtype=pos.dtype),
        )

    def _entries_from_windows(self, head: np.ndarray, pos: np.ndarray, fend: np.ndarray) -> _StepEntries:
        """Locate entries whose lengths are all 1-byte varints from two 8-byte windows each.

        Entries that do not fit (longer lengths, other tags) come out not ok; the generic reader
        looks at them again. Byte fields are read as strided views of the windows.
        """
        head_bytes = head.view(np.uint8).reshape(-1, 8)  # 0x0a, entry length, 0x0a, name length, name...
        entry_end = pos + head_bytes[:, 1]
        entry_end += 2
        name_len = head_bytes[:, 3].astype(pos.dtype)
        name_start = pos + 4
        value_pos = name_start + name_len
        value = self.u64[value_pos].view(np.uint8).reshape(-1, 8)  # 0x12, feature length, kind tag,
        feature_len = value[:, 1]  # list length, 0x0a, run length
        kind = _KIND_OF_TAG[value[:, 2]]
        list_start = value_pos + 4
        empty = feature_len == 0
        any_empty = bool(empty.any())  # empty Features are rare: skip their fix-ups when absent
        ok = (head & _HEAD_MASK) == _HEAD_EXPECTED
        ok &= value[:, 0] == 0x12
        ok &= entry_end <= fend
        ok &= value_pos + feature_len == entry_end - 2
        list_len = value[:, 3].astype(pos.dtype)
        list_ok = (kind > 0) & (list_start + list_len == entry_end)
        ok &= (empty | list_ok) if any_empty else list_ok
        # Where ok and not empty, the list fills the entry: one run iff 0x0a, run length + 2 == list length.
        run_len = value[:, 5].astype(pos.dtype)
        single = (value[:, 4] == 0x0A) & (run_len + 2 == list_len)
        if any_empty:
            single &= ~empty
            kind = np.where(empty, KIND_NONE, kind)
        return _StepEntries(ok, entry_end, name_start, name_len, kind, list_start, np.where(single, run_len, -1))

    def _entries_generic(self, pos: np.ndarray, fend: np.ndarray) -> _StepEntries:
        """Locate canonical entries with any length encodings, byte by byte (vectorised)."""
        buf = self.buf
        entry_len, key_tag_pos, ok1 = read_lengths(buf, pos + 1)
        entry_end = key_tag_pos + entry_len
        ok = (take(buf, pos) == 0x0A) & (entry_end <= fend) & (take(buf, key_tag_pos) == 0x0A)
        name_len, name_start, ok2 = read_lengths(buf, key_tag_pos + 1)
        value_tag_pos = name_start + name_len
        ok &= (value_tag_pos < entry_end) & (take(buf, value_tag_pos) == 0x12)
        feature_len, feature_start, ok3 = read_lengths(buf, value_tag_pos + 1)
        ok &= feature_start + feature_len == entry_end
        kind = _KIND_OF_TAG[take(buf, feature_start)]
        list_len, list_start, ok4 = read_lengths(buf, feature_start + 1)
        empty = feature_len == 0
        ok &= empty | ((kind > 0) & (list_start + list_len == entry_end) & (True if ok4 is None else ok4))
        ok = both_ok(both_ok(both_ok(ok, ok1), ok2), ok3)
        return _StepEntries.located(ok, entry_end, name_start, name_len, kind, empty, list_start,
                                    np.full(len(pos), -1, dtype=np.int64))

    def _file_by_key(self, rec: np.ndarray, keys: np.ndarray | None, found: _StepEntries) -> None:
        """Group entries by name key and file each group under its feature id (``keys`` None:
        all entries are known to have one name)."""
        if keys is None or (keys == keys[0]).all():
            groups, in_order = [(0, len(rec))], True
        else:
            order = np.argsort(keys, kind="stable")
            rec, keys, found = rec[order], keys[order], found.select(order)
            bounds = np.flatnonzero(keys[1:] != keys[:-1]) + 1
            groups, in_order = list(zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(keys)].tolist())), False
        collided = set() if keys is None else self._hash_collisions(keys, found, groups)
        for index, (lo, hi) in enumerate(groups):
            members = slice(lo, hi)
            if index in collided:
                self._file_exactly(rec[members], found.select(members))
                continue
            start = int(found.name_start[lo])
            name = self.buf[start : start + int(found.name_len[lo])].tobytes()
            self._file(name, rec[members], found.kind[members], found.list_start[members], found.entry_end[members],
                       found.single_len[members], in_order)

    def _hash_collisions(self, keys: np.ndarray, found: _StepEntries, groups: list[tuple[int, int]]) -> set[int]:
        """Groups (by index) of hashed long names whose members do not all share one name."""
        hashed = keys >= _U64(1 << 63)
        if not hashed.any():
            return set()
        lo = np.array([g[0] for g in groups])
        first = np.repeat(lo, [g[1] - g[0] for g in groups])  # each entry's group representative
        differs = hashed & ~self._names_equal(found.name_start, found.name_len, found.name_start[first], found.name_len[first])
        return set(np.unique(np.searchsorted(lo, np.flatnonzero(differs), side="right") - 1).tolist())

    def _file(self, name: bytes, rec, kind, list_start, list_end, single_len, in_order: bool = True) -> None:
        fid = self.by_name.get(name)
        if fid is None and (name in self.invalid_names or not _is_utf8(name)):
            self.invalid_names.add(name)
            self.fallback[rec] = True  # the exact walker reports the bad name with its offset
            return
        if fid is None:
            fid = self.by_name[name] = len(self.names)
            self.names.append(name)
        if self.wanted is None or name in self.wanted:
            entries = self.entries.setdefault(fid, _Entries())
            entries.chunks.append((rec, kind, list_start, list_end, single_len))
            entries.in_record_order &= in_order

    def _file_exactly(self, rec: np.ndarray, found: _StepEntries) -> None:
        """Group by the name bytes themselves (used only when two long names share a hash)."""
        by_name: dict[bytes, list[int]] = {}
        for i, (s, n) in enumerate(zip(found.name_start.tolist(), found.name_len.tolist())):
            by_name.setdefault(self.buf[s : s + n].tobytes(), []).append(i)
        for name, index in by_name.items():
            m = np.array(index, dtype=np.int64)
            self._file(name, rec[m], found.kind[m], found.list_start[m], found.entry_end[m], found.single_len[m], False)

    def _name_keys(self, name_start: np.ndarray, name_len: np.ndarray) -> np.ndarray:
        """A uint64 key per name: its length byte and bytes for names under 8 bytes, else a hash."""
        keys = self.u64[name_start - 1] & _LOW_BYTES_MASK[np.minimum(name_len + 1, 8)]
        if (name_len > 127).any():  # the length is a multi-byte varint: not its own first byte
            keys |= name_len.astype(np.uint64) << _U64(56)
        if (name_len >= 8).any():
            long = np.flatnonzero(name_len >= 8)
            keys[long] = self._hash_names(name_start[long], name_len[long]) | _U64(1 << 63)
        return keys

    def _hash_names(self, name_start: np.ndarray, name_len: np.ndarray) -> np.ndarray:
        digest = name_len.astype(np.uint64) * _U64(0x9E3779B97F4A7C15)
        for word in range(int(name_len.max() + 7) // 8):
            remaining = np.clip(name_len - 8 * word, 0, 8)
            chunk = words_at(self.u64, name_start + 8 * word) & _LOW_BYTES_MASK[remaining]
            digest = (digest ^ chunk) * _U64(0xFF51AFD7ED558CCD)
            digest ^= digest >> _U64(29)
        return digest

    def _all_named_as_first(self, name_start: np.ndarray, name_len: np.ndarray) -> bool:
        """Do all entries have the first entry's name (compared byte for byte, 8 at a time)?"""
        first_len = int(name_len[0])
        if not (name_len == first_len).all():
            return False
        for word in range((first_len + 7) // 8):
            words = self.u64[name_start + 8 * word] & _LOW_BYTES_MASK[min(first_len - 8 * word, 8)]
            if not (words == words[0]).all():
                return False
        return True

    def _names_equal(self, start_a: np.ndarray, len_a: np.ndarray, start_b: np.ndarray, len_b: np.ndarray) -> np.ndarray:
        """Per pair: are the names at (start_a, len_a) and (start_b, len_b) the same bytes?"""
        equal = len_a == len_b
        for word in range(int(len_a.max() + 7) // 8):
            mask = _LOW_BYTES_MASK[np.clip(len_a - 8 * word, 0, 8)]
            equal &= (words_at(self.u64, start_a + 8 * word) & mask) == (words_at(self.u64, start_b + 8 * word) & mask)
        return equal


def _is_utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ------------------------------------------------------------------ canonical entries -> values


def _fast_pieces(walk: _Walk) -> dict[int, list[_Piece]]:
    """Decode the values of every wanted feature found by the walk; non-canonical lists and
    duplicate keys send their records to the fallback instead.

    Features whose every list is one short run (scalars, short lists) are decoded together per
    kind, one vectorised call for all of them, which keeps wide sparse batches fast. Numeric runs
    are grouped by their length as well when it is the same in every record (float scalars,
    fixed-size vectors, 1-byte varints): runs of one length are gathered a word at a time and
    1-byte varints need no continuation-bit work; mixed lengths go byte by byte.
    """
    pieces: dict[int, list[_Piece]] = {}
    single_runs: dict[tuple[int, int], list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]] = {}
    for fid, entries in walk.entries.items():
        rec, kind, start, end, single_len = entries.columns()
        if len(entries.chunks) > 1 or not entries.in_record_order:
            rec, kind, start, end, single_len = _in_record_order(walk, rec, kind, start, end, single_len)
        kinds = kind[:1] if (kind == kind[0]).all() else np.unique(kind)
        for k in kinds.tolist():
            if len(kinds) == 1:
                parts = rec, start, end, single_len
            else:
                select = kind == k
                parts = rec[select], start[select], end[select], single_len[select]
            if k == KIND_NONE:
                pieces.setdefault(fid, []).append(_Piece.empty(KIND_NONE, parts[0]))
            elif (parts[3] >= 0).all():
                lengths = parts[3]
                width = int(lengths[0]) if k != KIND_BYTES and (lengths == lengths[0]).all() else -1
                single_runs.setdefault((k, width), []).append((fid, parts[0], parts[1] + 2, lengths))
            else:
                pieces.setdefault(fid, []).append(_decode_entries(walk, k, *parts[:3]))
    for (run_kind, _), runs in single_runs.items():
        for fid, piece in _decode_single_runs(walk, run_kind, runs):
            pieces.setdefault(fid, []).append(piece)
    return pieces


def _in_record_order(walk: _Walk, rec: np.ndarray, *columns: np.ndarray):
    """Sort a feature's entries by record; records holding the feature twice go to the fallback."""
    if len(rec) < 2 or (rec[1:] > rec[:-1]).all():
        return (rec,) + columns
    order = np.argsort(rec, kind="stable")
    rec = rec[order]
    walk.fallback[rec[1:][rec[1:] == rec[:-1]]] = True
    return (rec,) + tuple(column[order] for column in columns)


def _decode_entries(walk: _Walk, kind: int, rec, start, end) -> _Piece:
    """Values of one feature's canonical entries of one kind, any list layout."""
    buf = walk.buf
    if kind == KIND_BYTES:
        owner, value_start, value_len, bad = bytes_list_values(buf, start, end)
        walk.fallback[rec[bad]] = True
        counts, lengths, data = decode_bytes(buf, owner, value_start, value_len, len(rec))
        return _Piece(kind, rec, counts, lengths, data)
    payload_start, payload_len, ok = packed_payloads(buf, start, end)
    if kind == KIND_FLOAT:
        ok &= payload_len % 4 == 0
    if not ok.all():
        walk.fallback[rec[~ok]] = True  # non-canonical, or malformed: the exact walker decides
        payload_len = np.where(ok, payload_len, 0)
    owner = np.arange(len(rec), dtype=np.int64)
    if kind == KIND_FLOAT:
        counts, values = decode_floats(buf, owner, payload_start, payload_len, len(rec))
        return _Piece(kind, rec, counts, values)
    counts, values, bad = decode_varints(buf, owner, payload_start, payload_len, len(rec))
    walk.fallback[rec[bad]] = True
    return _Piece(kind, rec, counts, values)


def _decode_single_runs(walk: _Walk, kind: int, runs: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]):
    """(feature id, piece) for features whose lists are each one run: a bytes value, or a packed
    run of floats or varints. All features of the kind are decoded at once, then split."""
    buf = walk.buf
    sizes = [len(run[1]) for run in runs]
    if len(runs) > 1:
        rec, start, length = (np.concatenate([run[i] for run in runs]) for i in (1, 2, 3))
    else:
        _, rec, start, length = runs[0]
    if kind == KIND_BYTES:
        parts = zip(_split(rec, sizes), _split(length, sizes), _split(gather(buf, start, length), _part_sums(length, sizes)))
        return [(run[0], _Piece(kind, r, np.ones(len(r), dtype=np.int32), n, d)) for run, (r, n, d) in zip(runs, parts)]
    if kind == KIND_FLOAT:
        whole = length % 4 == 0
        if not whole.all():
            walk.fallback[rec[~whole]] = True  # malformed: the exact walker reports it
            length = np.where(whole, length, 0)
        counts = length // 4
        values = gather(buf, start, length).view("<f4")
        parts = zip(_split(rec, sizes), _split(counts, sizes), _split(values, _part_sums(counts, sizes)))
        return [(run[0], _Piece(kind, r, c, v)) for run, (r, c, v) in zip(runs, parts)]
    values, single = _single_varints(buf, start, length)
    nonempty = length > 0
    counts = nonempty.astype(np.int32)
    if not nonempty.all():
        values = values[nonempty]
    out = []
    varint_parts = zip(_split(rec, sizes), _split(counts, sizes), _split(values, _part_sums(counts, sizes)),
                       _split(single | ~nonempty, sizes))
    for run, (r, c, v, good) in zip(runs, varint_parts):
        # A run that is not one varint holds several (or is malformed): decode it the long way.
        piece = _Piece(kind, r, c, v) if good.all() else _decode_entries(walk, kind, r, run[2] - 2, run[2] + run[3])
        out.append((run[0], piece))
    return out


def _split(array: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Consecutive parts of ``array`` of the given sizes (views)."""
    if len(sizes) == 1:
        return [array]
    bounds = [0, *itertools.accumulate(sizes)]
    return [array[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


def _part_sums(values: np.ndarray, sizes: list[int]) -> list[int]:
    """Sum of ``values`` over each consecutive part of the given sizes."""
    if len(sizes) == 1:
        return [int(values.sum())]
    ends = np.cumsum(sizes)
    totals = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))[ends]
    return np.diff(totals, prepend=0).tolist()


# ------------------------------------------------------------------------ the exact walker


class _Malformed(Exception):
    """Raised inside the exact walker: (byte offset in the record, what was wrong)."""

    def __init__(self, offset: int, what: str):
        super().__init__(offset, what)
        self.offset = offset
        self.what = what


_GROUP_DEPTH_LIMIT = 100


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Malformed(start, "a varint runs past the end of its message")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(start, "a varint is longer than 10 bytes")


def _tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, next position), with protobuf's checks on the tag."""
    value, after = _varint(data, pos, end)
    if after - pos > 5 or value > 0xFFFFFFFF:
        raise _Malformed(pos, f"invalid field tag {value:#x}")
    if value >> 3 == 0:
        raise _Malformed(pos, "field number 0 is not allowed")
    return value >> 3, value & 7, after


def _delimited(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of a length-delimited field's contents whose length varint is at ``pos``."""
    length, start = _varint(data, pos, end)
    if length > end - start:
        raise _Malformed(pos, f"a length-delimited field of {length} bytes runs past the end of its message ({end - start} left)")
    return start, start + length


def _skip(data: bytes, pos: int, end: int, field: int, wire_type: int, depth: int = 0) -> int:
    """Skip an unknown field whose tag was just read; returns the position after it."""
    if wire_type == 0:
        return _varint(data, pos, end)[1]
    if wire_type == 1 or wire_type == 5:
        width = 8 if wire_type == 1 else 4
        if pos + width > end:
            raise _Malformed(pos, f"a fixed{width * 8} field runs past the end of its message")
        return pos + width
    if wire_type == 2:
        return _delimited(data, pos, end)[1]
    if wire_type == 3:
        if depth >= _GROUP_DEPTH_LIMIT:
            raise _Malformed(pos, "groups nested too deeply")
        while True:
            if pos >= end:
                raise _Malformed(pos, f"group {field} has no end-group tag")
            inner, inner_type, pos = _tag(data, pos, end)
            if inner_type == 4:
                if inner != field:
                    raise _Malformed(pos, f"end-group tag {inner} does not close group {field}")
                return pos
            pos = _skip(data, pos, end, inner, inner_type, depth + 1)
    if wire_type == 4:
        raise _Malformed(pos, f"end-group tag {field} without a group")
    raise _Malformed(pos, f"invalid wire type {wire_type}")


def _list_segments(data: bytes, kind: int, start: int, end: int) -> list[tuple[int, int]]:
    """Value byte runs of one BytesList/FloatList/Int64List message, by protobuf's rules.

    bytes: one run per value; float: runs of little-endian float32s; int64: runs of varints.
    """
    runs = []
    pos = start
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if field == 1 and wire_type == 2:
            value_start, pos = _delimited(data, pos, end)
            if kind == KIND_FLOAT and (pos - value_start) % 4:
                raise _Malformed(value_start, f"a packed float list of {pos - value_start} bytes (not a multiple of 4)")
            if kind == KIND_INT64:
                cursor = value_start
                while cursor < pos:
                    cursor = _varint(data, cursor, pos)[1]
            runs.append((value_start, pos))
        elif field == 1 and kind == KIND_FLOAT and wire_type == 5:
            if pos + 4 > end:
                raise _Malformed(pos, "a float value runs past the end of its list")
            runs.append((pos, pos + 4))
            pos += 4
        elif field == 1 and kind == KIND_INT64 and wire_type == 0:
            value_start = pos
            pos = _varint(data, pos, end)[1]
            runs.append((value_start, pos))
        else:
            pos = _skip(data, pos, end, field, wire_type)
    return runs


@dataclasses.dataclass
class _EntryState:
    """A Features map entry being parsed: its key, and the list messages of its Feature's kinds."""

    key: bytes = b""
    kind: int = KIND_NONE
    lists: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # (kind, start, end)
    first_current: int = 0  # lists[first_current:] are of the current kind (a oneof switch resets)
    has_unknown: bool = False


def _parse_feature_into(data: bytes, start: int, end: int, entry: _EntryState) -> None:
    """Merge one Feature message into the entry (a repeated value field merges, as protobuf does)."""
    pos = start
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if field in (KIND_BYTES, KIND_FLOAT, KIND_INT64) and wire_type == 2:
            list_start, pos = _delimited(data, pos, end)
            if field != entry.kind:
                entry.kind = field
                entry.first_current = len(entry.lists)
            entry.lists.append((field, list_start, pos))
        else:
            pos = _skip(data, pos, end, field, wire_type)


def _parse_entry(data: bytes, start: int, end: int) -> _EntryState:
    entry = _EntryState()
    pos = start
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if field == 1 and wire_type == 2:
            key_start, pos = _delimited(data, pos, end)
            entry.key = data[key_start:pos]
            if not _is_utf8(entry.key):
                raise _Malformed(key_start, f"feature name {entry.key!r} is not valid UTF-8")
        elif field == 2 and wire_type == 2:
            feature_start, pos = _delimited(data, pos, end)
            _parse_feature_into(data, feature_start, pos, entry)
        else:
            entry.has_unknown = True
            pos = _skip(data, pos, end, field, wire_type)
    return entry


def _walk_record(data: bytes, wanted: set[bytes] | None) -> dict[bytes, tuple[int, list[tuple[int, int]]]]:
    """Parse one Example exactly as Python protobuf (upb) does: {name: (kind, value runs)}.

    Like upb, a map entry carrying unknown fields is dropped (after being checked), a later
    entry for a key replaces an earlier one, and a repeated Feature merges (same kind: lists
    concatenate; another kind: the oneof switches). Value runs are only located (and checked)
    for wanted names.
    """
    features: dict[bytes, tuple[int, list[tuple[int, int]]]] = {}
    end = len(data)
    pos = 0
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if field == 1 and wire_type == 2:
            features_start, pos = _delimited(data, pos, end)
            _walk_features(data, features_start, pos, wanted, features)
        else:
            pos = _skip(data, pos, end, field, wire_type)
    return features


def _walk_features(data, start, end, wanted, features) -> None:
    pos = start
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if field == 1 and wire_type == 2:
            entry_start, pos = _delimited(data, pos, end)
            entry = _parse_entry(data, entry_start, pos)
            if wanted is not None and entry.key not in wanted:
                continue
            runs = [_list_segments(data, kind, s, e) for kind, s, e in entry.lists]
            if not entry.has_unknown:
                features[entry.key] = (entry.kind, [run for part in runs[entry.first_current :] for run in part])
        else:
            pos = _skip(data, pos, end, field, wire_type)


def _fallback_pieces(batch: RecordBuffer, records: np.ndarray, wanted: set[bytes] | None,
                     base: int) -> dict[bytes, list[_Piece]]:
    """Decode the given records with the exact walker; values go through the shared decoders.

    ``base`` is the batch index of the chunk's first record (error messages name batch indexes).
    """
    per_feature: dict[bytes, dict[int, tuple[list[int], list[int], list[int], list[int]]]] = {}
    for index in records.tolist():
        data = batch.record_bytes(index)
        try:
            features = _walk_record(data, wanted)
        except _Malformed as error:
            raise ExampleDecodeError(
                f"record {base + index}: malformed tf.train.Example at byte {error.offset} of {len(data)}: {error.what}"
            ) from None
        record_start = int(batch.starts[index])
        for name, (kind, runs) in features.items():
            rec, owner, starts, lengths = per_feature.setdefault(name, {}).setdefault(kind, ([], [], [], []))
            slot = len(rec)
            rec.append(index)
            for run_start, run_end in runs:
                owner.append(slot)
                starts.append(record_start + run_start)
                lengths.append(run_end - run_start)
    pieces: dict[bytes, list[_Piece]] = {}
    for name, by_kind in per_feature.items():
        pieces[name] = [_piece_from_runs(batch.buf, kind, *(np.array(x, dtype=np.int64) for x in lists))
                        for kind, lists in by_kind.items()]
    return pieces


def _piece_from_runs(buf, kind: int, rec, owner, starts, lengths) -> _Piece:
    if kind == KIND_NONE:
        return _Piece.empty(KIND_NONE, rec)
    if kind == KIND_BYTES:
        counts, value_lengths, data = decode_bytes(buf, owner, starts, lengths, len(rec))
        return _Piece(kind, rec, counts, value_lengths, data)
    if kind == KIND_FLOAT:
        counts, values = decode_floats(buf, owner, starts, lengths, len(rec))
        return _Piece(kind, rec, counts, values)
    counts, values, bad = decode_varints(buf, owner, starts, lengths, len(rec))
    assert not bad.size, "the exact walker checked every varint"
    return _Piece(kind, rec, counts, values)


# --------------------------------------------------------------------------- both paths together


@dataclasses.dataclass
class _Feature:
    """All decoded pieces of one feature over the batch (one piece per kind seen)."""

    name: str
    pieces: list[_Piece]

    def kinds(self) -> dict[int, np.ndarray]:
        return {piece.kind: piece.rec for piece in self.pieces}


def _decode_features(batch: RecordBuffer, wanted: set[bytes] | None, exact_only: bool = False) -> dict[bytes, _Feature]:
    """Decode the batch chunk by chunk; each feature's pieces are joined in record order."""
    by_name: dict[bytes, dict[int, list[_Piece]]] = {}
    for base in range(0, batch.num_records, _CHUNK_RECORDS):
        chunk = batch.chunk(base, base + _CHUNK_RECORDS)
        for name, pieces in _decode_chunk(chunk, wanted, exact_only, base).items():
            for piece in pieces:
                by_name.setdefault(name, {}).setdefault(piece.kind, []).append(piece)
    return {name: _Feature(name.decode("utf-8"), [_concat_ordered(group) for group in by_kind.values()])
            for name, by_kind in by_name.items()}


def _decode_chunk(batch: RecordBuffer, wanted: set[bytes] | None, exact_only: bool, base: int) -> dict[bytes, list[_Piece]]:
    """Walk and decode one chunk: fast path for canonical records, exact walker for the rest.

    Returns {name: pieces (one per kind)} with batch record indexes (chunk index + ``base``).
    """
    walk = _Walk(batch, wanted)
    if exact_only:
        walk.fallback[:] = True
    else:
        walk.run()
    fast = _fast_pieces(walk)
    by_name: dict[bytes, list[_Piece]] = {}
    fallback = np.flatnonzero(walk.fallback)
    keep = ~walk.fallback
    for fid, pieces in fast.items():
        kept = [piece.keep(keep[piece.rec]) for piece in pieces] if fallback.size else pieces
        by_name[walk.names[fid]] = [piece for piece in kept if len(piece.rec)]
    if fallback.size:
        for name, pieces in _fallback_pieces(batch, fallback, wanted, base).items():
            by_name.setdefault(name, []).extend(pieces)
    features: dict[bytes, list[_Piece]] = {}
    for name, pieces in by_name.items():
        merged: dict[int, list[_Piece]] = {}
        for piece in pieces:
            merged.setdefault(piece.kind, []).append(piece)
        features[name] = []
        for group in merged.values():
            piece = _concat_pieces(group)
            piece.rec = (piece.rec + base).astype(np.int32, copy=False)  # int32 halves what chunks copy
            features[name].append(piece)
    return features


# ------------------------------------------------------------------------ inferred columns


def _inferred_batch(features: dict[bytes, _Feature], num_records: int) -> pa.RecordBatch:
    arrays, fields = [], []
    for name in sorted(features):
        feature = features[name]
        kind = _single_kind(feature)
        if kind == KIND_NONE:
            piece = feature.pieces[0]
            array = _list_array(pa.list_(pa.null()), pa.nulls(0), piece.rec, piece.counts, num_records, feature.name)
        else:
            piece = _concat_pieces([p.as_kind(kind) for p in feature.pieces])
            child = _child_array(piece, KIND_ARROW_TYPES[kind], feature.name)
            array = _list_array(pa.list_(KIND_ARROW_TYPES[kind]), child, piece.rec, piece.counts, num_records, feature.name)
        arrays.append(array)
        fields.append(pa.field(feature.name, array.type))
    return _record_batch(arrays, pa.schema(fields), num_records)


def _single_kind(feature: _Feature) -> int:
    kinds = {kind: rec for kind, rec in feature.kinds().items() if kind != KIND_NONE}
    if len(kinds) > 1:
        detail = "; ".join(f"{KIND_NAMES[kind]} in records {_some(rec)}" for kind, rec in sorted(kinds.items()))
        raise ArrowConversionError(
            f"feature {feature.name!r} has conflicting kinds across records: {detail}. "
            "One column holds one kind; fix the data or decode the batches separately."
        )
    return next(iter(kinds), KIND_NONE)


def _some(rec: np.ndarray) -> str:
    shown = ", ".join(str(r) for r in rec[:_MAX_ERROR_RECORDS].tolist())
    return f"[{shown}{', ...' if len(rec) > _MAX_ERROR_RECORDS else ''}] ({len(rec)} records)"


# --------------------------------------------------------------------------- schema targets

_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**63 - 1),  # int64_list holds int64: larger uint64 values never occur
    pa.bool_(): (0, 1),
}
_NUMPY_TYPES: dict[pa.DataType, np.dtype] = {
    pa.int8(): np.dtype(np.int8),
    pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8),
    pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32),
    pa.uint64(): np.dtype(np.uint64),
    pa.bool_(): np.dtype(bool),
    pa.float16(): np.dtype(np.float16),
    pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}


@dataclasses.dataclass(frozen=True)
class _Target:
    """One schema field: which feature feeds it, the kind it takes and its list shape.

    ``decoded_type`` is the type built from the values (``field.type`` with dictionary, view and
    fixed_size_binary types replaced by their plain counterparts), converted at the end.
    """

    field: pa.Field
    feature: bytes
    kind: int
    element: pa.DataType
    shape: str  # "scalar", "list", "large_list" or "fixed_size_list"
    decoded_type: pa.DataType
    list_size: int = 0


def _targets_for_schema(schema: pa.Schema) -> list[_Target]:
    if not isinstance(schema, pa.Schema):
        raise TypeError(f"schema must be a pyarrow.Schema, not {type(schema).__name__}")
    if len(set(schema.names)) != len(schema.names):
        raise ArrowConversionError(f"schema has duplicate field names: {schema.names}")
    return [_target_for_field(field) for field in schema]


def _target_for_field(field: pa.Field) -> _Target:
    decoded = _decoded_type(field.type)
    kind_type, shape, size = decoded, "scalar", 0
    if pa.types.is_list(decoded) or pa.types.is_large_list(decoded) or pa.types.is_fixed_size_list(decoded):
        shape = "list" if pa.types.is_list(decoded) else "large_list" if pa.types.is_large_list(decoded) else "fixed_size_list"
        size = decoded.list_size if shape == "fixed_size_list" else 0
        kind_type = decoded.value_type
    kind = _kind_of_type(kind_type)
    if kind is None:
        raise ArrowConversionError(
            f"field {field.name!r} has type {field.type}, which no Example feature maps to. Supported: "
            "int8..int64, uint8..uint64, bool, date32/64, timestamp, time32/64, duration (int64_list); "
            "float16/32/64 (float_list); binary, string, their large_ and _view variants and "
            "fixed_size_binary (bytes_list); dictionaries of those; and list, large_list, "
            "fixed_size_list, list_view or large_list_view of those."
        )
    return _Target(field, field.name.encode("utf-8"), kind, kind_type, shape, decoded, size)


def _decoded_type(arrow_type: pa.DataType) -> pa.DataType:
    """The plain type built before converting to ``arrow_type`` (itself when already plain)."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        return _decoded_type(arrow_type.value_type)
    if types.is_string_view(arrow_type):
        return pa.string()
    if types.is_binary_view(arrow_type) or types.is_fixed_size_binary(arrow_type):
        return pa.binary()
    if types.is_list(arrow_type) or types.is_list_view(arrow_type):
        return pa.list_(_decoded_type(arrow_type.value_type))
    if types.is_large_list(arrow_type) or types.is_large_list_view(arrow_type):
        return pa.large_list(_decoded_type(arrow_type.value_type))
    if types.is_fixed_size_list(arrow_type):
        return pa.list_(_decoded_type(arrow_type.value_type), arrow_type.list_size)
    return arrow_type


def _convert_to(array: pa.Array, arrow_type: pa.DataType, name: str, slot_rec: np.ndarray | None = None) -> pa.Array:
    """Convert a built array to the schema's type (dictionary, view, fixed-size binary...).

    ``slot_rec`` gives the record of each slot (None: slot i is record i), for error messages.
    """
    types = pa.types
    if array.type == arrow_type:
        return array
    if types.is_dictionary(arrow_type):
        return pc.dictionary_encode(_convert_to(array, arrow_type.value_type, name, slot_rec)).cast(arrow_type)
    if types.is_fixed_size_binary(arrow_type):
        lengths = pc.binary_length(array).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(array.is_valid().to_numpy(zero_copy_only=False) & (lengths != arrow_type.byte_width))
        if wrong.size:
            first = int(wrong[0])
            record = first if slot_rec is None else int(slot_rec[first])
            raise ArrowConversionError(
                f"feature {name!r}, record {record}: a value of {int(lengths[first])} bytes, but field {name!r} "
                f"takes {arrow_type} ({arrow_type.byte_width} bytes each)"
            )
        return array.cast(arrow_type)
    if types.is_list(array.type) or types.is_large_list(array.type) or types.is_fixed_size_list(array.type):
        return _convert_list(array, arrow_type, name, slot_rec)
    return array.cast(arrow_type)


def _convert_list(array: pa.Array, arrow_type: pa.DataType, name: str, slot_rec: np.ndarray | None) -> pa.Array:
    records = np.arange(len(array)) if slot_rec is None else slot_rec
    if pa.types.is_fixed_size_list(array.type):
        counts = np.full(len(array), array.type.list_size)
        offsets = np.arange(len(array) + 1) * array.type.list_size
    else:
        offsets = np.asarray(array.offsets)
        counts = np.diff(offsets)
    child = _convert_to(array.values, arrow_type.value_type, name, np.repeat(records, counts))
    validity = array.buffers()[0]
    if pa.types.is_list_view(arrow_type) or pa.types.is_large_list_view(arrow_type):
        view = pa.ListViewArray if pa.types.is_list_view(arrow_type) else pa.LargeListViewArray
        offset_type = np.int32 if pa.types.is_list_view(arrow_type) else np.int64
        mask = array.is_null() if array.null_count else None
        return view.from_arrays(offsets[:-1].astype(offset_type), counts.astype(offset_type), child, mask=mask)
    buffers = [validity] if pa.types.is_fixed_size_list(arrow_type) else [validity, array.buffers()[1]]
    return pa.Array.from_buffers(arrow_type, len(array), buffers, children=[child])


def _kind_of_type(arrow_type: pa.DataType) -> int | None:
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type) or _is_temporal(arrow_type):
        return KIND_INT64
    if pa.types.is_floating(arrow_type):
        return KIND_FLOAT
    if is_bytes(arrow_type):
        return KIND_BYTES
    return None


def _is_temporal(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type) or pa.types.is_time(arrow_type)
            or pa.types.is_duration(arrow_type))


def _storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """The integer type whose values a temporal type stores (itself for the others)."""
    if not _is_temporal(arrow_type):
        return arrow_type
    return pa.int32() if arrow_type.bit_width == 32 else pa.int64()


def _build_column(target: _Target, feature: _Feature | None, num_records: int) -> pa.Array:
    name = target.field.name
    if feature is None:
        piece = _Piece.empty(target.kind, np.zeros(0, dtype=np.int64))
    else:
        _check_kinds(target, feature)
        piece = _concat_pieces([p.as_kind(target.kind) for p in feature.pieces])
    if target.shape == "scalar":
        array = _scalar_array(target, piece, num_records)
    else:
        if not target.field.nullable and len(piece.rec) < num_records:
            missing = np.setdiff1d(np.arange(num_records), piece.rec)
            raise ArrowConversionError(
                f"feature {name!r} is missing from records {_some(missing)}, but field {name!r} is not nullable"
            )
        child = _child_array(piece, target.element, name)
        if target.shape == "fixed_size_list":
            array = _fixed_size_list_array(target, piece, child, num_records)
        else:
            array = _list_array(target.decoded_type, child, piece.rec, piece.counts, num_records, name)
    return _convert_to(array, target.field.type, name)


def _check_kinds(target: _Target, feature: _Feature) -> None:
    for kind, rec in feature.kinds().items():
        if kind not in (KIND_NONE, target.kind):
            raise ArrowConversionError(
                f"feature {target.field.name!r} in record {int(rec[0])} is a {KIND_NAMES[kind]}, but schema "
                f"field {target.field.name!r} of type {target.field.type} takes a {KIND_NAMES[target.kind]} "
                f"(records with the mismatch: {_some(rec)})"
            )


def _scalar_array(target: _Target, piece: _Piece, num_records: int) -> pa.Array:
    name = target.field.name
    multi = np.flatnonzero(piece.counts > 1)
    if multi.size:
        first = multi[0]
        raise ArrowConversionError(
            f"feature {name!r} holds {int(piece.counts[first])} values in record {int(piece.rec[first])}, but field "
            f"{name!r} of type {target.field.type} takes exactly one value per record; use a list type "
            f"(pa.list_({target.field.type})) for multi-valued features"
        )
    has_value = np.zeros(num_records, dtype=bool)
    has_value[piece.rec[piece.counts == 1]] = True
    if not target.field.nullable and not has_value.all():
        missing = np.flatnonzero(~has_value)
        raise ArrowConversionError(
            f"feature {name!r} has no value in records {_some(missing)}, but field {name!r} "
            f"({target.field.type}) is not nullable"
        )
    value_rec = piece.rec[piece.counts == 1]
    validity = None if has_value.all() else _bitmap(has_value)
    if target.kind == KIND_BYTES:
        lengths = np.zeros(num_records, dtype=np.int64)
        lengths[value_rec] = piece.values
        assert piece.data is not None  # a bytes piece holds its values' bytes
        return _binary_array(target.element, lengths, piece.data, validity, name, np.arange(num_records))
    values = _convert_numbers(piece.values, target.element, name, value_rec)
    full = np.zeros(num_records, dtype=values.dtype)
    full[value_rec] = values
    return _numeric_array(target.element, full, validity)


class _ValueRecords:
    """The record of each value of a piece, worked out only when an error message needs one."""

    def __init__(self, piece: _Piece):
        self.piece = piece

    def __getitem__(self, index: int) -> int:
        return int(np.repeat(self.piece.rec, self.piece.counts)[index])


def _child_array(piece: _Piece, element: pa.DataType, name: str) -> pa.Array:
    """The flat values of a list column, converted to the element type."""
    value_rec = _ValueRecords(piece)
    if piece.kind == KIND_BYTES:
        assert piece.data is not None  # a bytes piece holds its values' bytes
        return _binary_array(element, piece.values, piece.data, None, name, value_rec)
    return _numeric_array(element, _convert_numbers(piece.values, element, name, value_rec), None)


def _list_array(list_type: pa.DataType, child: pa.Array, rec, counts, num_records: int, name: str) -> pa.Array:
    everywhere = len(rec) == num_records  # rec is ascending and unique: every record holds the feature
    if everywhere:
        full_counts = counts
    else:
        full_counts = np.zeros(num_records, dtype=np.int64)
        full_counts[rec] = counts
    offsets = np.zeros(num_records + 1, dtype=np.int64)
    np.cumsum(full_counts, out=offsets[1:])
    large = pa.types.is_large_list(list_type)
    if not large and offsets[-1] > 2**31 - 1:
        raise ArrowConversionError(
            f"feature {name!r} holds {int(offsets[-1])} values in one batch, more than a list column can "
            "(2**31 - 1); decode smaller batches or ask for a large_list field"
        )
    validity = None
    if not everywhere:
        present = np.zeros(num_records, dtype=bool)
        present[rec] = True
        validity = _bitmap(present)
    offsets_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    return pa.Array.from_buffers(list_type, num_records, [validity, offsets_buffer], children=[child])


def _fixed_size_list_array(target: _Target, piece: _Piece, child: pa.Array, num_records: int) -> pa.Array:
    size, name = target.list_size, target.field.name
    wrong = np.flatnonzero(piece.counts != size)
    if wrong.size:
        first = wrong[0]
        raise ArrowConversionError(
            f"feature {name!r} holds {int(piece.counts[first])} values in record {int(piece.rec[first])}, but field "
            f"{name!r} of type {target.field.type} takes exactly {size}"
        )
    if len(piece.rec) == num_records:
        # from_buffers, not from_arrays: from_arrays divides by the list size to count the rows (SIGFPE for size 0)
        return pa.Array.from_buffers(target.decoded_type, num_records, [None], children=[child])
    # Null slots still occupy `size` child values: spread the values over all rows.
    slot = (piece.rec[:, None] * size + np.arange(size)).reshape(-1)
    take = np.full(num_records * size, len(child), dtype=np.int64)
    take[slot] = np.arange(len(child))
    padded = pa.concat_arrays([child, _filler(target.element)]).take(pa.array(take))
    present = np.zeros(num_records, dtype=bool)
    present[piece.rec] = True
    return pa.Array.from_buffers(target.decoded_type, num_records, [_bitmap(present)], children=[padded])


def _filler(element: pa.DataType) -> pa.Array:
    """One placeholder value (zero or empty) to fill the child slots of null fixed-size lists."""
    if _kind_of_type(element) == KIND_BYTES:
        return pa.array([b""], type=pa.binary()).cast(element)
    return _numeric_array(element, np.zeros(1, dtype=_numpy_storage(element)), None)


def _numpy_storage(element: pa.DataType) -> np.dtype:
    return _NUMPY_TYPES[_storage_type(element)]


def _convert_numbers(values: np.ndarray, element: pa.DataType, name: str,
                     value_rec: np.ndarray | _ValueRecords) -> np.ndarray:
    """int64 or float32 values as numpy values of the element type; out-of-range ints are errors."""
    if values.dtype == np.float32:
        with np.errstate(over="ignore"):
            return values.astype(_NUMPY_TYPES[element], copy=False)
    storage = _storage_type(element)
    low, high = _INT_RANGES[storage]
    if (low, high) != (-(2**63), 2**63 - 1) and values.size:
        bad = np.flatnonzero((values < low) | (values > high))
        if bad.size:
            first = bad[0]
            raise ArrowConversionError(
                f"feature {name!r}, record {int(value_rec[first])}: value {int(values[first])} is out of range "
                f"for {element} ([{low}, {high}]); use a wider type in the schema"
            )
    return values.astype(_numpy_storage(element), copy=False)


def _numeric_array(element: pa.DataType, values: np.ndarray, validity: pa.Buffer | None) -> pa.Array:
    if pa.types.is_boolean(element):
        data = _bitmap(values.astype(bool))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values))
    return pa.Array.from_buffers(element, len(values), [validity, data])


def _binary_array(element: pa.DataType, lengths: np.ndarray, data: np.ndarray, validity, name: str,
                  slot_rec: np.ndarray | _ValueRecords) -> pa.Array:
    """A binary/string array from value lengths and bytes; string types check UTF-8.

    ``slot_rec`` gives the record of each slot, for the error message.
    """
    large = pa.types.is_large_binary(element) or pa.types.is_large_string(element)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not large and offsets[-1] > 2**31 - 1:
        raise ArrowConversionError(
            f"feature {name!r} holds {int(offsets[-1])} bytes of values in one batch, more than a binary column "
            "can (2**31 - 1); decode smaller batches or ask for large_binary / large_string"
        )
    binary_type = pa.large_binary() if large else pa.binary()
    offsets_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    array = pa.Array.from_buffers(binary_type, len(lengths), [validity, offsets_buffer, pa.py_buffer(data)])
    if not (pa.types.is_string(element) or pa.types.is_large_string(element)):
        return array
    try:
        return array.cast(element)
    except pa.ArrowInvalid:
        bad = next(i for i, value in enumerate(array.to_pylist()) if value is not None and not _is_utf8(value))
        raise ArrowConversionError(
            f"feature {name!r}, record {int(slot_rec[bad])}: value "
            f"{array[bad].as_py()[:40]!r} is not valid UTF-8, but field {name!r} is {element}; use binary"
        ) from None


def _bitmap(mask: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little"))
