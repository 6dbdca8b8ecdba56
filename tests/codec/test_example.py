"""Properties of the Example codec: canonical bytes equal protobuf's deterministic serialization of
the same values, decoding gives them back (narrowed to float32), output does not depend on the
process, bad values and malformed bytes raise our errors with the place named."""

from __future__ import annotations

import os
import pathlib
import random
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import tfrbeam.codec.example as example_module
from tests.helpers import with_float32_bits as _bits
from tfrbeam.codec.example import (
    INT64_MAX,
    INT64_MIN,
    KINDS,
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
    encode_varint,
    packed_varints,
)
from tfrbeam.codec.protos import example_pb2 as pb
from tfrbeam.errors import ExampleDecodeError, ExampleEncodeError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
UNDECLARED = object()

# ---------------------------------------------------------------------------------------------
# Reference: the same values through protobuf's generated classes
# ---------------------------------------------------------------------------------------------


def _narrow(values: list) -> list[float]:
    with np.errstate(all="ignore"):
        return np.array(values, dtype=np.float64).astype(np.float32).astype(np.float64).tolist()


def _reference_feature(kind: str | None, values: list) -> pb.Feature:
    feature = pb.Feature()
    if kind == "int64":
        feature.int64_list.SetInParent()
        feature.int64_list.value.extend(values)
    elif kind == "float":
        feature.float_list.SetInParent()
        feature.float_list.value.extend(values)
    elif kind == "bytes":
        feature.bytes_list.SetInParent()
        feature.bytes_list.value.extend(values)
    return feature


def _utf8_order(items) -> list:
    return sorted(items, key=lambda item: item[0].encode("utf-8"))


def _reference_features_field(reference: dict) -> bytes:
    """Field 1 holding the Features: every entry serialized by protobuf, entries in UTF-8 byte order.

    (Not protobuf's own map order: upb's deterministic order puts a name after every longer name
    it is a prefix of; see test_name_order_is_cpp_and_pure_python_protobufs_not_upbs_quirk.)"""
    body = b"".join(pb.Features(feature={name: _reference_feature(*kv)}).SerializeToString()
                    for name, kv in _utf8_order(reference.items()))
    return pb.BytesList(value=[body]).SerializeToString()  # BytesList.value is also field 1, length-delimited


def _reference_example(reference: dict) -> bytes:
    return _reference_features_field(reference)


def _expected_decoding(reference: dict) -> dict:
    return {name: (kind, _narrow(values) if kind == "float" else values)
            for name, (kind, values) in sorted(reference.items())}


def _protobuf_decoding(message_features) -> dict:
    out = {}
    for name in sorted(message_features):
        feature = message_features[name]
        which = feature.WhichOneof("kind")
        out[name] = ((which[:-5] if which != "bytes_list" else "bytes"), list(getattr(feature, which).value)) \
            if which else (None, [])
    return out


# ---------------------------------------------------------------------------------------------
# Strategies: (value, declared kind or UNDECLARED, reference kind, reference values)
# ---------------------------------------------------------------------------------------------

INT64S = st.integers(INT64_MIN, INT64_MAX)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)  # float64: subnormals, -0.0, beyond float32
NAMES = st.text(max_size=10)  # includes "", NUL and astral characters; never lone surrogates
TEXTS = st.one_of(st.binary(max_size=12), st.text(max_size=8))
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "float16", "float32",
          "float64", "S4", "U4", ">i4", ">f8"]


def _as_bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


@st.composite
def numpy_feature(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    if dtype == np.uint64:
        elements = st.integers(0, INT64_MAX)
    elif dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=True)
    elif dtype.kind == "U":  # no lone surrogates (no UTF-8 form: test_lone_surrogates_are_refused); numpy drops trailing NULs
        elements = st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=4)
    else:
        elements = None
    array = draw(hnp.arrays(dtype, shape, elements=elements))
    flat = array.ravel().tolist()
    if dtype.kind in "iub":
        flat = [int(v) for v in flat]
        if draw(st.booleans()):
            return array, "float", "float", flat
        return array, draw(st.sampled_from([UNDECLARED, "int64"])), "int64", flat
    if dtype.kind == "f":
        return array, draw(st.sampled_from([UNDECLARED, "float"])), "float", flat
    return array, draw(st.sampled_from([UNDECLARED, "bytes"])), "bytes", [_as_bytes(v) for v in flat]


@st.composite
def plain_feature(draw):
    form = draw(st.sampled_from(["int", "float", "bool", "text", "ints", "floats", "mixed", "texts", "empty",
                                 "nokind", "none", "tuple", "numpy_scalar"]))
    declare = draw(st.booleans())
    if form == "int":
        value = draw(INT64S)
        kind = draw(st.sampled_from(["int64", "float"])) if declare else UNDECLARED
        return value, kind, ("float" if kind == "float" else "int64"), [value]
    if form == "float":
        value = draw(FLOATS)
        return value, "float" if declare else UNDECLARED, "float", [value]
    if form == "bool":
        value = draw(st.booleans())
        return value, "int64" if declare else UNDECLARED, "int64", [int(value)]
    if form == "text":
        value = draw(TEXTS)
        return value, "bytes" if declare else UNDECLARED, "bytes", [_as_bytes(value)]
    if form in ("ints", "tuple"):
        values = draw(st.lists(INT64S, min_size=1, max_size=40))
        value = tuple(values) if form == "tuple" else values
        return value, "int64" if declare else UNDECLARED, "int64", values
    if form == "floats":
        values = draw(st.lists(FLOATS, min_size=1, max_size=40))
        return values, "float" if declare else UNDECLARED, "float", values
    if form == "mixed":  # ints and floats → float
        values = draw(st.lists(st.one_of(FLOATS, st.integers(-(2**70), 2**70)), min_size=1, max_size=20))
        assume(any(isinstance(v, float) for v in values) or declare)
        return values, "float" if declare else UNDECLARED, "float", values
    if form == "texts":
        values = draw(st.lists(TEXTS, min_size=1, max_size=10))
        return values, "bytes" if declare else UNDECLARED, "bytes", [_as_bytes(v) for v in values]
    if form == "empty":
        kind = draw(st.sampled_from(KINDS))
        return draw(st.sampled_from([[], ()])), kind, kind, []
    if form == "nokind":
        return [], None, None, []
    if form == "numpy_scalar":
        value = draw(st.one_of(st.integers(-128, 127).map(np.int8), FLOATS.map(np.float64),
                               st.floats(width=32).map(np.float32), st.booleans().map(np.bool_)))
        if isinstance(value, np.floating):
            return value, UNDECLARED, "float", [float(value)]
        return value, UNDECLARED, "int64", [int(value)]
    return None, UNDECLARED, "omitted", []


FEATURE = st.one_of(plain_feature(), numpy_feature())


def _split(drawn: dict) -> tuple[dict, dict | None, dict]:
    values = {name: d[0] for name, d in drawn.items()}
    kinds = {name: d[1] for name, d in drawn.items() if d[1] is not UNDECLARED}
    reference = {name: (d[2], d[3]) for name, d in drawn.items() if d[2] != "omitted"}
    return values, kinds or None, reference


# ---------------------------------------------------------------------------------------------
# Canonical encoding = protobuf's deterministic serialization; decoding inverts it
# ---------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(NAMES, FEATURE, max_size=12))
def test_encoding_is_protobufs_deterministic_serialization_and_decodes_back(drawn):
    values, kinds, reference = _split(drawn)
    encoded = encode_example(values, kinds)
    assert encoded == _reference_example(reference)
    assert _bits(decode_example(encoded, kinds=True)) == _bits(_expected_decoding(reference))
    assert _bits(decode_example(encoded)) == _bits({n: v for n, (_, v) in _expected_decoding(reference).items()})


def _random_row(seed: int) -> dict:
    """200-300 features of every plain kind, names with NUL, "" and non-ASCII (cheaper than hypothesis)."""
    rng = random.Random(seed)
    alphabet = ["a", "b", "\x00", "é", "\u4e2d", "\U0001f600", "_"]
    drawn = {}
    for _ in range(rng.randint(200, 300)):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        form = rng.randrange(5)
        if form == 0:
            values = [rng.randint(INT64_MIN, INT64_MAX) for _ in range(rng.randint(1, 3))]
            drawn[name] = (values if len(values) > 1 else values[0], UNDECLARED, "int64", values)
        elif form == 1:
            values = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(rng.randint(1, 3))]
            drawn[name] = (values, UNDECLARED, "float", values)
        elif form == 2:
            values = [rng.randbytes(rng.randint(0, 5)) for _ in range(rng.randint(1, 3))]
            drawn[name] = (values, UNDECLARED, "bytes", values)
        elif form == 3:
            kind = rng.choice(KINDS)
            drawn[name] = ([], kind, kind, [])
        else:
            drawn[name] = (None, UNDECLARED, "omitted", [])
    return drawn


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32))
def test_hundreds_of_features_encode_canonically(seed):
    drawn = _random_row(seed)
    values, kinds, reference = _split(drawn)
    encoded = encode_example(values, kinds)
    assert encoded == _reference_example(reference)
    assert list(decode_example(encoded)) == sorted(reference)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(NAMES, st.tuples(st.sampled_from(KINDS), st.lists(st.lists(INT64S, max_size=4), max_size=4)),
                       max_size=4),
       st.dictionaries(NAMES, plain_feature(), max_size=4))
def test_sequence_examples_encode_canonically_and_decode_back(lists, context_drawn):
    context, kinds, context_reference = _split(context_drawn)
    feature_lists, list_kinds, reference_entries = {}, {}, []
    for name, (kind, steps) in _utf8_order(lists.items()):
        typed = [[_as_bytes(str(v)) for v in step] if kind == "bytes" else step for step in steps]
        feature_lists[name] = typed
        list_kinds[name] = kind
        entry = pb.FeatureLists()
        entry.feature_list[name].feature.extend(_reference_feature(kind, step) for step in typed)
        reference_entries.append(entry.SerializeToString())
    body = b"".join(reference_entries)
    expected = _reference_features_field(context_reference) + b"\x12" + encode_varint(len(body)) + body
    encoded = encode_sequence_example(context, feature_lists, kinds, list_kinds)
    assert encoded == expected
    decoded_context, decoded_lists = decode_sequence_example(encoded, kinds=True)
    assert _bits(decoded_context) == _bits(_expected_decoding(context_reference))
    expected_lists = {name: [(list_kinds[name], _narrow(s) if list_kinds[name] == "float" else s) for s in steps]
                      for name, steps in sorted(feature_lists.items())}
    assert _bits(decoded_lists) == _bits(expected_lists)


def test_sequence_example_list_kinds_are_inferred_across_steps():
    encoded = encode_sequence_example({}, {"x": [[1], [], [2.5, 3]], "t": ["a", [], [b"b", "c"]]})
    _, lists = decode_sequence_example(encoded, kinds=True)
    assert lists == {"t": [("bytes", [b"a"]), ("bytes", []), ("bytes", [b"b", b"c"])],
                     "x": [("float", [1.0]), ("float", []), ("float", [2.5, 3.0])]}
    two_d = encode_sequence_example({}, {"m": np.arange(6).reshape(3, 2)})
    assert decode_sequence_example(two_d)[1] == {"m": [[0, 1], [2, 3], [4, 5]]}
    assert encode_sequence_example({}, {}) == b"\x0a\x00\x12\x00"
    objects = encode_sequence_example({}, {"o": [np.array([1, 2.5], dtype=object), range(2)]})
    assert decode_sequence_example(objects, kinds=True)[1] == {"o": [("float", [1.0, 2.5]), ("float", [0.0, 1.0])]}
    assert encode_sequence_example({}, {"gone": None, "empty": []}) == encode_sequence_example({}, {"empty": ()})


@pytest.mark.parametrize("steps, kinds, message", [
    ([[], []], None, "every step is empty"),
    ([[1], ["a"]], None, "steps mix kinds"),
    ([[1], None], None, "step 1 is None"),
    ("abc", None, "must be a sequence of steps"),
    ([[1.5]], "int64", "step 0: float value 1.5"),
    ([[1], [2]], ["int64"], "1 per-step kinds declared for 2 steps"),
    ([[1], [object()]], None, "step 1: unsupported value of type object at index 0"),
    ([[1]], ["int"], "is not a feature kind"),
])
def test_bad_feature_lists_are_rejected_with_the_list_named(steps, kinds, message):
    with pytest.raises(ExampleEncodeError, match=re.escape(message)) as info:
        encode_sequence_example({}, {"seq": steps}, feature_list_kinds=None if kinds is None else {"seq": kinds})
    assert "seq" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Value rules, one by one
# ---------------------------------------------------------------------------------------------


def _one(value, kind=UNDECLARED):
    kinds = None if kind is UNDECLARED else {"x": kind}
    return decode_example(encode_example({"x": value}, kinds), kinds=True)["x"]


def test_float64_is_narrowed_to_float32_like_numpy():
    assert _one(16777217.0) == ("float", [16777216.0])
    assert _one(0.1) == ("float", [float(np.float32(0.1))])
    assert _one([1e39, -1e300, 3.4028235e38, 3.4028235677973366e38]) == \
        ("float", [float("inf"), float("-inf"), 3.4028234663852886e38, float("inf")])  # the last is the exact tie
    assert _one(1e-45) == ("float", [2.0 ** -149])  # nearest float32 subnormal
    assert _one(5e-324) == ("float", [0.0])
    negative_zero = _one(-0.0)[1][0]
    assert negative_zero == 0.0 and struct.pack("<f", negative_zero) == b"\x00\x00\x00\x80"
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF4000000000123))[0]
    with np.errstate(all="ignore"):
        expected = np.array([payload_nan]).astype("<f4").tobytes()
    assert encode_example({"x": payload_nan}).endswith(expected)
    assert encode_example({"x": [payload_nan, 1.0]})[-8:-4] == expected


def test_ints_become_int64_and_bools_zero_or_one():
    assert _one([True, False, 2]) == ("int64", [1, 0, 2])
    assert _one(np.uint64(INT64_MAX)) == ("int64", [INT64_MAX])
    assert _one([INT64_MIN, -1, 0, 127, 128, 16383, 16384, INT64_MAX]) == \
        ("int64", [INT64_MIN, -1, 0, 127, 128, 16383, 16384, INT64_MAX])
    assert _one(np.array([[1, 2], [3, 4]], dtype=np.int16)) == ("int64", [1, 2, 3, 4])
    assert _one(np.asfortranarray(np.arange(6).reshape(2, 3))) == ("int64", [0, 1, 2, 3, 4, 5])  # C order
    assert _one(np.arange(-50, 50, dtype=">i8")) == ("int64", list(range(-50, 50)))


def test_ints_in_a_float_feature_round_via_float64_in_lists_and_arrays():
    big = 2**54 + 2**30 + 1  # direct int → float32 rounding would give 2**54 + 2**31
    assert _one([big], "float") == ("float", [float(2**54)])
    assert _one(np.array([big], dtype=np.int64), "float") == ("float", [float(2**54)])
    assert _one(np.array([big], dtype=np.uint64), "float") == ("float", [float(2**54)])


def test_text_values_are_utf8_and_bytes_like_values_are_bytes():
    assert _one(["é", b"\xff", bytearray(b"a"), memoryview(b"bc"), np.bytes_(b"d"), np.str_("ü")]) == \
        ("bytes", ["é".encode(), b"\xff", b"a", b"bc", b"d", "ü".encode()])
    assert _one(np.array(["ab", "ç"])) == ("bytes", [b"ab", "ç".encode()])
    assert _one(np.array([b"a\x00", b"b"], dtype="S3")) == ("bytes", [b"a", b"b"])  # numpy drops trailing NULs
    assert _one(np.array(["x", b"y"], dtype=object)) == ("bytes", [b"x", b"y"])


def test_none_omits_and_empty_values_follow_the_declared_or_dtype_kind():
    assert decode_example(encode_example({"a": None, "b": 1})) == {"b": [1]}
    assert encode_example({}) == b"\x0a\x00"
    assert encode_example({"a": None}) == b"\x0a\x00"
    assert _one([], "float") == ("float", [])
    assert _one(np.array([], dtype=np.int32)) == ("int64", [])
    assert _one(np.array([]), "int64") == ("int64", [])  # np.array([]) is float64; nothing contradicts int64
    assert _one(np.zeros((0, 3), dtype="U2")) == ("bytes", [])
    assert _one([], None) == (None, [])
    assert _one(np.array([], dtype=np.float32), None) == (None, [])


def test_other_sequences_are_lists_and_the_name_cache_stays_bounded(monkeypatch):
    assert _one(range(3)) == ("int64", [0, 1, 2])
    row = {f"n{i}": i for i in range(5)}
    expected = encode_example(row)
    monkeypatch.setattr(example_module, "_NAME_CACHE", {})
    monkeypatch.setattr(example_module, "_NAME_CACHE_LIMIT", 2)
    assert encode_example(row) == expected
    assert len(example_module._NAME_CACHE) <= 2


def test_kinds_for_absent_names_are_ignored_and_name_order_does_not_matter():
    kinds = {"zzz": "int64", "a": "float", "absent_and_misspelt": "integer"}  # checked only when used
    forward = encode_example({"a": 1, "b": [b"x"], "c": 2.5}, kinds)
    backward = encode_example({"c": 2.5, "b": [b"x"], "a": 1}, kinds)
    assert forward == backward
    assert decode_example(forward, kinds=True) == {"a": ("float", [1.0]), "b": ("bytes", [b"x"]), "c": ("float", [2.5])}


def test_names_sort_by_utf8_bytes():
    names = ["b", "a", "", "\x00", "é", "z", "\uffff", "\U0001f600", "A", "aa", "\u0800"]
    encoded = encode_example(dict.fromkeys(names, 1))
    assert list(decode_example(encoded)) == sorted(names, key=lambda n: n.encode("utf-8")) == sorted(names)
    assert encoded == _reference_example({n: ("int64", [1]) for n in names})


def _names_in_wire_order(example: bytes) -> list[str]:
    """Feature names in the order their entries appear (short test Examples: 1-byte lengths)."""
    names, pos = [], 2
    while pos < len(example):
        entry = example[pos + 2: pos + 2 + example[pos + 1]]
        names.append(entry[2: 2 + entry[1]].decode("utf-8"))
        pos += 2 + example[pos + 1]
    return names


_ORDER_SCRIPT = """
import sys
from tfrbeam.codec.protos import example_pb2 as pb
names = ["b", "a", "", "ab", "aa", "\\u00e9", "e", "\\x00", "z"]
message = pb.Example(features=pb.Features(feature={n: pb.Feature(int64_list=pb.Int64List(value=[1])) for n in names}))
sys.stdout.write(message.SerializeToString(deterministic=True).hex())
"""


def test_name_order_is_cpp_and_pure_python_protobufs_not_upbs_quirk():
    """docs/format.md: entries sorted by the names' UTF-8 bytes, as C++, Java and pure-Python protobuf sort
    them. upb (the default Python runtime) puts a name after every longer name it is a proper
    prefix of ("aa", "ab", "a", ...): a comparator quirk (protocolbuffers/protobuf#26621)."""
    names = ["b", "a", "", "ab", "aa", "é", "e", "\x00", "z"]
    ours = encode_example(dict.fromkeys(names, 1))
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python", PYTHONPATH=str(REPO_ROOT))
    pure_python = subprocess.run([sys.executable, "-c", _ORDER_SCRIPT], env=env, capture_output=True, text=True,
                                 check=True, cwd=REPO_ROOT).stdout
    assert bytes.fromhex(pure_python) == ours
    assert list(decode_example(ours)) == ["", "\x00", "a", "aa", "ab", "b", "e", "z", "é"]
    upb = pb.Example(features=pb.Features(feature={n: pb.Feature(int64_list=pb.Int64List(value=[1])) for n in names}))
    upb_order = _names_in_wire_order(upb.SerializeToString(deterministic=True))
    assert upb_order in (list(decode_example(ours)), ["\x00", "aa", "ab", "a", "b", "e", "z", "é", ""])
    # Names with no prefix relation: upb agrees byte for byte.
    no_prefixes = ["b", "a", "é", "\x00", "z", "ca"]
    upb = pb.Example(features=pb.Features(feature={n: pb.Feature(float_list=pb.FloatList(value=[0.5]))
                                                   for n in no_prefixes}))
    assert upb.SerializeToString(deterministic=True) == encode_example(dict.fromkeys(no_prefixes, 0.5))


def test_float_path_without_struct_matches_struct_path(monkeypatch):
    """CPython 3.14 changed struct's NaN handling; the numpy fallback must give the same bytes."""
    values = {"a": 0.1, "b": [1e39, -0.0, float("nan"), 5e-324, 2**70], "c": 1e300, "d": [1, 2.5]}
    with_struct = encode_example(values)
    monkeypatch.setattr(example_module, "_STRUCT_IS_NUMPY", False)
    assert encode_example(values) == with_struct


@settings(max_examples=200, deadline=None)
@given(st.lists(INT64S, max_size=60))
def test_varint_helpers_match_protobuf(values):
    expected = pb.Int64List(value=values).SerializeToString()
    payload = b"".join(encode_varint(v) for v in values)
    assert packed_varints(np.array(values, dtype=np.int64)) == payload
    if values:
        assert expected == b"\x0a" + encode_varint(len(payload)) + payload
    else:
        assert expected == b""


# ---------------------------------------------------------------------------------------------
# Determinism across processes
# ---------------------------------------------------------------------------------------------

_SUBPROCESS_SCRIPT = """
import sys
from tfrbeam.codec.example import encode_example
names = {f"feature_{i}_\\u00e9" for i in range(60)} | {"", "\\x00", "z"}
features = {name: [len(name), 0.5, -3] if len(name) % 2 else [name, b"x"] for name in names}
sys.stdout.write(",".join(list(features)[:5]) + "\\n" + encode_example(features).hex())
"""


def test_same_values_give_same_bytes_in_processes_with_different_hash_seeds():
    outputs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO_ROOT))
        done = subprocess.run([sys.executable, "-c", _SUBPROCESS_SCRIPT], env=env, capture_output=True, text=True,
                              check=True, cwd=REPO_ROOT)
        outputs.append(done.stdout.split("\n"))
    (order_1, bytes_1), (order_2, bytes_2) = outputs
    assert order_1 != order_2  # the dicts really were built in different orders
    assert bytes_1 == bytes_2


# ---------------------------------------------------------------------------------------------
# Encoding errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, kind, message", [
    (2**63, UNDECLARED, "above the int64 maximum"),
    (-(2**63) - 1, UNDECLARED, "below the int64 minimum"),
    ([1, 2**64], UNDECLARED, "above the int64 maximum"),
    (np.array([2**63], dtype=np.uint64), UNDECLARED, "uint64 value 9223372036854775808 is above"),
    (np.array([2**64 - 1], dtype=np.uint64), "int64", "above the int64 maximum"),
    ([10**400, 1.5], UNDECLARED, "too large for a float"),
    ([1, b"x"], UNDECLARED, "mixes text/bytes (index 1) with numbers"),
    (["a", 2.0], UNDECLARED, "mixes text/bytes (index 0) with numbers"),
    ([1, None], UNDECLARED, "None at index 1 inside a list"),
    ([], UNDECLARED, "kinds={name: 'int64' | 'float' | 'bytes'}"),
    (1.5, "int64", "float value 1.5 at index 0 for a feature declared int64"),
    ([1, 2.0], "int64", "float value 2.0 at index 1"),
    (np.array([1.0]), "int64", "floats are never cast to int"),
    ([1], "bytes", "int64 values for a feature declared 'bytes'"),
    ("a", "float", "bytes values for a feature declared 'float'"),
    (np.array(["a"]), "int64", "array for a feature declared 'int64'"),
    ([1], None, "declared with no kind (None)"),
    (5, None, "declared with no kind (None)"),
    ("", None, "declared with no kind (None)"),
    ({1, 2}, UNDECLARED, "unsupported value of type set"),
    ((v for v in [1]), UNDECLARED, "unsupported value of type generator"),
    ([object()], UNDECLARED, "unsupported value of type object at index 0"),
    (1 + 2j, UNDECLARED, "unsupported value of type complex"),
    (np.array([1 + 2j]), UNDECLARED, "dtype complex128 has no Example kind"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), UNDECLARED, "has no Example kind"),
    ("\ud800", UNDECLARED, "cannot be encoded as UTF-8"),
])
def test_bad_values_raise_with_the_feature_named(value, kind, message):
    kinds = None if kind is UNDECLARED else {"feat": kind}
    with pytest.raises(ExampleEncodeError, match=re.escape(message)) as info:
        encode_example({"ok": 1, "feat": value}, kinds)
    assert str(info.value).startswith("feature 'feat': ")


@pytest.mark.parametrize("features, kinds, message", [
    ({1: 2}, None, "feature name 1 is a int; names must be str"),
    ({"a": 1, b"b": 2}, None, "names must be str"),
    ({"\udc80": 1}, None, "is not valid Unicode text"),
    ([("a", 1)], None, "must be a mapping"),
    ({"a": 1}, {"a": "string"}, "kinds['a'] = 'string' is not a feature kind"),
    ({"a": 1}, {"a": "int64_list"}, "is not a feature kind"),
    ({"a": 1}, {"a": ["int64"]}, "is not a feature kind"),
    ({"a": 1}, ["int64"], "kinds must be a mapping"),
])
def test_bad_names_and_kinds_are_rejected(features, kinds, message):
    with pytest.raises(ExampleEncodeError, match=re.escape(message)):
        encode_example(features, kinds)


# ---------------------------------------------------------------------------------------------
# Decoding: protobuf's rules, and malformed bytes
# ---------------------------------------------------------------------------------------------


def _check_against_protobuf(blob: bytes, message_type=pb.Example) -> None:
    """decode agrees with protobuf when it accepts; otherwise ExampleDecodeError naming a byte,
    found by our wire walker (never the fallback), chained from protobuf's error."""
    decode = decode_example if message_type is pb.Example else decode_sequence_example
    walker = example_module._WireWalker(blob)
    walk = walker.example if message_type is pb.Example else walker.sequence_example
    try:
        message = message_type.FromString(blob)
    except (DecodeError, UnicodeDecodeError):  # the pure-Python runtime raises the latter for bad names
        message = None
    if message is None:
        with pytest.raises(ExampleDecodeError) as info:
            decode(blob)
        text = str(info.value)
        assert re.search(r"at byte \d+", text) and "protobuf rejected it" not in text, text
        assert isinstance(info.value.__cause__, (DecodeError, UnicodeDecodeError))
        with pytest.raises(example_module._WireProblem):
            walk(0, len(blob))
        return
    walk(0, len(blob))  # the walker is never stricter than protobuf
    if message_type is pb.Example:
        assert _bits(decode(blob, kinds=True)) == _bits(_protobuf_decoding(message.features.feature))
    else:
        decoded = decode(blob, kinds=True)
        assert _bits(decoded[0]) == _bits(_protobuf_decoding(message.context.feature))
        assert list(decoded[1]) == sorted(message.feature_lists.feature_list)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(NAMES, plain_feature(), max_size=4))
def test_every_truncation_decodes_as_protobuf_does_or_raises_our_error(drawn):
    values, kinds, _ = _split(drawn)
    encoded = encode_example(values, kinds)
    for cut in range(len(encoded)):
        _check_against_protobuf(encoded[:cut])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(NAMES, plain_feature(), max_size=4), st.data())
def test_corrupted_bytes_decode_as_protobuf_does_or_raise_our_error(drawn, data):
    values, kinds, _ = _split(drawn)
    blob = bytearray(encode_example(values, kinds))
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["set", "insert", "delete"]))
        position = data.draw(st.integers(0, len(blob)))
        if action == "insert":
            blob[position:position] = bytes([data.draw(st.integers(0, 255))])
        elif position < len(blob):
            if action == "set":
                blob[position] = data.draw(st.integers(0, 255))
            else:
                del blob[position]
    _check_against_protobuf(bytes(blob))


def _wire_fields(depth: int):
    """Random protobuf-shaped field sequences: known and unknown numbers, every wire type, groups."""
    numbers = st.sampled_from([1, 1, 2, 3, 15])
    scalar = st.one_of(
        st.tuples(numbers, st.just(0), st.integers(0, 2**64 - 1).map(lambda v: example_module._varint_slow(v))),
        st.tuples(numbers, st.just(5), st.binary(min_size=4, max_size=4)),
        st.tuples(numbers, st.just(1), st.binary(min_size=8, max_size=8)),
        st.tuples(numbers, st.just(2), st.binary(max_size=6)),
    )
    if depth == 0:
        return st.lists(scalar, max_size=3)
    nested = st.tuples(numbers, st.just(2), _wire_fields(depth - 1).map(_wire_bytes))
    group = st.tuples(st.just(15), st.just(3), _wire_fields(depth - 1).map(_wire_bytes))
    return st.lists(st.one_of(scalar, nested, group), max_size=4)


def _wire_bytes(fields) -> bytes:
    out = b""
    for number, wire_type, payload in fields:
        tag = example_module._varint_slow(number << 3 | wire_type)
        if wire_type == 2:
            out += tag + example_module._varint_slow(len(payload)) + payload
        elif wire_type == 3:
            out += tag + payload + example_module._varint_slow(number << 3 | 4)
        else:
            out += tag + payload
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_wire_fields(4).map(_wire_bytes), st.integers(0, 1000))
def test_random_wire_structures_are_judged_exactly_as_protobuf_judges_them(blob, cut):
    _check_against_protobuf(blob)
    _check_against_protobuf(blob[: cut % (len(blob) + 1)])
    _check_against_protobuf(blob, pb.SequenceExample)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=24))
def test_random_bytes_are_judged_exactly_as_protobuf_judges_them(blob):
    _check_against_protobuf(blob)
    _check_against_protobuf(blob, pb.SequenceExample)


@pytest.mark.parametrize("blob, message", [
    (bytes.fromhex("0f"), "wire type 7 (field 1) at byte 0"),
    (bytes.fromhex("0a0a0a080a017812031a01ff"), "truncated varint at byte 11 inside feature 'x' (int64_list)"),
    (bytes.fromhex("0a080a060a02c3281200"), "invalid UTF-8 in feature name (invalid continuation byte) at byte 6"),
    (bytes.fromhex("0a0b0a090a0178120412030a01"),
     "truncated: field 1 declares 1 bytes but only 0 remain in its enclosing message at byte 12 inside "
     "feature 'x' (float_list)"),
    (bytes.fromhex("0a0c0a0a0a017812051203" "0a0100"),
     "packed float list of 1 bytes (not a multiple of 4) at byte 13 inside feature 'x' (float_list)"),
    (bytes.fromhex("0a0d0a0b0a01781206" "1a04" "0a02" "ff"), "truncated varint at byte 13 inside feature 'x' (int64_list)"),
    (bytes.fromhex("0a030a017b"), "group of field 15 is never closed at byte 4 inside features > feature entry #0"),
    (bytes.fromhex("0a0e0a0c0a01781207" "0a05" "0a04" "00"), "inside feature 'x' (bytes_list)"),
    (bytes.fromhex("0a02" "0a"), "truncated varint at byte 3 inside features"),
    (bytes.fromhex("0a08" "0a030a0178"),
     "truncated: field 1 declares 8 bytes but only 5 remain in its enclosing message at byte 1"),
    (bytes.fromhex("08ffffffffffffffffffff01"), "varint longer than 10 bytes at byte 1"),
    (bytes.fromhex("00"), "field number 0 at byte 0"),
    (bytes.fromhex("0c"), "end-group tag of field 1 with no group open at byte 0"),
])
def test_malformed_bytes_are_described_precisely(blob, message):
    with pytest.raises(ExampleDecodeError, match=re.escape(message)) as info:
        decode_example(blob)
    assert str(info.value).startswith(f"malformed tf.train.Example ({len(blob)} bytes): ")
    assert isinstance(info.value.__cause__, DecodeError)


def _nested_groups(levels: int, inside_feature: bool) -> bytes:
    """Unknown group field 15 nested `levels` deep, at the Example level or inside a Feature."""
    groups = b"\x7b" * levels + b"\x7c" * levels
    if not inside_feature:
        return groups
    entry = b"\x0a\x01x\x12" + encode_varint(len(groups)) + groups
    features = b"\x0a" + encode_varint(len(entry)) + entry
    return b"\x0a" + encode_varint(len(features)) + features


@pytest.mark.parametrize("levels, inside_feature", [(100, False), (101, False), (97, True), (98, True)])
def test_group_nesting_limit_is_protobufs(levels, inside_feature):
    blob = _nested_groups(levels, inside_feature)
    _check_against_protobuf(blob)
    if levels in (101, 98):
        with pytest.raises(ExampleDecodeError, match="groups nested deeper than 100 levels"):
            decode_example(blob)


def test_an_undiagnosed_rejection_still_raises_our_error_with_protobufs_reason(monkeypatch):
    monkeypatch.setattr(example_module._WireWalker, "example", lambda self, pos, end: None)
    with pytest.raises(ExampleDecodeError, match=r"\(1 bytes\): protobuf rejected it \(DecodeError: ") as info:
        decode_example(b"\x0f")
    assert isinstance(info.value.__cause__, DecodeError)


def test_malformed_sequence_examples_name_the_list_and_step():
    good = encode_sequence_example({"c": 1}, {"seq": [[1], [2, 3]]})
    cut = good[:-1]
    with pytest.raises(ExampleDecodeError, match=r"inside feature list 'seq' \(step 1, int64_list\)"):
        decode_sequence_example(cut)
    broken_context = bytes.fromhex("0a080a060a01631201" "0f") + b"\x12\x00"
    with pytest.raises(ExampleDecodeError, match=re.escape("inside context feature 'c'")):
        decode_sequence_example(broken_context)


def test_decoding_follows_protobuf_rules_for_odd_but_valid_encodings():
    entry = lambda name, feature: b"\x0a" + bytes([len(name) + len(feature) + 4]) + b"\x0a" + bytes([len(name)]) \
        + name + b"\x12" + bytes([len(feature)]) + feature
    body = entry(b"a", bytes.fromhex("1a0408010802")) + entry(b"a", bytes.fromhex("0a030a0178")) \
        + entry(b"b", bytes.fromhex("1a030a0105" "12060a040000803f")) + entry(b"c", b"") + entry(b"d", b"\x78\x01")
    data = b"\x0a" + bytes([len(body)]) + body
    assert decode_example(data, kinds=True) == {
        "a": ("bytes", [b"x"]),  # duplicate name: last entry wins
        "b": ("float", [1.0]),  # two kinds in one Feature: last wins
        "c": (None, []),  # no kind set
        "d": (None, []),  # only an unknown field
    }
    assert decode_example(bytearray(data)) == decode_example(memoryview(data)) == decode_example(data)
    with pytest.raises(ExampleDecodeError, match="must be bytes, got str"):
        decode_example("not bytes")


def test_lone_surrogates_are_refused():
    """Text with a lone surrogate has no UTF-8 form: a clear error naming the feature, as a list or a numpy array."""
    for value in (["ok", "\ud800"], np.array(["ok", "\udfff"])):
        with pytest.raises(ExampleEncodeError, match=r"feature 'a': text '\\ud[8f]\w\w' cannot be encoded as UTF-8"):
            encode_example({"a": value})
