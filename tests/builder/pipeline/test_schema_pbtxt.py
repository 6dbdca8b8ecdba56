"""``schema.pbtxt``: the TensorFlow Metadata schema a build writes beside its manifest, and builds from one (issue 46 item 3).

The written file is parsed with TFMD's own proto (text format) and checked field by field; TFT's
``schema_as_feature_spec`` rules (tensorflow_transform/tf_metadata/schema_utils.py, rewritten here since
TFT needs TensorFlow) applied to it give exactly the parse spec of the manifest and of ``tfrbeam inspect``;
a schema given as the features comes out of the build unchanged; and a schema with no Example equivalent is
one line naming the feature and why.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tfrbeam.builder import run
from tfrbeam.builder.running.write_table import write_dataset
from tfrbeam.cli.main import main as cli_main
from tfrbeam.errors import BadRecordError, ConfigError, OutputExistsError
from tfrbeam.layout.manifest import read_manifest, verify_dataset

schema_pb2 = pytest.importorskip("tensorflow_metadata.proto.v0.schema_pb2", reason="pip install 'tfrbeam[tfmd]'")
text_format = pytest.importorskip("google.protobuf.text_format")

ROWS = 300
FEATURES = {
    "id": {"type": "int64"},
    "score": {"type": "float", "on_null": "omit"},
    "name": {"type": "bytes"},
    "embedding": {"type": "float", "length": 3},
    "tags": {"type": "int64"},
    "pair": {"type": "int64", "length": 2, "on_null": "omit"},
}


def rows_table() -> pa.Table:
    """Rows in three chunks: a nullable score, fixed and variable-length lists, an optional fixed-length pair."""
    chunks = []
    for start in range(0, ROWS, 100):
        ids = list(range(start, start + 100))
        chunks.append(pa.table({
            "id": pa.array(ids, pa.int64()),
            "score": pa.array([None if i % 7 == 0 else i * 0.25 for i in ids], pa.float64()),
            "name": pa.array([f"row-{i}" for i in ids], pa.string()),
            "embedding": pa.array([[i, i + 0.5, -i] for i in ids], pa.list_(pa.float64())),
            "tags": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int64())),
            "pair": pa.array([None if i % 5 == 0 else [i, -i] for i in ids], pa.list_(pa.int64())),
        }))
    return pa.concat_tables(chunks)


EXPECTED_TEXT = """
feature { name: "id" type: INT presence { min_fraction: 1.0 min_count: 1 } shape { } }
feature { name: "score" type: FLOAT value_count { min: 1 max: 1 } }
feature { name: "name" type: BYTES presence { min_fraction: 1.0 min_count: 1 } shape { } }
feature { name: "embedding" type: FLOAT presence { min_fraction: 1.0 min_count: 1 } shape { dim { size: 3 } } }
feature { name: "tags" type: INT presence { min_fraction: 1.0 min_count: 1 } }
feature { name: "pair" type: INT value_count { min: 2 max: 2 } }
"""


def read_schema(path: pathlib.Path) -> Any:
    return text_format.Parse(path.read_text(), schema_pb2.Schema())


def tft_feature_spec(schema: Any) -> dict[str, str]:
    """TFT's schema_as_feature_spec, as its documented rules say, printed as tfrbeam prints a parse spec.

    A feature with a shape is FixedLenFeature(its dims) and must have presence.min_fraction 1; any other
    is VarLenFeature; deprecated and PLANNED/ALPHA/DEBUG_ONLY features are left out; BYTES is tf.string,
    INT tf.int64, FLOAT tf.float32; sparse features and other types are errors in TFT.
    """
    assert not schema.sparse_feature
    dtypes = {schema_pb2.BYTES: "tf.string", schema_pb2.INT: "tf.int64", schema_pb2.FLOAT: "tf.float32"}
    skipped = {schema_pb2.DEPRECATED, schema_pb2.PLANNED, schema_pb2.ALPHA, schema_pb2.DEBUG_ONLY}
    spec = {}
    for feature in schema.feature:
        if feature.deprecated or feature.lifecycle_stage in skipped:
            continue
        dtype = dtypes[feature.type]
        if feature.HasField("shape"):
            assert feature.presence.min_fraction == 1, feature.name  # TFT raises ValueError here
            spec[feature.name] = f"tf.io.FixedLenFeature({[dim.size for dim in feature.shape.dim]}, {dtype})"
        else:
            spec[feature.name] = f"tf.io.VarLenFeature({dtype})"
    return spec


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("schema") / "ds"
    write_dataset(rows_table(), out, features=FEATURES, num_shards=2, splits={"train": 0.7, "eval": 0.3},
                  schema_pbtxt=True, progress=False)
    return out


def test_the_build_writes_schema_pbtxt_beside_the_manifest_field_by_field(built):
    schema = read_schema(built / "schema.pbtxt")
    assert schema == text_format.Parse(EXPECTED_TEXT, schema_pb2.Schema())
    by_name = {feature.name: feature for feature in schema.feature}
    assert list(by_name) == list(FEATURES)  # the features' order
    assert by_name["id"].HasField("shape") and list(by_name["id"].shape.dim) == []  # a scalar: shape with no dims
    assert by_name["score"].WhichOneof("shape_type") == "value_count" and not by_name["score"].HasField("presence")
    assert by_name["tags"].WhichOneof("shape_type") is None  # variable length: no bounds are claimed
    assert by_name["embedding"].shape.dim[0].size == 3
    manifest = read_manifest(str(built)).to_dict()
    assert manifest["schema_pbtxt"] == "schema.pbtxt"
    verify_dataset(str(built))


def test_tft_feature_spec_of_the_schema_is_the_manifests_and_inspects_parse_spec(built, capsys):
    spec = tft_feature_spec(read_schema(built / "schema.pbtxt"))
    assert spec == read_manifest(str(built)).to_dict()["parse_example_spec"]
    assert cli_main(["inspect", "--json", str(built / "train"), str(built / "eval")]) == 0
    assert spec == json.loads(capsys.readouterr().out)["parse_example_spec"]
    assert spec["score"] == "tf.io.VarLenFeature(tf.float32)" and spec["id"] == "tf.io.FixedLenFeature([], tf.int64)"


def test_a_schema_in_gives_the_same_schema_out(built, tmp_path):
    given = built / "schema.pbtxt"
    out = tmp_path / "again"
    write_dataset(rows_table(), out, features=str(given), num_shards=1, schema_pbtxt=True, progress=False)
    assert read_schema(out / "schema.pbtxt") == read_schema(given)
    manifest = read_manifest(str(out)).to_dict()
    assert {name: entry["shape"] for name, entry in manifest["features"].items()} == {
        "id": [], "score": [], "name": [], "embedding": [3], "tags": None, "pair": [2]}
    assert manifest["config"]["features"]["score"]["on_null"] == "omit"
    assert manifest["config"]["features"]["id"]["on_null"] == "error"


def test_the_config_key_features_from_builds_from_a_schema(built, tmp_path):
    data = tmp_path / "rows.parquet"
    pq.write_table(rows_table(), data, row_group_size=64)
    out = tmp_path / "from_yaml"
    run({"input": {"path": str(data)}, "features_from": str(built / "schema.pbtxt"),
         "output": {"path": str(out), "num_shards": 1, "schema_pbtxt": True}}, progress=False)
    assert read_schema(out / "schema.pbtxt") == read_schema(built / "schema.pbtxt")


def test_a_required_feature_the_rows_lack_is_a_bad_row_not_a_guess(built, tmp_path):
    table = rows_table().set_column(0, "id", pa.array([None] + list(range(1, ROWS)), pa.int64()))
    with pytest.raises(BadRecordError, match=r"table:1: feature 'id': is null \(on_null: error"):
        write_dataset(table, tmp_path / "bad", features=str(built / "schema.pbtxt"), num_shards=1, progress=False)


BAD_SCHEMAS = {
    "struct": ('feature { name: "nested" type: STRUCT }', "'nested'.*STRUCT"),
    "sparse": ('feature { name: "i" type: INT } feature { name: "v" type: FLOAT } '
               'sparse_feature { name: "sp" index_feature { name: "i" } value_feature { name: "v" } }',
               "sparse_feature 'sp'"),
    "weighted": ('feature { name: "w" type: FLOAT } feature { name: "x" type: INT } '
                 'weighted_feature { name: "wx" feature { step: "x" } weight_feature { step: "w" } }',
                 "weighted_feature 'wx'"),
    "rank2": ('feature { name: "image" type: FLOAT presence { min_fraction: 1 } shape { dim { size: 2 } '
              'dim { size: 3 } } }', r"'image'.*shape \[2, 3\]"),
    "shape_optional": ('feature { name: "x" type: INT presence { min_fraction: 0.5 } shape { } }',
                       "'x'.*min_fraction 0.5"),
    "no_type": ('feature { name: "u" }', "'u'.*TYPE_UNKNOWN"),
    "nested_counts": ('feature { name: "n" type: INT value_counts { value_count { min: 1 max: 1 } } }',
                      "'n'.*value_counts"),
    "twice": ('feature { name: "a" type: INT } feature { name: "a" type: FLOAT }', "'a'.*twice"),
    "not_text": ("{ this is not a schema", "not a TensorFlow Metadata schema"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEMAS))
def test_a_schema_without_an_example_equivalent_is_one_line_naming_the_feature(case, tmp_path):
    text, named = BAD_SCHEMAS[case]
    path = tmp_path / "schema.pbtxt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named) as raised:
        write_dataset(rows_table(), tmp_path / "out", features=str(path), progress=False)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_deprecated_features_are_left_out_as_tft_leaves_them_out(tmp_path):
    path = tmp_path / "schema.pbtxt"
    path.write_text('feature { name: "id" type: INT presence { min_fraction: 1 min_count: 1 } shape { } }\n'
                    'feature { name: "old" type: BYTES lifecycle_stage: DEPRECATED }')
    write_dataset(rows_table(), tmp_path / "out", features=str(path), num_shards=1, progress=False)
    assert list(read_manifest(str(tmp_path / "out")).to_dict()["features"]) == ["id"]


def test_without_tensorflow_metadata_the_options_name_the_extra(built, tmp_path, monkeypatch):
    for name in [name for name in sys.modules if name.startswith("tensorflow_metadata")] + ["tensorflow_metadata"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it fails as when it is not installed
    for features, schema_pbtxt in ((None, True), (str(built / "schema.pbtxt"), False)):
        with pytest.raises(ConfigError, match=r"pip install 'tfrbeam\[tfmd\]'") as raised:
            write_dataset(rows_table(), tmp_path / "out", features=features, schema_pbtxt=schema_pbtxt, progress=False)
        assert "\n" not in str(raised.value)


def test_a_rebuild_replaces_its_own_schema_and_never_a_users(tmp_path):
    out = tmp_path / "ds"
    write_dataset(rows_table(), out, features=FEATURES, num_shards=1, progress=False)
    assert not (out / "schema.pbtxt").exists()  # only when asked
    (out / "schema.pbtxt").write_text("# curated by hand\n")
    with pytest.raises(OutputExistsError, match=r"schema\.pbtxt"):
        write_dataset(rows_table(), out, features=FEATURES, num_shards=1, schema_pbtxt=True, overwrite=True,
                      progress=False)
    assert (out / "schema.pbtxt").read_text() == "# curated by hand\n"
    (out / "schema.pbtxt").unlink()
    for seed in (1, 2):  # the second replaces the first's schema.pbtxt, which its manifest lists
        write_dataset(rows_table(), out, features=FEATURES, num_shards=1, schema_pbtxt=True, overwrite=True, seed=seed,
                      progress=False)
        assert read_schema(out / "schema.pbtxt") == text_format.Parse(EXPECTED_TEXT, schema_pb2.Schema())
    write_dataset(rows_table(), out, features=FEATURES, num_shards=1, overwrite=True, progress=False)
    assert not (out / "schema.pbtxt").exists()  # the old dataset's, gone with it
    verify_dataset(str(out))


def test_in_a_bucket_a_replace_writes_it_under_a_free_name_the_manifest_lists(bucket):
    """Object stores: the schema goes in before the manifest's switch, under a name the old dataset's readers do not
    use; each manifest names its own, and the replaced one is collected after the switch."""
    listed = []
    for seed in (1, 2):
        write_dataset(rows_table(), bucket.url("ds"), features=FEATURES, num_shards=1, seed=seed, schema_pbtxt=True,
                      overwrite=True, progress=False, pipeline_options=bucket.pipeline_args())
        manifest = json.loads(bucket.get("ds/tfrbeam_dataset.json"))
        listed.append(manifest["schema_pbtxt"])
        schema = text_format.Parse(bucket.get(f"ds/{manifest['schema_pbtxt']}").decode(), schema_pb2.Schema())
        assert schema == text_format.Parse(EXPECTED_TEXT, schema_pb2.Schema())
    assert listed[0] == "schema.pbtxt" and listed[1] != listed[0] and listed[1].endswith("-schema.pbtxt")
    assert [key for key in bucket.listing() if key.startswith("ds/") and "schema" in key] == [f"ds/{listed[1]}"]
