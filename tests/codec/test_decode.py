"""Tests of the columnar decoder (Example records -> Arrow RecordBatch).

The oracle is ``decode_example`` (protobuf's rules, through the generated classes): every record
of a decoded batch must hold exactly what it returns for that record, whether the record took the
lockstep fast path or the exact per-record walker, and both paths must agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from benchmarks.table import make_benchmark_table
from tfrbeam.codec import decode as columnar_decode, wire
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.encode import encode_record_batch, record_batch_to_examples
from tfrbeam.codec.example import decode_example, encode_example
from tfrbeam.codec.protos import example_pb2
from tfrbeam.errors import ArrowConversionError, ExampleDecodeError
from tfrbeam.tfrecord.records import read_records

KIND_TYPES = {"bytes": pa.binary(), "float": pa.float32(), "int64": pa.int64()}


# ----------------------------------------------------------------------------- wire writer


def varint(value: int, extra: int = 0) -> bytes:
    """Varint of value (two's complement for negatives); ``extra`` adds non-minimal padding bytes."""
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or extra:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
        if not value and extra:
            while extra > 1:
                out.append(0x80)
                extra -= 1
            out.append(0)
            break
    return bytes(out)


def field(number: int, payload: bytes, pad: int = 0) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload), pad) + payload


def f32(value: float) -> bytes:
    return struct.pack("<f", value)


def entry(name: bytes, feature: bytes) -> bytes:
    return field(1, field(1, name) + field(2, feature))


def example(*entries: bytes) -> bytes:
    return field(1, b"".join(entries))


UNKNOWN_FIELDS = [
    varint(15 << 3 | 0) + varint(300),  # varint
    varint(14 << 3 | 1) + bytes(8),  # fixed64
    varint(13 << 3 | 5) + bytes(4),  # fixed32
    field(12, b"junk"),  # length-delimited
    varint(11 << 3 | 3) + varint(10 << 3 | 0) + b"\x01" + varint(11 << 3 | 4),  # group
]


# ------------------------------------------------------------------------------ comparisons


def normalise(kind, values):
    """Values comparable across paths: floats as float32 bits, any NaN as one marker."""
    if kind == "float":
        return ["nan" if math.isnan(v) else struct.pack("<f", v) for v in values]
    return list(values)


def rows_of(batch: pa.RecordBatch) -> list[dict]:
    """Per record: {name: (kind, values)} for the non-null cells of an inferred batch."""
    columns = batch.to_pydict()
    kinds = {}
    for f in batch.schema:
        value_type = f.type.value_type
        kinds[f.name] = next((k for k, t in KIND_TYPES.items() if t == value_type), None)
    rows = []
    for i in range(batch.num_rows):
        rows.append({name: (kinds[name], normalise(kinds[name], col[i])) for name, col in columns.items() if col[i] is not None})
    return rows


def expected_rows(records) -> list[dict]:
    """What decode_example says, in the same shape as rows_of (a no-kind feature takes the column kind)."""
    return [{name: (kind, normalise(kind, values)) for name, (kind, values) in decode_example(r, kinds=True).items()}
            for r in records]


def assert_matches_oracle(records, batch=None):
    batch = examples_to_record_batch(records) if batch is None else batch
    got = rows_of(batch)
    want = expected_rows(records)
    assert batch.num_rows == len(records)
    column_kinds = {name: kind for row in want for name, (kind, _) in row.items() if kind is not None}
    for i, (g, w) in enumerate(zip(got, want)):
        w = {name: (column_kinds.get(name, kind), values) for name, (kind, values) in w.items()}
        assert g == w, f"record {i}"
    assert batch.schema.names == sorted(batch.schema.names)
    return batch


def assert_paths_agree(records, schema=None):
    fast = columnar_decode._to_record_batch(records, schema)
    exact = columnar_decode._to_record_batch(records, schema, exact_only=True)
    assert fast.schema == exact.schema
    for name in fast.schema.names:
        a, b = fast.column(name), exact.column(name)
        assert a.equals(b) or _same_bits(a, b), name
    return fast


def _same_bits(a: pa.Array, b: pa.Array) -> bool:
    """Equal, comparing floats by bit pattern (NaN != NaN under Array.equals)."""
    if a.to_pylist() == b.to_pylist():
        return True
    flat_a, flat_b = a, b
    while pa.types.is_list(flat_a.type) or pa.types.is_fixed_size_list(flat_a.type):
        if flat_a.offsets.to_pylist() != flat_b.offsets.to_pylist() if pa.types.is_list(flat_a.type) else False:
            return False
        flat_a, flat_b = flat_a.flatten(), flat_b.flatten()
    return np.asarray(flat_a).tobytes() == np.asarray(flat_b).tobytes()


def fast_path_records(records, wanted=None) -> np.ndarray:
    """Which records the lockstep walk accepted (not sent to the exact walker)."""
    batch = wire.RecordBuffer.from_input(records)
    walk = columnar_decode._Walk(batch, wanted)
    walk.run()
    columnar_decode._fast_pieces(walk)
    return ~walk.fallback


# ------------------------------------------------------------------------ hypothesis inputs

NAMES = ["", "a", "b", "i0", "emb", "abcd", "abcde", "abcdefg", "abcdefgh", "feature_number_one",
         "feature_number_two", "ünïcødé", "nul\x00key", "x" * 130]
INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL_INT = st.integers(0, 300)
FLOAT_BITS = st.integers(0, 2**32 - 1).map(lambda b: float(np.array([b], dtype=np.uint32).view(np.float32)[0]))
FLOATS = st.one_of(st.floats(width=32, allow_nan=False), FLOAT_BITS)
BYTES_VALUES = st.one_of(st.binary(max_size=12), st.binary(min_size=120, max_size=300))


@st.composite
def features(draw):
    """A dict of features {name: (kind, values)} with some per-name kind consistency left to chance."""
    names = draw(st.lists(st.one_of(st.sampled_from(NAMES), st.text(max_size=10)), max_size=8, unique=True))
    out = {}
    for name in names:
        kind = draw(st.sampled_from(["int64", "float", "bytes", None]))
        size = draw(st.one_of(st.just(1), st.integers(0, 5), st.integers(30, 80)))
        if kind == "int64":
            values = draw(st.lists(st.one_of(INT64, SMALL_INT), min_size=size, max_size=size))
        elif kind == "float":
            values = draw(st.lists(FLOATS, min_size=size, max_size=size))
        elif kind == "bytes":
            values = draw(st.lists(BYTES_VALUES, min_size=min(size, 6), max_size=min(size, 6)))
        else:
            values = []
        out[name] = (kind, values)
    return out


def canonical(feats: dict) -> bytes:
    values = {name: (np.array(v, dtype=np.float32) if kind == "float" else v) for name, (kind, v) in feats.items()}
    return encode_example(values, kinds={name: kind for name, (kind, _) in feats.items()})


def list_bytes(kind, values, style) -> bytes:
    """The list message of one feature, packed, unpacked or in mixed runs."""
    if kind == "bytes":
        return b"".join(field(1, v) for v in values)
    one = (lambda v: varint(v)) if kind == "int64" else f32
    unpacked_tag = varint(1 << 3 | (0 if kind == "int64" else 5))
    if style == "packed":
        return field(1, b"".join(one(v) for v in values)) if values else b""
    if style == "unpacked":
        return b"".join(unpacked_tag + one(v) for v in values)
    out = b""  # mixed: alternate packed pairs and unpacked singles, an empty run at the start
    out += field(1, b"")
    for i in range(0, len(values), 3):
        out += field(1, b"".join(one(v) for v in values[i : i + 2]))
        if i + 2 < len(values):
            out += unpacked_tag + one(values[i + 2])
    return out


@st.composite
def wire_records(draw):
    """Records built by hand with non-canonical encodings protobuf accepts (or canonical ones)."""
    feats = draw(features())
    entries = []
    for name, (kind, values) in feats.items():
        key = name.encode("utf-8")
        tag_number = {"bytes": 1, "float": 2, "int64": 3}.get(kind)
        style = draw(st.sampled_from(["packed", "unpacked", "mixed"]))
        feature = b""
        if draw(st.booleans()):  # an earlier kind the oneof drops when the last one arrives
            earlier = draw(st.sampled_from(["bytes", "float", "int64"]))
            feature += field(
                {"bytes": 1, "float": 2, "int64": 3}[earlier],
                list_bytes(earlier, [7] if earlier != "bytes" else [b"7"], "packed"),
            )
        if draw(st.integers(0, 5)) == 0:
            feature += draw(st.sampled_from(UNKNOWN_FIELDS))
        if tag_number is not None:
            body = list_bytes(kind, values, style)
            if draw(st.integers(0, 5)) == 0:
                body = draw(st.sampled_from(UNKNOWN_FIELDS)) + body
            if draw(st.booleans()) and len(body) > 1 and kind != "bytes" and style == "packed":
                feature += field(tag_number, b"") + field(tag_number, body)  # a split message merges
            else:
                feature += field(tag_number, body, pad=draw(st.sampled_from([0, 0, 0, 2])))
        elif feature and draw(st.booleans()):
            pass  # an earlier kind with no final kind switch: that kind stays
        if draw(st.integers(0, 6)) == 0:  # an earlier entry under the same key: the last wins
            entries.append(entry(key, field(3, field(1, varint(99)))))
        if draw(st.integers(0, 6)) == 0:  # value before key
            entries.append(field(1, field(2, feature) + field(1, key)))
        elif draw(st.integers(0, 8)) == 0:  # an unknown field inside the entry: upb drops the entry
            entries.append(field(1, field(1, key) + field(2, feature) + UNKNOWN_FIELDS[0]))
        else:
            entries.append(entry(key, feature))
    order = draw(st.permutations(range(len(entries))))
    entries = [entries[i] for i in order]
    cut = draw(st.integers(0, len(entries)))
    chunks = [b"".join(entries[:cut]), b"".join(entries[cut:])]
    if draw(st.booleans()):
        out = field(1, chunks[0]) + draw(st.sampled_from(UNKNOWN_FIELDS)) + field(1, chunks[1])
    else:
        out = field(1, b"".join(chunks))
    return out


def consistent(records) -> bool:
    """True if no feature has two kinds across the records (else the batch is an error)."""
    kinds = {}
    for r in records:
        for name, (kind, _) in decode_example(r, kinds=True).items():
            if kind is not None and kinds.setdefault(name, kind) != kind:
                return False
    return True


# ------------------------------------------------------------------------------------ tests


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(features(), min_size=1, max_size=12))
def test_canonical_records_take_the_fast_path_and_match_the_oracle(batch_features):
    records = [canonical(f) for f in batch_features]
    assume(consistent(records))
    assert fast_path_records(records).all()
    assert_matches_oracle(records)
    assert_paths_agree(records)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(wire_records(), features().map(canonical)), min_size=1, max_size=10))
def test_non_canonical_records_match_the_oracle_on_both_paths(records):
    assume(consistent(records))
    assert_matches_oracle(records)
    assert_paths_agree(records)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire_records(), st.data())
def test_damaged_records_fail_exactly_when_protobuf_fails(record, data):
    position = data.draw(st.integers(0, max(len(record) - 1, 0)))
    how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if how == "flip" and record:
        damaged = record[:position] + bytes([record[position] ^ data.draw(st.integers(1, 255))]) + record[position + 1 :]
    elif how == "cut":
        damaged = record[:position]
    else:
        damaged = record[:position] + data.draw(st.binary(min_size=1, max_size=3)) + record[position:]
    try:
        expected = decode_example(damaged, kinds=True)
    except ExampleDecodeError:
        expected = None
    records = [example(entry(b"ok", field(3, field(1, varint(1))))), damaged]
    assume(expected is None or consistent(records))
    for exact_only in (False, True):
        if expected is None:
            with pytest.raises(ExampleDecodeError, match=r"record 1: malformed"):
                columnar_decode._to_record_batch(records, None, exact_only)
        else:
            assert_matches_oracle(records, columnar_decode._to_record_batch(records, None, exact_only))


def test_protobuf_rules_on_hand_built_records():
    records = [
        example(entry(b"i", field(3, varint(8) + varint(1) + varint(8) + varint(-1) + varint(8) + varint(300)))),  # unpacked
        example(entry(b"i", field(3, field(1, varint(1) + varint(2)) + varint(8) + varint(3) + field(1, varint(4))))),
        example(entry(b"d", field(3, field(1, varint(1)))), entry(b"d", field(3, field(1, varint(2))))),  # last wins
        example(entry(b"k", field(3, field(1, varint(5))) + field(2, field(1, f32(1.0))))),  # last kind wins
        example(entry(b"m", field(3, field(1, varint(5))) + field(3, field(1, varint(6))))),  # same kind merges
        field(1, entry(b"a", b"")) + field(1, entry(b"b", field(1, field(1, b"x")))),  # Features in two chunks
        example(entry(b"u", field(3, field(1, varint(9))))) + UNKNOWN_FIELDS[0],  # unknown at Example level
        example(entry(b"u", field(3, field(1, varint(9)) + UNKNOWN_FIELDS[3]))),  # unknown inside the list
        example(entry(b"e", field(3, field(1, varint(1))) ), field(1, field(1, b"e") + field(2, b"") + UNKNOWN_FIELDS[0])),
        example(field(1, field(2, field(2, field(1, f32(2.5)))) + field(1, b"vk"))),  # value before key
        example(entry(b"f", field(2, varint(1 << 3 | 5) + f32(1.5) + varint(1 << 3 | 5) + f32(-2.25)))),
        field(1, field(1, field(1, b"p") + field(2, field(3, field(1, varint(7)), pad=3), pad=2), pad=4), pad=1),
        b"",
        b"\x0a\x00",
    ]
    batch = assert_matches_oracle(records)
    rows = batch.to_pydict()
    assert rows["i"][0] == [1, -1, 300] and rows["i"][1] == [1, 2, 3, 4]
    assert rows["d"][2] == [2]
    assert rows["k"][3] == [1.0] and rows["m"][4] == [5, 6]
    assert rows["a"][5] == [] and rows["b"][5] == [b"x"]
    assert rows["u"][6] == [9] and rows["u"][7] == [9]
    assert rows["e"][8] == [1]  # the later entry with an unknown field is dropped, as upb does
    assert rows["vk"][9] == [2.5]
    assert rows["f"][10] == [1.5, -2.25]
    assert rows["p"][11] == [7]
    assert fast_path_records(records).tolist() == [False] * 12 + [True, True]


def test_same_name_two_kinds_in_a_batch_is_a_conflict_naming_records():
    records = [encode_example({"x": [1]}), encode_example({"x": [1.5]}), encode_example({"x": [2]}),
               encode_example({"y": b"z"})]
    with pytest.raises(ArrowConversionError, match=r"'x'.*float_list in records \[1\].*int64_list in records \[0, 2\]"):
        examples_to_record_batch(records)


def test_features_with_no_kind():
    records = [encode_example({"n": [], "m": []}, kinds={"n": None, "m": None}), encode_example({"m": [3]}), b""]
    batch = examples_to_record_batch(records)
    assert batch.schema.field("n").type == pa.list_(pa.null())
    assert batch.column("n").to_pylist() == [[], None, None]
    assert batch.schema.field("m").type == pa.list_(pa.int64())
    assert batch.column("m").to_pylist() == [[], [3], None]


def test_a_feature_absent_everywhere_and_empty_batches():
    assert examples_to_record_batch([]).num_columns == 0
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.list_(pa.string()))])
    empty = examples_to_record_batch([], schema=schema)
    assert empty.schema == schema and empty.num_rows == 0
    batch = examples_to_record_batch([b"", encode_example({"c": [1]})], schema=schema)
    assert batch.to_pydict() == {"a": [None, None], "b": [None, None]}


# ------------------------------------------------------------------------------- schemas


def test_schema_scalars_lists_and_conversions():
    records = [
        encode_example({"i": 5, "b": 1, "f": 0.5, "s": "héllo", "raw": b"\xff", "l": [1, 2], "fl": [1.0, 2.0],
                        "u": 200, "t": 1_700_000_000_000, "e": [], "x": "skipped"}, kinds={"e": "float"}),
        encode_example({"i": -7, "b": 0, "f": 1e30, "s": "", "raw": b"", "l": [], "fl": [3.0, 4.0], "u": 0,
                        "t": 0, "e": [0.25]}, kinds={"l": "int64"}),
        encode_example({"f": 2.0, "fl": [5.0, 6.0]}),
    ]
    schema = pa.schema([
        pa.field("i", pa.int8()), pa.field("b", pa.bool_()), pa.field("f", pa.float64()),
        pa.field("s", pa.string()), pa.field("raw", pa.large_binary()), pa.field("l", pa.large_list(pa.int16())),
        pa.field("fl", pa.list_(pa.float32(), 2)), pa.field("u", pa.uint8()), pa.field("t", pa.timestamp("ms")),
        pa.field("e", pa.list_(pa.float16())), pa.field("missing", pa.list_(pa.int64())),
    ])
    batch = examples_to_record_batch(records, schema=schema)
    assert batch.schema == schema
    got = batch.to_pydict()
    assert got["i"] == [5, -7, None]
    assert got["b"] == [True, False, None]
    assert got["f"] == [0.5, float(np.float32(1e30)), 2.0]
    assert got["s"] == ["héllo", "", None]
    assert got["raw"] == [b"\xff", b"", None]
    assert got["l"] == [[1, 2], [], None]
    assert got["fl"] == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert got["u"] == [200, 0, None]
    assert batch.column("t").cast(pa.int64()).to_pylist() == [1_700_000_000_000, 0, None]
    assert got["e"] == [[], [0.25], None]
    assert got["missing"] == [None, None, None]
    assert_paths_agree(records, schema)


def test_fixed_size_list_with_null_rows_and_wrong_lengths():
    records = [encode_example({"v": [1.0, 2.0]}), b"", encode_example({"v": [3.0, 4.0]})]
    schema = pa.schema([pa.field("v", pa.list_(pa.float32(), 2))])
    assert examples_to_record_batch(records, schema=schema).column("v").to_pylist() == [[1.0, 2.0], None, [3.0, 4.0]]
    bad = records + [encode_example({"v": [1.0, 2.0, 3.0]})]
    with pytest.raises(ArrowConversionError, match=r"'v' holds 3 values in record 3.*takes exactly 2"):
        examples_to_record_batch(bad, schema=schema)


def test_zero_size_fixed_lists_decode_instead_of_crashing():
    """pyarrow's FixedSizeListArray.from_arrays divides by the list size: a size of 0 killed the process (SIGFPE)."""
    records = [encode_example({"e": []}, kinds={"e": "int64"}), b"", encode_example({"e": []}, kinds={"e": "int64"})]
    schema = pa.schema([pa.field("e", pa.list_(pa.int64(), 0))])
    assert examples_to_record_batch(records, schema=schema).column("e").to_pylist() == [[], None, []]
    assert examples_to_record_batch(records[:1], schema=schema).column("e").to_pylist() == [[]]


@pytest.mark.parametrize(
    "records, field, message",
    [
        ([encode_example({"a": [1, 2, 3]})], pa.field("a", pa.int64()),
         r"'a' holds 3 values in record 0, but field 'a' of type int64 takes exactly one value"),
        ([encode_example({"a": 1}), b""], pa.field("a", pa.int64(), nullable=False),
         r"'a' has no value in records \[1\].*not nullable"),
        ([encode_example({"a": [1]}), b""], pa.field("a", pa.list_(pa.int64()), nullable=False),
         r"'a' is missing from records \[1\].*not nullable"),
        ([encode_example({"a": 1}), encode_example({"a": 2.5})], pa.field("a", pa.int64()),
         r"'a' in record 1 is a float_list, but schema field 'a' of type int64 takes a int64_list"),
        ([encode_example({"a": b"x"})], pa.field("a", pa.list_(pa.float32())),
         r"'a' in record 0 is a bytes_list.*takes a float_list"),
        ([encode_example({"a": 1}), encode_example({"a": 128})], pa.field("a", pa.int8()),
         r"'a', record 1: value 128 is out of range for int8"),
        ([encode_example({"a": [0, -1]})], pa.field("a", pa.list_(pa.uint64())),
         r"'a', record 0: value -1 is out of range for uint64"),
        ([encode_example({"a": 2})], pa.field("a", pa.bool_()), r"'a', record 0: value 2 is out of range for bool"),
        ([encode_example({"a": "ok"}), encode_example({"a": b"\xc3\x28"})], pa.field("a", pa.string()),
         r"'a', record 1: value b'\\xc3\(' is not valid UTF-8"),
        ([encode_example({"a": ["ok", "fine"]}), encode_example({"a": [b"x", b"\xff"]})], pa.field("a", pa.list_(pa.string())),
         r"'a', record 1: value b'\\xff' is not valid UTF-8"),
        ([b""], pa.field("a", pa.struct([("x", pa.int64())])), r"field 'a' has type struct.*Supported"),
    ],
)
def test_schema_errors_name_feature_record_and_cause(records, field, message):
    with pytest.raises(ArrowConversionError, match=message):
        examples_to_record_batch(records, schema=pa.schema([field]))


def test_schema_projection_skips_other_features_even_malformed_values():
    broken_ints = field(3, field(1, b"\x80"))  # a packed varint cut short: malformed if decoded
    record = example(entry(b"keep", field(3, field(1, varint(4)))), entry(b"skip", broken_ints))
    schema = pa.schema([pa.field("keep", pa.int64())])
    for exact_only in (False, True):
        assert columnar_decode._to_record_batch([record], schema, exact_only).to_pydict() == {"keep": [4]}
    with pytest.raises(ExampleDecodeError, match="record 0"):
        examples_to_record_batch([record])
    assert fast_path_records([record], wanted={b"keep"}).all()
    assert not fast_path_records([record]).any()


# ------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "record, what",
    [
        (b"\x0a\x05\x0a\x03", "runs past the end"),
        (b"\x0e", "invalid wire type 6"),
        (b"\x00\x00", "field number 0"),
        (example(entry(b"f", field(2, field(1, b"abc")))), "not a multiple of 4"),
        (example(entry(b"\xff", b"")), "not valid UTF-8"),
        (example(entry(b"i", field(3, field(1, b"\xff" * 10 + b"\x01")))), "longer than 10 bytes"),
        (example(entry(b"i", field(3, field(1, b"\x01\x80")))), "runs past the end"),
        (b"\x13\x1c", "does not close group"),
    ],
)
def test_malformed_records_name_index_and_cause(record, what):
    with pytest.raises(ExampleDecodeError) as caught:
        examples_to_record_batch([encode_example({"a": 1}), encode_example({"a": 2}), record])
    assert "record 2" in str(caught.value) and what in str(caught.value)
    with pytest.raises(ExampleDecodeError):
        decode_example(record)


# --------------------------------------------------------------------------- input forms


def test_input_forms_agree():
    records = [encode_example({"a": [i, i + 1], "s": f"v{i}"}) for i in range(5)]
    data = b"".join(records)
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in records]))).astype(np.int64)

    class Encoded:
        def __init__(self):
            self.data, self.offsets = data, offsets

    want = examples_to_record_batch(records)
    assert examples_to_record_batch((data, offsets)).equals(want)
    assert examples_to_record_batch(Encoded()).equals(want)
    assert examples_to_record_batch(pa.array(records, pa.binary())).equals(want)
    assert examples_to_record_batch(pa.array(records, pa.large_binary()).slice(1, 3)).equals(want.slice(1, 3))
    assert examples_to_record_batch((memoryview(data)[len(records[0]) :], offsets[1:] - offsets[1])).equals(want.slice(1))
    with pytest.raises(ExampleDecodeError, match="non-decreasing"):
        examples_to_record_batch((data, offsets[::-1]))
    with pytest.raises(TypeError):
        examples_to_record_batch(data)




def _alike_record(index: int) -> bytes:
    return encode_example({"f": [index / 3], "k": [index % 100], "vec": [float(index)] * 3})


@pytest.mark.parametrize("odd_one", [
    None,
    ("value", encode_example({"f": [0.5], "k": [300], "vec": [1.0, -2.0, 3.5]})),  # a 2-byte varint
    ("longer", encode_example({"f": [0.5, 0.25], "k": [7], "vec": [1.0, -2.0, 3.5]})),
    ("empty", encode_example({"f": [], "k": [7], "vec": [1.0, -2.0, 3.5]}, kinds={"f": "float"})),
    ("kind", encode_example({"f": [b"x"], "k": [7], "vec": [1.0, -2.0, 3.5]})),
    ("missing", encode_example({"k": [7], "vec": [1.0, -2.0, 3.5]})),
    ("two runs", example(entry(b"f", field(2, field(1, f32(0.5)) + field(1, f32(1.0)))),
                         entry(b"k", field(3, field(1, varint(7)))), entry(b"vec", field(2, field(1, f32(1.0) * 3))))),
])
def test_entries_framed_alike_take_one_comparison_and_odd_ones_the_general_path(monkeypatch, odd_one):
    records = [_alike_record(i) for i in range(40)]
    if odd_one is not None:
        records[17] = odd_one[1]
    if odd_one is None or odd_one[0] == "value":
        calls = []
        original = columnar_decode._Walk._entries_from_windows
        monkeypatch.setattr(columnar_decode._Walk, "_entries_from_windows",
                            lambda self, *args: calls.append(1) or original(self, *args))
        assert_matches_oracle(records)
        assert len(calls) == (0 if odd_one is None else 1)  # only the step of the odd value leaves the short path
        monkeypatch.undo()
    if odd_one is not None and odd_one[0] == "kind":
        with pytest.raises(ArrowConversionError, match="feature 'f'"):
            examples_to_record_batch(records)
        return
    assert_matches_oracle(records)
    assert_paths_agree(records)


def test_one_byte_varint_runs_with_a_continuation_bit_are_malformed():
    """A packed int64 run of one byte >= 0x80 is a cut varint, in a batch of 1-byte values too."""
    good = [example(entry(b"k", field(3, field(1, varint(n))))) for n in range(100)]
    cut = example(entry(b"k", field(3, field(1, b"\x81"))))
    with pytest.raises(ExampleDecodeError):
        decode_example(cut)
    for exact_only in (False, True):
        with pytest.raises(ExampleDecodeError, match="record 100: malformed"):
            columnar_decode._to_record_batch(good + [cut], None, exact_only)
    assert examples_to_record_batch(good).column("k").to_pylist() == [[n] for n in range(100)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 39), max_size=3), st.data())
def test_damage_to_entries_framed_alike_is_found_as_on_the_exact_path(damaged, data):
    """Bytes flipped in some records of a batch framed alike: the same values, or the same error, as record by record."""
    records = [bytearray(_alike_record(i)) for i in range(40)]
    for index in damaged:
        at = data.draw(st.integers(0, len(records[index]) - 1))
        records[index][at] ^= data.draw(st.integers(1, 255))
    records = [bytes(record) for record in records]
    try:
        expected = [decode_example(record, kinds=True) for record in records]
    except ExampleDecodeError:
        expected = None
    assume(expected is None or consistent(records))
    for exact_only in (False, True):
        if expected is None:
            with pytest.raises(ExampleDecodeError, match="malformed"):
                columnar_decode._to_record_batch(records, None, exact_only)
        else:
            assert_matches_oracle(records, columnar_decode._to_record_batch(records, None, exact_only))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(wire_records(), features().map(canonical)), min_size=1, max_size=8), st.data())
def test_spans_in_a_buffer_with_other_bytes_around_decode_as_the_records(records, data):
    """(buffer, starts, ends): garbage between and after the records (fewer or more than the
    decoder's padding, so read in place or copied) changes nothing."""
    assume(consistent(records))
    buffer, starts, ends = bytearray(data.draw(st.binary(max_size=40))), [], []
    for record in records:
        starts.append(len(buffer))
        buffer += record
        ends.append(len(buffer))
        buffer += data.draw(st.one_of(st.binary(max_size=20), st.just(b"\xff" * 400)))
    spans = (np.frombuffer(bytes(buffer), dtype=np.uint8), np.array(starts, np.int64), np.array(ends, np.int64))
    try:
        want = examples_to_record_batch(records)
    except ExampleDecodeError as exc:
        with pytest.raises(ExampleDecodeError) as got:
            examples_to_record_batch(spans)
        assert str(got.value) == str(exc)
    else:
        got = examples_to_record_batch(spans)
        assert got.schema == want.schema
        assert all(
            got.column(i).equals(want.column(i)) or _same_bits(got.column(i), want.column(i)) for i in range(want.num_columns)
        )


def test_span_input_is_checked():
    data = np.zeros(10, dtype=np.uint8)
    with pytest.raises(ExampleDecodeError, match="differ in number"):
        examples_to_record_batch((data, np.array([0, 1]), np.array([1])))
    with pytest.raises(ExampleDecodeError, match="within the 10-byte buffer"):
        examples_to_record_batch((data, np.array([4]), np.array([11])))
    with pytest.raises(ExampleDecodeError, match="start <= end"):
        examples_to_record_batch((data, np.array([4]), np.array([3])))


# ---------------------------------------------------------------------- TensorFlow's vectors


def test_tf_vector_examples_decode_and_match_tensorflow(tf_vectors):
    records = list(read_records(str(tf_vectors / "examples.tfrecord")))
    expected = json.loads((tf_vectors / "examples.json").read_text())["examples"]
    batch = assert_matches_oracle(records[:19])
    assert fast_path_records(records[:19]).all()
    columns = batch.to_pydict()
    for index in (0, 3, 4, 6, 7, 8, 9, 10, 15, 16, 18):
        for feature in expected[index]["features"]:
            got = columns[feature["name"]][index]
            if feature["kind"] == "int64_list":
                assert got == feature["values"]
            elif feature["kind"] == "float_list":
                bits = batch.column(feature["name"])[index].values.to_numpy(zero_copy_only=False).view(np.uint32)
                assert [f"{b:#010x}" for b in bits] == feature["values_f32_bits"]
            elif feature["kind"] == "bytes_list" and feature.get("values_b64") is not None:
                assert got == [base64.b64decode(v) for v in feature["values_b64"]]
    assert columns["nokind"][2] == []
    assert hashlib.sha256(columns["large"][11][0]).hexdigest() == expected[11]["features"][1]["values_sha256"][0]
    assert sum(name.startswith("k0") and columns[name][12] is not None for name in columns) == 1000
    assert columns["k0999"][12] == [999, -999]
    assert all(columns[name][13] is None and columns[name][14] is None for name in columns)


def test_tf_vector_benchmark_row_with_its_schema(tf_vectors):
    record = list(read_records(str(tf_vectors / "examples.tfrecord")))[19]
    schema = pa.schema([pa.field(f"i{j}", pa.int64()) for j in range(8)] + [pa.field(f"f{j}", pa.float32()) for j in range(8)]
                       + [pa.field("s0", pa.string()), pa.field("s1", pa.string()),
                          pa.field("emb", pa.list_(pa.float32(), 16)), pa.field("n0", pa.int64())])
    row = examples_to_record_batch([record], schema=schema).to_pylist()[0]
    assert row["i3"] == 2708660121019638208 and row["n0"] == 697 and row["s0"] == "egltktvgg"
    assert np.float32(row["f3"]).view(np.uint32) == 0xC4F6903B and len(row["emb"]) == 16


def test_tf_wire_vectors_follow_protobuf_and_keep_nan_bits(tf_vectors):
    records = list(read_records(str(tf_vectors / "examples_wire.tfrecord")))
    for record in records:  # one per record: they reuse names with different kinds
        assert_matches_oracle([record])
        assert_paths_agree([record])
    nan_batch = examples_to_record_batch([records[3]])
    bits = nan_batch.column(0)[0].values.to_numpy(zero_copy_only=False).view(np.uint32)
    assert [hex(b) for b in bits] == ["0x7fc00001", "0xffc00000", "0x7f800001", "0x7fffffff"]


def test_protobuf_itself_agrees_on_a_batch():
    message = example_pb2.Example()
    message.features.feature["a"].int64_list.value.extend([1, -(2**63)])
    message.features.feature["b"].float_list.value.extend([0.5])
    message.features.feature["c"].bytes_list.value.extend([b"", b"q"])
    record = message.SerializeToString()
    assert examples_to_record_batch([record]).to_pydict() == {"a": [[1, -(2**63)]], "b": [[0.5]], "c": [[b"", b"q"]]}


def _names_sharing_a_hash() -> tuple[str, str]:
    """Two printable 16-byte names to which the lockstep walk's 64-bit name hash gives one value.

    ``_Walk._hash_names`` mixes each 8-byte word in as ``xorshift29((digest ^ word) * C)``; picking the second
    name's first word fixes its second word (the one that makes ``digest ^ word`` equal), until that is printable.
    """
    mask = 2**64 - 1

    def mix(digest: int, word: bytes) -> int:
        digest = ((digest ^ int.from_bytes(word, "little")) * 0xFF51AFD7ED558CCD) & mask
        return digest ^ (digest >> 29)

    start = (16 * 0x9E3779B97F4A7C15) & mask
    first, second = b"feature_", b"number_1"
    before_second = mix(start, first) ^ int.from_bytes(second, "little")
    for n in range(1_000_000):
        other_first = b"f%07d" % n
        other_second = (mix(start, other_first) ^ before_second).to_bytes(8, "little")
        if all(0x20 <= byte < 0x7F for byte in other_second):
            return (first + second).decode(), (other_first + other_second).decode()
    raise AssertionError("no printable name shares the hash")


def test_long_names_whose_hashes_collide_are_still_told_apart():
    one, other = _names_sharing_a_hash()
    records = [encode_example({one: [i], "z": [float(i)]}) for i in range(4)]
    records.append(encode_example({other: [7], "z": [9.0]}))
    walk = columnar_decode._Walk(wire.RecordBuffer.from_input(records), None)
    found = bytes(walk.buf)
    hashes = walk._hash_names(np.array([found.find(name.encode()) for name in (one, other)]), np.array([16, 16]))
    assert hashes[0] == hashes[1]  # the names really collide (else _names_sharing_a_hash must follow the hash)
    assert fast_path_records(records).all()
    batch = assert_matches_oracle(records)
    assert batch.column(one).to_pylist() == [[0], [1], [2], [3], None]
    assert batch.column(other).to_pylist() == [None] * 4 + [[7]]


@pytest.mark.parametrize("count", [1, 2, 5])
def test_gather_cuts_exact_spans_of_every_width(count):
    rng = np.random.default_rng(count)
    buf = rng.integers(0, 256, 4000, dtype=np.uint8)
    buf[-wire.PAD :] = 0
    for width in range(20):
        for lengths in (np.full(count, width), rng.integers(0, width + 1, count), np.r_[np.full(count - 1, 1), 600]):
            # anywhere, and ending within a few bytes of the buffer's end (windows would run past it)
            for starts in (rng.integers(0, 3000, count), buf.size - lengths - rng.integers(0, 3, count)):
                got = wire.gather(buf, starts, lengths)
                assert got.flags.c_contiguous
                assert got.tobytes() == b"".join(buf[s : s + n].tobytes() for s, n in zip(starts, lengths))


# ------------------------------------------------------------------------ encoder round trip


def _as_float32(values):
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes ±inf, as written
        return [None if v is None else float(np.float32(v)) for v in values]


def test_benchmark_table_round_trips_through_the_encoder():
    table = make_benchmark_table(3000, seed=5)
    encoded = encode_record_batch(table)
    assert fast_path_records(encoded).all()
    batch = examples_to_record_batch(encoded, schema=table.schema)
    assert batch.schema == table.schema
    for name in table.column_names:
        want = table.column(name).to_pylist()
        if name.startswith("f"):  # float64 columns are written as float32
            want = _as_float32(want)
        assert batch.column(name).to_pylist() == want, name
    inferred = examples_to_record_batch(encoded)
    assert inferred.schema.names == sorted(table.column_names)
    assert inferred.column("n0").null_count == table.column("n0").null_count
    assert_paths_agree(record_batch_to_examples(table.slice(0, 200)), table.schema)


def _column(draw, arrow_type, size):
    """A random column of ``arrow_type`` the encoder accepts (nulls only at the top level)."""
    value_type = getattr(arrow_type, "value_type", None)
    is_list = any(check(arrow_type) for check in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
                                                   pa.types.is_list_view, pa.types.is_large_list_view))
    element = value_type if is_list else arrow_type
    if pa.types.is_dictionary(element):
        element = element.value_type
    if pa.types.is_boolean(element):
        values = st.booleans()
    elif pa.types.is_unsigned_integer(element):  # int64_list holds uint64 values up to 2**63 - 1
        values = st.integers(0, min(2**element.bit_width - 1, 2**63 - 1))
    elif pa.types.is_integer(element):
        values = st.integers(-(2 ** (element.bit_width - 1)), 2 ** (element.bit_width - 1) - 1)
    elif pa.types.is_floating(element):
        values = st.floats(width=16 if element.bit_width == 16 else 64, allow_nan=False)
    elif pa.types.is_fixed_size_binary(element):
        values = st.binary(min_size=element.byte_width, max_size=element.byte_width)
    elif pa.types.is_string(element) or pa.types.is_large_string(element) or pa.types.is_string_view(element):
        values = st.text(max_size=6)
    else:
        values = st.binary(max_size=6)
    if is_list:
        size_of = arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None
        values = st.lists(values, min_size=size_of or 0, max_size=size_of or 4)
    rows = draw(st.lists(st.one_of(st.none(), values), min_size=size, max_size=size))
    return pa.array(rows, type=arrow_type)


ROUND_TRIP_TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(), pa.bool_(),
    pa.float16(), pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
    pa.string_view(), pa.binary_view(), pa.binary(3), pa.dictionary(pa.int8(), pa.string()),
    pa.list_(pa.int32()), pa.large_list(pa.float32()), pa.list_(pa.int64(), 2), pa.list_(pa.string()),
    pa.list_view(pa.binary()), pa.large_list_view(pa.uint8()), pa.list_(pa.float64()), pa.list_(pa.bool_()),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_type_the_encoder_takes_round_trips(data):
    size = data.draw(st.integers(0, 6))
    types = data.draw(st.lists(st.sampled_from(ROUND_TRIP_TYPES), min_size=1, max_size=5))
    batch = pa.RecordBatch.from_arrays([_column(data.draw, t, size) for t in types],
                                       names=[f"c{i}" for i in range(len(types))])
    decoded = examples_to_record_batch(record_batch_to_examples(batch), schema=batch.schema)
    assert decoded.schema == batch.schema
    for name, arrow_type in zip(batch.schema.names, types):
        want = batch.column(name).to_pylist()
        if arrow_type in (pa.float64(), pa.list_(pa.float64())):
            want = [None if v is None else (_as_float32(v) if isinstance(v, list) else _as_float32([v])[0]) for v in want]
        assert decoded.column(name).to_pylist() == want, (name, arrow_type)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(wire_records(), features().map(canonical)), min_size=1, max_size=12), st.integers(1, 4))
def test_chunked_decoding_matches_the_oracle_and_names_batch_indexes(records, chunk):
    assume(consistent(records))
    original = columnar_decode._CHUNK_RECORDS
    columnar_decode._CHUNK_RECORDS = chunk
    try:
        assert_matches_oracle(records)
        with pytest.raises(ExampleDecodeError, match=rf"^record {len(records)}: malformed"):
            examples_to_record_batch(records + [b"\x0e"])
    finally:
        columnar_decode._CHUNK_RECORDS = original


def test_short_entries_at_the_buffer_end_next_to_very_long_ones():
    long_name = "n" * 700
    records = [encode_example({long_name: [1], "v": [b"x" * 600] * 3}), encode_example({"ab": [2], "v": [b"y" * 590]}),
               encode_example({"ab": [3], "v": b"z"})]
    for order in (records, records[::-1]):
        batch = assert_matches_oracle(order)
        assert_paths_agree(order)
        assert batch.num_rows == 3
    spans = np.array([0, 5000]), np.array([700, 3])
    buf = np.zeros(5003 + wire.PAD, dtype=np.uint8)
    assert wire.gather(buf, *spans).size == 703
