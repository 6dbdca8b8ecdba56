"""The columnar SequenceExample decoder gives what decode_sequence_example (protobuf) gives, record by record."""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tests.codec.test_encode import EDGE_CODE_POINTS
from tests.helpers import with_float32_bits
from tfrbeam.codec.example import decode_sequence_example, encode_example, encode_sequence_example
from tfrbeam.codec.sequence_decode import has_feature_lists, sequence_examples_to_record_batches
from tfrbeam.errors import ArrowConversionError, ExampleDecodeError
from tfrbeam.tfrecord.records import read_records

NAMES = st.one_of(st.text(max_size=4), st.lists(st.sampled_from(EDGE_CODE_POINTS), max_size=2).map("".join))
VALUES = {
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float": st.one_of(st.floats(width=32), st.sampled_from([math.nan, -0.0, math.inf])),
    "bytes": st.binary(max_size=6),
}


def _values(kind: str, max_size: int = 3) -> st.SearchStrategy:
    return st.lists(VALUES[kind], max_size=max_size)


@st.composite
def sequence_batches(draw):
    """Records of one schema of kinds (names may appear both as context and as list), some oddly encoded."""
    context_kinds = draw(st.dictionaries(NAMES, st.sampled_from(sorted(VALUES)), max_size=3))
    list_kinds = draw(st.dictionaries(NAMES, st.sampled_from(sorted(VALUES)), max_size=3))
    records = []
    for _ in range(draw(st.integers(0, 6))):
        context = {name: draw(_values(kind)) for name, kind in context_kinds.items() if draw(st.booleans())}
        lists = {name: draw(st.lists(_values(kind), max_size=4)) for name, kind in list_kinds.items() if draw(st.booleans())}
        record = encode_sequence_example(context, lists, kinds=context_kinds, feature_list_kinds=list_kinds)
        records.append(record)
        oddity = draw(st.sampled_from(["canonical", "canonical", "merged", "unknown field", "swapped", "no context"]))
        if oddity == "merged" and records:  # two messages back to back are one, merged (maps: the later key wins)
            records[-1] = records[-1] + records[draw(st.integers(0, len(records) - 1))]
        elif oddity == "unknown field":
            records[-1] = b"\x18\x07" + records[-1] + b"\x2a\x01z"
        elif oddity == "swapped":  # the feature lists first, then the context
            context_end = 2 + records[-1][1] if records[-1][1] < 0x80 else None
            if context_end is not None:
                records[-1] = records[-1][context_end:] + records[-1][:context_end]
        elif oddity == "no context":
            records[-1] = records[-1][2 + records[-1][1]:] if records[-1][1] < 0x80 else records[-1]
    return records, context_kinds, list_kinds


def _expected(records: list[bytes]) -> list[tuple[dict, dict]]:
    return [decode_sequence_example(record) for record in records]


def _rows(context: pa.RecordBatch, lists: pa.RecordBatch) -> list[tuple[dict, dict]]:
    """Our batches as decode_sequence_example's pairs (absent features and lists left out)."""
    drop_none = lambda row: {name: value for name, value in sorted(row.items()) if value is not None}
    return list(zip(map(drop_none, context.to_pylist()), map(drop_none, lists.to_pylist())))


@settings(max_examples=150, deadline=None)
@given(sequence_batches())
def test_inferred_batches_equal_protobuf_record_by_record(drawn):
    records, _, _ = drawn
    context, lists = sequence_examples_to_record_batches(records)
    assert context.num_rows == lists.num_rows == len(records)
    assert with_float32_bits(_rows(context, lists)) == with_float32_bits(_expected(records))


@settings(max_examples=100, deadline=None)
@given(sequence_batches())
def test_schema_batches_equal_protobuf_record_by_record(drawn):
    records, context_kinds, list_kinds = drawn
    arrow = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}
    context_schema = pa.schema([(name, pa.list_(arrow[kind])) for name, kind in context_kinds.items()])
    sequence_schema = pa.schema([(name, pa.list_(pa.list_(arrow[kind]))) for name, kind in list_kinds.items()])
    context, lists = sequence_examples_to_record_batches(records, context_schema, sequence_schema)
    assert context.schema == context_schema and lists.schema == sequence_schema
    assert with_float32_bits(_rows(context, lists)) == with_float32_bits(_expected(records))


def test_step_types_scalar_fixed_and_variable():
    records = [
        encode_sequence_example({"id": 1}, {"t": [1.5, 2.5], "xy": [[1, 2], [3, 4]], "w": [[b"a"], [], [b"b", b"c"]]}),
        encode_sequence_example({"id": 2}, {"t": [], "xy": [[5, 6]]}, feature_list_kinds={"t": "float"}),
    ]
    schema = pa.schema([("t", pa.list_(pa.float32())), ("xy", pa.list_(pa.list_(pa.int64(), 2))),
                        ("w", pa.large_list(pa.list_(pa.string())))])
    context, lists = sequence_examples_to_record_batches(records, pa.schema([("id", pa.int64())]), schema)
    assert context.column("id").to_pylist() == [1, 2]
    assert lists.schema == schema
    assert lists.to_pylist() == [
        {"t": [1.5, 2.5], "xy": [[1, 2], [3, 4]], "w": [["a"], [], ["b", "c"]]},
        {"t": [], "xy": [[5, 6]], "w": None},
    ]


@pytest.mark.parametrize("good, steps, step_type, message", [
    ([[0.5]], [[1.0], [2.0, 3.0]], pa.float32(),
     "record 1 of the batch: feature list 's' holds 2 values in step 1, but the step type float takes exactly one value "
     "per step"),
    ([[0.5]], [[1.0], []], pa.float32(), "record 1 of the batch: feature list 's' has no value in steps [1] (1 steps)"),
    ([[0.5, 1.5]], [[1.0, 2.0], [3.0]], pa.list_(pa.float32(), 2),
     "record 1 of the batch: feature list 's' holds 1 values in step 1"),
    ([[7]], [[1.0]], pa.int64(), "record 1 of the batch: feature list 's' in step 0 is a float_list"),
])
def test_steps_that_do_not_fit_the_step_type_name_the_record_and_step(good, steps, step_type, message):
    records = [encode_sequence_example({}, {"s": good}), encode_sequence_example({}, {"s": steps})]
    with pytest.raises((ArrowConversionError, ExampleDecodeError), match=re.escape(message)):
        sequence_examples_to_record_batches(records, None, pa.schema([("s", pa.list_(step_type))]))


def test_malformed_records_get_protobufs_diagnosis_with_the_record_index():
    good = encode_sequence_example({"a": [1]}, {"s": [[1]]})
    bad = good[:-1]  # cut inside the last step
    with pytest.raises(ExampleDecodeError, match=r"record 1 of the batch: malformed tf\.train\.SequenceExample .*truncated"):
        sequence_examples_to_record_batches([good, bad])
    with pytest.raises(ArrowConversionError, match="sequence schema field 's' has type int64"):
        sequence_examples_to_record_batches([good], None, pa.schema([("s", pa.int64())]))
    with pytest.raises(ArrowConversionError, match="feature list 's' is missing from records \\[1\\]"):
        sequence_examples_to_record_batches([good, encode_sequence_example({}, {})], None,
                                            pa.schema([pa.field("s", pa.list_(pa.int64()), nullable=False)]))


def test_an_example_is_a_sequence_example_without_lists_and_has_feature_lists_tells_them_apart():
    records = [encode_example({"a": [1]}), encode_sequence_example({"a": [1]}, {}), b"",
               encode_sequence_example({}, {"s": [[1]]}), b"\x12\x00"]
    assert has_feature_lists(records).tolist() == [False, True, False, True, True]
    context, lists = sequence_examples_to_record_batches(records[:1])
    assert context.to_pylist() == [{"a": [1]}] and lists.num_columns == 0 and lists.num_rows == 1


def test_long_lists_and_many_records():
    rng = np.random.default_rng(3)
    records = [encode_sequence_example({"n": [i]}, {"v": rng.integers(-1000, 1000, size=(int(n), 2)),
                                                    "b": [[b"x" * int(k)] for k in rng.integers(0, 200, int(n))]})
               for i, n in enumerate(rng.integers(0, 700, 60))]
    context, lists = sequence_examples_to_record_batches(records)
    assert with_float32_bits(_rows(context, lists)) == with_float32_bits(_expected(records))


def test_tensorflow_sequence_examples_decode_as_protobuf_does(tf_vectors):
    records = list(read_records(tf_vectors / "sequence_examples.tfrecord"))
    context, lists = sequence_examples_to_record_batches(records)
    assert with_float32_bits(_rows(context, lists)) == with_float32_bits(_expected(records))
    assert lists.column("nokind_step").to_pylist()[3] == [[], [3]]  # a step with no kind: no values


@st.composite
def step_features(draw):
    """Canonical step Features of one kind (some empty: no kind), and a plain step type they may or may not fit."""
    kind = draw(st.sampled_from(sorted(VALUES)))
    size = draw(st.integers(0, 3))
    steps = draw(st.lists(st.one_of(st.just([]), st.lists(VALUES[kind], min_size=size, max_size=size),
                                    st.lists(VALUES[kind], max_size=4)), min_size=1, max_size=6))
    element = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}[kind]
    step_type = draw(st.sampled_from([element, pa.list_(element), pa.list_(element, size)]))
    return encode_sequence_example({}, {"s": steps}, feature_list_kinds={"s": kind}), step_type


@settings(max_examples=200, deadline=None)
@given(st.lists(step_features(), min_size=1, max_size=4), st.data())
def test_plain_steps_read_directly_equal_the_framed_example_path(drawn, data):
    from tfrbeam.codec import sequence_decode

    step_type = data.draw(st.sampled_from([step for _, step in drawn]))
    records = [record for record, step in drawn if step == step_type]
    schema = pa.schema([("s", pa.list_(step_type))])
    outcomes = []
    for plain in (sequence_decode._plain_steps, lambda *args: None):
        original = sequence_decode._plain_steps
        sequence_decode._plain_steps = plain
        try:
            outcomes.append(repr(with_float32_bits(sequence_examples_to_record_batches(records, None, schema)[1].to_pylist())))
        except (ArrowConversionError, ExampleDecodeError) as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
        finally:
            sequence_decode._plain_steps = original
    assert outcomes[0] == outcomes[1]
