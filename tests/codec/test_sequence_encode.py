"""The columnar SequenceExample encoder equals encode_sequence_example, group by group and byte for byte."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from tests.codec.test_encode import EDGE_CODE_POINTS, HYPOTHESIS, _kind, column, names
from tests.helpers import with_float32_bits
from tfrbeam.codec import sequence_encode
from tfrbeam.codec.encode import EncodedExamples
from tfrbeam.codec.example import decode_sequence_example, encode_sequence_example
from tfrbeam.codec.sequence_encode import encode_sequence_batch
from tfrbeam.errors import ArrowConversionError
from tfrbeam.tfrecord.records import read_records

# ---------------------------------------------------------------------------------------------
# The reference: encode_sequence_example on each group's values, taken row by row.


def reference_records(table: pa.Table | pa.RecordBatch, offsets, context, feature_lists) -> list[bytes]:
    kinds = {field.name: _kind(field.type) for field in table.schema}
    rows = table.to_pylist()
    records = []
    for first, last in itertools.pairwise(np.asarray(offsets).tolist()):
        context_values = {name: rows[first][name] for name in context}
        lists = {name: [[] if row[name] is None else row[name] for row in rows[first:last]] for name in feature_lists}
        records.append(encode_sequence_example(
            context_values, lists, kinds={name: kinds[name] for name in context},
            feature_list_kinds={name: kinds[name] for name in feature_lists},
        ))
    return records


def assert_matches_reference(table, offsets, context, feature_lists) -> EncodedExamples:
    encoded = encode_sequence_batch(table, np.asarray(offsets, np.int64), context, feature_lists)
    expected = reference_records(table, offsets, context, feature_lists)
    assert len(encoded) == len(expected)
    for index, (record, reference) in enumerate(zip(encoded.to_list(), expected)):
        assert record == reference, f"group {index}: differs from encode_sequence_example"
        decoded = decode_sequence_example(record)
        assert with_float32_bits(decoded) == with_float32_bits(decode_sequence_example(reference))
        assert list(decoded[1]) == sorted(feature_lists)
    return encoded


@st.composite
def grouped_tables(draw, max_groups: int = 5, max_steps: int = 4, max_columns: int = 6):
    """(table, group offsets, context names, feature-list names): every column kind, nulls, edge names."""
    sizes = draw(st.lists(st.integers(1, max_steps), min_size=1, max_size=max_groups))
    num_rows = sum(sizes)
    column_names = draw(st.lists(names, max_size=max_columns, unique=True))
    columns = {name: draw(column(num_rows)) for name in column_names}
    # Names are drawn up to 6 characters, so this ignored column (a table of no columns has no rows) never clashes.
    table = pa.table({**columns, "ignored rows": pa.array(range(num_rows))})
    roles = draw(st.lists(st.sampled_from(["context", "list", "ignored"]), min_size=len(column_names),
                          max_size=len(column_names)))
    context = [name for name, role in zip(column_names, roles) if role == "context"]
    feature_lists = [name for name, role in zip(column_names, roles) if role == "list"]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return table, offsets, draw(st.permutations(context)), draw(st.permutations(feature_lists))


@HYPOTHESIS
@given(grouped_tables())
def test_random_groups_equal_encode_sequence_example(drawn):
    assert_matches_reference(*drawn)


@HYPOTHESIS
@given(grouped_tables(max_groups=8), st.data())
def test_chunked_tables_and_batches_encode_alike(drawn, data):
    table, offsets, context, feature_lists = drawn
    chunked = {}
    for name, array in zip(table.schema.names, table.columns):
        cuts = sorted(data.draw(st.lists(st.integers(0, table.num_rows), max_size=3)))
        bounds = [0, *cuts, table.num_rows]
        chunked[name] = pa.chunked_array([array.combine_chunks().slice(a, b - a) for a, b in itertools.pairwise(bounds)],
                                         type=array.type)
    expected = encode_sequence_batch(table, offsets, context, feature_lists).to_list()
    assert encode_sequence_batch(pa.table(chunked), offsets, context, feature_lists).to_list() == expected
    batch = pa.RecordBatch.from_arrays([a.combine_chunks() for a in table.columns], names=table.schema.names)
    assert encode_sequence_batch(batch, offsets, context, feature_lists).to_list() == expected


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 7])
def test_groups_spanning_chunks_and_groups_larger_than_a_chunk(monkeypatch, rows_per_chunk):
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", rows_per_chunk)
    sizes = [1, 5, 2, 9, 1, 1, 3]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows = int(offsets[-1])
    table = pa.table({
        "user": pa.array(np.repeat(np.arange(len(sizes)), sizes)),
        "t": pa.array([float(i) if i % 4 else None for i in range(rows)], pa.float32()),
        "tags": pa.array([[f"t{i}"] * (i % 3) if i % 5 else None for i in range(rows)], pa.list_(pa.string())),
    })
    encoded = assert_matches_reference(table, offsets, ["user"], ["t", "tags"])
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", 65536)
    assert encoded.to_list() == encode_sequence_batch(table, offsets, ["user"], ["t", "tags"]).to_list()


@HYPOTHESIS
@given(grouped_tables(max_groups=8), st.integers(1, 6), st.randoms(use_true_random=False))
def test_runs_of_groups_in_buffers_of_their_own_join_to_the_batch(drawn, rows_per_chunk, random):
    """encode_sequence_chunks: the same records as encode_sequence_batch, in runs of whole groups; with ``rows``,
    as if the table had been taken in that order first."""
    table, offsets, context, feature_lists = drawn
    expected = encode_sequence_batch(table, offsets, context, feature_lists).to_list()
    original = sequence_encode._ROWS_PER_CHUNK
    sequence_encode._ROWS_PER_CHUNK = rows_per_chunk  # (no monkeypatch fixture under hypothesis)
    try:
        runs = list(sequence_encode.encode_sequence_chunks(table, offsets, context, feature_lists))
        order = list(range(table.num_rows))
        random.shuffle(order)
        plain = pa.table({name: table[name].cast(sequence_encode._without_string_views(table[name].type))
                          for name in table.schema.names})  # take has no kernel for string views
        taken = plain.take(pa.array(order))  # its rows, in the order argsort(order), are the table's again
        ordered = list(sequence_encode.encode_sequence_chunks(taken, offsets, context, feature_lists,
                                                              rows=np.argsort(order)))
        direct = encode_sequence_batch(taken, offsets, context, feature_lists).to_list()
        shuffled = list(sequence_encode.encode_sequence_chunks(table, offsets, context, feature_lists,
                                                               rows=np.asarray(order)))
    finally:
        sequence_encode._ROWS_PER_CHUNK = original
    assert [record for run in runs for record in run.to_list()] == expected
    assert [record for run in ordered for record in run.to_list()] == expected
    assert [record for run in shuffled for record in run.to_list()] == direct
    bounds = np.cumsum([0, *map(len, runs)])
    assert set(bounds.tolist()) <= set(range(len(offsets)))  # runs end where groups do
    if len(offsets) > 2 and rows_per_chunk == 1:
        assert len(runs) == len(offsets) - 1  # one group a run


def test_the_next_runs_rows_are_taken_on_a_thread_while_this_run_is_encoded(monkeypatch):
    """With ``rows``, pyarrow's take (no GIL) of run i + 1 overlaps the caller's encoding of run i."""
    import threading
    import time

    table = pa.table({"g": np.repeat(np.arange(10), 3), "x": np.arange(30)})
    offsets = np.arange(0, 31, 3)
    order = np.random.default_rng(0).permutation(30)
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", 6)  # 5 runs of 2 groups
    taken_on = []
    take = sequence_encode._taken

    def spied(table_, names_, rows_):
        taken_on.append((threading.current_thread().name, tuple(names_)))
        return take(table_, names_, rows_)

    monkeypatch.setattr(sequence_encode, "_taken", spied)
    runs = sequence_encode.encode_sequence_chunks(table, offsets, ["g"], ["x"], rows=order)
    first = next(runs)
    deadline = time.monotonic() + 5
    while len([n for n in taken_on if n[1] == ("x",)]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    steps = [name for name, names in taken_on if names == ("x",)]
    assert len(steps) == 2 and all(name.startswith("tfrbeam-sequence-take") for name in steps)  # run 2 while run 1 is out
    records = [*first.to_list(), *(record for run in runs for record in run.to_list())]
    taken = table.take(pa.array(order))
    assert records == encode_sequence_batch(taken, offsets, ["g"], ["x"]).to_list()
    assert list(sequence_encode.encode_sequence_chunks(table, np.array([0]), [], ["x"], rows=np.zeros(0, np.int64))) == []


def test_rows_must_be_rows_of_the_table():
    table = pa.table({"x": [1, 2, 3]})
    with pytest.raises(ArrowConversionError, match=re.escape("rows must be row numbers of the table's 3 rows, got 0 .. 3")):
        list(sequence_encode.encode_sequence_chunks(table, np.array([0, 2]), ["x"], [], rows=np.array([0, 3])))
    with pytest.raises(ArrowConversionError, match=re.escape("must run from 0 to the given rows' 2 rows, got 0 .. 3")):
        list(sequence_encode.encode_sequence_chunks(table, np.array([0, 3]), ["x"], [], rows=np.array([2, 1])))
    records = list(sequence_encode.encode_sequence_chunks(table, np.array([0, 1, 2]), ["x"], [], rows=np.array([2, 0])))
    assert records[0].to_list() == encode_sequence_batch(pa.table({"x": [3, 1]}), np.array([0, 1, 2]), ["x"], []).to_list()


def test_every_arrow_type_as_context_and_as_steps_with_nulls():
    """int64 / float32 / bytes / string scalars, lists and fixed-size lists of each, nulls everywhere."""
    values = {
        pa.int64(): [7, None, -(2**63), 2**63 - 1],
        pa.float32(): [0.5, None, float("nan"), -0.0],
        pa.binary(): [b"", None, b"\x00\xff", b"abc"],
        pa.string(): ["x", None, "😀", ""],
    }
    columns = {}
    for arrow_type, cells in values.items():
        items = [v for v in cells if v is not None][:2]
        columns[f"s_{arrow_type}"] = pa.array(cells, arrow_type)
        columns[f"l_{arrow_type}"] = pa.array([items, None, [], items[:1]], pa.list_(arrow_type))
        columns[f"f_{arrow_type}"] = pa.array([items, None, items, items[::-1]], pa.list_(arrow_type, 2))
    table = pa.table(columns)
    names_ = table.schema.names
    for offsets in ([0, 4], [0, 1, 2, 3, 4], [0, 2, 4], [0, 1, 4]):
        assert_matches_reference(table, offsets, names_, [])
        assert_matches_reference(table, offsets, [], names_)
        assert_matches_reference(table, offsets, names_[::2], names_[1::2])
    record = encode_sequence_batch(table, np.array([0, 2, 4]), [], names_)[0]
    _, lists = decode_sequence_example(record, kinds=True)
    assert lists["s_int64"] == [("int64", [7]), ("int64", [])]  # a null step: an empty list of the kind
    assert lists["f_string"] == [("bytes", [b"x", b"\xf0\x9f\x98\x80"]), ("bytes", [])]
    context, _ = decode_sequence_example(encode_sequence_batch(table, np.array([0, 1, 4]), names_, [])[1])
    assert "s_int64" not in context and "l_int64" not in context  # a null in the first row: absent


@pytest.mark.parametrize("feature_names", [
    ["\uff01", "\U0001f600"],
    ["\ue000", "\U00010000", "\uffff", "\U0010ffff", "\ud7ff"],
    ["ab", "a", "", "abc", "b"],
    EDGE_CODE_POINTS[1:],
])
def test_names_are_ordered_by_utf8_bytes_in_context_and_feature_lists(feature_names):
    table = pa.table({name: pa.array([index, index + 1], pa.int64()) for index, name in enumerate(feature_names)})
    half = len(feature_names) // 2
    context, lists = feature_names[:half], feature_names[half:]
    record = assert_matches_reference(table, [0, 2], context, lists)[0]
    decoded_context, decoded_lists = decode_sequence_example(record)
    by_utf8 = lambda chosen: sorted(chosen, key=lambda name: name.encode())
    assert list(decoded_context) == sorted(context) and list(decoded_lists) == sorted(lists)
    assert record == encode_sequence_example({n: table[n][0].as_py() for n in context},
                                             {n: table[n].to_pylist() for n in by_utf8(lists)})


def test_no_feature_lists_and_no_context_give_both_fields_empty():
    table = pa.table({"x": [1, 2, 3]})
    assert encode_sequence_batch(table, np.array([0, 1, 3]), [], []).to_list() == [b"\x0a\x00\x12\x00"] * 2
    assert encode_sequence_batch(table.slice(0, 0), np.array([0]), ["x"], []).to_list() == []
    assert len(encode_sequence_batch(table.slice(0, 0), np.array([0]), [], ["x"])) == 0


def test_long_groups_and_long_values_stay_exact():
    """Groups of hundreds of steps (FeatureList bodies beyond a varint byte or two) and long strings."""
    sizes = [1, 500, 3, 130, 17000 // 40]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows = int(offsets[-1])
    rng = np.random.default_rng(5)
    table = pa.table({
        "g": pa.array(np.repeat(np.arange(len(sizes)), sizes)),
        "v": pa.array(rng.integers(-(2**40), 2**40, rows)),
        "w": pa.array(["y" * int(n) for n in rng.integers(0, 300, rows)]),
        "e": pa.array([[1.5] * int(n) for n in rng.integers(0, 40, rows)], pa.list_(pa.float64())),
    })
    assert_matches_reference(table, offsets, ["g"], ["v", "w", "e"])


@pytest.mark.parametrize("offsets, message", [
    ([0, 2, 2, 4], "group 1 (rows 2 .. 2) is empty"),
    ([0, 3, 2, 4], "group 1 (rows 3 .. 2) is empty or reversed"),
    ([1, 4], "must run from 0 to the table's 4 rows, got 1 .. 4"),
    ([0, 3], "must run from 0 to the table's 4 rows, got 0 .. 3"),
    ([], "1-D integer array"),
    ([0.0, 4.0], "1-D integer array"),
    ([[0, 4]], "1-D integer array"),
])
def test_bad_group_offsets_are_clear_errors(offsets, message):
    table = pa.table({"x": [1, 2, 3, 4]})
    with pytest.raises(ArrowConversionError, match=re.escape(message)):
        encode_sequence_batch(table, np.array(offsets), ["x"], [])


@pytest.mark.parametrize("context, feature_lists, message", [
    (["x"], ["x"], "column 'x' is listed both as context and as a feature list"),
    (["x", "x"], [], "column 'x' is listed twice"),
    ([], ["nope"], "column 'nope' is not in the table"),
    (["d"], [], "column 'd' appears more than once in the table"),
])
def test_bad_column_names_are_clear_errors(context, feature_lists, message):
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([1, 2]), pa.array([3, 4])], names=["x", "d", "d"])
    with pytest.raises(ArrowConversionError, match=re.escape(message)):
        encode_sequence_batch(table, np.array([0, 2]), context, feature_lists)


def test_value_errors_name_the_table_row(monkeypatch):
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", 2)
    table = pa.table({
        "u": pa.array([1, 2, 3, 2**63], pa.uint64()),
        "l": pa.array([[1], [2], [None], [4]], pa.list_(pa.int64())),
        "t": pa.array([pa.scalar(0, pa.timestamp("s"))] * 4),
    })
    offsets = np.array([0, 1, 3, 4])
    with pytest.raises(ArrowConversionError, match=re.escape("column 'u', row 3: uint64 value 9223372036854775808")):
        encode_sequence_batch(table, offsets, [], ["u"])
    with pytest.raises(ArrowConversionError, match=re.escape("column 'l', row 2: the list holds a null")):
        encode_sequence_batch(table, offsets, [], ["l"])
    with pytest.raises(ArrowConversionError, match=re.escape("column 't' has Arrow type timestamp[s]")):
        encode_sequence_batch(table, offsets, [], ["t"])
    with pytest.raises(ArrowConversionError, match=re.escape("column 'u', row 1: uint64 value 9223372036854775808")):
        encode_sequence_batch(table.take([0, 3, 1, 2]), offsets, ["u"], [])  # row 1 of the groups' first rows


# ---------------------------------------------------------------------------------------------
# TensorFlow's own SequenceExamples (tests/data/tf-vectors), rebuilt from columns.

_ARROW_TYPES = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}


def _as_columns(record: bytes) -> tuple[pa.Table, list[str], list[str]] | None:
    """The record as a table of one group (one row per step, the context repeated), if columns can hold it."""
    context, lists = decode_sequence_example(record, kinds=True)
    step_counts = {len(steps) for steps in lists.values()}
    if (set(context) & set(lists) or len(step_counts) > 1 or 0 in step_counts
            or any(kind is None for kind, _ in context.values())
            or any(kind is None or kind != steps[0][0] for steps in lists.values() for kind, _ in steps)):
        return None
    steps = step_counts.pop() if step_counts else 1
    columns = {name: pa.array([values] * steps, pa.list_(_ARROW_TYPES[kind])) for name, (kind, values) in context.items()}
    for name, feature_steps in lists.items():
        columns[name] = pa.array([values for _, values in feature_steps], pa.list_(_ARROW_TYPES[feature_steps[0][0]]))
    table = pa.table(columns) if columns else pa.table({"_": pa.array([0] * steps)})
    return table, list(context), list(lists)


def test_tensorflow_sequence_examples_rebuild_byte_for_byte(tf_vectors):
    records = list(read_records(tf_vectors / "sequence_examples.tfrecord"))
    rebuilt = []
    for index, record in enumerate(records):
        columns = _as_columns(record)
        if columns is None:
            continue
        table, context, lists = columns
        encoded = encode_sequence_batch(table, np.array([0, table.num_rows]), context, lists)
        expected = record if record.startswith(b"\x0a") else b"\x0a\x00" + record
        expected = expected if lists or expected.endswith(b"\x12\x00") else expected + b"\x12\x00"
        assert encoded.to_list() == [expected], f"TF record {index}"
        rebuilt.append(index)
    assert rebuilt == [0, 1, 2, 4]  # 1 is empty: a group of one row and no features; 3 has an empty FeatureList


def test_records_are_allocated_from_arrows_system_pool():
    """The encoded bytes come from malloc through Arrow's system pool, which keeps freed batches' heap for
    them: pyarrow's default pool (mimalloc) gives freed pages back and numpy asks for huge pages."""
    rows = 20_000
    table = pa.table({"g": pa.array(np.repeat(np.arange(rows // 10), 10)), "v": pa.array(np.arange(rows, dtype=np.float32)),
                      "w": pa.array([f"word-{index}" for index in range(rows)])})
    system = pa.system_memory_pool()
    before = system.bytes_allocated()
    encoded = encode_sequence_batch(table, np.arange(0, rows + 1, 10), ["g"], ["v", "w"])
    assert system.bytes_allocated() - before >= encoded.data.nbytes > 0
    held = system.bytes_allocated()
    del encoded
    assert system.bytes_allocated() < held
