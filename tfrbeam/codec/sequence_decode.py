"""Columnar decoder for tf.train.SequenceExample: many records -> a context batch and a feature-lists batch.

A SequenceExample is ``0a len(context Features)`` then ``12 len(FeatureLists)``; the context field
is byte for byte an Example, so the context spans go to the columnar Example decoder in place.
The FeatureLists are walked in lockstep with numpy (one cursor per message, one field per step:
map entries, then the steps of the lists asked for), so Python steps number the most entries or
steps of one list, not the records. Each step's Feature is then framed as a one-feature Example
(``0a len [0a len [0a 00 12 len Feature]]``, assembled for all steps at once) and decoded by the
same Example decoder, so steps follow exactly the rules (and errors) of Example features.

Records not in that canonical shape (a field repeated, an unknown field, a map entry without its
key, a duplicated list name, malformed bytes) are parsed by protobuf and re-encoded canonically
first (``encode_sequence_example``), which also gives malformed records protobuf's precise error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES, examples_to_record_batch
from tfrbeam.codec.encode import Spans, concatenate_parts, varint_sizes
from tfrbeam.codec.example import decode_sequence_example, encode_sequence_example
from tfrbeam.codec.kinds import ARROW_TYPES, FEATURE_TYPES, KIND_BYTES, KIND_FLOAT, KIND_OF_TYPE, WIRE_TAGS
from tfrbeam.codec.wire import (
    RecordBuffer,
    bytes_list_values,
    decode_bytes,
    decode_floats,
    decode_varints,
    exclusive_cumsum,
    gather,
    packed_payloads,
    read_lengths,
    take,
)
from tfrbeam.errors import ArrowConversionError, ExampleDecodeError

__all__ = ["has_feature_lists", "sequence_examples_to_record_batches"]

_CONTEXT_TAG, _LISTS_TAG = 0x0A, 0x12  # SequenceExample fields 1 and 2, length-delimited
_STEP_NAME = ""  # the one feature of each step's framed Example


def sequence_examples_to_record_batches(
    records: Any,
    context_schema: pa.Schema | None = None,
    sequence_schema: pa.Schema | None = None,
    *,
    max_features: int | None = DEFAULT_MAX_FEATURES,
) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """Decode serialized tf.train.SequenceExamples into ``(context batch, feature-lists batch)``, row i = record i.

    ``records`` is what ``examples_to_record_batch`` takes. The context batch is exactly that
    decoder's output for the records' context features (``context_schema`` as its schema). Each
    feature list is a ``list<step>`` column, null where a record lacks the list: with
    ``sequence_schema`` its fields are ``list`` / ``large_list`` of a step type, taken as an Example
    schema field takes a feature (scalar: exactly one value per step, ``fixed_size_list``, ``list``);
    without it every list found becomes ``list<list<kind>>``, columns sorted by name.
    """
    batch = RecordBuffer.from_input(records)
    layout = _Layout.of(batch, sequence_schema)
    if layout.odd.any():
        batch = _canonical(batch, np.flatnonzero(layout.odd))
        layout = _Layout.of(batch, sequence_schema)
        if layout.odd.any():  # re-encoded records are canonical: this would be a bug, never bad data
            raise ExampleDecodeError(f"record {int(np.flatnonzero(layout.odd)[0])} of the batch could not be walked")
    context = examples_to_record_batch((batch.buf, layout.context_starts, layout.context_ends), context_schema,
                                       max_features=max_features)
    return context, _lists_batch(batch, layout, sequence_schema)


def has_feature_lists(records: Any) -> np.ndarray:
    """Per record, whether it holds a top-level field 2 (length-delimited): a SequenceExample's feature_lists.

    A tf.train.Example has only field 1 (its features, the same bytes as a SequenceExample's
    context), so this is how a reader tells the two apart.
    """
    batch = RecordBuffer.from_input(records)
    fields, _ = _fields(batch.buf, batch.starts, batch.ends)
    found = np.zeros(batch.num_records, dtype=bool)
    found[fields.owner[fields.tag == _LISTS_TAG]] = True
    return found


# --------------------------------------------------------------------------- the lockstep walk


@dataclasses.dataclass(frozen=True)
class _Fields:
    """Length-delimited fields of a set of messages, message by message: owner (ascending), tag, spans."""

    owner: np.ndarray
    tag: np.ndarray
    start: np.ndarray  # the field's first byte (its tag)
    value_start: np.ndarray
    value_end: np.ndarray

    def select(self, keep: np.ndarray) -> _Fields:
        return _Fields(*(part[keep] for part in dataclasses.astuple(self)))


def _fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[_Fields, np.ndarray]:
    """Every field of the messages ``buf[starts[i]:ends[i]]``, and which messages are not walkable here.

    Walkable: one-byte tags of length-delimited fields (numbers 1 to 15) with lengths of at most
    4 varint bytes, each inside its message. One Python step per field of the longest message.
    """
    odd = np.zeros(len(starts), dtype=bool)
    owner = np.arange(len(starts), dtype=np.int64)
    pos, end = starts.astype(np.int64), ends.astype(np.int64)
    live = pos < end
    owner, pos, end = owner[live], pos[live], end[live]
    parts: list[tuple[np.ndarray, ...]] = []
    while owner.size:
        tag = take(buf, pos)
        length, after, ok = read_lengths(buf, pos + 1)
        value_end = after + length
        good = ((tag & 0x87) == 0x02) & (value_end <= end)
        if ok is not None:
            good &= ok
        if not good.all():
            odd[owner[~good]] = True
            owner, pos, end, tag, after, value_end = (part[good] for part in (owner, pos, end, tag, after, value_end))
        parts.append((owner, tag, pos, after, value_end))
        more = value_end < end
        owner, pos, end = owner[more], value_end[more], end[more]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return _Fields(empty, empty.astype(np.uint8), empty, empty, empty), odd
    joined = [np.concatenate(column) for column in zip(*parts)]
    order = np.argsort(joined[0], kind="stable")
    return _Fields(*(column[order] for column in joined)), odd


@dataclasses.dataclass(frozen=True)
class _Steps:
    """One feature list's steps over the batch: its records (ascending), their step counts, each step's Feature span."""

    records: np.ndarray
    counts: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where everything is: each record's context span, each wanted list's steps, the records to re-encode."""

    context_starts: np.ndarray
    context_ends: np.ndarray
    lists: dict[str, _Steps]
    odd: np.ndarray

    @classmethod
    def of(cls, batch: RecordBuffer, sequence_schema: pa.Schema | None) -> _Layout:
        """Walk the batch: the top-level fields, the FeatureLists' entries, the wanted lists' steps."""
        buf = batch.buf
        top, odd = _fields(buf, batch.starts, batch.ends)
        odd |= _not_canonical_top(top, batch.num_records)
        context = top.select(top.tag == _CONTEXT_TAG)
        context_starts, context_ends = batch.starts.copy(), batch.starts.copy()  # no context field: an empty Example
        context_starts[context.owner], context_ends[context.owner] = context.start, context.value_end
        entries = _Entries.of(buf, top.select(top.tag == _LISTS_TAG), odd)
        wanted = list(entries.names) if sequence_schema is None else list(sequence_schema.names)
        lists = {name: entries.steps(buf, entries.named(name), odd) for name in wanted}
        return cls(context_starts, context_ends, lists, odd)


@dataclasses.dataclass(frozen=True)
class _Entries:
    """The FeatureLists map entries of a batch: each one's record, name (index into ``names``) and value span."""

    records: np.ndarray
    names: list[str]
    name_index: np.ndarray
    values: _Fields

    @classmethod
    def of(cls, buf: np.ndarray, lists_fields: _Fields, odd: np.ndarray) -> _Entries:
        """The entries of the records' feature_lists fields; marks in ``odd`` the records not walkable here."""
        entries, entries_odd = _fields(buf, lists_fields.value_start, lists_fields.value_end)
        odd[lists_fields.owner[entries_odd]] = True
        odd[lists_fields.owner[entries.owner[entries.tag != 0x0A]]] = True
        records = lists_fields.owner[entries.owner]
        parts, parts_odd = _fields(buf, entries.value_start, entries.value_end)
        odd[records[parts_odd]] = True
        keys, values, bad_entries = _key_and_value(parts, len(entries.owner))
        odd[records[bad_entries]] = True
        names, name_index, bad_names = _entry_names(buf, keys)
        odd[records[bad_names]] = True
        odd[_duplicated(records, name_index, len(names))] = True
        return cls(records, names, name_index, values)

    def named(self, name: str) -> np.ndarray:
        """The entries of list ``name``, in record order."""
        if name not in self.names:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.name_index == self.names.index(name))

    def steps(self, buf: np.ndarray, chosen: np.ndarray, odd: np.ndarray) -> _Steps:
        """The steps of entries ``chosen``; marks in ``odd`` the records whose lists are not walkable here."""
        steps, steps_odd = _steps_of(buf, self.values.value_start[chosen], self.values.value_end[chosen])
        odd[self.records[chosen[steps_odd]]] = True
        odd[self.records[chosen[steps.owner[steps.tag != 0x0A]]]] = True
        counts = np.bincount(steps.owner, minlength=len(chosen)).astype(np.int64)
        return _Steps(self.records[chosen], counts, steps.value_start, steps.value_end)


def _steps_of(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[_Fields, np.ndarray]:
    """The steps (fields) of FeatureList bodies: lists whose steps all have their first step's size are
    cut at once (float scalars, fixed-size steps); the others are walked in lockstep."""
    length, after, ok = read_lengths(buf, starts + 1)
    size = after + length - starts
    nonempty = ends > starts
    if ok is not None:
        nonempty &= ok
    candidates = np.flatnonzero(nonempty & (take(buf, starts) == 0x0A) & (size > 0)
                                & ((ends - starts) % np.maximum(size, 1) == 0))
    count = (ends[candidates] - starts[candidates]) // size[candidates]
    owner = np.repeat(candidates, count)
    step_number = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(exclusive_cumsum(count), count)
    position = starts[owner] + step_number * size[owner]
    step_length, step_after, step_ok = read_lengths(buf, position + 1)
    fits = (take(buf, position) == 0x0A) & (step_after + step_length == position + size[owner])
    if step_ok is not None:
        fits &= step_ok
    uniform = np.zeros(len(starts), dtype=bool)
    uniform[candidates] = True
    uniform[owner[~fits]] = False
    walked = np.flatnonzero(~uniform & (ends > starts))
    rest, odd_rest = _fields(buf, starts[walked], ends[walked])
    odd = np.zeros(len(starts), dtype=bool)
    odd[walked[odd_rest]] = True
    keep = uniform[owner]
    if not keep.all():
        owner, position, step_after, step_length = owner[keep], position[keep], step_after[keep], step_length[keep]
    cut = _Fields(owner, np.full(len(owner), 0x0A, dtype=np.uint8), position, step_after, step_after + step_length)
    rest = dataclasses.replace(rest, owner=walked[rest.owner])
    if not rest.owner.size or not cut.owner.size:  # one of them: already in owner order
        return (cut if cut.owner.size else rest), odd
    both = [np.concatenate(parts) for parts in zip(dataclasses.astuple(cut), dataclasses.astuple(rest))]
    order = np.argsort(both[0], kind="stable")
    return _Fields(*(part[order] for part in both)), odd


def _not_canonical_top(top: _Fields, count: int) -> np.ndarray:
    """Records whose fields are not: the context (at most once), then the feature lists (at most once)."""
    contexts = np.bincount(top.owner[top.tag == _CONTEXT_TAG], minlength=count)
    lists = np.bincount(top.owner[top.tag == _LISTS_TAG], minlength=count)
    others = np.bincount(top.owner[(top.tag != _CONTEXT_TAG) & (top.tag != _LISTS_TAG)], minlength=count)
    odd = (contexts > 1) | (lists > 1) | (others > 0)
    first_tag = np.zeros(count, dtype=np.int64)
    is_first = np.ones(top.owner.size, dtype=bool)
    is_first[1:] = top.owner[1:] != top.owner[:-1]
    first_tag[top.owner[is_first]] = top.tag[is_first]
    return odd | ((contexts == 1) & (lists == 1) & (first_tag != _CONTEXT_TAG))


def _key_and_value(parts: _Fields, entries: int) -> tuple[_Fields, _Fields, np.ndarray]:
    """Each map entry's key (field 1) and value (field 2), and the entries not exactly key then value."""
    per_entry = np.bincount(parts.owner, minlength=entries)
    first = exclusive_cumsum(per_entry)
    bad = per_entry != 2
    two = np.flatnonzero(~bad)
    key_at, value_at = first[two], first[two] + 1
    bad[two[(parts.tag[key_at] != 0x0A) | (parts.tag[value_at] != 0x12)]] = True
    keys = np.zeros(entries, dtype=np.int64)
    values = np.zeros(entries, dtype=np.int64)
    good = np.flatnonzero(~bad)
    keys[good], values[good] = first[good], first[good] + 1
    if parts.owner.size == 0:
        empty = np.zeros(entries, dtype=np.int64)
        nothing = _Fields(empty, empty.astype(np.uint8), empty, empty, empty)
        return nothing, nothing, bad
    keys[bad], values[bad] = 0, 0  # placeholders: bad entries send their record to re-encoding
    return parts.select(keys), parts.select(values), bad


def _entry_names(buf: np.ndarray, keys: _Fields) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The distinct list names, each entry's index among them, and entries whose name is not UTF-8."""
    lengths = keys.value_end - keys.value_start
    data = gather(buf, keys.value_start, lengths)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    array = pa.Array.from_buffers(pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    encoded = array.dictionary_encode()
    index = np.asarray(encoded.indices, dtype=np.int64)
    names, bad_name = [], []
    for key in encoded.dictionary.to_pylist():
        try:
            names.append(key.decode("utf-8"))
            bad_name.append(False)
        except UnicodeDecodeError:
            names.append("")
            bad_name.append(True)
    bad = np.asarray(bad_name, dtype=bool)[index] if len(names) else np.zeros(0, dtype=bool)
    return names, index, bad


def _duplicated(records: np.ndarray, names: np.ndarray, distinct: int) -> np.ndarray:
    """Records holding one list name twice (protobuf keeps the last; re-encoding does that)."""
    order = np.sort(records * max(distinct, 1) + names)
    repeated = order[1:][order[1:] == order[:-1]]
    return np.unique(repeated // max(distinct, 1))


def _canonical(batch: RecordBuffer, odd: np.ndarray) -> RecordBuffer:
    """The batch with records ``odd`` replaced by their canonical encoding (protobuf's reading of them)."""
    encoded = []
    for index in odd.tolist():
        try:
            context, lists = decode_sequence_example(batch.record_bytes(index), kinds=True)
        except ExampleDecodeError as exc:
            raise ExampleDecodeError(f"record {index} of the batch: {exc}") from exc
        encoded.append(encode_sequence_example(
            {name: values for name, (_, values) in context.items()},
            {name: [values for _, values in steps] for name, steps in lists.items()},
            kinds={name: kind for name, (kind, _) in context.items()},
            feature_list_kinds={name: [kind for kind, _ in steps] for name, steps in lists.items()},
        ))
    end = int(batch.ends.max()) if batch.num_records else 0
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    buf = np.concatenate([batch.buf[:end], np.frombuffer(b"".join(encoded), dtype=np.uint8),
                          np.zeros(batch.buf.size - end, dtype=np.uint8)])
    starts, ends = batch.starts.copy(), batch.ends.copy()
    starts[odd] = end + exclusive_cumsum(lengths)
    ends[odd] = starts[odd] + lengths
    return RecordBuffer(buf, starts, ends)


# --------------------------------------------------------------------------- the steps' values


def _lists_batch(batch: RecordBuffer, layout: _Layout, schema: pa.Schema | None) -> pa.RecordBatch:
    count = batch.num_records
    names = sorted(layout.lists) if schema is None else list(schema.names)
    arrays, fields = [], []
    for name in names:
        field = None if schema is None else schema.field(name)
        steps = layout.lists[name]
        values = _step_values(batch.buf, steps, name, None if field is None else _step_type(field))
        array = _list_column(steps, values, count, name, field)
        arrays.append(array)
        fields.append(field if field is not None else pa.field(name, array.type))
    if not arrays:
        no_columns = pa.Array.from_buffers(pa.struct([]), count, [None], children=[])
        return pa.RecordBatch.from_struct_array(no_columns)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _step_type(field: pa.Field) -> pa.DataType:
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        return field.type.value_type
    raise ArrowConversionError(
        f"sequence schema field {field.name!r} has type {field.type}; a feature list is a list (or large_list) "
        "of its step type, e.g. pa.list_(pa.float32()) for one float per step"
    )


def _step_values(buf: np.ndarray, steps: _Steps, name: str, step_type: pa.DataType | None) -> pa.Array:
    """Every step's values, steps of all records back to back; errors name the record and the step."""
    try:
        return _decode_steps(buf, steps.starts, steps.ends, step_type)
    except (ArrowConversionError, ExampleDecodeError) as exc:
        raise _step_error(buf, steps, name, step_type, exc) from exc


def _decode_steps(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, step_type: pa.DataType | None) -> pa.Array:
    """The Features at ``buf[starts[i]:ends[i]]``: read directly when canonical and of a plain step type,
    else each framed as a one-feature Example and decoded as one (which also words every error)."""
    direct = None if step_type is None else _plain_steps(buf, starts, ends, step_type)
    return direct if direct is not None else _framed_steps(buf, starts, ends, step_type)


# Step types read directly: their values' type, list shape, and the Feature tag of their kind.
_PLAIN_KINDS = {ARROW_TYPES[name]: (KIND_OF_TYPE[name], WIRE_TAGS[name]) for name in FEATURE_TYPES}


def _plain_steps(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, step_type: pa.DataType) -> pa.Array | None:
    """Steps of an int64 / float32 / binary scalar, fixed_size_list or list type, when every step's Feature is
    canonical and fits; None otherwise (the framed path then decodes them, or says what is wrong)."""
    element = step_type.value_type if pa.types.is_list(step_type) or pa.types.is_fixed_size_list(step_type) else step_type
    if element not in _PLAIN_KINDS:
        return None
    kind, tag = _PLAIN_KINDS[element]
    count = len(starts)
    length, body_start, ok = read_lengths(buf, starts + 1)
    empty = starts == ends  # a Feature with no kind: no values
    good = empty | ((take(buf, starts) == tag) & (body_start + length == ends))
    if ok is not None:
        good &= empty | ok
    if not good.all():
        return None
    body_start, body_end = np.where(empty, ends, body_start), ends
    owner = np.arange(count, dtype=np.int64)
    if kind == KIND_BYTES:
        value_owner, value_start, value_length, bad = bytes_list_values(buf, body_start, body_end)
        if bad.size:
            return None
        counts, lengths, data = decode_bytes(buf, value_owner, value_start, value_length, count)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] > 2**31 - 1:
            return None
        values = pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                  pa.py_buffer(data)])
    else:
        payload_start, payload_length, packed = packed_payloads(buf, body_start, body_end)
        if not packed.all() or (kind == KIND_FLOAT and (payload_length % 4).any()):
            return None
        if kind == KIND_FLOAT:
            counts, numbers = decode_floats(buf, owner, payload_start, payload_length, count)
        else:
            counts, numbers, bad = decode_varints(buf, owner, payload_start, payload_length, count)
            if bad.size:
                return None
        values = pa.Array.from_buffers(element, len(numbers), [None, pa.py_buffer(np.ascontiguousarray(numbers))])
    return _shaped(values, counts, step_type)


def _shaped(values: pa.Array, counts: np.ndarray, step_type: pa.DataType) -> pa.Array | None:
    """Each step's values as the step type: one value, a fixed-size list or a list (None when they do not fit)."""
    if pa.types.is_fixed_size_list(step_type):
        if (counts != step_type.list_size).any():
            return None
        # from_buffers, not from_arrays: from_arrays divides by the list size to count the rows, and it may be 0
        return pa.Array.from_buffers(step_type, len(counts), [None], children=[values])
    if pa.types.is_list(step_type):
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if offsets[-1] > 2**31 - 1:
            return None
        return pa.Array.from_buffers(step_type, len(counts), [None, pa.py_buffer(offsets.astype(np.int32))], children=[values])
    return values if (counts == 1).all() else None


def _framed_steps(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, step_type: pa.DataType | None) -> pa.Array:
    """The steps framed as one-feature Examples and decoded by the Example decoder."""
    lengths = ends - starts
    entry = 3 + varint_sizes(lengths) + lengths  # 0a 00 (the empty name), 12 len, the Feature
    body = 1 + varint_sizes(entry) + entry
    framed = concatenate_parts(len(lengths), [b"\x0a", body, b"\x0a", entry, b"\x0a\x00\x12", lengths,
                                              Spans(buf, starts, lengths)])
    schema = None if step_type is None else pa.schema([pa.field(_STEP_NAME, step_type, nullable=False)])
    decoded = examples_to_record_batch(framed, schema, max_features=None)
    if decoded.num_columns:
        return decoded.column(0)
    return pa.array([[]] * len(lengths), pa.list_(pa.null()))


def _step_error(buf: np.ndarray, steps: _Steps, name: str, step_type: pa.DataType | None, error: Exception) -> Exception:
    """The error of the first record whose steps fail on their own, in terms of records and steps."""
    first = exclusive_cumsum(steps.counts)
    for record, start, count in zip(steps.records.tolist(), first.tolist(), steps.counts.tolist()):
        try:
            _decode_steps(buf, steps.starts[start:start + count], steps.ends[start:start + count], step_type)
        except (ArrowConversionError, ExampleDecodeError) as single:
            message = str(single)
            for ours, theirs in (("feature ''", f"feature list {name!r}"), ("field '' of type", "the step type"),
                                 ("field ''", "the step type"),
                                 ("records [", "steps ["), (" records)", " steps)"), ("record ", "step "),
                                 ("per record", "per step")):
                message = message.replace(ours, theirs)
            return type(single)(f"record {record} of the batch: {message}")
    return type(error)(f"feature list {name!r}: {error}")


def _list_column(steps: _Steps, values: pa.Array, count: int, name: str, field: pa.Field | None) -> pa.Array:
    """The list<step> column: each record's steps, null where the record lacks the list."""
    full = np.zeros(count, dtype=np.int64)
    full[steps.records] = steps.counts
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(full, out=offsets[1:])
    present = np.zeros(count, dtype=bool)
    present[steps.records] = True
    if field is not None and not field.nullable and not present.all():
        missing = np.flatnonzero(~present)[:5].tolist()
        raise ArrowConversionError(f"feature list {name!r} is missing from records {missing}, but field {name!r} "
                                   "is not nullable")
    large = field is not None and pa.types.is_large_list(field.type)
    if not large and offsets[-1] > 2**31 - 1:
        raise ArrowConversionError(f"feature list {name!r} holds {int(offsets[-1])} steps in one batch; decode "
                                   "smaller batches or ask for a large_list field")
    list_type = (pa.large_list if large else pa.list_)(values.type)
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    offset_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    return pa.Array.from_buffers(list_type, count, [validity, offset_buffer], children=[values])
