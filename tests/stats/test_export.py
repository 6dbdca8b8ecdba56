"""TFRecord -> Parquet export: build then export gives back the input rows, per split, for every type the build supports."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import struct

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings, strategies as st

from tests import memfs
from tests.example_builds import build_examples
from tfrbeam.beam.parquet_export import ExportToParquet
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.main import main
from tfrbeam.codec.encode import record_batch_to_examples
from tfrbeam.codec.example import decode_example
from tfrbeam.errors import ConfigError, OutputExistsError, RecordError
from tfrbeam.stats.export import export_to_parquet, parquet_name
from tfrbeam.tfrecord.records import RecordWriter, read_records

CONFIGS = ("demo.yaml", "csv_example.yaml", "parquet_example.yaml")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """The three example configs built from the demo data (in a temp working directory)."""
    return build_examples(tmp_path_factory.mktemp("builds"), *CONFIGS)["demo"].parent


def _float_key(value: float) -> bytes:
    return struct.pack("<f", value)  # bit-exact, NaN included


def canonical_example(example: dict) -> tuple:
    """An Example as sorted (name, values) pairs; floats by their float32 bits, text (a string column) by its UTF-8
    bytes (what the Example holds)."""
    return tuple(sorted(
        (name, tuple(_canonical_value(v) for v in values)) for name, values in example.items()
    ))


def _canonical_value(value):
    if isinstance(value, float):
        return _float_key(value)
    return value.encode("utf-8") if isinstance(value, str) else value


def canonical_row(row: dict) -> tuple:
    """A Parquet row as the Example it stands for: null -> absent, scalar -> one value, list -> its values."""
    example = {}
    for name, value in row.items():
        if value is None:
            continue
        example[name] = value if isinstance(value, list) else [value]
    return canonical_example(example)


def split_records(dataset: pathlib.Path, split: str) -> collections.Counter:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    compression = manifest.get("compression")
    return collections.Counter(
        canonical_example(decode_example(record))
        for shard in manifest["splits"][split]["shards"]
        for record in read_records(str(dataset / shard["path"]), compression)
    )


def parquet_rows(paths) -> collections.Counter:
    return collections.Counter(canonical_row(row) for path in paths for row in pq.read_table(path).to_pylist())


@pytest.mark.parametrize("config", CONFIGS)
def test_build_then_export_gives_each_splits_rows(built, tmp_path, config):
    dataset = built / config.removesuffix(".yaml")
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    paths = export_to_parquet(str(dataset), str(tmp_path / "parquet"))
    assert len(paths) == sum(len(entry["shards"]) for entry in manifest["splits"].values())
    for split, entry in manifest["splits"].items():
        mine = sorted(path for path in paths if pathlib.Path(path).parent.name == split)
        assert [pathlib.Path(path).name for path in mine] == sorted(parquet_name(shard["path"]) for shard in entry["shards"])
        assert parquet_rows(mine) == split_records(dataset, split)
        assert sum(pq.ParquetFile(path).metadata.num_rows for path in mine) == entry["num_examples"]
    schema = pq.read_schema(paths[0])
    for name, feature in manifest["features"].items():
        field = schema.field(name)
        if feature["shape"] == []:
            assert not pa.types.is_list(field.type) and not pa.types.is_fixed_size_list(field.type)
        elif feature["shape"] is None:
            assert pa.types.is_list(field.type)
        else:
            assert pa.types.is_fixed_size_list(field.type) and field.type.list_size == feature["shape"][0]
        assert field.nullable == (not feature["always_present"] or feature["shape"] is None)


def test_demo_export_equals_the_demo_input_rows(built, tmp_path):
    """Across splits, the exported rows are the demo table's good rows, computed without the pipeline."""
    from tests.builder.pipeline.test_graph import expected_demo_examples

    paths = export_to_parquet(str(built / "demo"), str(tmp_path / "demo"))
    expected = collections.Counter({
        tuple((name, tuple(_float_key(v) if isinstance(v, float) else v for v in values)) for name, values in key): count
        for key, count in expected_demo_examples().items()
    })
    assert parquet_rows(paths) == expected


def test_page_checksums_are_written_and_catch_a_flipped_byte(built, tmp_path):
    path = export_to_parquet(str(built / "demo"), str(tmp_path / "x"), splits=["eval"])[0]
    assert pq.read_table(path, page_checksum_verification=True).num_rows > 0
    metadata = pq.ParquetFile(path).metadata
    column = metadata.row_group(0).column(metadata.schema.names.index("distance"))
    data = bytearray(pathlib.Path(path).read_bytes())
    data[column.data_page_offset + column.total_compressed_size - 3] ^= 0x55
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(bytes(data))
    with pytest.raises(OSError, match=r"(?i)crc|checksum"):
        pq.read_table(broken, page_checksum_verification=True)


def test_export_split_and_columns_from_the_command_line(built, tmp_path, capsys):
    out = tmp_path / "cols"
    assert main(["export", str(built / "csv_example"), str(out), "--split", "validation", "--columns", "route", "tags"]) == 0
    assert os.listdir(out) == ["validation"]
    table = pq.read_table(next((out / "validation").iterdir()))
    assert table.schema.names == ["route", "tags"]
    assert "wrote 1 Parquet file under" in capsys.readouterr().out
    assert main(["export", str(built / "csv_example"), str(out), "--columns", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["export", str(built / "csv_example"), str(out), "--split", "nope"]) == 2


def test_a_corrupt_shard_leaves_no_parquet_file_at_all(built, tmp_path):
    """Invariant: the export is published whole or not at all; a failed shard leaves no Parquet file and no temp,
    not even those of the shards before it."""
    dataset = tmp_path / "demo"
    shutil.copytree(built / "demo", dataset)
    shard = dataset / "train" / "train-00002-of-00004.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(RecordError, match=r"train-00002-of-00004\.tfrecord"):
        export_to_parquet(str(dataset), str(out), splits=["train"])
    assert sorted(os.listdir(out / "train")) == []


def test_beam_export_writes_the_local_exports_files_with_checksums(built, tmp_path):
    dataset = built / "csv_example"
    local = export_to_parquet(str(dataset), str(tmp_path / "local"))
    with beam.Pipeline() as pipeline:
        written = pipeline | ExportToParquet(str(dataset), str(tmp_path / "beam"))
        names = [path.replace(str(tmp_path / "local"), str(tmp_path / "beam")) for path in local]
        assert_that(written, equal_to(names))
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    for split, entry in manifest["splits"].items():
        files = sorted((tmp_path / "beam" / split).glob("*.parquet"))
        assert [path.name for path in files] == sorted(parquet_name(shard["path"]) for shard in entry["shards"])
        for path in files:  # OUTPUT_DIR/<split>/<shard name>.parquet holds that shard's rows, as the local export's
            table = pq.read_table(path, page_checksum_verification=True)
            assert table.equals(pq.read_table(tmp_path / "local" / split / path.name))
        assert parquet_rows(files) == split_records(dataset, split)


def test_beam_export_refuses_existing_files_unless_overwrite(built, tmp_path):
    dataset = built / "csv_example"
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "train" / "old-00009-of-00010.parquet").write_bytes(b"an older export")
    with pytest.raises(OutputExistsError, match=r"old-00009-of-00010.parquet .* pass --overwrite \(overwrite=True\)"):
        ExportToParquet(str(dataset), str(out))
    with beam.Pipeline() as pipeline:
        _ = pipeline | ExportToParquet(str(dataset), str(out), overwrite=True)
    assert not (out / "train" / "old-00009-of-00010.parquet").exists()
    assert sorted(path.name for path in (out / "train").iterdir()) == sorted(
        parquet_name(path.name) for path in (dataset / "train").glob("*.tfrecord*"))


def test_beam_export_reads_and_writes_a_non_local_filesystem(built):
    """A dataset on another Beam filesystem (memfs://, as gs:// would be): the manifest and every file go through Beam."""
    dataset = memfs.upload(built / "csv_example", "memfs://bucket/csv_example")
    out = "memfs://bucket/exported"
    try:
        with beam.Pipeline() as pipeline:
            _ = pipeline | ExportToParquet(dataset, out)
        written = memfs.files_under(out)
        manifest = json.loads((built / "csv_example" / "tfrbeam_dataset.json").read_text())
        assert sorted(written) == sorted(f"{split}/{parquet_name(shard['path'])}" for split, entry in
                                         manifest["splits"].items() for shard in entry["shards"])
        for split in manifest["splits"]:
            tables = [pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
                      for name, data in written.items() if name.startswith(f"{split}/")]
            rows = collections.Counter(canonical_row(row) for table in tables for row in table.to_pylist())
            assert rows == split_records(built / "csv_example", split)
        with pytest.raises(OutputExistsError, match="memfs://bucket/exported/"):
            ExportToParquet(dataset, out)
    finally:
        memfs.clear("memfs://bucket")


def test_plain_tfrecord_files_with_no_records_are_refused_clearly(tmp_path):
    with RecordWriter(str(tmp_path / "empty.tfrecord")):
        pass
    with pytest.raises(ConfigError, match="hold no records"):
        export_to_parquet(str(tmp_path / "*.tfrecord"), str(tmp_path / "out"))


_NUMBERS = {
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=True, allow_infinity=True),
    "bytes": st.binary(max_size=8),
}
_ARROW = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}


@st.composite
def tables(draw, layouts=("scalar", "nullable", "fixed", "list")):
    rows = draw(st.integers(1, 40))
    columns = {}
    for index in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(sorted(_NUMBERS)))
        layout = draw(st.sampled_from(layouts))
        values = _NUMBERS[kind]
        name = f"{layout}_{kind}_{index}"
        if layout == "scalar":
            column = pa.array(draw(st.lists(values, min_size=rows, max_size=rows)), _ARROW[kind])
        elif layout == "nullable":
            column = pa.array(draw(st.lists(st.none() | values, min_size=rows, max_size=rows)), _ARROW[kind])
        elif layout == "fixed":
            size = draw(st.integers(1, 3))
            column = pa.array(draw(st.lists(st.lists(values, min_size=size, max_size=size), min_size=rows, max_size=rows)),
                              pa.list_(_ARROW[kind], size))
        else:
            column = pa.array(draw(st.lists(st.none() | st.lists(values, max_size=3), min_size=rows, max_size=rows)),
                              pa.list_(_ARROW[kind]))
        columns[name] = column
    return pa.table(columns)


def table_examples(table: pa.Table) -> collections.Counter:
    """What the table's rows are as Examples, from the encoder's own output decoded one by one."""
    return collections.Counter(canonical_example(decode_example(record)) for record in record_batch_to_examples(table))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tables(), st.integers(1, 3))
def test_hypothesis_tables_round_trip_through_plain_tfrecord_files(tmp_path_factory, table, files):
    directory = tmp_path_factory.mktemp("rt")
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for index, (low, high) in enumerate(zip(bounds[:-1], bounds[1:])):
        with RecordWriter(str(directory / f"part-{index}.tfrecord")) as writer:
            for record in record_batch_to_examples(table.slice(low, high - low)):
                writer.write(record)
    if all(column.null_count == len(column) or (pa.types.is_list(column.type) and all(
            not item for item in column.to_pylist())) for column in table.columns):
        return  # no feature has a kind in any record: nothing to infer a schema from
    try:
        paths = export_to_parquet(str(directory / "part-*.tfrecord"), str(directory / "out"))
    except ConfigError as error:
        assert "no kind" in str(error) or "hold no records" in str(error)
        return
    exported = parquet_rows(paths)
    expected = table_examples(table)
    kept = {name for path in paths for name in pq.read_schema(path).names}
    expected = collections.Counter({tuple(pair for pair in key if pair[0] in kept): count for key, count in expected.items()})
    assert exported == expected
    original = collections.Counter(canonical_row(row) for row in table.to_pylist())
    if kept == set(table.column_names):
        assert exported == original  # and the Parquet rows are the table's rows


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tables(layouts=("scalar", "nullable", "list")))
def test_hypothesis_tables_round_trip_through_a_build(tmp_path_factory, table):
    """Parquet input -> tfrbeam build (config from infer-config) -> export: every split's rows, and all of them the input's."""
    from tfrbeam.builder.pipeline.infer_config import infer_config

    directory = tmp_path_factory.mktemp("build-rt")
    pq.write_table(table, directory / "input.parquet")
    config = directory / "config.yaml"
    config.write_text(infer_config(str(directory / "input.parquet")))
    dataset = directory / "dataset"
    assert build_main([str(config), "--quiet", "--set", f"output.path={dataset}"]) == 0
    paths = export_to_parquet(str(dataset), str(directory / "parquet"))
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    for split in manifest["splits"]:
        assert parquet_rows([path for path in paths if pathlib.Path(path).parent.name == split]) == split_records(dataset, split)
    assert parquet_rows(paths) == collections.Counter(canonical_row(row) for row in table.to_pylist())


def test_export_refuses_existing_parquet_files_unless_overwrite(built, tmp_path, capsys):
    out = tmp_path / "again"
    assert main(["export", str(built / "demo"), str(out), "--split", "eval"]) == 0
    stale = out / "eval" / "eval-00007-of-00008.parquet"
    stale.write_bytes(b"left over from an older export")
    capsys.readouterr()
    assert main(["export", str(built / "demo"), str(out), "--split", "eval"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(built / "demo"), str(out), "--split", "eval", "--overwrite"]) == 0
    assert os.listdir(out / "eval") == ["eval-00000-of-00001.parquet"]


def test_a_feature_that_is_always_an_empty_list_exports_as_a_list(tmp_path):
    """Found by hypothesis in CI: open_dataset infers shape [0], and Arrow cannot build fixed_size_list<0> arrays."""
    table = pa.table({"empty": pa.array([[], []], pa.list_(pa.int64())), "n": pa.array([1, 2])})
    with RecordWriter(str(tmp_path / "a.tfrecord")) as writer:
        for record in record_batch_to_examples(table):
            writer.write(record)
    [path] = export_to_parquet(str(tmp_path / "a.tfrecord"), str(tmp_path / "out"))
    exported = pq.read_table(path)
    assert pa.types.is_list(exported.schema.field("empty").type)
    assert exported.column("empty").to_pylist() == [[], []] and exported.column("n").to_pylist() == [1, 2]


def test_a_tensor_feature_is_exported_in_its_shape_and_builds_back_into_the_same_tensor(tmp_path):
    """[2, 3] and [2, 2] tensors leave as Arrow tensors of their shape, not as flat values, locally and through the
    Beam export; the Parquet file builds back into a dataset of the same shapes."""
    import tfrbeam

    rows = 20_000  # three chunks in, three blocks of 8,192 records decoded and shaped apart
    floats = np.arange(rows * 2 * 3, dtype=np.float32).reshape(rows, 2, 3)
    ints = np.arange(rows * 2 * 2, dtype=np.int64).reshape(rows, 2, 2) - 7
    whole = pa.table({"id": list(range(rows)), "x": pa.FixedShapeTensorArray.from_numpy_ndarray(floats),
                      "y": pa.array(ints.tolist(), pa.list_(pa.list_(pa.int64(), 2), 2))})
    table = pa.concat_tables([whole.slice(0, 7_000), whole.slice(7_000, 6_000), whole.slice(13_000)])
    assert table.column("x").num_chunks == 3
    tfrbeam.write_dataset(table, str(tmp_path / "ds"), num_shards=1, shuffle=False, progress=False)
    assert main(["export", str(tmp_path / "ds"), str(tmp_path / "local")]) == 0
    with beam.Pipeline() as pipeline:
        _ = pipeline | ExportToParquet(str(tmp_path / "ds"), str(tmp_path / "beam"))
    for out in ("local", "beam"):
        exported = pq.read_table(next((tmp_path / out).rglob("*.parquet")))
        assert exported.num_rows == rows and exported.column("id").to_pylist() == list(range(rows))
        assert exported.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [2, 3])
        assert exported.schema.field("y").type == pa.fixed_shape_tensor(pa.int64(), [2, 2])
        assert np.array_equal(exported.column("x").combine_chunks().to_numpy_ndarray(), floats)
        assert np.array_equal(exported.column("y").combine_chunks().to_numpy_ndarray(), ints)
    rebuilt = tfrbeam.write_dataset(exported, str(tmp_path / "again"), num_shards=1, shuffle=False, progress=False)
    assert rebuilt is not None
    manifest = json.loads((tmp_path / "again" / "tfrbeam_dataset.json").read_text())
    assert (manifest["features"]["x"]["shape"], manifest["features"]["y"]["shape"]) == ([2, 3], [2, 2])
