"""Statistics as a Beam combine: the same numbers as ``tfrbeam stats`` computes locally, on a real build."""

from __future__ import annotations

import json
import os
import pathlib

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests import memfs
from tests.example_builds import build_examples
from tfrbeam.beam.stats_combine import ComputeDatasetStats, SplitStatsCombineFn, WriteStatsFiles, files_pattern
from tfrbeam.stats.compute import compute_stats, write_dataset_stats

EXACT_KEYS = ("present", "missing", "num_values", "values_per_example", "min", "max", "num_zeros", "num_nan",
              "top_values", "num_unique", "length")


@pytest.fixture(scope="module")
def demo_build(tmp_path_factory) -> pathlib.Path:
    return build_examples(tmp_path_factory.mktemp("statsbuild"), "csv_example.yaml")["csv_example"]


def _same(beam_stats: dict, local: dict) -> None:
    assert list(beam_stats["splits"]) == list(local["splits"])
    for split, entry in local["splits"].items():
        assert beam_stats["splits"][split]["num_examples"] == entry["num_examples"]
        for name, feature in entry["features"].items():
            other = beam_stats["splits"][split]["features"][name]
            for key in EXACT_KEYS:
                assert other[key] == feature[key], (split, name, key)
            for key in ("mean", "std"):
                assert other[key] == (None if feature[key] is None else pytest.approx(feature[key], rel=1e-9))


def test_beam_combine_gives_the_local_numbers_and_writes_the_files(demo_build, tmp_path):
    local = compute_stats(str(demo_build))
    with beam.Pipeline() as pipeline:
        stats = pipeline | ComputeDatasetStats(str(demo_build))
        written = stats | WriteStatsFiles(str(tmp_path))

        def check(documents):
            assert len(documents) == 1
            _same(documents[0], local)

        assert_that(stats, check)
        assert_that(written, equal_to([str(tmp_path / "stats.json"), str(tmp_path / "stats.html")]), label="paths")
    on_disk = json.loads((tmp_path / "stats.json").read_text())
    _same(on_disk, local)
    assert on_disk["drift"]["baseline"] == "train"
    assert 'class="feature-row"' in (tmp_path / "stats.html").read_text()


def test_stats_of_a_dataset_on_a_non_local_filesystem(demo_build):
    """The manifest and the shards read through Beam's FileSystems (memfs://, as gs:// would be), not local files."""
    local = compute_stats(str(demo_build))
    dataset = memfs.upload(demo_build, "memfs://bucket/stats")
    try:
        with beam.Pipeline() as pipeline:
            stats = pipeline | ComputeDatasetStats(dataset)
            _ = stats | WriteStatsFiles(dataset)

            def check(documents):
                assert len(documents) == 1 and documents[0]["source"] == dataset
                _same(documents[0], local)

            assert_that(stats, check)
        written = memfs.files_under(dataset)
        _same(json.loads(written["stats.json"]), local)
        assert 'class="feature-row"' in written["stats.html"].decode()
    finally:
        memfs.clear("memfs://bucket")


def test_combine_fn_merges_accumulators_as_one_pass():
    import pyarrow as pa

    fn = SplitStatsCombineFn({"x": "int64"})
    batch = pa.record_batch({"x": pa.array([[1], [2, 3], None], pa.list_(pa.int64()))})
    left = fn.add_input(fn.create_accumulator(), batch)
    right = fn.add_input(fn.create_accumulator(), batch)
    merged = fn.extract_output(fn.merge_accumulators([left, right]))
    assert merged.num_examples == 6 and merged.features["x"].present == 4 and merged.features["x"].num_values == 6


def test_a_split_is_read_through_one_glob_when_one_matches_exactly(demo_build):
    manifest = json.loads((demo_build / "tfrbeam_dataset.json").read_text())
    files = [str(demo_build / shard["path"]) for shard in manifest["splits"]["train"]["shards"]]
    assert files_pattern(files) == str(demo_build / "train" / "*-of-00004.tfrecord.gz")
    assert files_pattern(files[:2]) is None  # the glob would match the other shards too


def test_write_dataset_stats_is_what_the_build_calls(demo_build):
    json_path, html_path = write_dataset_stats(str(demo_build))
    assert json_path == os.path.join(str(demo_build), "stats.json") and os.path.isfile(html_path)
    stats = json.loads(pathlib.Path(json_path).read_text())
    manifest = json.loads((demo_build / "tfrbeam_dataset.json").read_text())
    assert {split: entry["num_examples"] for split, entry in stats["splits"].items()} == {
        split: entry["num_examples"] for split, entry in manifest["splits"].items()
    }


def test_a_split_without_records_is_reported_with_zero_examples(tmp_path):
    from tfrbeam.codec.example import encode_example
    from tfrbeam.tfrecord.records import RecordWriter

    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    with RecordWriter(str(tmp_path / "train" / "train-00000-of-00001.tfrecord")) as writer:
        for value in range(5):
            writer.write(encode_example({"x": [value]}))
    with RecordWriter(str(tmp_path / "eval" / "eval-00000-of-00001.tfrecord")):
        pass
    shards = {
        split: [{"path": f"{split}/{split}-00000-of-00001.tfrecord", "num_examples": count}]
        for split, count in (("train", 5), ("eval", 0))
    }
    manifest = {
        "format": "tfrbeam-dataset/1",
        "compression": None,
        "features": {"x": {"type": "int64", "shape": [], "always_present": True}},
        "splits": {split: {"num_examples": entries[0]["num_examples"], "shards": entries} for split, entries in shards.items()},
    }
    (tmp_path / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    with beam.Pipeline() as pipeline:
        stats = pipeline | ComputeDatasetStats(str(tmp_path))
        assert_that(stats, lambda docs: _check_empty_eval(docs[0], compute_stats(str(tmp_path))))


def _check_empty_eval(document: dict, local: dict) -> None:
    assert document["splits"]["eval"]["num_examples"] == 0 == local["splits"]["eval"]["num_examples"]
    assert document["splits"]["train"]["features"]["x"]["max"] == 4
    assert document["drift"]["comparisons"]["eval"]["x"] is None
