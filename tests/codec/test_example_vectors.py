"""The Example codec against files TensorFlow 2.21 wrote (tests/data/tf-vectors).

Every record decodes to exactly what the JSON says (floats by float32 bit pattern, bytes by base64
or sha256, a Feature with no kind as kind None / []), and every examples.tfrecord record
re-encodes to the very bytes TF wrote, except record 13 (a 0-byte ``Example()``), which we
encode as ``0a 00``: an Example whose features field is present and empty, decoded identically.

examples_wire.tfrecord holds hand-made encodings. We decode them by protobuf's rules (the JSON's
protobuf column); TF's C++ parser (``tf.io.parse_single_example``) differs case by case:

- record 2, int64 list of packed [1, 2] + unpacked 3 + packed [4]: protobuf (and we) give
  [1, 2, 3, 4]; TF gives [1, 2], silently dropping the later runs.
- record 3, float32 NaN bit patterns 7fc00001 ffc00000 7f800001 7fffffff: protobuf (and we) widen
  to Python floats, which quiets the signalling NaN 7f800001 to 7fc00001; TF keeps all four exactly.
- record 7, one Feature with int64_list [5] then float_list [1.0]: protobuf (and we) keep the last
  kind (float [1.0]); TF keeps the first (int64 [5]).
- record 9, an unknown field inside Features: protobuf (and we) ignore it; TF fails with
  "Could not parse example input".
- record 10, an unknown field inside a Feature: protobuf (and we) ignore it; TF fails with
  "Unsupported datatype.".
In records 0, 1, 4, 5, 6 and 8 (unpacked runs, duplicate names: last wins, a split Features
field, an unknown field at the Example level) TF and protobuf agree, and so do we.

Framing is tested in test_records.py; here the files are only read through ``read_records``.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from tests.helpers import float32_bits as _f32_bits, with_float32_bits as _bits
from tfrbeam.codec.example import (
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
)
from tfrbeam.tfrecord.records import read_records

_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64", None: None}

# examples_wire records where TF's parser and protobuf disagree; see the module docstring.
_TF_DIFFERS = {2, 3, 7, 9, 10}


def _load(tf_vectors, name: str) -> dict:
    return json.loads((tf_vectors / name).read_text(encoding="utf-8"))


def _assert_values(kind: str | None, values: list, expected: dict, where: str) -> None:
    """values (as decoded) equal the JSON's description of one Feature (or one step)."""
    assert kind == _KIND_NAMES[expected["kind"]], where
    if expected["kind"] is None:
        assert values == [], where
    elif expected["kind"] == "int64_list":
        assert values == expected["values"], where
        assert all(type(v) is int for v in values), where
    elif expected["kind"] == "float_list":
        assert [_f32_bits(v) for v in values] == expected["values_f32_bits"], where
        assert all(type(v) is float for v in values), where
    else:
        assert all(type(v) is bytes for v in values), where
        if expected.get("values_b64") is not None:
            assert values == [base64.b64decode(v) for v in expected["values_b64"]], where
        else:
            assert [hashlib.sha256(v).hexdigest() for v in values] == expected["values_sha256"], where
            assert [len(v) for v in values] == expected["values_len"], where


def _assert_features(decoded: dict, expected: list[dict], where: str) -> None:
    assert list(decoded) == [f["name"] for f in expected], where
    assert list(decoded) == sorted(decoded, key=lambda name: name.encode("utf-8")), where
    for feature in expected:
        assert feature["name"].encode("utf-8").hex() == feature["name_utf8_hex"]
        kind, values = decoded[feature["name"]]
        _assert_values(kind, values, feature, f"{where} feature {feature['name']!r}")


def _split(decoded_with_kinds: dict) -> tuple[dict, dict]:
    """decode_example(kinds=True) output as (values, kinds), the arguments of encode_example."""
    values = {name: values for name, (_, values) in decoded_with_kinds.items()}
    kinds = {name: kind for name, (kind, _) in decoded_with_kinds.items()}
    return values, kinds


@pytest.fixture(scope="module")
def example_records(tf_vectors) -> list[bytes]:
    return list(read_records(tf_vectors / "examples.tfrecord"))


@pytest.mark.parametrize("file_name", ["examples.tfrecord", "examples.tfrecord.gz"])
def test_every_tf_example_decodes_to_what_the_json_says(tf_vectors, file_name):
    expected = _load(tf_vectors, "examples.json")["examples"]
    records = list(read_records(tf_vectors / file_name))
    assert len(records) == len(expected) == 20
    for record, case in zip(records, expected):
        where = f"{file_name} record {case['index']} ({case['description']})"
        assert hashlib.sha256(record).hexdigest() == case["record_sha256"], where
        decoded = decode_example(record, kinds=True)
        _assert_features(decoded, case["features"], where)
        assert _bits(decode_example(record)) == _bits({name: values for name, (_, values) in decoded.items()}), where


def test_tf_parse_example_agrees_with_our_decoding_of_tf_written_records(example_records, tf_vectors):
    expected = _load(tf_vectors, "examples.json")["examples"]
    for record, case in zip(example_records, expected):
        decoded = decode_example(record, kinds=True)
        for feature in case["features"]:
            if "tf_parse_example" not in feature:  # left out for the 1000-feature record
                continue
            kind, values = decoded[feature["name"]]
            for tf_kind, tf_values in feature["tf_parse_example"].items():
                if kind is None:  # TF gives an empty list of every dtype for a Feature with no kind
                    assert tf_values == [], (case["index"], feature["name"])
                else:
                    _assert_tf_values(tf_kind, tf_values, values, f"record {case['index']} {feature['name']!r}")


def _assert_tf_values(tf_kind: str, tf_values: list, values: list, where: str) -> None:
    if tf_kind == "float_list":
        assert [_f32_bits(v) for v in values] == tf_values, where
    elif tf_kind == "int64_list":
        assert values == tf_values, where
    else:
        expected = [v if isinstance(v, dict) else base64.b64decode(v) for v in tf_values]
        got = [{"length": len(v), "sha256": hashlib.sha256(v).hexdigest()} if isinstance(e, dict) else v
               for v, e in zip(values, expected)]
        assert got == expected, where


def test_every_tf_example_reencodes_to_the_bytes_tf_wrote(example_records, tf_vectors):
    expected = _load(tf_vectors, "examples.json")["examples"]
    for record, case in zip(example_records, expected):
        if case["index"] == 13:
            continue  # the 0-byte Example(); see test_an_example_with_no_features_field_encodes_as_0a00
        values, kinds = _split(decode_example(record, kinds=True))
        assert encode_example(values, kinds) == record, case["description"]
        if all(values.values()):  # no empty list and no kind-less Feature: kinds are not needed
            assert encode_example(values) == record, case["description"]


def test_an_example_with_no_features_field_encodes_as_0a00(example_records, tf_vectors):
    """Record 13 is TF's Example() (0 bytes); we always write the features field, so {} → 0a 00."""
    case = _load(tf_vectors, "examples.json")["examples"][13]
    assert case["has_features_field"] is False
    record = example_records[13]
    assert record == b""
    assert decode_example(record) == {}
    assert encode_example(decode_example(record)) == b"\x0a\x00"
    assert encode_example(decode_example(record)) == example_records[14]  # TF's own "present but empty"
    assert decode_example(b"\x0a\x00") == decode_example(record)


def test_scalars_and_declared_kinds_reproduce_the_benchmark_row(example_records):
    """Record 19 (row 0 of the benchmark table), written from scalars as a tabular row would be."""
    values, kinds = _split(decode_example(example_records[19], kinds=True))
    row = {name: value if len(value) > 1 else value[0] for name, value in values.items()}
    assert encode_example(row) == example_records[19]
    assert encode_example(row, kinds) == example_records[19]
    assert encode_example(dict(reversed(list(row.items())))) == example_records[19]


def test_hand_encoded_wire_records_decode_by_protobuf_rules(tf_vectors):
    cases = _load(tf_vectors, "examples_wire.json")["examples"]
    records = list(read_records(tf_vectors / "examples_wire.tfrecord"))
    assert len(records) == len(cases) == 11
    for record, case in zip(records, cases):
        assert base64.b64decode(case["record_b64"]) == record
        where = f"examples_wire record {case['index']} ({case['description']})"
        _assert_features(decode_example(record, kinds=True), case["features"], where)


def test_where_tf_parser_differs_from_protobuf_we_follow_protobuf(tf_vectors):
    """Each documented difference holds, and in every other case TF agrees with our decoding."""
    cases = _load(tf_vectors, "examples_wire.json")["examples"]
    records = list(read_records(tf_vectors / "examples_wire.tfrecord"))
    ours = {case["index"]: decode_example(record, kinds=True) for record, case in zip(records, cases)}
    tf = {case["index"]: {f["name"]: f["tf_parse_example"] for f in case["features"]} for case in cases}

    assert ours[2]["mixed_i"] == ("int64", [1, 2, 3, 4])
    assert tf[2]["mixed_i"]["int64_list"] == [1, 2]

    assert [_f32_bits(v) for v in ours[3]["nan_bits"][1]] == ["0x7fc00001", "0xffc00000", "0x7fc00001", "0x7fffffff"]
    assert tf[3]["nan_bits"]["float_list"] == ["0x7fc00001", "0xffc00000", "0x7f800001", "0x7fffffff"]

    assert ours[7]["twokinds"] == ("float", [1.0])
    assert tf[7]["twokinds"]["int64_list"] == [5]
    assert "Data types don't match" in tf[7]["twokinds"]["float_list"]["error"]

    assert ours[9] == {"u": ("int64", [9])}
    assert all("Could not parse example input" in r["error"] for r in tf[9]["u"].values())
    assert ours[10] == {"u": ("int64", [9])}
    assert all("Unsupported datatype" in r["error"] for r in tf[10]["u"].values())

    for index in sorted(set(ours) - _TF_DIFFERS):
        for name, (kind, values) in ours[index].items():
            tf_values = tf[index][name][f"{kind}_list"]
            _assert_tf_values(f"{kind}_list", tf_values, values, f"examples_wire record {index} {name!r}")


def _assert_sequence(decoded: tuple[dict, dict], case: dict) -> None:
    context, feature_lists = decoded
    where = f"sequence record {case['index']} ({case['description']})"
    _assert_features(context, case["context"], where)
    assert list(feature_lists) == [f["name"] for f in case["feature_lists"]], where
    for feature_list in case["feature_lists"]:
        steps = feature_lists[feature_list["name"]]
        assert len(steps) == feature_list["num_steps"] == len(feature_list["steps"]), where
        for index, ((kind, values), expected) in enumerate(zip(steps, feature_list["steps"])):
            _assert_values(kind, values, expected, f"{where} list {feature_list['name']!r} step {index}")


def test_sequence_examples_decode_to_what_the_json_says(tf_vectors):
    cases = _load(tf_vectors, "sequence_examples.json")["sequence_examples"]
    records = list(read_records(tf_vectors / "sequence_examples.tfrecord"))
    assert len(records) == len(cases) == 5
    for record, case in zip(records, cases):
        assert base64.b64decode(case["record_b64"]) == record
        decoded = decode_sequence_example(record, kinds=True)
        _assert_sequence(decoded, case)
        context, feature_lists = decode_sequence_example(record)
        assert _bits(context) == _bits({name: values for name, (_, values) in decoded[0].items()})
        assert _bits(feature_lists) == _bits({name: [v for _, v in steps] for name, steps in decoded[1].items()})


def test_sequence_examples_reencode_canonically(tf_vectors):
    """Records with both fields re-encode exactly; for the others we add the absent field(s) empty."""
    cases = _load(tf_vectors, "sequence_examples.json")["sequence_examples"]
    records = list(read_records(tf_vectors / "sequence_examples.tfrecord"))
    for record, case in zip(records, cases):
        context, feature_lists = decode_sequence_example(record, kinds=True)
        encoded = encode_sequence_example(
            {name: values for name, (_, values) in context.items()},
            {name: [values for _, values in steps] for name, steps in feature_lists.items()},
            kinds={name: kind for name, (kind, _) in context.items()},
            feature_list_kinds={name: [kind for kind, _ in steps] for name, steps in feature_lists.items()},
        )
        expected = record
        if not case["has_context_field"]:
            expected = b"\x0a\x00" + expected
        if not case["has_feature_lists_field"]:
            expected = expected + b"\x12\x00"
        assert encoded == expected, case["description"]
        assert _bits(decode_sequence_example(encoded, kinds=True)) == _bits((context, feature_lists))
    assert [c["index"] for c in cases if c["has_context_field"] and c["has_feature_lists_field"]] == [0, 4]


def test_sequence_example_kinds_inferred_per_list_reproduce_tf_bytes(tf_vectors):
    """Record 0 (a ragged bytes list with an empty last step) needs no kinds at all."""
    record = next(iter(read_records(tf_vectors / "sequence_examples.tfrecord")))
    context, feature_lists = decode_sequence_example(record)
    assert feature_lists["tokens"][2] == []
    assert encode_sequence_example(context, feature_lists) == record
