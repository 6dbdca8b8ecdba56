"""Beam YAML pipelines that end in WriteTFRecordDataset or start from ReadTFExamples, run by Beam YAML's own runner.

Each pipeline runs as ``python -m apache_beam.yaml.main --yaml_pipeline_file=...`` in a subprocess on
the FnApiRunner, with tfrbeam's shipped provider file included, and its result is read back with
tfrbeam (or, for ReadTFExamples, from the JSON lines Beam YAML wrote).

Beam YAML's CSV and JSON transforms (ReadFromCsv, WriteToJson) run on Beam's DataFrames, which need
pandas < 2.4 (``apache-beam[yaml]`` pins it); the test extras install a newer pandas for other
tests. When this environment's pandas is one Beam's DataFrames cannot import, the pipelines run
with a pandas that fits first on their PYTHONPATH (``pip install --target``, kept in pytest's
cache), which is what a Beam YAML user's ``pip install apache-beam[yaml]`` gives them.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest
import yaml

from tfrbeam import decode_example, read_records
from tfrbeam.beam.yaml_rows import PROVIDERS_FILE, arrow_schema_of
from tfrbeam.builder.pipeline.yaml_write import WriteTFRecordDataset
from tfrbeam.errors import ConfigError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PIPELINE_TIMEOUT_SECONDS = 300
BEAM_YAML_PANDAS = "pandas>=2.2,<2.4"  # apache-beam[yaml]'s pin (Beam 2.72 to 2.77)


@pytest.fixture(scope="module")
def beam_yaml_env(request, tmp_path_factory) -> dict[str, str]:
    """The environment Beam YAML's subprocess runs in: this one, with a pandas Beam's DataFrames import first."""
    env = dict(os.environ)
    probe = [sys.executable, "-c", "import apache_beam.dataframe.frames"]
    if subprocess.run(probe, capture_output=True, env=env).returncode == 0:
        return env
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: then once per session
    target = (cache.mkdir("beam-yaml-pandas") if cache is not None else tmp_path_factory.mktemp("beam-yaml-pandas")) / "site"
    if not target.exists():
        staging = target.with_name(f"site.{os.getpid()}")
        installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                    str(staging), BEAM_YAML_PANDAS], capture_output=True, text=True)
        if installed.returncode != 0:
            pytest.skip(f"Beam's DataFrames cannot import this pandas and {BEAM_YAML_PANDAS} could not be installed: "
                        f"{installed.stderr[-300:]}")
        try:
            staging.rename(target)
        except OSError:  # another worker put it there first
            shutil.rmtree(staging, ignore_errors=True)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    assert subprocess.run(probe, capture_output=True, env=env).returncode == 0
    return env


def run_pipeline(directory: pathlib.Path, pipeline: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a Beam YAML pipeline (its ``pipeline:`` section) with tfrbeam's provider file included, in ``directory``."""
    text = textwrap.dedent(pipeline) + f"providers:\n  - include: {PROVIDERS_FILE}\n"
    (directory / "pipeline.yaml").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "apache_beam.yaml.main", "--yaml_pipeline_file=pipeline.yaml", "--runner=FnApiRunner"],
        cwd=directory, env=env, capture_output=True, text=True, timeout=PIPELINE_TIMEOUT_SECONDS,
    )


def succeeded(result: subprocess.CompletedProcess) -> bool:
    return result.returncode == 0 or pytest.fail(f"the pipeline failed:\n{result.stderr[-3000:]}")


def json_lines(directory: pathlib.Path, prefix: str) -> list[dict]:
    """The rows Beam's WriteToJson wrote as ``directory/prefix-SSSSS-of-NNNNN`` files."""
    return [json.loads(line) for path in sorted(directory.glob(f"{prefix}-*")) for line in path.read_text().splitlines()]


def dataset_examples(path: pathlib.Path) -> dict[str, list[dict]]:
    """Every split's Examples, decoded, read shard by shard as the manifest lists them."""
    manifest = json.loads((path / "tfrbeam_dataset.json").read_text())
    return {split: [decode_example(record) for shard in entry["shards"] for record in read_records(str(path / shard["path"]))]
            for split, entry in manifest["splits"].items()}


def csv_rows(count: int) -> tuple[str, list[dict]]:
    """A CSV of ``count`` rows (ints, text, floats a float32 holds exactly, a column with empty cells) and the
    Examples each row must become (an empty cell: the feature absent)."""
    lines, examples = ["id,name,score,tag"], []
    for number in range(count):
        tag = "" if number % 5 == 0 else f"t{number % 3}"
        lines.append(f"{number},name {number},{number / 4 - 3},{tag}")
        example = {"id": [number], "name": [f"name {number}".encode()], "score": [number / 4 - 3]}
        examples.append({**example, "tag": [tag.encode()]} if tag else example)
    return "\n".join(lines) + "\n", examples


def test_the_provider_file_names_both_transforms_by_their_modules():
    text = pathlib.Path(PROVIDERS_FILE).read_text()
    assert "WriteTFRecordDataset: tfrbeam.builder.pipeline.yaml_write.WriteTFRecordDataset" in text
    assert "ReadTFExamples: tfrbeam.beam.yaml_rows.ReadTFExamples" in text


def test_an_installed_tfrbeam_ships_the_provider_file(tmp_path):
    """The sdist holds it and building the package from that sdist puts it beside the module naming it (what
    ``pip install .`` installs)."""
    source = tmp_path / "source"
    shutil.copytree(REPO_ROOT / "tfrbeam", source / "tfrbeam", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "MANIFEST.in", "README.md", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, source / name)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=source, check=True,
                   capture_output=True)
    with tarfile.open(next((tmp_path / "dist").glob("*.tar.gz"))) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    unpacked = next((tmp_path / "unpacked").iterdir())
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path / "lib")], cwd=unpacked, check=True,
                   capture_output=True)
    installed = tmp_path / "lib" / "tfrbeam" / "beam" / pathlib.Path(PROVIDERS_FILE).name
    assert installed.read_text() == pathlib.Path(PROVIDERS_FILE).read_text()


def test_a_csv_read_by_beam_yaml_becomes_a_dataset_of_exactly_its_rows(tmp_path, beam_yaml_env):
    text, expected = csv_rows(40)
    (tmp_path / "rows.csv").write_text(text)
    result = run_pipeline(tmp_path, """\
        pipeline:
          transforms:
            - type: ReadFromCsv
              name: Read
              config: {path: rows.csv}
            - type: WriteTFRecordDataset
              input: Read
              config:
                path: ds
                splits: {train: 0.75, eval: 0.25}
                num_shards: {train: 2, eval: 1}
                seed: 7
        """, beam_yaml_env)
    assert succeeded(result)
    manifest = json.loads((tmp_path / "ds" / "tfrbeam_dataset.json").read_text())
    assert list(manifest["splits"]) == ["train", "eval"] and manifest["seed"] == 7
    assert [len(manifest["splits"][split]["shards"]) for split in ("train", "eval")] == [2, 1]
    found = dataset_examples(tmp_path / "ds")
    assert all(found.values())  # both splits hold rows
    every = sorted((example for examples in found.values() for example in examples), key=lambda example: example["id"])
    assert every == expected
    assert manifest["rows_read"] == 40 and manifest["bad_records"]["count"] == 0


def write_ages(directory: pathlib.Path, env: dict[str, str], config: dict, after: tuple[dict, ...] = ()
               ) -> subprocess.CompletedProcess:
    """ReadFromCsv of ages.csv (a typo in row 2's age, an unknown fold in row 4's) into WriteTFRecordDataset with int64
    features split by the fold column, ``config`` added to its config; ``after``: transforms after it."""
    (directory / "ages.csv").write_text("id,age,fold\n1,12,a\n2,x7,a\n3,40,b\n4,51,c\n5,33,a\n")
    write = {"type": "WriteTFRecordDataset", "name": "Write", "input": "Read",
             "config": {"path": "ds", "features": {"id": "int64", "age": "int64"},
                        "splits": {"column": "fold", "map": {"a": "train", "b": "eval"}}, **config}}
    transforms = [{"type": "ReadFromCsv", "name": "Read", "config": {"path": "ages.csv"}}, write, *after]
    return run_pipeline(directory, yaml.safe_dump({"pipeline": {"transforms": transforms}}, sort_keys=False), env)


def test_rows_the_build_cannot_convert_go_to_the_error_output_with_their_reason(tmp_path, beam_yaml_env):
    result = write_ages(tmp_path, beam_yaml_env, {"error_handling": {"output": "bad_rows"},
                                                  "errors": {"max_bad_fraction": 0.5}},
                        after=({"type": "WriteToJson", "input": "Write.bad_rows", "config": {"path": "bad/rows.json"}},))
    assert succeeded(result)
    bad = sorted(json_lines(tmp_path / "bad", "rows.json"), key=lambda row: row["element"][0])
    assert [row["element"] for row in bad] == [[2, "x7", "a"], [4, "51", "c"]]  # the rows as read (age is text)
    assert "feature 'age'" in bad[0]["msg"] and "'x7' is not an int64" in bad[0]["msg"]
    assert "split column 'fold' holds 'c', which is not a key of splits.map" in bad[1]["msg"]
    found = {split: sorted(example["id"][0] for example in examples)
             for split, examples in dataset_examples(tmp_path / "ds").items()}
    assert found == {"train": [1, 5], "eval": [3]}
    manifest = json.loads((tmp_path / "ds" / "tfrbeam_dataset.json").read_text())
    assert manifest["rows_read"] == 5 and manifest["bad_records"]["count"] == 2


def test_without_error_handling_the_builds_own_errors_setting_fails_on_a_bad_row(tmp_path, beam_yaml_env):
    result = write_ages(tmp_path, beam_yaml_env, {})
    assert result.returncode != 0
    assert "BadRecordError" in result.stderr and "'x7' is not an int64" in result.stderr
    assert not (tmp_path / "ds" / "tfrbeam_dataset.json").exists()


def test_read_tf_examples_gives_the_datasets_rows_with_the_manifests_schema(tmp_path, beam_yaml_env):
    import pyarrow as pa

    import tfrbeam

    table = pa.table({
        "id": pa.array(range(30), pa.int64()),
        "name": [f"row {number}" for number in range(30)],
        "score": pa.array([number / 8 for number in range(30)], pa.float32()),
        "note": [None if number % 4 == 0 else f"n{number}" for number in range(30)],
        "ids": [list(range(number % 3)) for number in range(30)],
    })
    tfrbeam.write_dataset(table, tmp_path / "ds", splits={"train": 0.6, "eval": 0.4}, progress=False)
    result = run_pipeline(tmp_path, """\
        pipeline:
          transforms:
            - type: ReadTFExamples
              name: Read
              config: {path: ds, split_field: split}
            - type: WriteToJson
              input: Read
              config: {path: out/rows.json}
        """, beam_yaml_env)
    assert succeeded(result)
    rows = json_lines(tmp_path / "out", "rows.json")
    splits = {split: {example["id"][0] for example in examples}
              for split, examples in dataset_examples(tmp_path / "ds").items()}
    expected = [{**row, "split": next(split for split, ids in splits.items() if row["id"] in ids)}
                for row in table.to_pylist()]
    assert sorted(rows, key=lambda row: row["id"]) == expected


def test_read_tf_examples_refuses_a_binary_name_that_is_no_feature(tmp_path):
    import pyarrow as pa

    import tfrbeam
    from tfrbeam.beam.yaml_rows import ReadTFExamples

    tfrbeam.write_dataset(pa.table({"id": [1, 2]}), tmp_path / "ds", progress=False)
    with pytest.raises(ConfigError, match=r"binary names \['image'\], which are not features"):
        ReadTFExamples(str(tmp_path / "ds"), binary=["image"])


def test_error_handling_with_errors_fail_is_refused_as_a_contradiction():
    with pytest.raises(ConfigError, match="error_handling sends bad rows to an output, but errors says fail"):
        WriteTFRecordDataset("unused", errors="fail", error_handling={"output": "bad_rows"})


def test_a_beam_field_with_no_arrow_type_is_named():
    from apache_beam.typehints.row_type import RowTypeConstraint
    from apache_beam.utils.timestamp import Timestamp

    with pytest.raises(ConfigError, match="field 'when' has a Beam type with no Arrow equivalent"):
        arrow_schema_of(RowTypeConstraint.from_fields([("id", int), ("when", Timestamp)]), "WriteTFRecordDataset")


@pytest.mark.parametrize("transform", ["tfrbeam.builder.pipeline.yaml_write.WriteTFRecordDataset",
                                       "tfrbeam.beam.yaml_rows.ReadTFExamples"])
def test_beam_yaml_finds_a_typed_and_described_config_for_every_option(transform):
    """Beam YAML's config schema (its docs and checks) comes from the annotations and the docstring's Args: an option
    typed as Any (an ``X | None`` annotation, or any string annotation) or left undescribed is a defect."""
    from apache_beam.utils.python_callable import PythonCallableWithSource
    from apache_beam.yaml.yaml_provider import InlineProvider

    factory = PythonCallableWithSource.load_from_source(transform)
    schema = InlineProvider.config_schema_from_callable(factory)
    untyped = [field.name for field in schema.fields if field.type.WhichOneof("type_info") == "logical_type"]
    undescribed = [field.name for field in schema.fields if not field.description]
    assert (untyped, undescribed) == ([], [])
    assert "path" in [field.name for field in schema.fields]


def test_read_tf_examples_reads_plain_files_and_gives_bytes_only_where_asked(tmp_path):
    """A glob of TFRecord files (no manifest: types from the records, every field nullable); a bytes feature that is
    not UTF-8 fails the read naming it, and is bytes when named in binary."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from tfrbeam import RecordWriter, encode_example
    from tfrbeam.beam.yaml_rows import ReadTFExamples

    with RecordWriter(str(tmp_path / "part-0.tfrecord")) as writer:
        for number in range(3):
            writer.write(encode_example({"id": [number], "blob": [bytes([0xFF, number])], "name": [f"n{number}".encode()]}))
    pattern = str(tmp_path / "*.tfrecord")
    with pytest.raises(Exception, match=r"bytes features \['blob'\] hold values that are not UTF-8.*binary"):
        with beam.Pipeline("FnApiRunner") as pipeline:
            _ = pipeline | ReadTFExamples(pattern)
    with beam.Pipeline("FnApiRunner") as pipeline:
        rows = pipeline | ReadTFExamples(pattern, binary=["blob"]) | beam.Map(lambda row: row._asdict())
        assert_that(rows, equal_to([{"id": number, "blob": bytes([0xFF, number]), "name": f"n{number}"}
                                    for number in range(3)]))
