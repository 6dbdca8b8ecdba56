"""WriteDataset and write_dataset: the build after reading, on rows that are not files.

The same rows give the same shard bytes as ``tfrbeam build`` of a Parquet file of them, in a
user's pipeline (on the FnApiRunner and the multi-process DirectRunner) and from a table in memory;
errors are one-line TfrbeamErrors; under a fault in the publish the output holds the old dataset or
the new one, never neither.
"""

from __future__ import annotations

import json
import logging
import pathlib

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import tfrbeam
from tests.faults import injected
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.example import decode_example
from tfrbeam.errors import BadRecordError, CommitError, ConfigError, InputError, OutputExistsError, TfrbeamError
from tfrbeam.layout.manifest import read_manifest, verify_dataset
from tfrbeam.tfrecord.records import read_records

SPLITS = {"train": 0.75, "eval": 0.25}


def rows_table(count: int = 2000) -> pa.Table:
    ids = np.arange(count, dtype=np.int64)
    return pa.table({
        "id": ids,
        "label": [f"class-{i % 7}" for i in range(count)],
        "score": (ids * 0.37).astype(np.float64),
        "tags": [[i % 5, i % 11] for i in range(count)],
    })


def shard_bytes(dataset: pathlib.Path) -> dict[str, bytes]:
    """Every shard file of a dataset by its path in the dataset (the indexes carry mtimes, so they are left out)."""
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {shard["path"]: (dataset / shard["path"]).read_bytes()
            for split in manifest["splits"].values() for shard in split["shards"]}


def cli_build(tmp_path: pathlib.Path, table: pa.Table, output: str, **settings) -> pathlib.Path:
    """``tfrbeam build`` of the table written as one Parquet file; settings are config keys (YAML values)."""
    pq.write_table(table, tmp_path / "rows.parquet")
    config = {"input": {"path": str(tmp_path / "rows.parquet")}, "output": {"path": str(tmp_path / output)},
              "splits": SPLITS, **settings}
    if "num_shards" in settings:
        config["output"]["num_shards"] = config.pop("num_shards")
    (tmp_path / f"{output}.yaml").write_text(json.dumps(config))
    assert build_main([str(tmp_path / f"{output}.yaml"), "--quiet"]) == 0
    return tmp_path / output


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[pa.Table, dict[str, bytes]]:
    """The rows and the shards ``tfrbeam build`` makes of them (seed 5, three shards per split)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    table = rows_table()
    dataset = cli_build(tmp_path, table, "cli", shuffle={"seed": 5}, num_shards=3)
    return table, shard_bytes(dataset)


def test_write_dataset_of_a_table_gives_the_bytes_tfrbeam_build_gives(tmp_path, reference):
    table, expected = reference
    result = tfrbeam.write_dataset(table, tmp_path / "api", splits=SPLITS, seed=5, num_shards=3, progress=False)
    assert shard_bytes(tmp_path / "api") == expected
    assert result.manifest_path == str(tmp_path / "api" / "tfrbeam_dataset.json")
    assert sum(result.num_examples.values()) == table.num_rows
    assert result.summary.splitlines()[0].split() == ["split", "examples", "shards", "bytes"]
    assert read_manifest(str(tmp_path / "api")).to_dict()["config"]["input"] == {
        "format": "arrow", "path": "table", "columns": None, "split_bytes": 64 << 20}
    assert verify_dataset(str(tmp_path / "api")) == []


def test_write_dataset_of_a_pandas_dataframe_gives_the_bytes_tfrbeam_build_gives(tmp_path, reference):
    """A real pandas DataFrame, taken through the Arrow PyCapsule stream (pandas is not a dependency of tfrbeam)."""
    import pandas
    table, expected = reference
    frame = table.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and hasattr(frame, "__arrow_c_stream__")
    tfrbeam.write_dataset(frame, tmp_path / "pandas", splits=SPLITS, seed=5, num_shards=3, progress=False)
    assert shard_bytes(tmp_path / "pandas") == expected


def test_write_dataset_keeps_its_rows_out_of_the_job_graph(tmp_path, reference, monkeypatch):
    """Beam pickles and bz2-compresses what beam.Create holds: only (batch, first row) pairs may go there."""
    table, expected = reference
    created: list = []
    original = beam.Create.__init__

    def recording(self, values, *args, **kwargs):
        created.extend(values)
        original(self, values, *args, **kwargs)

    monkeypatch.setattr(beam.Create, "__init__", recording)
    tfrbeam.write_dataset(table, tmp_path / "api", splits=SPLITS, seed=5, num_shards=3, progress=False)
    assert shard_bytes(tmp_path / "api") == expected
    assert ((0, 1, 2000),) in created  # the one batch, starting at row 1, of 2000 rows
    assert not [value for value in created if isinstance(value, SourceBatch)]
    assert not (tmp_path / "api" / "write-dataset-rows.arrow").exists()


def test_a_full_disk_while_the_rows_are_staged_is_one_line_and_leaves_nothing(tmp_path, reference, monkeypatch):
    """ENOSPC writing the table's IPC file: OutputNotWritableError, no dataset, nothing left beside the output."""
    import errno

    from tfrbeam.beam import filesystem as fs

    table, _ = reference
    create = fs.create

    def full_disk(path, *args, **kwargs):
        if path.endswith("write-dataset-rows.arrow"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return create(path, *args, **kwargs)

    monkeypatch.setattr(fs, "create", full_disk)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(tfrbeam.errors.OutputNotWritableError, match="No space left on device") as raised:
        tfrbeam.write_dataset(table, tmp_path / "api", num_shards=3, progress=False)
    assert "\n" not in str(raised.value)
    assert sorted(tmp_path.iterdir()) == before or [p.name for p in tmp_path.iterdir()] == ["api"]
    assert not (tmp_path / "api" / "tfrbeam_dataset.json").exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".tfrbeam")]


def test_write_dataset_on_worker_processes_gives_the_same_bytes(tmp_path, reference):
    """``--workers 2``: the workers are other processes, reading the table's batches from the run's staging files."""
    table, expected = reference
    result = tfrbeam.write_dataset(table, tmp_path / "api", splits=SPLITS, seed=5, num_shards=3, progress=False,
                                   pipeline_options=["--workers=2"])
    assert shard_bytes(tmp_path / "api") == expected
    assert result.manifest["run"]["workers"]["count"] == 2 and result.manifest["run"]["piece_store"] == "spill"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["api"]  # no staging left beside it


def test_without_shuffle_write_dataset_keeps_the_table_order_as_the_build_keeps_the_file_order(tmp_path):
    table = rows_table(500)
    expected = shard_bytes(cli_build(tmp_path, table, "cli", shuffle={"enabled": False}, num_shards=2))
    tfrbeam.write_dataset(table, tmp_path / "api", splits=SPLITS, shuffle=False, num_shards=2, progress=False)
    assert shard_bytes(tmp_path / "api") == expected
    ids = [decode_example(record)["id"][0] for record in read_records(str(tmp_path / "api" / "train" /
                                                                         "train-00000-of-00002.tfrecord"))]
    assert ids == sorted(ids)


def _pipeline_build(output: pathlib.Path, elements: list, options: list[str], **settings) -> list[str]:
    """WriteDataset at the end of a pipeline of ours; returns what its output PCollection held."""
    seen = output.parent / f"{output.name}.seen"
    with beam.Pipeline(options=PipelineOptions(options)) as pipeline:
        paths = (pipeline | beam.Create(elements, reshuffle=False)
                 | tfrbeam.WriteDataset(output, **{"splits": SPLITS, "seed": 5, "num_shards": 3, **settings}))
        _ = paths | beam.Map(lambda path: seen.write_text(path))
    return [seen.read_text()]


@pytest.mark.parametrize("options", [
    ["--runner=FnApiRunner"],
    ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
], ids=["fnapi", "direct-multi-processing"])
def test_write_dataset_in_a_pipeline_gives_the_bytes_tfrbeam_build_gives(tmp_path, reference, options):
    table, expected = reference
    output = tmp_path / "beam"
    seen = _pipeline_build(output, table.to_batches(max_chunksize=300), options, schema=table.schema)
    assert shard_bytes(output) == expected
    assert seen == [str(output / "tfrbeam_dataset.json")]
    assert verify_dataset(str(output)) == []


def test_dicts_with_the_schema_inferred(tmp_path, reference):
    """write_dataset of a list of dicts (types inferred by pyarrow); WriteDataset of dicts typed by its features."""
    table, expected = reference
    rows = table.to_pylist()
    tfrbeam.write_dataset(rows, tmp_path / "listed", splits=SPLITS, seed=5, num_shards=3, progress=False)
    assert shard_bytes(tmp_path / "listed") == expected
    scalars = table.drop_columns(["tags"])
    reference_scalars = shard_bytes(cli_build(tmp_path, scalars, "cli", shuffle={"seed": 5}, num_shards=3))
    features = {"id": "int64", "label": "bytes", "score": "float"}  # no schema=: the features' types imply it
    _pipeline_build(tmp_path / "dicts", scalars.to_pylist(), ["--runner=FnApiRunner"], features=features)
    assert shard_bytes(tmp_path / "dicts") == reference_scalars


class ArrowStreamOnly:
    """A table that offers nothing but the Arrow PyCapsule stream interface (as pandas, Polars and DuckDB do)."""

    def __init__(self, table: pa.Table):
        self._table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self._table.__arrow_c_stream__(requested_schema)


def test_anything_that_exports_an_arrow_stream(tmp_path, reference):
    table, expected = reference
    source = ArrowStreamOnly(table)
    assert not isinstance(source, (pa.Table, pa.RecordBatchReader))
    tfrbeam.write_dataset(source, tmp_path / "stream", splits=SPLITS, seed=5, num_shards=3, progress=False)
    assert shard_bytes(tmp_path / "stream") == expected


def _one_line(error: TfrbeamError) -> str:
    """The error's one line; nothing it is chained to is Beam's (a runner's wrapped worker traceback)."""
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    current: BaseException | None = error
    while current is not None:
        assert not type(current).__module__.startswith("apache_beam") and "Traceback" not in str(current), repr(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return text


def test_errors_are_one_line_tfrbeam_errors(tmp_path):
    table = rows_table(100)
    with pytest.raises(ConfigError) as caught:
        tfrbeam.write_dataset(table, tmp_path / "bad", splits={"train": 0.5, "eval": 0.2}, num_shards=0, progress=False)
    text = _one_line(caught.value)
    assert "output.num_shards: 0 is out of range" in text and "splits: fractions" in text
    with pytest.raises(ConfigError) as caught:
        tfrbeam.write_dataset(table, tmp_path / "bad", features={"idd": "int64"}, progress=False)
    assert "column 'idd' is not in table" in _one_line(caught.value) and "did you mean 'id'?" in str(caught.value)
    with pytest.raises(ConfigError, match="cannot take int as rows"):
        tfrbeam.write_dataset(42, tmp_path / "bad", progress=False)
    broken = pa.table({"id": pa.array([1, None, 3], pa.int64())})  # a null in a feature without on_null: a bad row
    with pytest.raises(BadRecordError) as caught:
        tfrbeam.write_dataset(broken, tmp_path / "bad", features={"id": "int64"}, progress=False)
    assert _one_line(caught.value).startswith("table:2: ")
    assert not (tmp_path / "bad").exists()
    tfrbeam.write_dataset(table, tmp_path / "taken", progress=False)
    with pytest.raises(OutputExistsError) as caught:
        tfrbeam.write_dataset(table, tmp_path / "taken", seed=9, progress=False)
    assert "holds a different dataset (its config differs at shuffle.seed)" in _one_line(caught.value)
    with pytest.raises(ConfigError, match="a PCollection has none"):
        tfrbeam.WriteDataset(tmp_path / "x", shuffle=False)
    with pytest.raises(ConfigError, match=r"give schema= .* \(label: no type, or a struct field\)"):
        tfrbeam.WriteDataset(tmp_path / "x", features={"id": "int64", "label": {"source": "label"}})


def test_bad_rows_go_to_dead_letters_named_by_their_row(tmp_path):
    table = pa.table({"id": pa.array([1, None, 3, None], pa.int64()), "name": ["a", "b", "c", "d"]})
    result = tfrbeam.write_dataset(table, tmp_path / "ds", features={"id": "int64", "name": "bytes"},
                                   errors={"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}, progress=False)
    assert result.manifest["bad_records"]["count"] == 2
    letters = [json.loads(line) for line in (tmp_path / "ds" / "_errors" / "00000-table.jsonl").read_text().splitlines()]
    assert [(row["file"], row["line"], json.loads(row["raw"])["name"]) for row in letters] == [("table", 2, "b"),
                                                                                               ("table", 4, "d")]


def _dataset_state(output: pathlib.Path) -> tuple[str, dict[str, bytes]]:
    return read_manifest(str(output)).run_id, shard_bytes(output)


def test_the_publish_in_a_pipeline_leaves_the_old_dataset_or_the_new_one_under_a_fault(tmp_path):
    """ENOSPC at every file operation of WriteDataset's in-pipeline commit: before the exchange the old dataset stays
    whole, from it on the new one is there; never neither, never a mix."""
    table = rows_table(300)
    batches = table.to_batches(max_chunksize=100)
    output = tmp_path / "ds"
    _pipeline_build(output, batches, ["--runner=FnApiRunner"], schema=table.schema)
    old = _dataset_state(output)
    log: list[str] = []
    _pipeline_build(tmp_path / "counted", batches, ["--runner=FnApiRunner"], schema=table.schema)
    with injected(None, 0, log):  # number the operations of a replace
        _pipeline_build(tmp_path / "counted", batches, ["--runner=FnApiRunner"], schema=table.schema, seed=7,
                        overwrite=True)
    operations = len(log)
    assert [line.split()[1] for line in log].count("exchange") == 1, log
    outcomes = set()
    for at in range(1, operations + 1):
        try:
            with injected("enospc", at):
                _pipeline_build(output, batches, ["--runner=FnApiRunner"], schema=table.schema, seed=7, overwrite=True)
        except Exception as error:  # the user's pipeline raises what its runner raises
            assert "No space left on device" in str(error) or "disk is full" in str(error), error
        assert verify_dataset(str(output)) == [], log[at - 1]
        state = _dataset_state(output)
        if state == old:
            outcomes.add("old")
        else:
            assert state[1] == shard_bytes(tmp_path / "counted"), log[at - 1]  # the new dataset, whole
            outcomes.add("new")
            _pipeline_build(output, batches, ["--runner=FnApiRunner"], schema=table.schema, overwrite=True)
            old = _dataset_state(output)
    assert outcomes == {"old", "new"}


def test_write_dataset_publishes_from_its_launcher_and_keeps_the_old_dataset_when_that_fails(tmp_path):
    table = rows_table(300)
    output = tmp_path / "ds"
    tfrbeam.write_dataset(table, output, progress=False)
    old = _dataset_state(output)
    log: list[str] = []
    tfrbeam.write_dataset(table, tmp_path / "counted", progress=False)
    with injected(None, 0, log):  # number the operations of a replace
        tfrbeam.write_dataset(table, tmp_path / "counted", seed=7, overwrite=True, progress=False)
    exchange = next(number for number, line in enumerate(log, start=1) if line.split()[1] == "exchange")
    for at in (1, exchange // 2, exchange):
        with injected("enospc", at), pytest.raises(CommitError) as caught:
            tfrbeam.write_dataset(table, output, seed=7, overwrite=True, progress=False)
        assert "disk is full" in _one_line(caught.value) and "the old dataset at" in str(caught.value)
        assert _dataset_state(output) == old and verify_dataset(str(output)) == []
    tfrbeam.write_dataset(table, output, seed=7, overwrite=True, progress=False)
    assert shard_bytes(output) == shard_bytes(tmp_path / "counted")


def test_write_dataset_shows_progress_and_the_summary_and_writes_stats_when_asked(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tfrbeam"):
        result = tfrbeam.write_dataset(rows_table(400), tmp_path / "ds", stats=True)
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith("shuffle and write: 400 examples") for message in messages), messages
    assert any(message.startswith(f"built {tmp_path / 'ds'}:") and "rows read:  400" in message for message in messages)
    stats = json.loads((tmp_path / "ds" / "stats.json").read_text())
    assert result is not None and json.dumps(stats).count('"id"') >= 1


def test_an_empty_table_makes_an_empty_dataset_unless_allow_empty_is_false(tmp_path):
    empty = rows_table(0)
    result = tfrbeam.write_dataset(empty, tmp_path / "empty", progress=False)
    assert result is not None and result.num_examples == {"train": 0}
    with pytest.raises(InputError, match=r"table holds no rows; errors\.allow_empty is false"):
        tfrbeam.write_dataset(empty, tmp_path / "refused", errors={"allow_empty": False}, progress=False)
    assert not (tmp_path / "refused").exists()


def test_a_failed_pipeline_leaves_its_staging_directory_until_discarded(tmp_path):
    from tfrbeam.builder.pipeline.commit import discard_staging

    broken = pa.record_batch({"id": pa.array([1, None, 3], pa.int64())})
    write = tfrbeam.WriteDataset(tmp_path / "ds", features={"id": "int64"})
    with pytest.raises(Exception, match=r"pcollection:2: feature 'id': is null"):
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            _ = pipeline | beam.Create([broken]) | write
    assert write.plan is not None and pathlib.Path(write.plan.staging_dir).is_dir()
    assert not (tmp_path / "ds").exists()
    discard_staging(write.plan)
    assert not pathlib.Path(write.plan.staging_dir).exists()


def test_a_dict_that_does_not_fit_the_schema_is_a_bad_row_and_tables_are_taken_whole(tmp_path):
    rows = [{"id": 1, "name": "a"}, {"id": "two", "name": "b"}, {"id": 3, "name": "c"}]
    settings = {"features": {"id": "int64", "name": "bytes"}, "num_shards": 1, "splits": {"train": 1.0},
                "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}}
    _pipeline_build(tmp_path / "dicts", rows, ["--runner=FnApiRunner"], **settings)
    manifest = read_manifest(str(tmp_path / "dicts")).to_dict()
    assert (manifest["rows_read"], manifest["bad_records"]["count"]) == (3, 1)
    letters = (tmp_path / "dicts" / "_errors" / "00000-pcollection.jsonl").read_text().splitlines()
    [letter] = [json.loads(line) for line in letters]
    assert (letter["file"], letter["line"], json.loads(letter["raw"])) == ("pcollection", 2, {"id": "two", "name": "b"})
    assert "does not fit the schema" in letter["reason"]
    table = pa.table({"id": [1, 3], "name": ["a", "c"]})  # the good rows, as one pyarrow.Table element
    _pipeline_build(tmp_path / "table", [table], ["--runner=FnApiRunner"], **settings)
    assert shard_bytes(tmp_path / "table") == shard_bytes(tmp_path / "dicts")


def test_shards_sized_by_bytes_stay_under_the_cap(tmp_path):
    result = tfrbeam.write_dataset(rows_table(3000), tmp_path / "capped", max_bytes_per_shard="40KiB", progress=False)
    shards = result.manifest["splits"]["train"]["shards"]
    assert len(shards) > 1 and all((tmp_path / "capped" / shard["path"]).stat().st_size <= 40 << 10 for shard in shards)
    assert sum(shard["num_examples"] for shard in shards) == 3000
