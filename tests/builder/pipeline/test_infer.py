"""infer-config: the written YAML is complete, commented, accepted unchanged and builds what it says."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tfrbeam.builder.config import load_config
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.csv import read_csv_file
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.errors import ConfigError, InputError


def load(tmp_path, text: str):
    path = tmp_path / "inferred.yaml"
    path.write_text(text)
    return load_config(str(path))


def convert_all(config) -> tuple[int, int]:
    """(good rows, bad rows) of the whole first input under a resolved config."""
    path = config.input.path
    if config.input.format == "parquet":
        sources = read_parquet_file(path, config.input.columns)
    else:
        sources = read_csv_file(path, config.input.csv, config.input.columns)
    good = bad = 0
    for source in sources:
        converted = convert_source_batch(source, config.features)
        good, bad = good + converted.batch.num_rows, bad + len(converted.bad_rows)
    return good, bad


def test_csv_with_nulls_lists_and_types(tmp_path):
    data = tmp_path / "flights.csv"
    rows = ["id;carrier;delay;tail;emb;tags;flag"]
    for i in range(50):
        delay = "NA" if i % 7 == 0 else f"{i * 1.5}"
        tail = "" if i % 5 == 0 else f"N{i}"
        rows.append(f"{i};\"AA;x\";{delay};{tail};{i}.5|{i}|0;{i % 3};{'true' if i % 2 else 'false'}")
    data.write_text("\n".join(rows) + "\n")
    text = infer_config(str(data))
    assert yaml.safe_load(text)["input"]["csv"]["delimiter"] == ";"
    assert "# Inferred from the first 50 rows of" in text
    assert '# "", "NA" stand in for missing numbers, so they are null values in every column.' not in text
    assert ('# "NA" stands in for missing numbers, so it is a null value; a text column where a word token is a value\n'
            '# ("NA" for Namibia) has its own null_values.') in text
    assert "  delay: {type: float, on_null: omit}   # 8 of 50 sampled rows are null: they leave the feature out" in text
    assert '  emb: {type: float, on_null: error, separator: "|", length: 3}' in text
    assert "  tail: {type: bytes, on_null: error}" in text  # "" is a value: only NA was made null
    assert "  flag: {type: int64, on_null: error}" in text  # true/false: proposed as true_values/false_values
    assert '    true_values: ["true"]' in text
    config = resolve_config(load(tmp_path, text))
    assert [(s.name, s.type, s.shape, s.on_null) for s in config.features] == [
        ("id", "int64", (), "error"), ("carrier", "bytes", (), "error"), ("delay", "float", (), "omit"),
        ("tail", "bytes", (), "error"), ("emb", "float", (3,), "error"), ("tags", "int64", (), "error"),
        ("flag", "int64", (), "error")]
    assert config.input.csv.null_values == ("NA",)
    assert convert_all(config) == (50, 0)


def test_empty_fields_in_number_columns_become_null_values(tmp_path):
    data = tmp_path / "x.csv"
    data.write_text("a,b\n1,x\n,y\n3,\n")
    text = infer_config(str(data))
    assert '    null_values: [""]' in text
    config = resolve_config(load(tmp_path, text))
    assert [(s.name, s.type, s.on_null) for s in config.features] == [("a", "int64", "omit"), ("b", "bytes", "omit")]
    assert convert_all(config) == (3, 0)


def test_no_header_is_detected_and_names_are_made_up(tmp_path):
    data = tmp_path / "x.tsv"
    data.write_text("1\t2.5\tx\n3\t4\ty\n")
    text = infer_config(str(data))
    assert "# No header line was detected: the columns got names; rename them in column_names." in text
    config = load(tmp_path, text)
    assert config.input.csv.header is False and config.input.csv.delimiter == "\t"
    assert config.input.csv.column_names == ("column_0", "column_1", "column_2")
    assert [s.type for s in resolve_config(config).features] == ["int64", "float", "bytes"]


def test_every_csv_spectrum_file(tmp_path, csv_spectrum):
    for path in sorted((csv_spectrum / "csvs").glob("*.csv")):
        config = resolve_config(load(tmp_path, infer_config(str(path))))
        good, bad = convert_all(config)
        assert bad == 0 and good >= 1, path.name


def test_every_parquet_testing_data_file(tmp_path, parquet_testing):
    outcomes = {}
    for path in sorted((parquet_testing / "data").glob("*.parquet")):
        text = infer_config(str(path))
        config = resolve_config(load(tmp_path, text))
        try:
            outcomes[path.name] = convert_all(config)
        except InputError as error:
            assert str(path) in str(error)
            outcomes[path.name] = "InputError"
    assert outcomes["datapage_v1-corrupt-checksum.parquet"] == "InputError"
    assert outcomes["rle-dict-uncompressed-corrupt-checksum.parquet"] == "InputError"
    assert outcomes["alltypes_plain.parquet"] == (8, 0)  # its timestamp column now declared int64
    assert outcomes["int96_from_spark.parquet"] == (6, 0)
    assert outcomes["fixed_length_decimal.parquet"] == (24, 0)
    assert outcomes["nested_structs.rust.parquet"] == (1, 0)  # one feature per struct field
    assert outcomes["nested_lists.snappy.parquet"] == (3, 0)  # the nested list is left out, b is kept
    assert outcomes["list_columns.parquet"] == (1, 2)  # null list items are bad rows
    readable = [o for o in outcomes.values() if o != "InputError"]
    assert len(readable) == 26


def test_parquet_comments_say_what_casts_do(tmp_path):
    table = pa.table({
        "ts": pa.array([datetime.datetime(2020, 1, 1)], pa.timestamp("us")),
        "day": pa.array([datetime.date(2020, 1, 2)]),
        "price": pa.array([1], pa.decimal128(5, 2)),
        "tags": pa.array([["a"]]),
        "m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
        "req": pa.array([1], pa.int64()),
    }, schema=pa.schema([("ts", pa.timestamp("us")), ("day", pa.date32()), ("price", pa.decimal128(5, 2)),
                         ("tags", pa.list_(pa.string())), ("m", pa.map_(pa.string(), pa.int64())),
                         pa.field("req", pa.int64(), nullable=False)]))
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    text = infer_config(str(path))
    assert (
        "  ts: {type: int64, on_null: omit}   # timestamp[us] as int64: the count of us (use type: bytes for ISO 8601 text)"
        in text
    )
    assert "  day: {type: int64, on_null: omit}   # date32[day] as int64: days since 1970-01-01" in text
    assert "  price: {type: float, on_null: omit}   # decimal128(5, 2) as a 32-bit float, rounded" in text
    assert "  tags: {type: bytes, on_null: omit}   # nullable in the schema" in text
    assert "  # left out: m (map<string, int64 ('m')>): no Example feature can hold it" in text
    assert "  req: {type: int64, on_null: error}\n" in text
    config = resolve_config(load(tmp_path, text))
    assert convert_all(config) == (1, 0)
    assert config.feature("tags").shape is None


def test_glob_input_and_format_override(tmp_path):
    (tmp_path / "part-1.data").write_text("a\n1\n")
    with pytest.raises(ConfigError, match=r"pass --format \(csv, parquet, jsonl, orc, avro, tfrecord\)"):
        infer_config(str(tmp_path / "*.data"))
    text = infer_config(str(tmp_path / "*.data"), format="csv")
    config = load(tmp_path, text)
    assert config.input.path == str(tmp_path / "*.data") and config.input.format == "csv"
    with pytest.raises(ConfigError, match="--format: 'json' is not one of csv, parquet, jsonl, orc, avro, tfrecord"):
        infer_config(str(tmp_path / "*.data"), format="json")


def test_the_rest_of_the_config_is_complete_and_commented(tmp_path):
    data = tmp_path / "x.csv"
    data.write_text("a\n1\n")
    text = infer_config(str(data))
    raw = yaml.safe_load(text)
    assert set(raw) == {"input", "features", "shuffle", "splits", "split_key", "output", "errors"}
    assert raw["splits"] == {"train": 0.9, "eval": 0.1} and raw["shuffle"] == {"enabled": True, "seed": 42}
    assert raw["output"] == {"path": "out/x", "compression": "none"}  # the sharding default is a comment
    assert all(line.startswith(("#", "  ")) or " #" in line or line.endswith(":") for line in text.splitlines())
    config = load(tmp_path, text)
    assert config.output.max_bytes_per_shard == 256 << 20 and config.errors.on_bad_record == "fail"


def test_the_edits_infer_config_invites_work(tmp_path):
    data = tmp_path / "x.csv"
    data.write_text("a,b\n1,x\n2,y\n")
    path = tmp_path / "inferred.yaml"
    path.write_text(infer_config(str(data)))
    assert load_config(str(path), ["output.num_shards=4"]).output.num_shards == 4
    sized = load_config(str(path), ["output.max_bytes_per_shard=1MiB"]).output
    assert sized.max_bytes_per_shard == 1 << 20 and sized.num_shards is None
    keep_going = load_config(str(path), ["errors.on_bad_record=dead_letter"]).errors
    assert keep_going.max_bad_fraction == 0.1
    text = path.read_text()
    assert "  # num_shards: 4" in text and "  # max_bytes_per_shard: 256MiB" in text
    assert "  # max_bad_fraction:" in text
    edited = text.replace("  # num_shards: 4", "  num_shards: 4")
    path.write_text(edited)
    assert load_config(str(path)).output.num_shards == 4


def test_set_of_one_sharding_key_replaces_the_other(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("input: {path: a.csv}\noutput: {path: o, max_bytes_per_shard: 1MiB}\n")
    output = load_config(str(path), ["output.num_shards=3"]).output
    assert output.num_shards == 3 and output.max_bytes_per_shard is None
    path.write_text("input: {path: a.csv}\noutput: {path: o, num_shards: {train: 2}}\n")
    output = load_config(str(path), ["output.max_bytes_per_shard=2MiB"]).output
    assert output.num_shards is None and output.max_bytes_per_shard == 2 << 20
    with pytest.raises(ConfigError, match="cannot be set together"):
        load_config(str(path), ["output.max_bytes_per_shard=2MiB", "output.num_shards=2"])


PENGUINS = '''"","species","island","bill_length_mm","body_mass_g","sex","year"
"1","Adelie","Torgersen",39.1,3750,"male",2007
"2","Adelie","Torgersen",NA,NA,NA,2007
"3","Gentoo","Biscoe",46.1,4500,"female",2008
'''


def test_build_and_infer_config_infer_the_same_features(tmp_path):
    """One inference path: the build with features left out gets what infer-config writes (NA is null, "" is named)."""
    data = tmp_path / "penguins.csv"
    data.write_text(PENGUINS)
    built = resolve_config(load(tmp_path, f"input: {{path: {data}}}\noutput: {{path: {tmp_path / 'out'}}}\n"))
    text = infer_config(str(data))
    inferred = resolve_config(load(tmp_path, text))
    assert built.features == inferred.features
    assert built.input.csv.null_values == inferred.input.csv.null_values == ("NA",)
    assert [(s.name, s.source, s.type, s.on_null) for s in built.features] == [
        ("column_0", "column_0", "int64", "error"), ("species", "species", "bytes", "error"),
        ("island", "island", "bytes", "error"), ("bill_length_mm", "bill_length_mm", "float", "omit"),
        ("body_mass_g", "body_mass_g", "int64", "omit"), ("sex", "sex", "bytes", "omit"), ("year", "year", "int64", "error")]
    assert "column_0: {type: int64, on_null: error}   # the header gives column 0 no name" in text
    assert convert_all(built) == (3, 0)


def test_infer_config_proposes_boolean_tokens_and_timestamps(tmp_path):
    data = tmp_path / "flights.csv"
    data.write_text("id,cancelled,dep_time,day\n1,TRUE,2013-01-01 05:15:00,2013-01-01\n"
                    "2,FALSE,2013-01-01T05:29:30,2013-01-02\n3,FALSE,2013-01-01 06:00:00,2013-01-03\n")
    text = infer_config(str(data))
    assert '    true_values: ["TRUE"]' in text and '    false_values: ["FALSE"]' in text
    assert "  cancelled: {type: int64, on_null: error}" in text
    assert "  dep_time: {type: timestamp, unit: s, on_null: error}   # ISO 8601 text" in text
    config = resolve_config(load(tmp_path, text))
    assert config.feature("dep_time").time_unit == "s" and config.feature("day").time_unit == "s"
    built = resolve_config(load(tmp_path, f"input: {{path: {data}}}\noutput: {{path: {tmp_path / 'o'}}}\n"))
    assert built.features == config.features  # the build infers the same
    assert convert_all(config) == (3, 0)
    source = next(read_csv_file(str(data), config.input.csv))
    converted = convert_source_batch(source, config.features).batch
    assert converted.column("cancelled").to_pylist() == [1, 0, 0]
    assert converted.column("dep_time").to_pylist()[:2] == [1357017300, 1357018170]


def _parquet_of_every_kind(path) -> None:
    """Timestamps (s/ms/us/ns, with and without a zone), dates, decimals, dictionaries, bools, lists, a nested
    list and a struct, with nulls where the schema allows them."""
    n = 40
    stamps = [datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=37 * i) for i in range(n)]
    days = [datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)]
    table = pa.table({
        "ts_s": pa.array(stamps, pa.timestamp("s")),
        "ts_ms_utc": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
        "ts_us_paris": pa.array([None if i % 9 == 0 else s for i, s in enumerate(stamps)],
                                pa.timestamp("us", tz="Europe/Paris")),
        "ts_ns": pa.array(stamps, pa.timestamp("ns")),
        "day32": pa.array(days, pa.date32()),
        "day64": pa.array(days, pa.date64()),
        "price": pa.array([f"{i}.{i % 100:02d}" for i in range(n)]).cast(pa.decimal128(10, 2)),
        "kind": pa.array([["a", "b", "c"][i % 3] for i in range(n)]).dictionary_encode(),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
        "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int64())),
        "nested": pa.array([[[i], [i, i]] for i in range(n)], pa.list_(pa.list_(pa.int64()))),
        "point": pa.array([{"x": float(i), "y": i} for i in range(n)]),
        "stamps": pa.array([[s] for s in stamps], pa.list_(pa.timestamp("ms"))),
    })
    pq.write_table(table, path, row_group_size=16)


def _tree(root) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_a_parquet_build_without_features_is_byte_identical_to_the_infer_config_build(tmp_path):
    """One inference path: leaving features out builds exactly what the config infer-config writes builds."""
    from tfrbeam.cli.build import main as build_main

    data = tmp_path / "kinds.parquet"
    _parquet_of_every_kind(data)
    written = yaml.safe_load(infer_config(str(data)))
    assert {"ts_s", "ts_ms_utc", "ts_us_paris", "day64", "price", "kind", "point_x", "stamps"} <= set(written["features"])
    configs = {"written": written, "inferred": {key: value for key, value in written.items() if key != "features"}}
    for name, config in configs.items():
        config = {**config, "output": {**config["output"], "path": str(tmp_path / name)}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        assert build_main([str(tmp_path / f"{name}.yaml"), "--quiet"]) == 0, name
    written_tree, inferred_tree = _tree(tmp_path / "written"), _tree(tmp_path / "inferred")
    assert written_tree.keys() == inferred_tree.keys() and any(key.endswith(".tfrecord") for key in written_tree)
    for key in written_tree:
        if key == "tfrbeam_dataset.json" or "/.tfrbeam-index/" in key:  # indexes stamp the shard's mtime
            continue
        assert written_tree[key] == inferred_tree[key], key
    manifests = [json.loads(tree["tfrbeam_dataset.json"]) for tree in (written_tree, inferred_tree)]
    assert manifests[0]["features"] == manifests[1]["features"]
    assert _without_run_fields(manifests[0]) == _without_run_fields(manifests[1])


def _without_run_fields(manifest: dict) -> dict:
    """The manifest without what names this run (its run record and output path)."""
    config = {**manifest["config"], "output": {**manifest["config"]["output"], "path": None}}
    return {**{key: value for key, value in manifest.items() if key != "run"}, "config": config}


# ------------------------------------------------------------------------------ --sequence-by


def _aircraft_log(tmp_path) -> str:
    from tfrbeam.cli.demo_data import write_demo_data

    write_demo_data(str(tmp_path / "demo"), num_rows=30)
    return str(tmp_path / "demo" / "sequences" / "flights-by-aircraft.csv")


def test_sequence_by_writes_a_sequence_config_with_the_columns_constant_in_every_group(tmp_path):
    rows = {"user": [f"u{i % 20}" for i in range(200)], "t": list(range(200)), "plan": [f"p{i % 20 % 3}" for i in range(200)],
            "region": [i % 20 % 4 for i in range(200)], "amount": [i * 0.5 for i in range(200)],
            "tags": [[f"x{i % 20}"] for i in range(200)]}
    path = tmp_path / "events.parquet"
    pq.write_table(pa.table(rows), path)
    text = infer_config(str(path), sequence_by="user", order_by="t")
    sequence = yaml.safe_load(text)["sequence"]
    assert sequence == {"group_by": ["user"], "order_by": ["t"], "context": ["plan", "region"], "max_steps": None,
                        "overflow": "split", "min_steps": 1}
    assert "# context: the columns constant within every one of the sample's 20 groups (of 200 rows)" in text
    assert "tags: a list column, never proposed as context" in text
    config = load(tmp_path, text)
    assert config.sequence is not None and config.split_key == ("user",)
    assert resolve_config(config).sequence.sequence_features(resolve_config(config).features) == ("t", "amount", "tags")


def test_sequence_by_on_the_demo_flight_log_names_the_nearly_constant_column(tmp_path):
    log = _aircraft_log(tmp_path)
    text = infer_config(log, sequence_by="tailnum", order_by="sched_dep")
    sequence = yaml.safe_load(text)["sequence"]
    assert sequence["group_by"] == ["tailnum"] and sequence["order_by"] == ["sched_dep"] and sequence["context"] == []
    assert "# carrier: constant within 39 of the 40 groups with more than one row (not proposed)" in text
    config = resolve_config(load(tmp_path, text))
    assert config.feature("sched_dep").time_unit == "s"


def test_sequence_by_names_must_be_features_and_order_by_needs_sequence_by(tmp_path):
    log = _aircraft_log(tmp_path)
    with pytest.raises(ConfigError, match=r"--sequence-by: 'tail' is not a feature of the input \(features: tailnum, "):
        infer_config(log, sequence_by="tail")
    with pytest.raises(ConfigError, match="--order-by: 'when' is not a feature of the input"):
        infer_config(log, sequence_by="tailnum", order_by="when")
    with pytest.raises(ConfigError, match="--order-by needs --sequence-by"):
        infer_config(log, order_by="sched_dep")


def test_sequence_by_on_singleton_groups_proposes_no_context(tmp_path):
    path = tmp_path / "once.csv"
    path.write_text("id,v\n" + "".join(f"{i},{i % 3}\n" for i in range(30)))
    text = infer_config(str(path), sequence_by="id")
    assert yaml.safe_load(text)["sequence"]["context"] == []
    assert "# context: every group of the sample has one row, so nothing tells context from steps" in text


def test_the_infer_config_command_takes_sequence_by(tmp_path, capsys):
    from tfrbeam.cli.main import main

    log = _aircraft_log(tmp_path)
    assert main(["infer-config", log, "--sequence-by", "tailnum", "--order-by", "sched_dep"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["sequence"]["group_by"] == ["tailnum"]
    assert main(["infer-config", log, "--order-by", "sched_dep"]) == 2
    assert "--order-by needs --sequence-by" in capsys.readouterr().err


@pytest.mark.parametrize(("input_path", "first_file", "expected"), [
    ("data/flights.csv", "data/flights.csv", "flights"),
    ("data/flights-*.csv", "data/flights-00000.csv", "flights"),
    ("demo_data/parquet/*.parquet", "demo_data/parquet/flights-00000.parquet", "parquet"),
    ("gs://bucket/*.csv", "gs://bucket/a.csv", "bucket"),
    ("*.csv", "a.csv", "dataset"),
    ("logs/2024-??/part-*.csv.gz", "logs/2024-01/part-0.csv.gz", "part"),
])
def test_infer_config_names_the_output_after_the_input_not_its_first_file(input_path, first_file, expected):
    from tfrbeam.builder.pipeline.infer_config import output_stem

    assert output_stem(input_path, first_file) == expected


def test_infer_config_on_a_glob_names_the_output_after_the_glob(tmp_path):
    for index in range(2):
        (tmp_path / f"sales-{index:03d}.csv").write_text("a,b\n1,x\n")
    raw = yaml.safe_load(infer_config(str(tmp_path / "sales-*.csv")))
    assert raw["output"]["path"] == "out/sales"


def test_the_cli_format_choices_are_the_config_formats(tmp_path, capsys):
    """tfrbeam/cli/main.py lists the formats itself (it does not import the build at startup)."""
    from tfrbeam.builder.config import INPUT_FORMATS
    from tfrbeam.cli.main import main

    (tmp_path / "rows.data").write_text('{"id": 1}\n')
    assert main(["infer-config", str(tmp_path / "rows.data"), "--format", "jsonl"]) == 0
    assert "format: jsonl" in capsys.readouterr().out
    for fmt in INPUT_FORMATS:
        main(["infer-config", str(tmp_path / "none-*"), "--format", fmt])
        assert "invalid choice" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["infer-config", str(tmp_path / "rows.data"), "--format", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err
