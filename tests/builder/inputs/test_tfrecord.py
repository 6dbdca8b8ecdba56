"""input.format tfrecord: an existing dataset (through its manifest) or a glob of TFRecord files of tf.train.Example,
re-split, re-shuffled, re-sharded, projected or cast.

The glob inputs are written by this file's own TF-free writer in TensorFlow's layout (framing, masked CRC32C, the
Example protobuf encoded field by field), and by TensorFlow itself (tests/data/tf-vectors).
"""

from __future__ import annotations

import base64
import collections
import gzip
import json
import os
import pathlib
import shutil
import struct

import crc32c
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tfrbeam.builder.config import parse_config
from tfrbeam.builder.inputs.tfrecord import read_tfrecord_piece, tfrecord_pieces
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.read_index import ReadIndexBuilder, SplitTable, index_path_for, table_bytes

VECTORS = pathlib.Path(__file__).parents[2] / "data" / "tf-vectors"
ROWS = 240


# ------------------------------------------------------------------------- the tests' own TF-free writer


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as ten-byte two's complement, as protobuf writes them
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example_bytes(features: dict[str, list]) -> bytes:
    """A tf.train.Example, keys sorted as TF's deterministic serializer writes them: ints as int64_list (packed),
    floats as float_list (packed float32), bytes and str as bytes_list."""
    entries = b""
    for name in sorted(features):
        values = features[name] if isinstance(features[name], list) else [features[name]]
        if values and isinstance(values[0], float):
            feature = _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
        elif values and isinstance(values[0], int):
            feature = _field(3, _field(1, b"".join(_varint(value) for value in values)))
        else:
            feature = _field(1, b"".join(_field(1, value.encode() if isinstance(value, str) else value) for value in values))
        entries += _field(1, _field(1, name.encode()) + _field(2, feature))
    return _field(1, entries)


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(payloads: list[bytes]) -> bytes:
    """TFRecord framing: length, masked CRC of the length, payload, masked CRC of the payload."""
    out = b""
    for payload in payloads:
        length = struct.pack("<Q", len(payload))
        out += length + struct.pack("<I", _masked(length)) + payload + struct.pack("<I", _masked(payload))
    return out


def _rows() -> list[dict]:
    return [{"id": index, "label": index % 3, "score": index * 0.25 - 7.5, "name": f"item-{index:04d}",
             "tags": [f"t{j}" for j in range(index % 4)]} for index in range(ROWS)]


def write_glob(directory: pathlib.Path, gz: bool = False) -> list[dict]:
    """The rows in three TFRecord files (one gzip-compressed when gz), by the writer above."""
    rows = _rows()
    directory.mkdir(parents=True, exist_ok=True)
    for part in range(3):
        data = framed([example_bytes(row) for row in rows[part::3]])
        name = f"part-{part}.tfrecord"
        if gz and part == 1:
            (directory / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return rows


# ------------------------------------------------------------------------------------------ helpers


def build(tmp: pathlib.Path, name: str, config: dict, *args: str) -> tuple[int, pathlib.Path]:
    config_path = tmp / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return build_main([str(config_path), "--quiet", *args]), pathlib.Path(config["output"]["path"])


def built(tmp: pathlib.Path, name: str, config: dict, *args: str) -> pathlib.Path:
    status, output = build(tmp, name, config, *args)
    assert status == 0, f"{name} failed"
    return output


def shard_bytes(output: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() for path in sorted(output.rglob("*.tfrecord"))}


def _records(path: pathlib.Path) -> list[bytes]:
    data, records, position = path.read_bytes(), [], 0
    while position < len(data):
        length = struct.unpack_from("<Q", data, position)[0]
        records.append(data[position + 12:position + 12 + length])
        position += 16 + length
    return records


def decoded_rows(output: pathlib.Path) -> collections.Counter:
    """Every example of a dataset, decoded, as a multiset of JSON texts."""
    found: collections.Counter = collections.Counter()
    for path in sorted(output.rglob("*.tfrecord")):
        records = _records(path)
        if records:
            rows = examples_to_record_batch(records).to_pylist()
            found.update(json.dumps(row, sort_keys=True, default=bytes.decode) for row in rows)
    return found


def parquet_dataset(tmp: pathlib.Path, name: str = "from-parquet", **overrides) -> pathlib.Path:
    table = pa.Table.from_pylist(_rows())
    pq.write_table(table, tmp / "rows.parquet", row_group_size=70)
    config = {"input": {"path": str(tmp / "rows.parquet")}, "output": {"path": str(tmp / name), "num_shards": 3},
              "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}, **overrides}
    return built(tmp, name, config)


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() if path.is_file() else b"<dir>"
            for path in sorted(directory.rglob("*"))}


# ------------------------------------------------------------------------------------- datasets


def test_a_dataset_reshards_to_other_shards_and_seed_with_every_example_kept(tmp_path):
    source = parquet_dataset(tmp_path)
    output = built(tmp_path, "reshard", {"input": {"format": "tfrecord", "path": str(source)},
                                         "output": {"path": str(tmp_path / "reshard"), "num_shards": 5},
                                         "splits": {"train": 1.0}, "shuffle": {"seed": 99}})
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] == ROWS
    assert len(manifest["splits"]["train"]["shards"]) == 5
    assert decoded_rows(output) == decoded_rows(source)
    assert sum(decoded_rows(source).values()) == ROWS
    assert shard_bytes(output) != shard_bytes(source)  # re-shuffled and re-sharded, not copied


def test_the_format_is_inferred_from_a_dataset_directory_and_splits_pick_what_is_read(tmp_path):
    source = parquet_dataset(tmp_path)
    config = parse_config({"input": {"path": str(source), "splits": ["eval"]}, "output": {"path": "x"}})
    assert config.input.format == "tfrecord"
    output = built(tmp_path, "eval-only", {"input": {"path": str(source), "splits": ["eval"]},
                                           "output": {"path": str(tmp_path / "eval-only"), "num_shards": 1}})
    eval_count = json.loads((source / "tfrbeam_dataset.json").read_text())["splits"]["eval"]["num_examples"]
    assert json.loads((output / "tfrbeam_dataset.json").read_text())["splits"]["train"]["num_examples"] == eval_count
    status, _ = build(tmp_path, "no-split", {"input": {"path": str(source), "splits": ["test"]},
                                             "output": {"path": str(tmp_path / "no-split"), "num_shards": 1}})
    assert status != 0 and not (tmp_path / "no-split").exists()


def test_a_dataset_rebuilt_with_the_same_features_seed_and_shards_gives_the_parquet_builds_bytes(tmp_path):
    source = parquet_dataset(tmp_path)
    again = built(tmp_path, "again", {"input": {"format": "tfrecord", "path": str(source)},
                                      "output": {"path": str(tmp_path / "again"), "num_shards": 3},
                                      "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}})
    assert shard_bytes(again) == shard_bytes(source)
    assert len(shard_bytes(source)) == 6


def test_a_glob_written_by_a_tf_free_writer_builds_the_bytes_of_the_same_rows_in_parquet(tmp_path):
    write_glob(tmp_path / "glob")
    source = parquet_dataset(tmp_path)
    from_glob = built(tmp_path, "glob", {"input": {"path": str(tmp_path / "glob" / "*.tfrecord")},
                                         "output": {"path": str(tmp_path / "from-glob"), "num_shards": 3},
                                         "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}})
    assert shard_bytes(from_glob) == shard_bytes(source)


def test_projection_and_casts_read_only_the_configured_features(tmp_path):
    write_glob(tmp_path / "glob")
    output = built(tmp_path, "cast", {"input": {"path": str(tmp_path / "glob" / "*.tfrecord")},
                                      "features": {"id": {"type": "float"}, "label": {"type": "bytes"}},
                                      "output": {"path": str(tmp_path / "cast"), "num_shards": 1}})
    rows = sorted(decoded_rows(output).elements(), key=lambda text: json.loads(text)["id"])
    assert json.loads(rows[5]) == {"id": [5.0], "label": ["2"]}
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    assert sorted(manifest["features"]) == ["id", "label"]


def test_gzip_files_in_a_glob_are_read_by_their_extension(tmp_path):
    write_glob(tmp_path / "glob", gz=True)
    assert (tmp_path / "glob" / "part-1.tfrecord.gz").exists()
    plain_dir = tmp_path / "plain"
    write_glob(plain_dir)
    gz = built(tmp_path, "gz", {"input": {"format": "tfrecord", "path": str(tmp_path / "glob" / "part-*")},
                                "output": {"path": str(tmp_path / "gz-out"), "num_shards": 2}})
    plain = built(tmp_path, "plain", {"input": {"path": str(plain_dir / "*.tfrecord")},
                                      "output": {"path": str(tmp_path / "plain-out"), "num_shards": 2}})
    assert shard_bytes(gz) == shard_bytes(plain)


# ------------------------------------------------------------------------------ TensorFlow's files


def _tf_values(feature: dict) -> list:
    if feature["kind"] == "int64_list":
        return feature["values"]
    if feature["kind"] == "bytes_list":
        return [base64.b64decode(value) for value in feature["values_b64"]]
    return [float.fromhex(value) for value in feature["values_hex"]]


@pytest.mark.parametrize("name", ["examples.tfrecord", "examples.tfrecord.gz"])
def test_tensorflow_written_examples_read_as_tensorflow_wrote_them(name):
    expected = json.loads((VECTORS / "examples.json").read_text())
    schema = pa.schema([("b", pa.list_(pa.binary())), ("f", pa.list_(pa.float32())), ("i", pa.list_(pa.int64())),
                        ("k0007", pa.list_(pa.int64()))])
    path = str(VECTORS / name)
    compression = "gzip" if name.endswith(".gz") else None
    got = {}
    for start, stop, before in tfrecord_pieces(path, os.path.getsize(path), 1 << 30, compression):
        for source in read_tfrecord_piece(path, start, stop, before, schema, compression):
            assert not source.bad_rows
            got.update(zip(source.lines.tolist(), source.batch.to_pylist()))
    records = expected["examples"]
    assert sorted(got) == list(range(1, len(records) + 1))
    checked = 0
    for number, record in enumerate(records, 1):
        features = {feature["name"]: feature for feature in record["features"]}
        for column in schema.names:
            if column in features and features[column]["kind"] is not None:
                assert got[number][column] == _tf_values(features[column]), (number, column)
                checked += 1
            elif column not in features:
                assert got[number][column] is None
    assert checked >= 5


def test_a_damaged_crc_or_a_truncated_file_fails_the_build_naming_file_and_offset(tmp_path, capsys):
    for case, offset in [("corrupt_a_data_crc_bitflip.tfrecord", 164), ("corrupt_e_trunc_in_last_payload.tfrecord",
                                                                       1078023),
                         ("corrupt_d_trunc_in_last_header.tfrecord", 1078023)]:
        directory = tmp_path / case
        directory.mkdir()
        shutil.copy(VECTORS / case, directory / "data.tfrecord")
        status, output = build(tmp_path, case, {"input": {"path": str(directory / "*.tfrecord")},
                                                "features": {"i": {"type": "int64", "on_null": "omit"}},
                                                "output": {"path": str(tmp_path / f"out-{case}"), "num_shards": 1},
                                                "errors": {"on_bad_record": "skip", "max_bad_fraction": 1.0}})
        err = capsys.readouterr().err
        assert status != 0, case
        assert "data.tfrecord" in err and f"offset {offset}" in err, (case, err)
        assert not (output / "tfrbeam_dataset.json").exists()


def test_a_record_that_is_not_an_example_is_a_bad_row_naming_file_and_record(tmp_path):
    directory = tmp_path / "glob"
    directory.mkdir()
    rows = _rows()[:20]
    payloads = [example_bytes(row) for row in rows]
    payloads[6] = b"\xff\xff not a protobuf"
    payloads[11] = example_bytes({**rows[11], "label": [1.5]})  # the wrong kind
    payloads[15] = example_bytes({"id": 15})  # no label (on_null: error), no score (on_null: omit)
    (directory / "a.tfrecord").write_bytes(framed(payloads))
    status, output = build(tmp_path, "bad", {"input": {"path": str(directory / "*.tfrecord")},
                                             "features": {"id": {"type": "int64"}, "label": {"type": "int64"},
                                                          "score": {"type": "float", "on_null": "omit"}},
                                             "output": {"path": str(tmp_path / "bad-out"), "num_shards": 1},
                                             "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}})
    assert status == 0
    letters = [json.loads(line) for path in (output / "_errors").rglob("*") if path.is_file()
               for line in path.read_text().splitlines()]
    assert sorted(letter["line"] for letter in letters) == [7, 12, 16]
    assert {letter["file"] for letter in letters} == {str(directory / "a.tfrecord")}
    raw = {letter["line"]: letter["raw"] for letter in letters}
    assert base64.b64decode(raw[7].removeprefix("base64:")) == payloads[6]
    assert json.loads((output / "tfrbeam_dataset.json").read_text())["splits"]["train"]["num_examples"] == 17


def test_two_values_of_a_scalar_feature_are_a_bad_row_and_a_missing_one_a_null(tmp_path):
    path = tmp_path / "a.tfrecord"
    path.write_bytes(framed([example_bytes({"id": 1}), example_bytes({"id": [2, 3]}), example_bytes({"x": 4})]))
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    sources = list(read_tfrecord_piece(str(path), 0, None, 0, schema, None))
    assert [(source.lines.tolist(), source.batch.column("id").to_pylist()) for source in sources] == [([1, 3], [1, None])]
    assert [(row.line, row.reason) for row in sources[0].bad_rows] == [
        (2, "not a tf.train.Example of the input's features: " + sources[0].bad_rows[0].reason.split(": ", 1)[1])]
    assert "'id'" in sources[0].bad_rows[0].reason


# ------------------------------------------------------------------------------ hostile manifests


@pytest.mark.parametrize("hostile", ["../outside.tfrecord", "/etc/passwd", "symlink"])
def test_a_manifest_naming_a_file_outside_the_dataset_is_refused_before_the_pipeline(tmp_path, hostile, capsys):
    (tmp_path / "data").mkdir()
    source = parquet_dataset(tmp_path / "data")  # the dataset and, beside it, the file the manifest points at
    (tmp_path / "data" / "outside.tfrecord").write_bytes(framed([example_bytes({"id": [1]})]))
    manifest_path = source / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_path.read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    if hostile == "symlink":
        link = source / "train" / "link.tfrecord"
        os.symlink(tmp_path / "data" / "outside.tfrecord", link)
        shard["path"] = "train/link.tfrecord"
    else:
        shard["path"] = hostile
    manifest_path.write_text(json.dumps(manifest))
    before = snapshot(tmp_path / "data")
    status, output = build(tmp_path, "hostile", {"input": {"format": "tfrecord", "path": str(source)},
                                                 "output": {"path": str(tmp_path / "hostile-out"), "num_shards": 1}})
    err = capsys.readouterr().err
    assert status != 0
    assert "tfrbeam_dataset.json" in err and "splits.train.shards[0].path" in err, err
    assert not output.exists()
    assert snapshot(tmp_path / "data") == before


def test_a_damaged_manifest_is_a_config_error_naming_file_and_key(tmp_path, capsys):
    source = parquet_dataset(tmp_path)
    manifest_path = source / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["eval"]["shards"][0]["num_examples"] = -3
    manifest_path.write_text(json.dumps(manifest))
    status, _ = build(tmp_path, "damaged", {"input": {"format": "tfrecord", "path": str(source)},
                                            "output": {"path": str(tmp_path / "damaged-out"), "num_shards": 1}})
    err = capsys.readouterr().err
    assert status != 0 and "tfrbeam_dataset.json" in err and "num_examples" in err, err


def test_a_sequence_example_dataset_is_refused_with_a_clear_message(tmp_path):
    source = parquet_dataset(tmp_path)
    manifest_path = source / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["record_type"] = "SequenceExample"
    manifest["context_features"], manifest["sequence_features"] = manifest.pop("features"), {}
    manifest_path.write_text(json.dumps(manifest))
    from tfrbeam.builder.inputs.tfrecord import tfrecord_inputs
    with pytest.raises(ConfigError, match="SequenceExample"):
        tfrecord_inputs(parse_config({"input": {"format": "tfrecord", "path": str(source)},
                                      "output": {"path": "x"}}).input)


# ------------------------------------------------------------------------------------ infer-config


def test_infer_config_on_a_glob_decodes_a_sample_for_types_and_shapes(tmp_path):
    write_glob(tmp_path / "glob")
    text = infer_config(str(tmp_path / "glob" / "*.tfrecord"))
    config = yaml.safe_load(text)
    assert config["input"]["format"] == "tfrecord"
    features = {name: (spec["type"], spec.get("on_null")) for name, spec in config["features"].items()}
    assert {name: kind for name, (kind, _) in features.items()} == {
        "id": "int64", "label": "int64", "score": "float", "name": "bytes", "tags": "bytes"}
    config["output"] = {"path": str(tmp_path / "inferred"), "num_shards": 3}
    config.update(splits={"train": 0.8, "eval": 0.2}, shuffle={"seed": 7})
    inferred = built(tmp_path, "inferred", config)
    assert shard_bytes(inferred) == shard_bytes(parquet_dataset(tmp_path))


def test_infer_config_on_a_dataset_takes_the_manifests_features(tmp_path):
    source = parquet_dataset(tmp_path)
    config = yaml.safe_load(infer_config(str(source)))
    assert config["input"]["format"] == "tfrecord"
    assert sorted(config["features"]) == ["id", "label", "name", "score", "tags"]


# ------------------------------------------------------------------------------ record-range pieces


def _indexed_file(directory: pathlib.Path, interval: int) -> pathlib.Path:
    """One TFRecord file of every row and a read index with an entry every ``interval`` bytes (as a build writes)."""
    directory.mkdir()
    path = directory / "rows.tfrecord"
    payloads = [example_bytes(row) for row in _rows()]
    path.write_bytes(framed(payloads))
    builder = ReadIndexBuilder(interval)
    builder.add_batch(0, 0, [len(payload) for payload in payloads])
    index = pathlib.Path(index_path_for(str(path)))
    index.parent.mkdir()
    index.write_bytes(builder.to_bytes(path.stat().st_size, path.stat().st_mtime))
    return path


def _read_pieces(path: pathlib.Path, pieces) -> list[int]:
    schema = pa.schema([("id", pa.int64())])
    seen = []
    for start, stop, before in pieces:
        for source in read_tfrecord_piece(str(path), start, stop, before, schema, None):
            assert source.batch.column("id").to_pylist() == [number - 1 for number in source.lines.tolist()]
            seen += source.lines.tolist()
    return seen


def test_a_big_uncompressed_file_with_a_read_index_is_read_in_record_ranges(tmp_path):
    path = _indexed_file(tmp_path / "indexed", 1024)
    pieces = tfrecord_pieces(str(path), path.stat().st_size, 4096, None)
    assert len(pieces) >= 3 and pieces[0][:1] == (0,) and pieces[-1][1] is None
    assert _read_pieces(path, pieces) == list(range(1, ROWS + 1))
    assert tfrecord_pieces(str(path), path.stat().st_size, 1 << 30, None) == [(0, None, 0)]  # small: whole


def test_a_stale_read_index_leaves_the_file_whole(tmp_path):
    path = _indexed_file(tmp_path / "indexed", 1024)
    with open(path, "ab") as out:
        out.write(framed([example_bytes({"id": [ROWS]})]))
    assert tfrecord_pieces(str(path), path.stat().st_size, 4096, None) == [(0, None, 0)]
    assert _read_pieces(path, [(0, None, 0)]) == list(range(1, ROWS + 2))


# ------------------------------------------------------------------------------------------ config


def test_the_config_names_tfrecord_by_extension_and_keeps_its_keys_through_a_round_trip():
    from tfrbeam.builder.config import config_to_dict, format_from_path

    assert [format_from_path(path) for path in ("a/*.tfrecord", "x.tfrecord.gz", "x.TFRecord.zlib", "x.zlib")] == [
        "tfrecord", "tfrecord", "tfrecord", None]
    config = parse_config({"input": {"path": "d/*.tfrecord", "compression": "gzip", "splits": ["a", "b"]},
                           "output": {"path": "o"}})
    assert (config.input.tfrecord.compression, config.input.tfrecord.splits) == ("gzip", ("a", "b"))
    assert parse_config(config_to_dict(config)) == config
    with pytest.raises(ConfigError, match=r"input\.splits: only for input\.format tfrecord"):
        parse_config({"input": {"path": "d/*.csv", "splits": ["a"]}, "output": {"path": "o"}})
    with pytest.raises(ConfigError, match=r"input\.compression"):
        parse_config({"input": {"path": "d/*.tfrecord", "compression": "bz2"}, "output": {"path": "o"}})


def test_a_shard_whose_size_or_record_count_differs_from_its_manifest_fails_naming_it(tmp_path, capsys):
    source = parquet_dataset(tmp_path)
    manifest_path = source / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_path.read_text())
    shard = manifest["splits"]["eval"]["shards"][1]
    shard["num_examples"] += 1
    manifest["splits"]["eval"]["num_examples"] += 1  # the manifest agrees with itself, not with the shard
    manifest_path.write_text(json.dumps(manifest))
    status, output = build(tmp_path, "count", {"input": {"format": "tfrecord", "path": str(source)},
                                               "output": {"path": str(tmp_path / "count-out"), "num_shards": 1}})
    err = capsys.readouterr().err
    assert status != 0 and not (output / "tfrbeam_dataset.json").exists()
    assert shard["path"] in err and f"the manifest says {shard['num_examples']} records" in err, err
    shard["num_examples"] -= 1
    manifest["splits"]["eval"]["num_examples"] -= 1
    shard["num_bytes"] += 3
    manifest["splits"]["eval"]["num_bytes"] += 3
    manifest_path.write_text(json.dumps(manifest))
    status, _ = build(tmp_path, "size", {"input": {"format": "tfrecord", "path": str(source)},
                                         "output": {"path": str(tmp_path / "size-out"), "num_shards": 1}})
    err = capsys.readouterr().err
    assert status != 0 and "splits.eval.shards[1].num_bytes" in err, err


def test_bad_records_anywhere_in_blocks_are_named_exactly_and_the_rest_kept(tmp_path):
    bad = {0, 1, 2047, 4095, 4096, 4999}
    payloads = [b"\x08" if index in bad else example_bytes({"id": index}) for index in range(5000)]
    path = tmp_path / "many.tfrecord"
    path.write_bytes(framed(payloads))
    lines, ids, named = [], [], []
    for source in read_tfrecord_piece(str(path), 0, None, 0, pa.schema([("id", pa.int64())]), None):
        lines += source.lines.tolist()
        ids += source.batch.column("id").to_pylist()
        named += [row.line for row in source.bad_rows]
    assert named == sorted(index + 1 for index in bad)
    assert lines == [index + 1 for index in range(5000) if index not in bad] and ids == [line - 1 for line in lines]


def test_a_dataset_on_another_filesystem_is_read_through_beam_and_confined_by_prefix(tmp_path, capsys):
    """memfs:// stands in for gs://: the shards are objects read through Beam's FileSystems, paths checked by prefix."""
    from tests import memfs

    source = parquet_dataset(tmp_path)
    bucket = memfs.upload(source, "memfs://tfr-bucket/ds")
    try:
        remote = built(tmp_path, "remote", {"input": {"format": "tfrecord", "path": "memfs://tfr-bucket/ds"},
                                            "output": {"path": str(tmp_path / "remote"), "num_shards": 3},
                                            "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}})
        assert shard_bytes(remote) == shard_bytes(source)
        manifest = json.loads((source / "tfrbeam_dataset.json").read_text())
        manifest["splits"]["train"]["shards"][0]["path"] = "../other/x.tfrecord"
        (tmp_path / "hostile").mkdir()
        (tmp_path / "hostile" / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
        memfs.upload(tmp_path / "hostile", "memfs://tfr-bucket/ds")
        status, _ = build(tmp_path, "remote-hostile", {"input": {"format": "tfrecord", "path": "memfs://tfr-bucket/ds"},
                                                       "output": {"path": str(tmp_path / "rh"), "num_shards": 1}})
        assert status != 0 and "splits.train.shards[0].path" in capsys.readouterr().err
    finally:
        memfs.clear(bucket)


def test_a_read_index_whose_cut_entry_is_not_a_record_start_leaves_the_file_whole(tmp_path):
    path = _indexed_file(tmp_path / "indexed", 1024)
    good = tfrecord_pieces(str(path), path.stat().st_size, 4096, None)
    table = SplitTable(path.stat().st_size, path.stat().st_mtime, ROWS, (0, good[1][0] + 5), (0, good[1][2]), 1024)
    index = pathlib.Path(index_path_for(str(path), ".idx"))  # inside a record, where its header is not
    pathlib.Path(index_path_for(str(path))).unlink()
    index.write_bytes(table_bytes(table))
    assert tfrecord_pieces(str(path), path.stat().st_size, 4096, None) == [(0, None, 0)]


def test_a_declared_feature_the_sampled_records_never_hold_is_read_from_later_records(tmp_path):
    directory = tmp_path / "glob"
    directory.mkdir()
    payloads = [example_bytes({"id": index}) for index in range(10_020)]
    payloads += [example_bytes({"id": 10_020 + index, "rare": [index, index + 1]}) for index in range(30)]
    (directory / "a.tfrecord").write_bytes(framed(payloads))
    output = built(tmp_path, "rare", {"input": {"path": str(directory / "*.tfrecord")},
                                      "features": {"id": {"type": "int64"}, "rare": {"type": "int64", "on_null": "omit"}},
                                      "output": {"path": str(tmp_path / "rare-out"), "num_shards": 1}})
    rows = [json.loads(text) for text in decoded_rows(output).elements()]
    assert len(rows) == 10_050
    assert sorted(row["rare"] for row in rows if row.get("rare") is not None) == [[index, index + 1] for index in range(30)]


def test_a_gzip_dataset_reads_its_shards_by_their_extension(tmp_path):
    plain = parquet_dataset(tmp_path)
    gz = parquet_dataset(tmp_path, name="gz", output={"path": str(tmp_path / "gz"), "num_shards": 3, "compression": "gzip"})
    assert json.loads((gz / "tfrbeam_dataset.json").read_text())["compression"] == "gzip"
    again = built(tmp_path, "from-gz", {"input": {"path": str(gz)},
                                        "output": {"path": str(tmp_path / "from-gz"), "num_shards": 3},
                                        "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}})
    assert shard_bytes(again) == shard_bytes(plain)
