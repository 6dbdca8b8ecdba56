"""File contents as features (``from_file``): a column of paths becomes the files' bytes, and image header facts.

A folder of labelled PNG and JPEG images is made with Pillow, a CSV (path,label) lists them by paths
relative to the CSV, and the build reads them through Beam's FileSystems: the bytes in the dataset
equal the files, Pillow decodes them to the same pixels, and the height/width/channels/format
features match. A missing file is a dead letter naming it; a file above max_file_bytes is a bad row
saying its size and the limit; the multi_processing DirectRunner writes the same shards.
"""

from __future__ import annotations

import io
import json
import os
import pathlib

import numpy as np
import pyarrow as pa
import pytest
import yaml

from tfrbeam.builder.config import config_to_dict, parse_config
from tfrbeam.builder.features.convert import BatchProvenance, FeatureSpec, convert_batch, resolve_spec
from tfrbeam.builder.features.file_contents import FileOptions
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import ArrowConversionError, ConfigError

Image = pytest.importorskip("PIL.Image")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
COLOURS = {"red": (220, 20, 30), "green": (20, 200, 40), "blue": (30, 40, 210)}


def _image_folder(root: pathlib.Path, count: int = 12) -> list[tuple[str, str]]:
    """count small images of three labels (PNG RGB, PNG greyscale, JPEG), and their (relative path, label) rows."""
    (root / "images").mkdir(parents=True)
    rows = []
    for index in range(count):
        label = list(COLOURS)[index % 3]
        size = (8 + index, 5 + index % 4)
        pixels = np.zeros((size[1], size[0], 3), np.uint8) + np.array(COLOURS[label], np.uint8)
        pixels[0, 0] = (index, index, index)
        picture = Image.fromarray(pixels)
        if index % 4 == 1:
            picture, name = picture.convert("L"), f"{label}-{index}.png"
        elif index % 4 == 2:
            name = f"{label}-{index}.jpg"
        else:
            name = f"{label}-{index}.png"
        picture.save(root / "images" / name)
        rows.append((f"images/{name}", label))
    return rows


def _write_csv(root: pathlib.Path, rows: list[tuple[str, str]]) -> pathlib.Path:
    path = root / "labels.csv"
    path.write_text("path,label\n" + "".join(f"{file},{label}\n" for file, label in rows))
    return path


def _config(root: pathlib.Path, output: str, **extra) -> dict:
    return {
        "input": {"path": str(root / "labels.csv")},
        "features": {"image": {"source": "path", "from_file": True, "image": True}, "label": {"type": "bytes"}},
        "shuffle": {"seed": 5},
        "splits": {"train": 0.75, "eval": 0.25},
        "output": {"path": str(root / output), "num_shards": 2},
        **extra,
    }


def _build(root: pathlib.Path, config: dict, *options: str) -> int:
    path = root / "build.yaml"
    path.write_text(yaml.safe_dump(config))
    return build_main([str(path), "--quiet", *options])


def _read_back(dataset: pathlib.Path) -> list[dict]:
    from tfrbeam import open_dataset

    rows = []
    for split in ("train", "eval"):
        for batch in open_dataset(str(dataset), split, batch_size=4, output="arrow"):
            rows.extend(batch.to_pylist())
    return rows


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[pathlib.Path, list[tuple[str, str]]]:
    root = tmp_path_factory.mktemp("images")
    rows = _image_folder(root)
    _write_csv(root, rows)
    return root, rows


def test_an_image_folder_builds_into_a_dataset_of_the_files_bytes_and_header_facts(images):
    root, rows = images
    assert _build(root, _config(root, "out")) == 0
    read = _read_back(root / "out")
    assert len(read) == len(rows)
    by_bytes = {(root / path).read_bytes(): (path, label) for path, label in rows}
    assert len(by_bytes) == len(rows)
    for example in read:
        path, label = by_bytes[example["image"]]  # the bytes are exactly a file's
        assert example["label"] == label.encode()
        original = Image.open(root / path)
        decoded = Image.open(io.BytesIO(example["image"]))
        assert np.array_equal(np.asarray(decoded), np.asarray(original))  # the same pixels
        assert (example["image/width"], example["image/height"]) == original.size
        assert example["image/channels"] == len(original.getbands())
        assert example["image/format"] == {".png": b"png", ".jpg": b"jpeg"}[pathlib.Path(path).suffix]
    manifest = json.loads((root / "out" / "tfrbeam_dataset.json").read_text())
    assert manifest["config"]["features"]["image"]["from_file"] is True
    assert manifest["config"]["features"]["image/height"] == {
        "type": "int64", "source": "path", "on_null": "error", "from_file": "height"}


def test_the_multi_processing_runner_writes_the_same_shards(images, monkeypatch):
    root, _ = images
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    assert _build(root, _config(root, "in-process")) == 0
    assert _build(root, _config(root, "multi"), "--direct_num_workers=2", "--direct_running_mode=multi_processing") == 0
    shards = sorted(path.relative_to(root / "in-process") for path in (root / "in-process").glob("*/*.tfrecord"))
    assert len(shards) == 4
    assert shards == sorted(path.relative_to(root / "multi") for path in (root / "multi").glob("*/*.tfrecord"))
    for shard in shards:
        assert (root / "in-process" / shard).read_bytes() == (root / "multi" / shard).read_bytes()


def test_a_missing_file_is_a_dead_letter_naming_it(tmp_path):
    rows = _image_folder(tmp_path, count=6)
    rows.insert(2, ("images/nope.png", "red"))
    _write_csv(tmp_path, rows)
    config = _config(tmp_path, "out", errors={"on_bad_record": "dead_letter", "max_bad_fraction": 0.5})
    assert _build(tmp_path, config) == 0
    assert len(_read_back(tmp_path / "out")) == 6
    letters = [json.loads(line) for path in (tmp_path / "out" / "_errors").glob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert len(letters) == 1
    letter = letters[0]
    assert letter["file"] == str(tmp_path / "labels.csv") and letter["line"] == 4
    assert letter["raw"] == "images/nope.png,red"
    assert str(tmp_path / "images" / "nope.png") in letter["reason"] and "feature 'image'" in letter["reason"]
    assert "no such file" in letter["reason"].lower()


def test_a_missing_file_fails_a_build_that_fails_on_bad_rows_in_one_line(tmp_path, capsys):
    rows = _image_folder(tmp_path, count=3) + [("images/nope.png", "red")]
    _write_csv(tmp_path, rows)
    assert _build(tmp_path, _config(tmp_path, "out")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'labels.csv'}:5:" in err and "nope.png" in err and "Traceback" not in err


def test_a_file_above_max_file_bytes_is_a_bad_row_saying_its_size_and_the_limit(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"x" * 100)
    (tmp_path / "large.bin").write_bytes(b"y" * 101)
    batch = pa.record_batch({"path": ["small.bin", "large.bin", None]})
    spec = FeatureSpec("blob", "bytes", "path", on_null="omit", file=FileOptions(max_bytes=100))
    converted = convert_batch(batch, [resolve_spec(spec, pa.string())],
                              BatchProvenance(str(tmp_path / "list.csv"), batch, first_line=2))
    assert converted.batch.column("blob").to_pylist() == [b"x" * 100, None]
    [bad] = converted.bad_rows
    assert bad.line == 3
    assert str(tmp_path / "large.bin") in bad.reason
    assert "101 bytes" in bad.reason and "max_file_bytes is 100 bytes" in bad.reason
    assert "raise features.blob.max_file_bytes" in bad.reason


def test_a_too_large_file_in_a_build_is_a_dead_letter(tmp_path):
    rows = _image_folder(tmp_path, count=4)
    _write_csv(tmp_path, rows)
    sizes = {path: (tmp_path / path).stat().st_size for path, _ in rows}
    limit = sorted(sizes.values())[-2]  # the largest file is above it
    config = _config(tmp_path, "out", errors={"on_bad_record": "dead_letter", "max_bad_fraction": 0.5})
    config["features"]["image"]["max_file_bytes"] = limit
    assert _build(tmp_path, config) == 0
    letters = [json.loads(line) for path in (tmp_path / "out" / "_errors").glob("*.jsonl")
               for line in path.read_text().splitlines()]
    too_large = [path for path, size in sizes.items() if size > limit]
    assert [letter["raw"].split(",")[0] for letter in letters] == too_large
    assert f"max_file_bytes is {limit} bytes" in letters[0]["reason"]


def test_reads_run_concurrently_and_relative_paths_are_taken_from_the_input_files_directory(tmp_path, monkeypatch):
    """Each file read waits for the others: only a concurrent read finishes (a sequential one would time out)."""
    import threading

    from tfrbeam.builder.features import file_contents as file_features

    for index in range(8):
        (tmp_path / f"{index}.bin").write_bytes(bytes([index]))
    barrier = threading.Barrier(8, timeout=10)
    real = file_features.open_found  # every local file read opens its file through this public helper

    def waiting(path: str, *rest, **options):
        barrier.wait()
        return real(path, *rest, **options)

    monkeypatch.setattr(file_features, "open_found", waiting)
    monkeypatch.chdir(REPO_ROOT)  # not where the files are
    batch = pa.record_batch({"path": [f"{index}.bin" for index in range(8)]})
    spec = resolve_spec(FeatureSpec("blob", "bytes", "path", file=FileOptions()), pa.string())
    converted = convert_batch(batch, [spec], BatchProvenance(str(tmp_path / "list.csv"), batch))
    assert converted.batch.column("blob").to_pylist() == [bytes([index]) for index in range(8)]


def test_a_file_that_is_not_an_image_is_a_bad_row_only_when_image_facts_are_asked(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"not an image")
    batch = pa.record_batch({"path": ["a.txt"]})
    provenance = BatchProvenance(str(tmp_path / "list.csv"), batch)
    blob = resolve_spec(FeatureSpec("blob", "bytes", "path", file=FileOptions()), pa.string())
    assert convert_batch(batch, [blob], provenance).batch.column("blob").to_pylist() == [b"not an image"]
    height = resolve_spec(FeatureSpec("blob/height", "int64", "path", file=FileOptions(part="height", max_bytes=None)),
                          pa.string())
    [bad] = convert_batch(batch, [blob, height], provenance).bad_rows
    assert "feature 'blob/height'" in bad.reason and "a.txt" in bad.reason and "not an image" in bad.reason


def test_from_file_config_parses_expands_image_and_round_trips():
    config = parse_config({
        "input": {"path": "labels.csv"},
        "features": {"picture": {"source": "path", "from_file": True, "max_file_bytes": "1MiB",
                                 "image": ["height", "width"]},
                     "label": {"type": "bytes"}},
        "output": {"path": "out"},
    })
    assert [spec.name for spec in config.features] == ["picture", "picture/height", "picture/width", "label"]
    picture, height = config.features[0], config.features[1]
    assert (picture.type, picture.file) == ("bytes", FileOptions(part="bytes", max_bytes=1 << 20))
    assert (height.type, height.source, height.file) == ("int64", "path", FileOptions(part="height", max_bytes=None))
    assert parse_config(config_to_dict(config)) == config
    every = parse_config({"input": {"path": "a.csv"}, "output": {"path": "out"},
                          "features": {"p": {"from_file": True, "image": True}}})
    assert [spec.name for spec in every.features] == ["p", "p/height", "p/width", "p/channels", "p/format"]
    assert every.features[0].file == FileOptions()  # 64 MiB by default
    assert every.features[0].file.max_bytes == 64 << 20
    flow = parse_config({"input": {"path": "a.csv"}, "output": {"path": "out"},
                         "features": yaml.safe_load("p: {from_file: true, image: {height, format}}")})
    assert [spec.name for spec in flow.features] == ["p", "p/height", "p/format"]


@pytest.mark.parametrize("settings, message", [
    ({"from_file": "yes"}, "features.p.from_file: 'yes' is not true"),
    ({"from_file": True, "type": "int64"}, "features.p.type: from_file: true gives bytes values"),
    ({"max_file_bytes": "1MiB"}, "features.p.max_file_bytes: is only used with from_file"),
    ({"image": True}, "features.p.image: is only used with from_file: true"),
    ({"from_file": True, "separator": ";"}, "features.p.separator: a from_file feature is one file"),
    ({"from_file": True, "max_file_bytes": "2GiB"}, "features.p.max_file_bytes: 2147483648 is above 1GiB"),
    ({"from_file": True, "image": ["depth"]}, "features.p.image: 'depth' is not one of height, width, channels, format"),
    ({"from_file": "height", "max_file_bytes": 10}, "features.p.max_file_bytes: limits only from_file: true"),
])
def test_from_file_config_mistakes_are_one_line_each(settings, message):
    with pytest.raises(ConfigError) as caught:
        parse_config({"input": {"path": "a.csv"}, "output": {"path": "out"}, "features": {"p": settings}})
    assert message in str(caught.value)


def test_image_facts_without_pillow_are_a_config_error_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else real(name, *a))
    with pytest.raises(ConfigError, match=r"features.p.image: needs Pillow: pip install 'tfrbeam\[image\]'"):
        parse_config({"input": {"path": "a.csv"}, "output": {"path": "out"},
                      "features": {"p": {"from_file": True, "image": True}}})


def test_a_from_file_feature_needs_a_column_of_paths():
    spec = FeatureSpec("blob", "bytes", "path", file=FileOptions())
    assert resolve_spec(spec, pa.large_string()).is_list is False
    with pytest.raises(ArrowConversionError, match="from_file needs a column of paths"):
        resolve_spec(spec, pa.int64())


def test_a_batch_of_many_paths_is_converted_in_slices_that_bound_the_file_bytes_held(tmp_path, monkeypatch):
    """Slices aim at FILE_SLICE_BYTES of files; one above BATCH_FILE_BYTES is halved; rows, lines and bad rows
    come out as one conversion of the whole batch gives them."""
    from tfrbeam.builder.features import file_contents as file_features
    from tfrbeam.builder.features.convert import BadRow
    from tfrbeam.builder.inputs import batch as batches

    for index in range(40):
        (tmp_path / f"{index}.bin").write_bytes(bytes([index]) * (100 + index))
    paths = [f"{index}.bin" if index % 7 else "missing.bin" for index in range(40)]
    table = pa.record_batch({"path": paths, "n": list(range(40))})
    reader_bad = BadRow(str(tmp_path / "list.csv"), 1, "wrong number of fields", "x")
    source = batches.SourceBatch(path=str(tmp_path / "list.csv"), lines=np.arange(2, 42, dtype=np.int64),
                                 batch=table, bad_rows=(reader_bad,))
    specs = [resolve_spec(FeatureSpec("blob", "bytes", "path", on_null="omit", file=FileOptions()), pa.string()),
             resolve_spec(FeatureSpec("n", "int64", "n"), pa.int64())]
    whole = batches.convert_source_batch(source, specs)
    monkeypatch.setattr(batches, "FILE_SLICE_BYTES", 1000)  # ~8 files per slice
    monkeypatch.setattr(file_features, "BATCH_FILE_BYTES", 700)  # the first slice of 64 rows is too large: halved
    slices = list(batches.convert_in_slices(source, specs))
    assert len(slices) > 4
    assert all(piece.converted.batch.column("blob").nbytes < 2000 for piece in slices)
    assert pa.Table.from_batches([piece.converted.batch for piece in slices]).equals(
        pa.Table.from_batches([whole.batch]))
    assert [row for piece in slices for row in piece.converted.bad_rows] == whole.bad_rows
    assert whole.bad_rows[0] == reader_bad and len(whole.bad_rows) == 1 + 6
    assert np.concatenate([piece.lines[piece.converted.kept_rows] for piece in slices]).tolist() == \
        source.lines[whole.kept_rows].tolist()
    assert sum(piece.num_rows + len(piece.bad_rows) for piece in slices) == 41


def test_slices_of_a_few_files_write_the_same_shards_as_whole_batches(images, monkeypatch):
    from tfrbeam.builder.inputs import batch as batches

    root, _ = images
    assert _build(root, _config(root, "whole")) == 0
    monkeypatch.setattr(batches, "FILE_SLICE_BYTES", 1)  # one file per slice after the first
    monkeypatch.setattr(batches, "FIRST_SLICE_ROWS", 2)
    sliced = []
    real = batches.convert_source_batch
    monkeypatch.setattr(batches, "convert_source_batch", lambda source, specs: sliced.append(source.num_rows) or real(
        source, specs))
    assert _build(root, _config(root, "sliced")) == 0
    assert sliced == [2] + [1] * 10
    shards = sorted(path.relative_to(root / "whole") for path in (root / "whole").glob("*/*.tfrecord"))
    assert len(shards) == 4
    for shard in shards:
        assert (root / "whole" / shard).read_bytes() == (root / "sliced" / shard).read_bytes()


def test_files_on_a_remote_filesystem_are_read_relative_to_the_remote_listing(images, tmp_path):
    """memfs:// stands in for gs://: the CSV and its images are objects; relative paths are joined onto the CSV's prefix."""
    from tests import memfs

    root, rows = images
    bucket = memfs.upload(root / "images", "memfs://pets-bucket/data/images")
    (tmp_path / "labels.csv").write_text((root / "labels.csv").read_text())
    memfs.upload(tmp_path, "memfs://pets-bucket/data")
    try:
        config = _config(tmp_path, "out")
        config["input"]["path"] = "memfs://pets-bucket/data/labels.csv"
        assert _build(tmp_path, config) == 0
        assert sorted(example["image"] for example in _read_back(tmp_path / "out")) == sorted(
            (root / path).read_bytes() for path, _ in rows)
    finally:
        memfs.clear(bucket)
        memfs.clear("memfs://pets-bucket/data")


def test_infer_config_keeps_a_column_of_paths_as_text_and_from_file_added_resolves(images, tmp_path):
    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.infer_config import infer_config
    from tfrbeam.builder.pipeline.resolve import resolve_config

    root, _ = images
    text = infer_config(str(root / "labels.csv"))
    assert "from_file" not in text and "  path: {type: bytes, on_null: error}" in text
    edited = yaml.safe_load(text)
    edited["features"]["path"]["from_file"] = True
    edited["output"] = {"path": str(tmp_path / "out")}
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    config = resolve_config(load_config(str(tmp_path / "edited.yaml")))
    assert [(spec.name, spec.type, spec.file) for spec in config.features] == [
        ("path", "bytes", FileOptions()), ("label", "bytes", None)]
    assert config.features[0].file.root == os.getcwd()  # where relative inputs' directories are taken from
    assert config.input.columns == ("path", "label")


def test_a_row_whose_files_together_pass_what_a_record_holds_is_bad(tmp_path, monkeypatch):
    from tfrbeam.builder.features import convert as features

    monkeypatch.setattr(features, "_RECORD_FILE_BYTES", 100)  # stands in for TFRecord's 2 GiB - 1
    (tmp_path / "a").write_bytes(b"a" * 60)
    (tmp_path / "b").write_bytes(b"b" * 30)
    batch = pa.record_batch({"x": ["a", "a"], "y": ["b", "a"]})
    specs = [resolve_spec(FeatureSpec(name, "bytes", name, file=FileOptions()), pa.string()) for name in "xy"]
    converted = convert_batch(batch, specs, BatchProvenance(str(tmp_path / "list.csv"), batch))
    assert converted.batch.column("y").to_pylist() == [b"b" * 30]
    [bad] = converted.bad_rows
    assert bad.line == 2 and "the files of this row hold 120 bytes together, more than one record can" in bad.reason


def test_a_relative_input_files_directory_is_taken_from_the_launchers_directory_on_any_worker(tmp_path, monkeypatch):
    """Batches name their input file as the config gave it (relative); a worker running elsewhere still finds the
    files, from the directory the build was resolved in (FileOptions.root)."""
    (tmp_path / "data" / "images").mkdir(parents=True)
    (tmp_path / "data" / "images" / "a.bin").write_bytes(b"A")
    batch = pa.record_batch({"path": ["images/a.bin"]})
    spec = resolve_spec(FeatureSpec("blob", "bytes", "path", file=FileOptions(root=str(tmp_path))), pa.string())
    monkeypatch.chdir(REPO_ROOT)  # the worker's directory
    converted = convert_batch(batch, [spec], BatchProvenance("data/list.csv", batch))
    assert converted.batch.column("blob").to_pylist() == [b"A"]


def test_a_batch_over_the_file_budget_stops_reading_early(tmp_path, monkeypatch):
    from tfrbeam.builder.features import file_contents as file_features

    for index in range(200):
        (tmp_path / f"{index}.bin").write_bytes(b"z" * 10)
    monkeypatch.setattr(file_features, "BATCH_FILE_BYTES", 15)
    calls = []
    real = file_features.open_found  # every local file read opens its file through this public helper
    monkeypatch.setattr(file_features, "open_found",
                        lambda path, *rest, **options: calls.append(path) or real(path, *rest, **options))
    with pytest.raises(file_features.FileBatchTooLarge, match="more than 15 bytes"):
        file_features.read_files([f"{index}.bin" for index in range(200)], str(tmp_path), 100, image=False)
    assert 2 <= len(calls) < 100  # the reads after the budget ran out were skipped


def test_a_binary_column_of_paths_that_are_not_utf8_reads_them_as_the_os_names_them(tmp_path):
    name = b"caf\xe9.bin"  # latin-1, not UTF-8
    (tmp_path / os.fsdecode(name)).write_bytes(b"coffee")
    batch = pa.record_batch({"path": pa.array([name], pa.binary())})
    spec = resolve_spec(FeatureSpec("blob", "bytes", "path", file=FileOptions()), pa.binary())
    converted = convert_batch(batch, [spec], BatchProvenance(str(tmp_path / "list.parquet"), batch))
    assert converted.batch.column("blob").to_pylist() == [b"coffee"]
