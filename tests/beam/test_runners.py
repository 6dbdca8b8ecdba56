"""tfrbeam's Beam transforms on every runner the issue names, one read+write pipeline each.

The same pipeline (ReadFromTFRecord and ReadAllFromTFRecord into WriteToTFRecord with fixed and
with size-limited sharding; ReadExamples as record batches and as dicts into WriteExamples;
ReadSequenceExamples into WriteSequenceExamples) runs
on the DirectRunner in-process, in multi_processing mode with two workers, and on the
PortableRunner with an embedded job server (the portable representation Dataflow Runner v2
uses), its SDK workers in this process (LOOPBACK) and in separate processes started by an
EXTERNAL worker pool this module starts and stops; and it is turned into a Dataflow job with
``--dry_run=True`` offline. Runners start slowly, so there is one pipeline per runner. Beam's
DaskRunner is refused (tests/beam/test_lossy_runners.py).
"""

from __future__ import annotations

import collections
import os
import pathlib

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tests.helpers import shard_files
from tests.worker_pool import external_worker_pool, workers_started
from tfrbeam.beam.examples_read import ReadExamples
from tfrbeam.beam.examples_write import WriteExamples
from tfrbeam.beam.sequence_examples import ReadSequenceExamples, WriteSequenceExamples
from tfrbeam.beam.sink import WriteToTFRecord
from tfrbeam.beam.source import ReadAllFromTFRecord, ReadFromTFRecord
from tfrbeam.codec.example import decode_example, decode_sequence_example, encode_example, encode_sequence_example
from tfrbeam.tfrecord.records import RecordWriter, read_records

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
INPUT_RECORDS = [b"record-%03d" % i * (1 + i % 5) for i in range(120)]
EXAMPLES = [{"id": [i], "name": [b"n%d" % i], "score": [i / 4]} for i in range(30)]
SEQUENCES = [({"id": [i]}, {"step": [[j] for j in range(i % 4)], "w": [[j / 2] for j in range(i % 4)]}) for i in range(20)]



def _write_inputs(directory: pathlib.Path) -> tuple[str, str, str]:
    """Uncompressed inputs written by plain framing (no read index, as TF writes them): raw records
    in two files, one file of Examples and one of SequenceExamples. Returns their patterns."""
    directory.mkdir()
    for number, part in enumerate((INPUT_RECORDS[:70], INPUT_RECORDS[70:])):
        with RecordWriter(str(directory / f"in-{number}.tfrecord")) as writer:
            writer.write_many(part)
    with RecordWriter(str(directory / "examples.tfrecord")) as writer:
        writer.write_many(encode_example(example) for example in EXAMPLES)
    with RecordWriter(str(directory / "sequences.tfrecord")) as writer:
        kinds = {"step": "int64", "w": "float"}
        writer.write_many(encode_sequence_example(*pair, feature_list_kinds=kinds) for pair in SEQUENCES)
    return str(directory / "in-*.tfrecord"), str(directory / "examples.tfrecord"), str(directory / "sequences.tfrecord")


def _build(pipeline: beam.Pipeline, patterns: tuple[str, str, str], out: str, validate: bool = True) -> None:
    records, examples, sequences = patterns
    _ = (
        pipeline
        | "Read" >> ReadFromTFRecord(records, validate=validate)
        | "WriteFixed" >> WriteToTFRecord(f"{out}/fixed", num_shards=3)
    )
    _ = (
        pipeline
        | "Patterns" >> beam.Create([records])
        | "ReadAll" >> ReadAllFromTFRecord()
        | "WriteLimited" >> WriteToTFRecord(f"{out}/limited", max_records_per_shard=25, file_name_suffix=".gz")
    )
    _ = (
        pipeline
        | "ReadBatches" >> ReadExamples(examples, output="record_batches", batch_size=8, validate=validate)
        | "WriteBatches" >> WriteExamples(f"{out}/batches", num_shards=2)
    )
    _ = (
        pipeline
        | "ReadDicts" >> ReadExamples(examples, output="dicts", validate=validate)
        | "WriteDicts" >> WriteExamples(f"{out}/dicts", compression="zlib")
    )
    _ = (
        pipeline
        | "ReadSequences" >> ReadSequenceExamples(sequences, validate=validate)
        | "WriteSequences" >> WriteSequenceExamples(f"{out}/sequences", num_shards=2,
                                                    feature_list_kinds={"step": "int64", "w": "float"})
    )


def _verify(out: pathlib.Path) -> None:
    fixed, limited = shard_files(str(out / "fixed")), shard_files(str(out / "limited"), ".gz")
    assert len(fixed) == 3 and all(path.endswith("-of-00003") for path in fixed)
    assert len(limited) >= 5 and all(path.endswith(".gz") for path in limited)
    expected = collections.Counter(INPUT_RECORDS)
    for paths in (fixed, limited):
        assert collections.Counter(r for path in paths for r in read_records(path)) == expected
    assert all(sum(1 for _ in read_records(path)) <= 25 for path in limited)
    by_id = sorted(EXAMPLES, key=lambda example: example["id"])
    for name, compression in (("batches", None), ("dicts", "zlib")):
        suffix = ".gz" if name == "limited" else ""
        written = [decode_example(r) for path in shard_files(str(out / name), suffix) for r in read_records(path, compression)]
        assert sorted(written, key=lambda example: example["id"]) == by_id
    sequences = [decode_sequence_example(r) for path in shard_files(str(out / "sequences")) for r in read_records(path)]
    assert sorted(sequences, key=lambda pair: pair[0]["id"]) == SEQUENCES
    assert not [name for name in os.listdir(out) if name.startswith(".tfrbeam-temp")]


RUNNERS = {
    "direct_in_process": [],
    "direct_multi_processing": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    "portable_embedded": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
}


@pytest.fixture(scope="module")
def worker_pool(tmp_path_factory):
    with external_worker_pool(tmp_path_factory.mktemp("pool") / "pool.log") as pool:
        yield pool


@pytest.mark.parametrize("runner", [*RUNNERS, "portable_external_workers"])
def test_read_write_pipeline_runs(tmp_path, monkeypatch, request, runner):
    # multi_processing workers are separate Python processes: they import tfrbeam from this tree.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    patterns = _write_inputs(tmp_path / "input")
    out = tmp_path / "out"
    if runner == "portable_external_workers":
        address, log = request.getfixturevalue("worker_pool")
        started_before = workers_started(log)
        options = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                   f"--environment_config={address}"]
    else:
        options = RUNNERS[runner]
    with beam.Pipeline(options=PipelineOptions(options)) as pipeline:
        _build(pipeline, patterns, str(out))
    _verify(out)
    if runner == "portable_external_workers":
        assert workers_started(log) > started_before


def test_dataflow_job_builds_offline():
    """DataflowRunner --dry_run builds the job (portable pipeline proto + job) without GCP access."""
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs apache-beam[gcp]")
    options = PipelineOptions([
        "--runner=DataflowRunner", "--dry_run=True", "--project=fake-project", "--region=us-central1",
        "--temp_location=gs://fake-bucket/tmp",
    ])
    pipeline = beam.Pipeline(options=options)
    # validate=False: listing gs:// while building needs credentials (as with Beam's own reader).
    inputs = ("gs://fake-bucket/input/in-*.tfrecord", "gs://fake-bucket/input/examples.tfrecord",
              "gs://fake-bucket/input/sequences.tfrecord")
    _build(pipeline, inputs, "gs://fake-bucket/out", validate=False)
    result = pipeline.run()
    assert result.state == "DONE"
    names = {transform.unique_name for transform in result.job.proto_pipeline.components.transforms.values()}
    for expected in ("Read", "ReadAll", "ReadBatches", "ReadDicts", "WriteFixed/Write/Finalize",
                     "WriteLimited/Write/WriteBundleShards", "WriteFixed/Write/GroupByShard",
                     "WriteBatches/Write/Finalize", "WriteDicts/EncodeExamples", "ReadSequences",
                     "WriteSequences/EncodeSequenceExamples", "WriteSequences/Write/Finalize"):
        assert expected in names, f"{expected} missing from the Dataflow job graph"
