"""Every Arrow type of the one type table goes through every path that converts Arrow data the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.builder.features.convert import BatchProvenance, convert_batch, infer_spec, resolve_spec
from tfrbeam.codec import kinds
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.encode import encode_record_batch, feature_kind
from tfrbeam.codec.example import decode_example
from tfrbeam.codec.kinds import EXAMPLE_TYPES, plain_list
from tfrbeam.codec.protos import example_pb2

PLAIN = {"int64": [3, -1], "float": [0.5, 2.0], "bytes": [b"ab", b"cd"]}


def _values(arrow_type: pa.DataType) -> pa.Array:
    """Two rows of ``arrow_type`` (lists: one list of two items, one null row)."""
    if pa.types.is_dictionary(arrow_type):
        return pa.array(["ab", "cd"]).dictionary_encode().cast(arrow_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type) \
            or pa.types.is_list_view(arrow_type) or pa.types.is_large_list_view(arrow_type):
        item = _values(arrow_type.value_type).to_pylist()
        return pa.array([item, None], arrow_type)
    if pa.types.is_fixed_size_binary(arrow_type):
        return pa.array([b"abc", b"def"], arrow_type)
    if pa.types.is_boolean(arrow_type):
        return pa.array([True, False])
    if pa.types.is_integer(arrow_type):
        return pa.array([3, 1], arrow_type)
    if pa.types.is_floating(arrow_type):
        return pa.array([0.5, 2.0], arrow_type)
    return pa.array(["ab", "cd"] if "string" in str(arrow_type) else [b"ab", b"cd"], arrow_type)


@pytest.mark.parametrize("arrow_type", EXAMPLE_TYPES, ids=str)
def test_the_encoder_the_build_and_the_decoder_accept_the_same_types(arrow_type):
    column = _values(arrow_type)
    kind, is_list = feature_kind("x", arrow_type)
    batch = pa.record_batch({"x": column})
    direct = [decode_example(record) for record in encode_record_batch(batch).to_list()]
    spec = resolve_spec(infer_spec("x", arrow_type), arrow_type)
    converted = convert_batch(batch, [spec], BatchProvenance("<test>", batch))
    assert not converted.bad_rows
    built = [decode_example(record) for record in encode_record_batch(converted.batch).to_list()]
    assert built == direct  # the build converts each type to the same Example values the encoder writes
    schema = pa.schema([pa.field("x", arrow_type)])
    decoded = examples_to_record_batch(encode_record_batch(batch).to_list(), schema=schema)
    assert decoded.column(0).type == arrow_type
    expected = plain_list(column) if is_list else column
    assert decoded.column(0).to_pylist() == expected.to_pylist()
    assert kind in PLAIN


def test_plain_list_keeps_rows_of_a_list_view_with_gaps_and_nulls():
    values = pa.array([10, 11, 12, 13, 14])
    view = pa.ListViewArray.from_arrays(pa.array([3, 0, 1], pa.int32()), pa.array([2, 1, 0], pa.int32()), values,
                                        mask=pa.array([False, False, True]))
    plain = plain_list(view)
    assert plain.type == pa.list_(pa.int64()) and plain.to_pylist() == [[13, 14], [10], None]
    plain.validate(full=True)


def test_the_kind_table_is_the_example_format():
    assert kinds.FEATURE_TYPES == ("int64", "float", "bytes") == (kinds.INT64, kinds.FLOAT, kinds.BYTES)
    assert kinds.ARROW_TYPES == {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}
    assert kinds.TF_DTYPES == {"int64": "tf.int64", "float": "tf.float32", "bytes": "tf.string"}
    assert kinds.WIRE_TAGS == {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}
    assert (kinds.KIND_NONE, kinds.KIND_BYTES, kinds.KIND_FLOAT, kinds.KIND_INT64) == (0, 1, 2, 3)
    assert kinds.KIND_ARROW_TYPES == {1: pa.binary(), 2: pa.float32(), 3: pa.int64()}
    assert kinds.KIND_NAMES == {0: "no kind", 1: "bytes_list", 2: "float_list", 3: "int64_list"}
    # The wire kinds are the Feature oneof field numbers, and each tag is that field, length-delimited.
    fields = example_pb2.Feature.DESCRIPTOR.fields_by_name
    for name in kinds.FEATURE_TYPES:
        number = fields[f"{name}_list"].number
        assert kinds.KIND_OF_TYPE[name] == number and kinds.KIND_NAMES[number] == f"{name}_list"
        assert kinds.WIRE_TAGS[name] == number << 3 | 2
        assert example_pb2.Feature(**{f"{name}_list": {}}).SerializeToString() == bytes((kinds.WIRE_TAGS[name], 0))


def test_the_former_homes_of_the_table_are_the_table():
    from tfrbeam.builder.features.convert import FEATURE_TYPES as BUILD_TYPES
    from tfrbeam.dataset.spec import DTYPES
    from tfrbeam.layout.manifest import TF_DTYPES
    from tfrbeam.stats.accumulators import FEATURE_TYPES as STATS_TYPES

    assert BUILD_TYPES is DTYPES is kinds.FEATURE_TYPES
    assert STATS_TYPES is kinds.ARROW_TYPES and TF_DTYPES is kinds.TF_DTYPES


# --- the one kind table ---------------------------------------------------------------------------

PACKAGE = Path(tfrbeam.__file__).parent
_TABLE_TYPES = {"int64", "float32", "binary"}  # pa.int64(), pa.float32(), pa.binary(): the kinds' Arrow types
_KIND_WORDS = {"int64", "float", "bytes"}
# Copies in files another helper of issue 25 owns (tfrbeam/builder/): (file, function) -> why they stay for now.
_KNOWN_COPIES: dict[tuple[str, str], str] = {
    # Avro's primitive types ("float", "bytes", "long", ...) and their Arrow types: Avro's names, not feature kinds.
    ("builder/inputs/avro.py", "<module>"): "Avro primitive types",
}


def _is_table_type(node: ast.AST) -> bool:
    """``pa.int64()`` / ``pa.float32()`` / ``pa.binary()`` with no arguments (a kind's Arrow type)."""
    return (isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute)
            and node.func.attr in _TABLE_TYPES and isinstance(node.func.value, ast.Name) and node.func.value.id == "pa")


def _is_kind(node: ast.AST) -> bool:
    """A kind written out: "int64" / "float" / "bytes", a KIND_* name or a tuple holding one."""
    if isinstance(node, ast.Constant):
        return node.value in _KIND_WORDS
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return name.startswith("KIND_") or name in {"INT64", "FLOAT", "BYTES"}
    if isinstance(node, ast.Tuple):
        return any(_is_kind(item) for item in node.elts)
    return False


class _TableFinder(ast.NodeVisitor):
    """Collects (enclosing function or "<module>", line) of each dict literal pairing kinds with their Arrow types."""

    def __init__(self) -> None:
        self.scope = "<module>"
        self.found: list[tuple[str, int]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.scope = self.scope, node.name
        self.generic_visit(node)
        self.scope = outer

    def visit_Dict(self, node: ast.Dict) -> None:
        pairs = [(k, v) for k, v in zip(node.keys, node.values) if k is not None]
        if sum((_is_kind(k) and _is_table_type(v)) or (_is_table_type(k) and _is_kind(v)) for k, v in pairs) >= 2:
            self.found.append((self.scope, node.lineno))
        self.generic_visit(node)


def _kind_type_tables(source: str) -> list[tuple[str, int]]:
    finder = _TableFinder()
    finder.visit(ast.parse(source))
    return finder.found


def test_the_table_finder_sees_a_copy_keyed_either_way():
    assert _kind_type_tables('T = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}') == [("<module>", 1)]
    assert _kind_type_tables("def f():\n    return {pa.int64(): (KIND_INT64, 26), pa.binary(): (KIND_BYTES, 10)}") \
        == [("f", 2)]
    assert _kind_type_tables("D = {pa.int64(): np.int64, pa.float32(): np.float32}") == []


def test_no_module_but_kinds_maps_kinds_to_their_arrow_types():
    copies = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "codec/kinds.py":
            continue
        for scope, line in _kind_type_tables(path.read_text(encoding="utf-8")):
            if (where, scope) not in _KNOWN_COPIES:
                copies[f"{where}:{line}"] = scope
    assert copies == {}, "use tfrbeam.codec.kinds.ARROW_TYPES / KIND_ARROW_TYPES instead of a copy"
