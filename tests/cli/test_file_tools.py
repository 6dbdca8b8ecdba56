"""The `tfrbeam verify`, `cat` and `inspect` commands, run in-process through the console entry point."""

from __future__ import annotations

import base64
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tfrbeam.cli.main import main
from tfrbeam.codec.example import encode_example
from tfrbeam.tfrecord.records import RecordWriter


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_reports_each_file_and_fails_on_the_corrupt_one(capsys, tf_vectors):
    good = str(tf_vectors / "examples.tfrecord")
    bad = str(tf_vectors / "corrupt_b_length_crc_bitflip.tfrecord")
    code, out, _err = _run(capsys, "verify", "--examples", good, bad)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"OK   {good}: 20 records, 1078105 payload bytes, 1078425 file bytes")
    assert lines[1].startswith(f"FAIL {bad}: 3 records")
    assert "length CRC mismatch" in lines[2] and "offset 164" in lines[2]


def test_verify_accepts_globs_directories_and_compressed_files(capsys, tf_vectors, tmp_path):
    for name in ("raw.tfrecord", "raw.tfrecord.gz", "raw.tfrecord.zlib"):
        shutil.copy(tf_vectors / name, tmp_path / name)
    (tmp_path / ".tfrbeam-index").mkdir()
    (tmp_path / ".tfrbeam-index" / "ignored.idx").write_bytes(b"not a record file")
    code, out, _ = _run(capsys, "verify", str(tmp_path))
    assert code == 0
    assert out.count("OK  ") == 3 and "10 records" in out and "ignored.idx" not in out
    code, out, _ = _run(capsys, "verify", str(tmp_path / "raw.tfrecord*"))
    assert code == 0 and out.count("OK  ") == 3


def test_verify_examples_flags_a_payload_that_is_not_an_example(capsys, tmp_path):
    path = tmp_path / "junk.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(encode_example({"a": [1]}))
        writer.write(b"\xff\xff\xff")
    code, out, _ = _run(capsys, "verify", str(path))
    assert code == 0  # CRCs are fine
    code, out, _ = _run(capsys, "verify", "--examples", str(path))
    assert code == 1 and "not a tf.train.Example" in out and "offset 30" in out


def test_missing_input_is_a_one_line_error(capsys, tmp_path):
    code, out, err = _run(capsys, "cat", str(tmp_path / "nope.tfrecord"))
    assert code == 2 and out == ""
    assert err.strip() == f"tfrbeam: error: {tmp_path / 'nope.tfrecord'}: no such file, directory or matching files"


def test_corrupt_data_in_cat_is_a_one_line_error(capsys, tf_vectors):
    code, out, err = _run(capsys, "cat", str(tf_vectors / "corrupt_e_trunc_in_last_payload.tfrecord"))
    assert code == 1
    assert len(out.splitlines()) == 19
    assert err.count("\n") == 1 and "offset 1078023" in err and "Traceback" not in err


def test_cat_prints_json_lines_with_unambiguous_bytes(capsys, tf_vectors):
    examples = json.loads((tf_vectors / "examples.json").read_text())["examples"]
    code, out, _ = _run(capsys, "cat", str(tf_vectors / "examples.tfrecord"))
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 20
    assert lines[0] == {"b": ["abc"], "f": [1.5], "i": [42]}
    assert lines[6]["specials"][:3] == ["NaN", "Infinity", "-Infinity"]
    not_utf8 = lines[18]["notutf8"]
    assert all(set(value) == {"base64"} for value in not_utf8)
    expected = [base64.b64decode(v) for v in examples[18]["features"][0]["values_b64"]]
    assert [base64.b64decode(v["base64"]) for v in not_utf8] == expected
    assert lines[9]["名前"] == ["日本語のテキスト"]


def test_cat_limit_and_kinds(capsys, tf_vectors):
    code, out, _ = _run(capsys, "cat", "--limit", "2", "--kinds", str(tf_vectors / "examples.tfrecord"))
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 2
    assert lines[1]["f_empty"] == {"kind": "float", "values": []}
    assert lines[0]["i"] == {"kind": "int64", "values": [42]}


def test_cat_sequence_examples(capsys, tf_vectors):
    code, out, _ = _run(capsys, "cat", "--sequence", str(tf_vectors / "sequence_examples.tfrecord"))
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 5
    assert lines[1] == {"context": {}, "feature_lists": {}}


def test_inspect_reports_kinds_presence_and_a_parse_spec(capsys, tmp_path):
    path = tmp_path / "rows.tfrecord"
    with RecordWriter(str(path)) as writer:
        for i in range(10):
            row = {"id": i, "emb": [0.5, 1.5, 2.5], "tags": ["a"] * (i % 3), "name": b"x"}
            if i % 2:
                row["maybe"] = 1.0
            writer.write(encode_example(row, kinds={"tags": "bytes"}))
    code, out, _ = _run(capsys, "inspect", "--json", str(path))
    report = json.loads(out)
    assert code == 0 and report["records"] == 10
    assert report["features"]["maybe"] == {"kind": "float", "present": 5, "min_values": 1, "max_values": 1}
    assert report["features"]["tags"]["min_values"] == 0 and report["features"]["tags"]["max_values"] == 2
    assert report["parse_example_spec"] == {
        "emb": "tf.io.FixedLenFeature([3], tf.float32)",
        "id": "tf.io.FixedLenFeature([], tf.int64)",
        "maybe": "tf.io.VarLenFeature(tf.float32)",
        "name": "tf.io.FixedLenFeature([], tf.string)",
        "tags": "tf.io.VarLenFeature(tf.string)",
    }
    code, out, _ = _run(capsys, "inspect", str(path))
    assert "10 records" in out and "'emb': tf.io.FixedLenFeature([3], tf.float32)," in out and "50.0%" in out


def test_console_script_runs_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tfrbeam.cli.main", "verify", str(tmp_path / "missing")],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_every_command_has_a_description_in_help(capsys):
    code, out, _ = _run_help(capsys)
    assert code == 0
    commands = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if line.startswith("    ") and parts and parts[0] in ("verify", "cat", "inspect", "build", "infer-config"):
            commands[parts[0]] = parts[1] if len(parts) > 1 else ""
    assert set(commands) == {"verify", "cat", "inspect", "build", "infer-config"}
    for name in ("verify", "cat", "inspect"):
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code == 0
        sub_help = capsys.readouterr().out
        description = sub_help.split("\n\n")[1]
        assert not description.startswith(("positional", "options")) and len(description) > 30, sub_help


def _run_help(capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def test_cat_raw_prints_records_that_are_not_examples_and_the_error_says_so(capsys, tmp_path):
    path = tmp_path / "raw.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(b"hello \xff")
        writer.write(b"plain text")
    code, out, err = _run(capsys, "cat", str(path))
    assert code == 1 and "--raw" in err and len(err.strip().splitlines()) == 1
    code, out, err = _run(capsys, "cat", "--raw", str(path))
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [
        {"offset": 0, "size": 7, "data": {"base64": base64.b64encode(b"hello \xff").decode()}},
        {"offset": 23, "size": 10, "data": "plain text"},
    ]
    code, out, _ = _run(capsys, "cat", "--raw", "--limit", "1", str(path))
    assert code == 0 and len(out.splitlines()) == 1


def test_cat_prints_float32_values_as_their_shortest_round_trip_repr(capsys, tmp_path):
    import numpy as np

    values = [5.2, 0.1, 1e-45, 3.4028234663852886e38, 16777217.0, -0.0, 123456.789]
    path = tmp_path / "floats.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(encode_example({"x": np.array(values, np.float32)}))
    code, out, _ = _run(capsys, "cat", str(path))
    assert code == 0
    printed = out.strip()
    assert printed.startswith('{"x": [5.2, 0.1, 1e-45, 3.4028235e+38')
    assert "5.199999809265137" not in printed
    decoded = json.loads(printed)["x"]
    assert [np.float32(v) for v in decoded] == [np.float32(v) for v in values]
    assert np.signbit(np.float32(decoded[5]))


def test_cat_and_inspect_refuse_sequence_examples_read_as_examples(capsys, tf_vectors):
    """An Example parser keeps only a SequenceExample's context: printing that would silently drop its steps."""
    path = tf_vectors / "sequence_examples.tfrecord"
    for command in ("cat", "inspect"):
        code, out, err = _run(capsys, command, str(path))
        assert code == 1 and out == "", command
        assert "is a tf.train.SequenceExample (it has feature lists)" in err and "cat --sequence" in err, err
        assert len(err.strip().splitlines()) == 1


def test_verify_examples_checks_sequence_examples_as_sequence_examples(capsys, tf_vectors, tmp_path):
    code, out, _ = _run(capsys, "verify", "--examples", str(tf_vectors / "sequence_examples.tfrecord"))
    assert code == 0, out
    path = tmp_path / "broken-lists.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(encode_example({"a": [1]}) + b"\x12\x03\x0a\x05x")  # feature_lists whose entry runs past its end
    code, out, _ = _run(capsys, "verify", "--examples", str(path))
    assert code == 1 and "not a tf.train.SequenceExample" in out and "offset 0" in out


_SOURCE_ORDER = ["zeta", "alpha", *(f"column_{number}" for number in range(12))]


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory) -> pathlib.Path:
    """A build of a CSV whose columns are neither sorted by name nor in natural order: zeta, alpha, column_0..11."""
    from tfrbeam.cli.build import main as build_main

    directory = tmp_path_factory.mktemp("wide")
    rows = [",".join(_SOURCE_ORDER)] + [",".join(str(row * 100 + column) for column in range(len(_SOURCE_ORDER)))
                                        for row in range(30)]
    (directory / "wide.csv").write_text("\n".join(rows) + "\n")
    (directory / "wide.yaml").write_text(f"input: {{path: '{directory / 'wide.csv'}'}}\nsplits: {{train: 0.7, eval: 0.3}}\n"
                                         f"output: {{path: '{directory / 'out'}', num_shards: 1}}\n")
    assert build_main([str(directory / "wide.yaml"), "--quiet"]) == 0
    return directory / "out"


def test_the_manifest_keeps_the_source_column_order(wide_dataset):
    manifest = json.loads((wide_dataset / "tfrbeam_dataset.json").read_text())
    assert list(manifest["features"]) == _SOURCE_ORDER
    assert list(manifest["parse_example_spec"]) == _SOURCE_ORDER
    assert all(list(split["examples_with_feature"]) == _SOURCE_ORDER for split in manifest["splits"].values())


def test_cat_and_inspect_show_features_in_the_source_order(capsys, wide_dataset):
    for argv in (["cat", "--limit", "3"], ["cat", "--kinds", "--limit", "1"]):
        code, out, _ = _run(capsys, *argv, str(wide_dataset / "train"))
        assert code == 0 and all(list(json.loads(line)) == _SOURCE_ORDER for line in out.splitlines()), out
    code, out, _ = _run(capsys, "inspect", "--json", str(wide_dataset / "train"))
    report = json.loads(out)
    assert list(report["features"]) == _SOURCE_ORDER and list(report["parse_example_spec"]) == _SOURCE_ORDER
    code, out, _ = _run(capsys, "inspect", str(wide_dataset / "eval" / "*.tfrecord"))
    table, spec, summary = (section.splitlines()[1:] for section in out.split("\n\n")[1:4])
    assert [line.split()[0] for line in table] == _SOURCE_ORDER
    assert [line.split(":")[0].strip().strip("'") for line in spec[:-1]] == _SOURCE_ORDER
    assert [line.split()[0] for line in summary] == _SOURCE_ORDER


def test_stats_and_export_show_features_in_the_source_order(capsys, wide_dataset, tmp_path):
    import pyarrow.parquet as pq

    code, out, _ = _run(capsys, "stats", str(wide_dataset), "--output-dir", str(tmp_path / "stats"))
    assert code == 0
    stats = json.loads((tmp_path / "stats" / "stats.json").read_text())
    for split in stats["splits"].values():
        assert list(split["features"]) == _SOURCE_ORDER
    assert list(stats["drift"]["comparisons"]["eval"]) == _SOURCE_ORDER
    printed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("  feature")]
    assert printed[:len(_SOURCE_ORDER)] == _SOURCE_ORDER
    code, _, _ = _run(capsys, "export", str(wide_dataset), str(tmp_path / "parquet"))
    assert code == 0
    files = sorted((tmp_path / "parquet").glob("*/*.parquet"))
    assert files and all(pq.read_schema(path).names == _SOURCE_ORDER for path in files)


def test_inspect_prints_a_feature_spec_that_compiles_when_a_feature_has_no_kind(capsys, tmp_path):
    path = tmp_path / "kindless.tfrecord"
    with RecordWriter(str(path)) as writer:
        for number in range(3):  # "empty" is a Feature with no kind set: tf.train.Feature() as TensorFlow writes it
            writer.write(encode_example({"id": [number]}) + bytes.fromhex("0a0b0a090a05656d7074791200"))
    code, out, _ = _run(capsys, "inspect", str(path))
    assert code == 0
    spec_text = out.split("\n\n")[2]
    assert spec_text.startswith("feature_spec = {")
    namespace = {"tf": _FakeTf()}
    exec(compile(spec_text, "<inspect>", "exec"), namespace)  # must be Python a reader can paste
    assert namespace["feature_spec"] == {"id": ("FixedLenFeature", [], "int64")}
    assert "# 'empty': no kind in any record" in spec_text
    code, out, _ = _run(capsys, "inspect", "--json", str(path))
    assert json.loads(out)["parse_example_spec"] == {"id": "tf.io.FixedLenFeature([], tf.int64)"}


class _FakeTf:
    """Enough of ``tf`` for a pasted feature spec to run: ``tf.io.*Feature(...)`` and ``tf.int64`` etc."""

    int64, float32, string = "int64", "float32", "string"

    class io:  # named as TensorFlow names it
        @staticmethod
        def FixedLenFeature(shape, dtype):
            return ("FixedLenFeature", shape, dtype)

        @staticmethod
        def VarLenFeature(dtype):
            return ("VarLenFeature", dtype)


def test_a_gzip_file_without_a_gz_name_is_read_by_every_tool(capsys, tf_vectors, tmp_path):
    plain = str(tf_vectors / "examples.tfrecord")
    unnamed = tmp_path / "examples.tfrecord"  # TensorFlow-written GZIP, named as if uncompressed
    shutil.copy(tf_vectors / "examples.tfrecord.gz", unnamed)
    zlib_unnamed = tmp_path / "raw.data"
    shutil.copy(tf_vectors / "raw.tfrecord.zlib", zlib_unnamed)
    code, out, err = _run(capsys, "verify", str(unnamed), str(zlib_unnamed))
    assert code == 0 and out.count("OK  ") == 2 and ": 20 records, " in out and ": 10 records, " in out, out + err
    assert _run(capsys, "cat", str(unnamed))[1] == _run(capsys, "cat", plain)[1]
    assert json.loads(_run(capsys, "inspect", "--json", str(unnamed))[1])["records"] == 20
    code, _, err = _run(capsys, "index", "--dali", str(tmp_path / "idx"), str(unnamed))
    assert code == 2 and "this one is compressed" in err


def test_counts_of_one_read_as_singulars(capsys, tmp_path):
    path = tmp_path / "one.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(encode_example({"a": [1]}))
    shown = ""
    for argv in (["verify", str(path)], ["inspect", str(path)], ["index", "--dali", str(tmp_path / "idx"), str(path)],
                 ["demo-data", str(tmp_path / "demo"), "--rows", "1"],
                 ["stats", str(path), "--output-dir", str(tmp_path / "stats")]):
        code, out, err = _run(capsys, *argv)
        assert code == 0, err
        shown += out + err
    assert ": 1 record, " in shown and "1 file, 1 record, " in shown and "split files: 1 example" in shown
    assert re.findall(r"(?<![\d,.])1 (?!byte)[a-z]+s\b(?!/)|\(s\)", shown) == [], shown
