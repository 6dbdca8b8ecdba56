"""tf.train.Example / SequenceExample codec without TensorFlow: a hand-written canonical encoder
and a protobuf (upb) decoder with precise error messages.

Encoding is canonical (docs/format.md, "Deterministic bytes"): the bytes are exactly protobuf's
``SerializeToString(deterministic=True)`` of the same Example built with our generated classes,
with feature map entries sorted by the name's UTF-8 bytes, so the same values always give the same
bytes, in any process, whatever PYTHONHASHSEED or dict insertion order. That is the order of C++,
Java and pure-Python protobuf; upb (Python's default runtime) has a comparator quirk that puts a
name after every longer name it is a proper prefix of ("ab" before "a"), so only for such names
do its bytes differ from ours (protocolbuffers/protobuf#26621). A message is not built per call:
that is slower, and protobuf's non-deterministic map order differs between processes.

Value rules (what ``encode_example`` accepts for one feature):

- ``None`` omits the feature from the Example.
- int / bool / numpy integer or bool → int64 (bool → 0/1). Values outside int64 (a Python int
  >= 2**63 or < -2**63, a uint64 above 2**63-1) raise ExampleEncodeError.
- float / numpy floating → float32, narrowed from float64 with IEEE round-to-nearest-even as
  numpy's ``astype(np.float32)`` does: a finite float64 beyond float32's range becomes ±inf,
  NaN payloads are kept as numpy keeps them (the sign and top payload bits; the NaN is quieted).
  So a decoded float is the float32 value widened to a Python float, not the float64 you wrote.
- bytes / bytearray / memoryview / numpy bytes → bytes; str / numpy str → its UTF-8 bytes.
- A list, tuple or other sequence holds several values of one kind; ints mixed with floats make a
  float feature; text mixed with numbers, or a None inside a list, raise ExampleEncodeError.
- A numpy array is flattened in C (row-major) order, the order TF reads it back in; its kind
  comes from its dtype (integer/bool → int64, floating → float, S/U → bytes, object → as a list;
  fixed-width S values lose trailing NUL bytes, as numpy's own ``tolist()`` gives them).
- An int stored in a float feature is rounded as Python stores it: int → float64 → float32.
- An empty list/tuple/array gives the feature with an empty list of its declared kind, or of the
  kind a numpy dtype implies; an empty plain list with no declared kind raises
  ExampleEncodeError asking for ``kinds={name: "int64" | "float" | "bytes"}``.

``kinds`` declares a kind per feature name. Values are checked against it, never silently cast:
a float value for an int64 feature is an error, an int value for a float feature is fine. A kind
of ``None`` declares a Feature with no kind set (what TF writes for an empty ``Feature()``); its
value must be empty. ``decode_example(data, kinds=True)`` returns the same kind names, so
``encode_example(values, kinds)`` rebuilds the record byte for byte. The one exception is a
0-byte record (``Example()`` with no features field), which we re-encode as ``0a 00`` — an
Example whose features field is present and empty, equal under every parser.

Decoding follows protobuf's rules (we parse with the generated classes):
packed and unpacked int64/float lists both decode, a list mixing packed and unpacked runs is
concatenated, a duplicated feature name keeps its last entry, a Feature with two kinds keeps the
last one, a Features field split into several chunks is merged, unknown fields are ignored, and a
Feature with no kind set decodes to ``[]`` (kind ``None``). TensorFlow's C++ parser
(``tf.io.parse_example``) differs in these cases, as TF 2.21 showed on hand-made vectors:

- int64 list of packed [1, 2], then unpacked 3, then packed [4]: protobuf (and we) give
  [1, 2, 3, 4]; TF gives [1, 2] and silently drops the later runs.
- float32 signalling NaN bits 7f800001: protobuf's Python floats quiet it to 7fc00001 (as we do);
  TF keeps all NaN bit patterns exactly.
- a Feature with int64_list [5] and then float_list [1.0]: protobuf keeps the last (float
  [1.0]); TF keeps the first (int64 [5]) and refuses to read it as float.
- an unknown field inside Features: protobuf ignores it; TF fails "Could not parse example input".
- an unknown field inside a Feature: protobuf ignores it; TF fails "Unsupported datatype.".
Unknown fields at the Example level, duplicate names and split Features agree with TF.

Decoding uses whichever protobuf runtime is installed; the default (upb) is what the above and
our tests describe. Under the rare pure-Python runtime (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=
python) protobuf itself decodes every float32 NaN as the one canonical NaN and allows less nesting
of unknown groups. Encoding never uses protobuf and is the same everywhere.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from tfrbeam.codec.kinds import BYTES, FLOAT, INT64, WIRE_TAGS
from tfrbeam.codec.protos import example_pb2
from tfrbeam.errors import ExampleDecodeError, ExampleEncodeError

__all__ = [
    "BYTES",
    "FLOAT",
    "INT64",
    "INT64_MAX",
    "INT64_MIN",
    "KINDS",
    "decode_example",
    "decode_sequence_example",
    "encode_example",
    "encode_sequence_example",
    "encode_varint",
    "packed_varints",
]

KINDS: tuple[str, ...] = (BYTES, FLOAT, INT64)

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_UNDECLARED = object()  # kinds.get() default: no declaration for this name (None means "no kind")

# Feature field tags (Feature.oneof kind) and the one-field tag shared by every list and map entry.
_FEATURE_TAG = {kind: bytes((tag,)) for kind, tag in WIRE_TAGS.items()}
_FIELD1 = b"\x0a"
_FIELD2 = b"\x12"

# ---------------------------------------------------------------------------------------------
# Varints
# ---------------------------------------------------------------------------------------------


def _varint_slow(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINT_TABLE_SIZE = 1 << 14  # every 1- and 2-byte varint, precomputed: lengths and small ints
_VARINTS: tuple[bytes, ...] = tuple(_varint_slow(i) for i in range(_VARINT_TABLE_SIZE))


def _uvarint(value: int) -> bytes:
    """Varint of a non-negative int (lengths), from the table when small."""
    if value < _VARINT_TABLE_SIZE:
        return _VARINTS[value]
    return _varint_slow(value)


class _BadValue(ExampleEncodeError):
    """A value problem found below encode_example; re-raised as ExampleEncodeError with the name."""


def encode_varint(value: int) -> bytes:
    """The protobuf int64 varint of ``value`` (negative → 10-byte two's complement)."""
    if 0 <= value < _VARINT_TABLE_SIZE:
        return _VARINTS[value]
    if value < 0:
        if value < INT64_MIN:
            raise _BadValue(f"{value} is below the int64 minimum {INT64_MIN}")
        return _varint_slow(value + (1 << 64))
    if value > INT64_MAX:
        raise _BadValue(f"{value} is above the int64 maximum {INT64_MAX}")
    return _varint_slow(value)


def packed_varints(values: np.ndarray) -> bytes:
    """Concatenated int64 varints of a 1-D array of int64-range integers, vectorised with numpy."""
    unsigned = np.ascontiguousarray(values, dtype="<i8").view("<u8")
    if unsigned.size == 0:
        return b""
    sizes = np.ones(unsigned.shape, dtype=np.intp)
    for k in range(1, 10):
        sizes += unsigned >= np.uint64(1 << (7 * k))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    for k in range(int(sizes.max())):
        present = sizes > k
        chunk = ((unsigned[present] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        chunk[sizes[present] > k + 1] |= 0x80
        out[starts[present] + k] = chunk
    return out.tobytes()


# ---------------------------------------------------------------------------------------------
# float32 narrowing
# ---------------------------------------------------------------------------------------------


def _narrow_with_numpy(values: Any) -> bytes:
    try:
        wide = np.asarray(values, dtype=np.float64)
    except OverflowError as err:
        raise _BadValue(f"a number is too large for a float ({err})") from err
    with np.errstate(all="ignore"):
        return wide.astype("<f4").tobytes()


def _struct_narrows_like_numpy() -> bool:
    """struct's float packing is a plain C cast (as numpy's) on CPython < 3.14; probe, don't assume."""
    probes = [struct.unpack("<d", struct.pack("<Q", bits))[0]
              for bits in (0x7FF0000000000001, 0xFFF4000000000000, 0x7FF8000000000001, 0x0000000000000001)]
    probes += [0.1, -0.0, 16777217.0, 1.401298464324817e-45 * 1.5]
    return all(struct.pack("<f", x) == _narrow_with_numpy([x]) for x in probes)


_STRUCT_IS_NUMPY = _struct_narrows_like_numpy()

_PACK_ONE_FLOAT = struct.Struct("<f").pack


def _float32_bytes(values: Sequence[Any]) -> bytes:
    """Little-endian float32s of numbers, narrowed as numpy does (±inf beyond float32's range)."""
    if _STRUCT_IS_NUMPY and len(values) < 256:
        try:
            return struct.pack(f"<{len(values)}f", *values)
        except (OverflowError, struct.error):
            pass  # beyond float32's range (becomes ±inf) or an int beyond float64's: numpy decides
    return _narrow_with_numpy(values)


# ---------------------------------------------------------------------------------------------
# Feature encoding
# ---------------------------------------------------------------------------------------------

_INT_TYPES = frozenset({int, bool})
_NUMBER_TYPES = frozenset({int, bool, float})
_TEXT_TYPES = frozenset({bytes, str})
_EMPTY_FEATURE: dict[str | None, bytes] = {**{kind: tag + b"\x00" for kind, tag in _FEATURE_TAG.items()}, None: b""}
_ONE_FLOAT_PREFIX = b"\x12\x06\x0a\x04"  # float_list, len 6, packed value field, len 4


def _wrap_packed(kind: str, payload: bytes) -> bytes:
    """Feature bytes of a packed int64/float list whose packed payload is given."""
    if not payload:
        return _EMPTY_FEATURE[kind]
    inner = _FIELD1 + _uvarint(len(payload)) + payload
    return _FEATURE_TAG[kind] + _uvarint(len(inner)) + inner


def _int64_feature(values: Sequence[int]) -> bytes:
    table, size = _VARINTS, _VARINT_TABLE_SIZE
    payload = b"".join([table[v] if 0 <= v < size else encode_varint(v) for v in values])
    return _wrap_packed(INT64, payload)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _BadValue(f"text {text!r} cannot be encoded as UTF-8 ({err.reason})") from err


def _bytes_feature(values: Sequence[bytes | str]) -> bytes:
    parts = []
    for value in values:
        if type(value) is str:
            value = _utf8(value)
        parts.append(_FIELD1 + _uvarint(len(value)))
        parts.append(value)  # type: ignore[arg-type]  # str was encoded above (type() is, for speed, exact)
    inner = b"".join(parts)
    return _FIELD1 + _uvarint(len(inner)) + inner


def _normalize_item(value: Any, index: int) -> Any:
    """One list item as int / float / bytes / str, or _BadValue naming its index."""
    if value is None:
        raise _BadValue(f"None at index {index} inside a list (a list cannot hold a missing value; "
                        "use None for the whole feature to omit it)")
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise _BadValue(f"unsupported value of type {type(value).__name__} at index {index}: {value!r:.80}")


def _infer_kind(types: set[type]) -> str | None:
    if types <= _INT_TYPES:
        return INT64
    if types <= _NUMBER_TYPES:
        return FLOAT
    if types <= _TEXT_TYPES:
        return BYTES
    return None


def _first_index(values: Sequence[Any], types: tuple[type, ...]) -> int:
    return next(i for i, v in enumerate(values) if isinstance(v, types))


def _list_kind(values: Sequence[Any]) -> tuple[str | None, Sequence[Any]]:
    """The kind of a list's values (None when empty) and the values as plain Python objects."""
    if not values:
        return None, values
    inferred = _infer_kind(set(map(type, values)))
    if inferred is None:
        values = [_normalize_item(v, i) for i, v in enumerate(values)]
        inferred = _infer_kind(set(map(type, values)))
        if inferred is None:
            where = _first_index(values, (bytes, str))
            raise _BadValue(f"the list mixes text/bytes (index {where}) with numbers; "
                            "a feature holds one kind of value")
    return inferred, values


def _list_feature(values: Sequence[Any], kind: Any) -> bytes:
    """Feature bytes of a list/tuple of plain values, checked against the declared kind."""
    inferred, values = _list_kind(values)
    if inferred is None:
        if kind is _UNDECLARED:
            raise _BadValue("an empty list has no kind to infer: declare one with "
                            "kinds={name: 'int64' | 'float' | 'bytes'}")
        return _EMPTY_FEATURE[kind]
    return _encode_as(values, inferred, kind)


def _encode_as(values: Sequence[Any], inferred: str, kind: Any) -> bytes:
    """Encode values whose kind was inferred, under the declared kind (if any)."""
    if kind is _UNDECLARED or kind == inferred or (kind == FLOAT and inferred == INT64):
        target = inferred if kind is _UNDECLARED else kind
        if target == INT64:
            return _int64_feature(values)
        if target == FLOAT:
            return _wrap_packed(FLOAT, _float32_bytes(values))
        return _bytes_feature(values)
    if kind == INT64 and inferred == FLOAT:
        where = _first_index(values, (float,))
        raise _BadValue(f"float value {values[where]!r} at index {where} for a feature declared int64 "
                        "(floats are never cast to int; declare it 'float' or round the values yourself)")
    raise _BadValue(f"{inferred} values for a feature declared {kind!r}")


_DTYPE_KINDS = {"i": INT64, "u": INT64, "b": INT64, "f": FLOAT, "S": BYTES, "U": BYTES}


def _dtype_kind(array: np.ndarray) -> str:
    try:
        return _DTYPE_KINDS[array.dtype.kind]
    except KeyError:
        raise _BadValue(f"numpy dtype {array.dtype} has no Example kind (use integer, bool, float, "
                        "bytes, str or object arrays)") from None


def _ndarray_feature(array: np.ndarray, kind: Any) -> bytes:
    """Feature bytes of a numpy array (any shape, flattened in C order); kind from its dtype."""
    dtype_kind = array.dtype.kind
    if dtype_kind == "O":
        return _list_feature(array.ravel().tolist(), kind)
    inferred = _dtype_kind(array)
    if kind is not _UNDECLARED and kind != inferred and not (kind == FLOAT and inferred == INT64):
        if array.size == 0:  # e.g. np.array([]) is float64; with no values there is nothing to contradict
            return _EMPTY_FEATURE[kind]
        raise _BadValue(f"numpy {array.dtype} array for a feature declared {kind!r}"
                        + (" (floats are never cast to int)" if inferred == FLOAT and kind == INT64 else ""))
    target = inferred if kind is _UNDECLARED else kind
    flat = array.ravel()
    if target == BYTES:
        return _bytes_feature(flat.tolist())
    if target == FLOAT:
        if dtype_kind != "f" or array.dtype.itemsize > 8:
            # Integers and long doubles round via float64, exactly as a Python number does when
            # protobuf (or struct) stores it: int -> double -> float32.
            flat = flat.astype(np.float64)
        with np.errstate(all="ignore"):
            return _wrap_packed(FLOAT, flat.astype("<f4").tobytes())
    if dtype_kind == "u" and flat.size and flat.dtype.itemsize == 8 and int(flat.max()) > INT64_MAX:
        raise _BadValue(f"uint64 value {int(flat.max())} is above the int64 maximum {INT64_MAX}")
    if flat.size <= 16:
        return _int64_feature(flat.tolist())
    return _wrap_packed(INT64, packed_varints(flat.astype("<i8")))


_SCALAR_TYPES = (np.generic, bool, int, float, str, bytes, bytearray, memoryview)


def _as_list(value: Any) -> list[Any]:
    """A non-array feature value as a list of its items (a scalar is a list of one)."""
    if isinstance(value, _SCALAR_TYPES):
        return [_normalize_item(value, 0)]
    if isinstance(value, Sequence):
        return list(value)
    raise _BadValue(f"unsupported value of type {type(value).__name__}: {value!r:.80} (use a scalar, "
                    "a list/tuple or a numpy array; sets and iterators have no stable order)")


def _scalar_feature(value: Any, kind: Any) -> bytes:
    """Feature bytes of a value that is not a list/tuple (scalars, arrays, other sequences)."""
    if isinstance(value, np.ndarray):
        return _ndarray_feature(value, kind)
    return _list_feature(_as_list(value), kind)


def _value_kind(value: Any) -> str | None:
    """The kind a feature value implies by itself (None: empty, with no dtype to tell)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":
            return _list_kind(value.ravel().tolist())[0]
        return _dtype_kind(value)
    return _list_kind(value if type(value) in (list, tuple) else _as_list(value))[0]


def _feature_bytes(value: Any, kind: Any) -> bytes:
    """Canonical Feature bytes of one feature value (not None) under a declared kind or _UNDECLARED."""
    value_type = type(value)
    if value_type is list or value_type is tuple:
        return _list_feature(value, kind)
    if (value_type is bytes or value_type is str) and (kind is _UNDECLARED or kind == BYTES):
        return _bytes_feature((value,))
    return _scalar_feature(value, kind)


# ---------------------------------------------------------------------------------------------
# Names, kinds and maps
# ---------------------------------------------------------------------------------------------

class _NameEntry(NamedTuple):
    """Precomputed bytes of one feature name's map entry: the key, and whole entry prefixes for the
    two commonest values (one float, one int), so a scalar feature costs one lookup and one append."""

    key: bytes  # key field: tag 0x0a, length, UTF-8 name
    one_float: bytes  # entry tag, entry length, key, value tag/length, float_list, packed tag, length 4
    one_int: tuple[bytes, ...]  # the same for int64_list holding one varint, by varint length 1..10


_NAME_CACHE: dict[str, _NameEntry] = {}
_NAME_CACHE_LIMIT = 1 << 16


def _name_entry(name: Any, where: str) -> _NameEntry:
    """The cached _NameEntry of a feature name; ExampleEncodeError for a name that is not text."""
    entry = _NAME_CACHE.get(name) if type(name) is str else None
    if entry is not None:
        return entry
    if not isinstance(name, str):
        raise ExampleEncodeError(f"{where} name {name!r} is a {type(name).__name__}; names must be str")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ExampleEncodeError(f"{where} name {name!r} is not valid Unicode text ({err.reason})") from err
    key = _FIELD1 + _uvarint(len(encoded)) + encoded
    one_float = _FIELD1 + _uvarint(len(key) + 10) + key + b"\x12\x08" + _ONE_FLOAT_PREFIX
    one_int = (b"",) + tuple(
        _FIELD1 + _uvarint(len(key) + size + 6) + key + bytes((0x12, size + 4, 0x1A, size + 2, 0x0A, size))
        for size in range(1, 11))
    entry = _NameEntry(key, one_float, one_int)
    if len(_NAME_CACHE) >= _NAME_CACHE_LIMIT:
        _NAME_CACHE.clear()
    _NAME_CACHE[str(name)] = entry
    return entry


def _sorted_items(values: Mapping[str, Any], where: str) -> list[tuple[str, Any]]:
    """Items sorted by name; str order is UTF-8 byte order (UTF-8 preserves code point order)."""
    if not isinstance(values, Mapping):
        raise ExampleEncodeError(f"{where}s must be a mapping of name to value, got {type(values).__name__}")
    try:
        return sorted(values.items(), key=itemgetter(0))
    except TypeError:
        bad = next(name for name in values if not isinstance(name, str))
        raise ExampleEncodeError(f"{where} name {bad!r} is a {type(bad).__name__}; names must be str") from None


_KIND_CHOICES = (_UNDECLARED, None, BYTES, FLOAT, INT64)  # a tuple: `in` also works for unhashables


def _check_kinds_mapping(kinds: Any, argument: str) -> Mapping[str, Any] | None:
    """kinds itself must be a mapping (or None); each kind is checked when its feature is encoded,
    so a schema-wide mapping costs nothing per row for the names a row does not have."""
    if kinds is None or isinstance(kinds, Mapping):
        return kinds
    raise ExampleEncodeError(f"{argument} must be a mapping of feature name to kind, got {type(kinds).__name__}")


def _bad_kind(argument: str, name: str, kind: Any, per_step: bool = False) -> ExampleEncodeError:
    return ExampleEncodeError(f"{argument}[{name!r}] = {kind!r} is not a feature kind; use one of "
                              f"{', '.join(map(repr, KINDS))} (or None for a Feature with no kind)"
                              + ("; or a list of those, one per step" if per_step else ""))


def _append_entry(parts: list[bytes], key: bytes, message: bytes) -> None:
    """Append one map entry (key field, then the value message as field 2) to parts."""
    length = _uvarint(len(message))
    parts.append(_FIELD1 + _uvarint(len(key) + 1 + len(length) + len(message)) + key + _FIELD2 + length)
    parts.append(message)


def _features_body(items: list[tuple[str, Any]], kinds: Mapping[str, Any] | None, where: str) -> bytes:
    """Concatenated Features map entries for sorted (name, value) items; None values are omitted."""
    parts: list[bytes] = []
    append = parts.append
    cache, table, table_size = _NAME_CACHE, _VARINTS, _VARINT_TABLE_SIZE
    for name, value in items:
        if value is None:
            continue
        entry = cache.get(name) or _name_entry(name, where)
        kind = _UNDECLARED if kinds is None else kinds.get(name, _UNDECLARED)
        if kind not in _KIND_CHOICES:
            raise _bad_kind("kinds", name, kind)
        value_type = type(value)
        try:
            # Scalar fast paths: the whole entry prefix is precomputed for the name.
            if value_type is float and _STRUCT_IS_NUMPY and (kind is _UNDECLARED or kind == FLOAT):
                try:
                    packed = _PACK_ONE_FLOAT(value)
                except OverflowError:
                    packed = _narrow_with_numpy([value])
                append(entry.one_float)
                append(packed)
            elif value_type is int and (kind is _UNDECLARED or kind == INT64):
                varint = table[value] if 0 <= value < table_size else encode_varint(value)
                append(entry.one_int[len(varint)])
                append(varint)
            else:
                _append_entry(parts, entry.key, _feature_value(value, kind))
        except _BadValue as err:
            raise ExampleEncodeError(f"{where} {name!r}: {err}") from (err.__cause__ or err)
    return b"".join(parts)


def _features_bytes(features: Mapping[str, Any], kinds: Mapping[str, Any] | None, where: str) -> bytes:
    """A length-delimited Features field (tag 0x0a) holding every non-None feature."""
    body = _features_body(_sorted_items(features, where), kinds, where)
    return _FIELD1 + _uvarint(len(body)) + body


def _feature_value(value: Any, kind: Any) -> bytes:
    if kind is None:
        return _no_kind_feature(value)
    return _feature_bytes(value, kind)


def _no_kind_feature(value: Any) -> bytes:
    try:
        empty = len(value) == 0 and not isinstance(value, (str, bytes, bytearray, memoryview))
    except TypeError:
        empty = False
    if not empty:
        raise _BadValue(f"declared with no kind (None), which only an empty list can have, got {value!r:.80}")
    return b""


def encode_example(features: Mapping[str, Any], kinds: Mapping[str, str | None] | None = None) -> bytes:
    """Serialize one tf.train.Example canonically (docs/format.md); raises ExampleEncodeError naming the feature.

    ``features`` maps names to a scalar, a list/tuple, a numpy array, or None (omitted);
    ``kinds`` optionally declares "int64" | "float" | "bytes" (or None: no kind) per name. The
    module docstring gives the value rules; the result is deterministic across processes.
    """
    # The Features field's tag (field 1, length-delimited) is the Example's own framing.
    return _features_bytes(features, _check_kinds_mapping(kinds, "kinds"), "feature")


def encode_sequence_example(
    context: Mapping[str, Any],
    feature_lists: Mapping[str, Any],
    kinds: Mapping[str, str | None] | None = None,
    feature_list_kinds: Mapping[str, str | Sequence[str | None] | None] | None = None,
) -> bytes:
    """Serialize one tf.train.SequenceExample canonically; both fields are always written.

    ``context`` is encoded as encode_example's features, under ``kinds``. ``feature_lists`` maps a
    name to a sequence of steps (or a numpy array whose first axis is the steps), each step a value
    as for one Example feature; None omits the whole list, None as a step is an error. A list's
    kind is ``feature_list_kinds[name]`` or else inferred from all its non-empty steps (ints with
    floats → float), and applies to every step, so empty steps need no declaration of their own.
    ``feature_list_kinds[name]`` may also be a list with one kind per step (None: a step with no
    kind), the shape ``decode_sequence_example(data, kinds=True)`` gives, for exact round trips.
    """
    context_field = _features_bytes(context, _check_kinds_mapping(kinds, "kinds"), "context feature")
    list_kinds = _check_kinds_mapping(feature_list_kinds, "feature_list_kinds")
    parts: list[bytes] = []
    for name, steps in _sorted_items(feature_lists, "feature list"):
        if steps is None:
            continue
        key = _name_entry(name, "feature list").key
        kind = _UNDECLARED if list_kinds is None else list_kinds.get(name, _UNDECLARED)
        if not _is_list_kind(kind):
            raise _bad_kind("feature_list_kinds", name, kind, per_step=True)
        try:
            _append_entry(parts, key, _feature_list_bytes(steps, kind))
        except _BadValue as err:
            raise ExampleEncodeError(f"feature list {name!r}: {err}") from (err.__cause__ or err)
    body = b"".join(parts)
    return context_field + _FIELD2 + _uvarint(len(body)) + body


def _is_list_kind(kind: Any) -> bool:
    """A feature list's declared kind: one kind (or None, or undeclared), or a list of kinds per step."""
    if isinstance(kind, (list, tuple)):
        return all(each in _KIND_CHOICES[1:] for each in kind)
    return kind in _KIND_CHOICES


def _feature_list_bytes(steps: Any, kind: Any) -> bytes:
    """FeatureList bytes: each step a length-delimited Feature, of the list's kind (or its own)."""
    if isinstance(steps, (str, bytes, bytearray, memoryview)) or not isinstance(steps, (Sequence, np.ndarray)):
        raise _BadValue(f"a feature list must be a sequence of steps, got {type(steps).__name__}")
    steps = list(steps)
    for index, step in enumerate(steps):
        if step is None:
            raise _BadValue(f"step {index} is None (a step cannot be missing; use an empty list)")
    if isinstance(kind, (list, tuple)):
        if len(kind) != len(steps):
            raise _BadValue(f"{len(kind)} per-step kinds declared for {len(steps)} steps")
        step_kinds = kind
    else:
        step_kinds = [_steps_kind(steps) if kind is _UNDECLARED and steps else kind] * len(steps)
    parts = []
    for index, (step, step_kind) in enumerate(zip(steps, step_kinds)):
        try:
            feature = _feature_value(step, step_kind)
        except _BadValue as err:
            raise _BadValue(f"step {index}: {err}") from (err.__cause__ or err)
        parts.append(_FIELD1 + _uvarint(len(feature)))
        parts.append(feature)
    return b"".join(parts)


def _steps_kind(steps: list[Any]) -> str:
    """The one kind of a feature list's steps, inferred from their values (ints with floats → float)."""
    found: set[str] = set()
    for index, step in enumerate(steps):
        try:
            kind = _value_kind(step)
        except _BadValue as err:
            raise _BadValue(f"step {index}: {err}") from (err.__cause__ or err)
        if kind is not None:  # an empty step has no kind
            found.add(kind)
    if not found:
        raise _BadValue("every step is empty, so no kind can be inferred: declare one with "
                        "feature_list_kinds={name: 'int64' | 'float' | 'bytes'}")
    if found <= {INT64, FLOAT}:
        return FLOAT if FLOAT in found else INT64
    if found == {BYTES}:
        return BYTES
    raise _BadValue(f"steps mix kinds {sorted(found)}; every step of a feature list has one kind")


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

_ONEOF_KIND = {"bytes_list": BYTES, "float_list": FLOAT, "int64_list": INT64}


def _feature_values(feature: Any) -> tuple[str | None, list]:
    which = feature.WhichOneof("kind")
    if which is None:
        return None, []
    return _ONEOF_KIND[which], list(getattr(feature, which).value)


def _features_dict(feature_map: Any, with_kinds: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(feature_map):
        kind, values = _feature_values(feature_map[name])
        out[name] = (kind, values) if with_kinds else values
    return out


def _parse(message: Any, data: Any, what: str) -> None:
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ExampleDecodeError(f"a {what} must be bytes, got {type(data).__name__}")
        data = bytes(data)
    try:
        message.ParseFromString(data)
    except Exception as err:  # upb raises DecodeError, the pure-Python runtime also UnicodeDecodeError
        raise ExampleDecodeError(_diagnose(data, what, err)) from err


def decode_example(data: bytes, kinds: bool = False) -> dict[str, Any]:
    """Decode a serialized tf.train.Example by protobuf's rules, names sorted.

    Returns ``{name: [values]}`` (bytes, float or int values; a Feature with no kind → []), or with
    ``kinds=True`` ``{name: (kind, [values])}`` with kind "bytes" / "float" / "int64" / None.
    Floats are the stored float32 values widened to Python floats. Malformed bytes raise
    ExampleDecodeError saying what was wrong at which byte, inside which feature.
    """
    message = example_pb2.Example()
    _parse(message, data, "tf.train.Example")
    return _features_dict(message.features.feature, kinds)


def decode_sequence_example(data: bytes, kinds: bool = False) -> tuple[dict[str, Any], dict[str, list]]:
    """Decode a serialized tf.train.SequenceExample into ``(context, feature_lists)``.

    ``context`` is as decode_example returns; ``feature_lists`` maps each name to its steps, one
    list of values per step: ``{name: [[values], ...]}``, or with ``kinds=True``
    ``{name: [(kind, [values]), ...]}`` (each step carries its own kind, None for a step with no
    kind set). Absent context / feature_lists fields decode as empty dicts.
    """
    message = example_pb2.SequenceExample()
    _parse(message, data, "tf.train.SequenceExample")
    context = _features_dict(message.context.feature, kinds)
    lists = message.feature_lists.feature_list
    feature_lists: dict[str, list] = {}
    for name in sorted(lists):
        steps = [_feature_values(feature) for feature in lists[name].feature]
        feature_lists[name] = steps if kinds else [values for _, values in steps]
    return context, feature_lists


# ---------------------------------------------------------------------------------------------
# Diagnosing malformed bytes (protobuf says only "Error parsing message")
# ---------------------------------------------------------------------------------------------

_VARINT, _I64, _LEN, _START_GROUP, _END_GROUP, _I32 = range(6)
_MAX_DEPTH = 100  # upb's default recursion limit; only unknown groups can nest that deep here


class _WireProblem(Exception):
    """What is wrong, at which byte, under which fields (outermost first)."""

    def __init__(self, what: str, position: int, path: tuple[str, ...]):
        super().__init__(what)
        self.what = what
        self.position = position
        self.path = path


class _WireWalker:
    """Walks Example/SequenceExample wire bytes with protobuf's rules, raising _WireProblem.

    A length-delimited field that runs past its enclosing message is still walked up to where the
    bytes end, so a truncated record is reported at the innermost place it was cut.
    """

    def __init__(self, data: bytes):
        self.data = data

    def varint(self, pos: int, end: int, path: tuple[str, ...]) -> tuple[int, int]:
        start, result, shift = pos, 0, 0
        while True:
            if pos >= end:
                raise _WireProblem("truncated varint", start, path)
            if pos - start == 10:
                raise _WireProblem("varint longer than 10 bytes", start, path)
            byte = self.data[pos]
            result |= (byte & 0x7F) << shift
            pos += 1
            shift += 7
            if byte < 0x80:
                return result & 0xFFFFFFFFFFFFFFFF, pos

    def fields(self, pos: int, end: int, path: tuple[str, ...], depth: int):
        """Yield (field number, wire type, value start, value end, cut) for each field of a message.

        For a length-delimited field the value span is its content (after the length); ``cut`` is
        True when that content was cut short by the end of the enclosing message, in which case
        the span stops there and the problem is raised once the caller has walked it.
        """
        while pos < end:
            tag_pos = pos
            number, wire_type, pos = self.tag(pos, end, path)
            if wire_type == _END_GROUP:
                raise _WireProblem(f"end-group tag of field {number} with no group open", tag_pos, path)
            if wire_type != _LEN:
                value_start = pos
                pos = self.skip(number, wire_type, tag_pos, pos, end, path, depth)
                yield number, wire_type, value_start, pos, False
                continue
            length, content = self.varint(pos, end, path)
            if content + length <= end:
                pos = content + length
                yield number, wire_type, content, pos, False
                continue
            yield number, wire_type, content, end, True
            raise _WireProblem(f"truncated: field {number} declares {length} bytes but only {end - content} "
                               f"remain in its enclosing message", pos, path)

    def tag(self, pos: int, end: int, path: tuple[str, ...]) -> tuple[int, int, int]:
        tag_pos = pos
        tag, pos = self.varint(pos, end, path)
        number, wire_type = tag >> 3, tag & 7
        if wire_type > 5:
            raise _WireProblem(f"wire type {wire_type} (field {number})", tag_pos, path)
        if number == 0 or number > 0x1FFFFFFF:
            raise _WireProblem(f"field number {number}", tag_pos, path)
        return number, wire_type, pos

    def skip(self, number: int, wire_type: int, tag_pos: int, pos: int, end: int,
             path: tuple[str, ...], depth: int) -> int:
        """Position after the value of a field whose tag was read."""
        if wire_type == _VARINT:
            return self.varint(pos, end, path)[1]
        if wire_type in (_I64, _I32):
            size = 8 if wire_type == _I64 else 4
            if pos + size > end:
                raise _WireProblem(f"truncated fixed{size * 8} value of field {number}", pos, path)
            return pos + size
        if wire_type == _LEN:
            length, content = self.varint(pos, end, path)
            if content + length > end:
                raise _WireProblem(f"truncated: field {number} declares {length} bytes but only "
                                   f"{end - content} remain in its enclosing message", pos, path)
            return content + length
        return self.skip_group(number, tag_pos, pos, end, path, depth)

    def skip_group(self, number: int, tag_pos: int, pos: int, end: int, path: tuple[str, ...], depth: int) -> int:
        if depth + 1 > _MAX_DEPTH:
            raise _WireProblem(f"groups nested deeper than {_MAX_DEPTH} levels", tag_pos, path)
        while pos < end:
            inner_pos = pos
            inner_number, wire_type, pos = self.tag(pos, end, path)
            if wire_type == _END_GROUP:
                if inner_number != number:
                    raise _WireProblem(f"end-group tag of field {inner_number} closes the group of field "
                                       f"{number}", inner_pos, path)
                return pos
            pos = self.skip(inner_number, wire_type, inner_pos, pos, end, path, depth + 1)
        raise _WireProblem(f"group of field {number} is never closed", tag_pos, path)

    # Message walkers: each checks what protobuf checks (known fields' contents, UTF-8 keys).

    def example(self, pos: int, end: int) -> None:
        for number, wire_type, start, stop, _ in self.fields(pos, end, (), 0):
            if number == 1 and wire_type == _LEN:
                self.map_entries(start, stop, ("features",), 1, "feature", self.feature)

    def sequence_example(self, pos: int, end: int) -> None:
        for number, wire_type, start, stop, _ in self.fields(pos, end, (), 0):
            if number == 1 and wire_type == _LEN:
                self.map_entries(start, stop, ("context",), 1, "context feature", self.feature)
            elif number == 2 and wire_type == _LEN:
                self.map_entries(start, stop, ("feature_lists",), 1, "feature list", self.feature_list)

    def map_entries(self, pos: int, end: int, path: tuple[str, ...], depth: int, noun: str, walk_value) -> None:
        entry = 0
        for number, wire_type, start, stop, _ in self.fields(pos, end, path, depth):
            if number == 1 and wire_type == _LEN:
                self.entry(start, stop, path, f"{noun} entry #{entry}", depth + 1, noun, walk_value)
                entry += 1

    def entry(self, pos: int, end: int, path: tuple[str, ...], unnamed: str, depth: int, noun: str,
              walk_value) -> None:
        """Check a map entry: its key is valid UTF-8, its values (named by the key read so far) walk."""
        here = path + (unnamed,)
        for number, wire_type, start, stop, cut in self.fields(pos, end, here, depth):
            if wire_type != _LEN:
                continue
            if number == 1:
                try:
                    name = self.data[start:stop].decode("utf-8")
                except UnicodeDecodeError as err:
                    if not (cut and err.end == stop - start):  # a cut inside a character is truncation
                        raise _WireProblem(f"invalid UTF-8 in {noun} name ({err.reason})", start + err.start,
                                           here) from None
                    name = self.data[start:start + err.start].decode("utf-8") + "…"
                here = path + (f"{noun} {name!r}",)
            elif number == 2:
                walk_value(start, stop, here, depth + 1, cut)

    def feature_list(self, pos: int, end: int, path: tuple[str, ...], depth: int, _cut: bool = False) -> None:
        step = 0
        for number, wire_type, start, stop, cut in self.fields(pos, end, path, depth):
            if number == 1 and wire_type == _LEN:
                self.feature(start, stop, path + (f"step {step}",), depth + 1, cut)
                step += 1

    def feature(self, pos: int, end: int, path: tuple[str, ...], depth: int, _cut: bool = False) -> None:
        for number, wire_type, start, stop, _ in self.fields(pos, end, path, depth):
            if wire_type != _LEN or number not in (1, 2, 3):
                continue
            kind_path = path + (("bytes_list", "float_list", "int64_list")[number - 1],)
            for value_number, value_type, value_start, value_stop, cut in self.fields(start, stop, kind_path,
                                                                                     depth + 1):
                if value_number == 1 and value_type == _LEN and number != 1:
                    self.packed(number, value_start, value_stop, kind_path, cut)

    def packed(self, number: int, pos: int, end: int, path: tuple[str, ...], cut: bool) -> None:
        if number == 2:
            if (end - pos) % 4 and not cut:
                raise _WireProblem(f"packed float list of {end - pos} bytes (not a multiple of 4)", pos, path)
            return
        while pos < end:
            pos = self.varint(pos, end, path)[1]


def _diagnose(data: bytes, what: str, err: Exception) -> str:
    """A message saying what protobuf rejected, where: found by walking the wire bytes ourselves."""
    walker = _WireWalker(data)
    try:
        if what == "tf.train.Example":
            walker.example(0, len(data))
        else:
            walker.sequence_example(0, len(data))
    except _WireProblem as problem:
        inside = _describe_path(problem.path)
        return (f"malformed {what} ({len(data)} bytes): {problem.what} at byte {problem.position}"
                f"{inside}")
    return f"malformed {what} ({len(data)} bytes): protobuf rejected it ({type(err).__name__}: {err})"


_NAMED_PART = re.compile(r"^(context feature|feature list|feature) ['\"]")


def _describe_path(path: tuple[str, ...]) -> str:
    """' inside feature 'x' (int64_list)' for a problem under a named feature, else the field path."""
    if not path:
        return ""
    named = [index for index, part in enumerate(path) if _NAMED_PART.match(part)]
    if named:
        rest = path[named[-1] + 1:]
        return f" inside {path[named[-1]]}" + (f" ({', '.join(rest)})" if rest else "")
    return f" inside {' > '.join(path)}"

