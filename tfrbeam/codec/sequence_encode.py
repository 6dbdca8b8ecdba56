"""Columnar fast path for tf.train.SequenceExample: groups of table rows become one record each.

A group's context is its first row encoded as an Example (an Example's field 1 is byte for byte
a SequenceExample's context field), and each feature-list column is encoded one FeatureList step
per row, so a group's FeatureList body is one contiguous run of its rows' steps. The record is
then the context, the FeatureLists header and, per list, an entry header plus that run, put
together for all groups at once by the columnar Example encoder's assembler. The bytes equal
``encode_sequence_example`` on the same values (names in UTF-8 byte order, both fields written).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from tfrbeam.codec.encode import (
    EncodedExamples,
    Spans,
    concatenate_parts,
    encode_feature_list_steps,
    encode_record_batch,
    varint_sizes,
)
from tfrbeam.codec.example import encode_varint
from tfrbeam.errors import ArrowConversionError

__all__ = ["encode_sequence_batch", "encode_sequence_chunks"]

# Rows (steps) encoded together; a chunk holds whole groups, so a bigger group is one chunk.
_ROWS_PER_CHUNK = 65536


def encode_sequence_batch(
    table: pa.Table | pa.RecordBatch,
    group_offsets: np.ndarray,
    context: Sequence[str],
    feature_lists: Sequence[str],
) -> EncodedExamples:
    """One SequenceExample per group of rows ``group_offsets[g] .. group_offsets[g + 1]``, in group order.

    ``context`` columns come from each group's first row (a null there: the feature is absent);
    ``feature_lists`` columns give one step per row (a null: an empty list of the column's
    kind). Rows must already be in step order; other columns are ignored.
    """
    datas: list[np.ndarray] = []
    record_offsets: list[np.ndarray] = [np.zeros(1, np.int64)]
    written = 0
    for encoded in encode_sequence_chunks(table, group_offsets, context, feature_lists):
        datas.append(encoded.data)
        record_offsets.append(encoded.offsets[1:] + written)
        written += len(encoded.data)
    data = datas[0] if len(datas) == 1 else np.concatenate(datas) if datas else np.zeros(0, np.uint8)
    return EncodedExamples(data=data, offsets=np.concatenate(record_offsets))


def encode_sequence_chunks(
    table: pa.Table | pa.RecordBatch,
    group_offsets: np.ndarray,
    context: Sequence[str],
    feature_lists: Sequence[str],
    rows: np.ndarray | None = None,
) -> Iterator[EncodedExamples]:
    """``encode_sequence_batch``'s SequenceExamples as consecutive runs of whole groups, each in a buffer of its own.

    A run holds about _ROWS_PER_CHUNK steps (a bigger group is a run of its own); together, in
    order, the runs are ``encode_sequence_batch``'s records, without the copy that joins them.
    ``rows`` (optional) gives the steps' order: step ``i`` is row ``rows[i]`` of ``table`` and
    ``group_offsets`` bound steps; the rows are taken one run at a time, so no sorted copy of the
    whole table is made. Without it the steps are the table's rows in order. Row numbers in errors
    are step numbers.
    """
    steps = table.num_rows if rows is None else len(rows)
    offsets = _checked_offsets(group_offsets, steps, "the table's" if rows is None else "the given rows'")
    _check_names(table, context, feature_lists)
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= table.num_rows):
            raise ArrowConversionError(f"rows must be row numbers of the table's {table.num_rows} rows, got "
                                       f"{int(rows.min())} .. {int(rows.max())}")
    first_rows = offsets[:-1] if rows is None else rows[offsets[:-1]]
    context_records = encode_record_batch(_taken(table, context, first_rows)) if context else None
    names = sorted(feature_lists, key=lambda name: name.encode("utf-8"))
    chunks = list(_group_chunks(offsets))
    if not chunks:  # no groups
        return
    if rows is None:
        for first, last in chunks:
            low, high = int(offsets[first]), int(offsets[last])
            columns = {name: table.column(name).slice(low, high - low) for name in names}
            yield _encode_groups(offsets[first : last + 1], _context_part(context_records, first, last), columns)
        return
    # The next run's rows are taken (pyarrow, without the GIL) on a thread while this one is encoded.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrbeam-sequence-take") as taker:
        def take(chunk: tuple[int, int]) -> concurrent.futures.Future:
            return taker.submit(_taken, table, names, rows[int(offsets[chunk[0]]):int(offsets[chunk[1]])])

        upcoming = take(chunks[0])
        for index, (first, last) in enumerate(chunks):
            taken = upcoming.result()
            if index + 1 < len(chunks):
                upcoming = take(chunks[index + 1])
            columns = {name: taken.column(name) for name in names}
            yield _encode_groups(offsets[first : last + 1], _context_part(context_records, first, last), columns)


def _checked_offsets(group_offsets: np.ndarray, num_rows: int, whose: str) -> np.ndarray:
    """The offsets as int64, or ArrowConversionError saying which rule they break (``whose`` rows they bound)."""
    offsets = np.asarray(group_offsets)
    if offsets.ndim != 1 or len(offsets) == 0 or not np.issubdtype(offsets.dtype, np.integer):
        raise ArrowConversionError(
            f"group_offsets must be a 1-D integer array of n_groups + 1 values, got shape {offsets.shape} "
            f"of {offsets.dtype}"
        )
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != num_rows:
        raise ArrowConversionError(
            f"group_offsets must run from 0 to {whose} {num_rows} rows, got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    sizes = np.diff(offsets)
    if (sizes <= 0).any():
        group = int(np.argmax(sizes <= 0))
        raise ArrowConversionError(
            f"group {group} (rows {int(offsets[group])} .. {int(offsets[group + 1])}) is empty or reversed: "
            "every group needs at least one row (a SequenceExample of no steps has no row to take its context from)"
        )
    return offsets


def _check_names(table: pa.Table | pa.RecordBatch, context: Sequence[str], feature_lists: Sequence[str]) -> None:
    """Every name is one column of the table, listed once, as context or as feature list."""
    available = table.schema.names
    wanted = [*context, *feature_lists]
    for name in wanted:
        if wanted.count(name) > 1:
            where = "both as context and as a feature list" if name in context and name in feature_lists else "twice"
            raise ArrowConversionError(f"column {name!r} is listed {where}; each column becomes one feature")
        if available.count(name) != 1:
            found = "is not in the table" if name not in available else "appears more than once in the table"
            raise ArrowConversionError(f"column {name!r} {found} (columns: {available}); rename or drop columns first")


def _taken(table: pa.Table | pa.RecordBatch, names: Sequence[str], rows: np.ndarray) -> pa.Table:
    """The columns ``names`` at ``rows`` (in that order)."""
    columns = [table.column(name) for name in names]
    # pyarrow's take has no kernel for the view layouts of strings: take their plain form.
    columns = [column.cast(plain) if (plain := _without_string_views(column.type)) != column.type else column
               for column in columns]
    return pa.Table.from_arrays(columns, names=list(names)).take(pa.array(rows))


def _without_string_views(arrow_type: pa.DataType) -> pa.DataType:
    """The type with string_view / binary_view (also as list items, dictionary values) as large_string / large_binary."""
    types = pa.types
    if types.is_string_view(arrow_type):
        return pa.large_string()
    if types.is_binary_view(arrow_type):
        return pa.large_binary()
    if types.is_dictionary(arrow_type):
        return pa.dictionary(arrow_type.index_type, _without_string_views(arrow_type.value_type))
    if types.is_fixed_size_list(arrow_type):
        return pa.list_(_without_string_views(arrow_type.value_type), arrow_type.list_size)
    if types.is_list(arrow_type):
        return pa.list_(_without_string_views(arrow_type.value_type))
    if types.is_large_list(arrow_type):
        return pa.large_list(_without_string_views(arrow_type.value_type))
    return arrow_type  # list views take with any items (and cannot be cast to other items)


def _group_chunks(offsets: np.ndarray) -> Iterator[tuple[int, int]]:
    """Runs of whole groups (first, last) of about _ROWS_PER_CHUNK rows, at least one group each."""
    count = len(offsets) - 1
    first = 0
    while first < count:
        fitting = int(np.searchsorted(offsets, offsets[first] + _ROWS_PER_CHUNK, side="right")) - 1
        last = min(count, max(first + 1, fitting))
        yield first, last
        first = last


def _context_part(records: EncodedExamples | None, first: int, last: int) -> bytes | Spans:
    """The context field of groups first..last: their first rows' Example bytes (0a 00 for none)."""
    if records is None:
        return b"\x0a\x00"
    starts = records.offsets[first:last]
    return Spans(records.data, starts, records.offsets[first + 1 : last + 1] - starts)


def _encode_groups(
    offsets: np.ndarray, context: bytes | Spans, columns: dict[str, pa.Array | pa.ChunkedArray]
) -> EncodedExamples:
    """The SequenceExamples of consecutive groups (offsets: their step bounds; columns: those steps' rows)."""
    row_base = int(offsets[0])
    local = offsets - row_base
    count = len(offsets) - 1
    entries: list[bytes | np.ndarray | Spans] = []
    body_length = np.zeros(count, np.int64)
    for name, column in columns.items():
        steps = encode_feature_list_steps(name, column, row_base)
        starts = steps.offsets[local[:-1]]
        list_length = steps.offsets[local[1:]] - starts
        encoded_name = name.encode("utf-8")
        key = b"\x0a" + encode_varint(len(encoded_name)) + encoded_name
        entry_length = len(key) + 1 + varint_sizes(list_length) + list_length
        entries += [b"\x0a", entry_length, key + b"\x12", list_length, Spans(steps.data, starts, list_length)]
        body_length += 1 + varint_sizes(entry_length) + entry_length
    return concatenate_parts(count, [context, b"\x12", body_length, *entries])
