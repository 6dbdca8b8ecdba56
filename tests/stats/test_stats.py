"""tfrbeam.stats: every number checked against an independent pyarrow.compute / numpy computation on the decoded data."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.cli.main import main
from tfrbeam.codec.encode import record_batch_to_examples
from tfrbeam.codec.example import encode_example
from tfrbeam.codec.json_values import value_to_json
from tfrbeam.stats.accumulators import SplitAccumulator, stats_schema
from tfrbeam.stats.compute import accumulate_file, compute_stats, write_dataset_stats
from tfrbeam.stats.drift import jensen_shannon, l_infinity
from tfrbeam.stats.report import DECILES, dataset_stats
from tfrbeam.stats.sketches import DISTINCT_K, DistinctCount, TopValues, hash_binary
from tfrbeam.stats.text import format_fraction
from tfrbeam.tfrecord.records import RecordWriter

DOCUMENTED_KEYS = {"type", "present", "min", "max", "mean", "std", "num_zeros", "num_nan", "histogram", "quantiles",
                   "top_values", "num_unique"}


def write_table(path, table: pa.Table) -> str:
    with RecordWriter(str(path)) as writer:
        for record in record_batch_to_examples(table):
            writer.write(record)
    return str(path)


def sample_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    floats = rng.normal(3.0, 2.0, rows).astype(np.float32)
    floats[rng.random(rows) < 0.05] = 0.0
    floats[rng.random(rows) < 0.01] = np.nan
    floats[rng.random(rows) < 0.005] = np.inf
    floats[rng.random(rows) < 0.005] = -np.inf
    words = np.array([b"alpha", b"beta", b"gamma", b"\xff\xfe", b"", "caf\u00e9".encode()], dtype=object)
    labels = rng.choice(words, rows, p=[0.4, 0.25, 0.15, 0.1, 0.05, 0.05])
    lengths = rng.integers(0, 5, rows)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    varlist = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(-50, 50, int(lengths.sum()))),
                                       mask=pa.array(rng.random(rows) < 0.2))
    return pa.table({
        "count": pa.array(rng.integers(0, 7, rows)),
        "value": pa.array(floats),
        "label": pa.array(labels.tolist(), pa.binary()),
        "ids": varlist,
        "sometimes": pa.array(rng.integers(-1000, 1000, rows), mask=rng.random(rows) < 0.3),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 3).astype(np.float32)), 3),
    })


FEATURE_TYPES = {"count": "int64", "value": "float", "label": "bytes", "ids": "int64", "sometimes": "int64", "vector": "float"}


def decoded_values(table: pa.Table, name: str) -> tuple[pa.Array, int]:
    """(flat values, examples with the feature) as the Example holds them, computed with pyarrow alone."""
    column = table.column(name).combine_chunks()
    present = len(column) - column.null_count
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        return column.flatten(), present
    return column.drop_null(), present


def check_feature(entry: dict, values: pa.Array, present: int, kind: str) -> None:
    assert entry["present"] == present
    assert entry["num_values"] == len(values)
    if kind == "bytes":
        counts = pc.value_counts(values).to_pylist()
        expected = sorted(((item["counts"], item["values"]) for item in counts), key=lambda pair: (-pair[0], pair[1]))
        got = [(item["count"], item["value"]) for item in entry["top_values"]]
        assert got == [(count, value_to_json("bytes", value)) for count, value in expected]
        assert entry["num_unique"] == pc.count_distinct(values).as_py() and not entry["num_unique_estimated"]
        lengths = pc.binary_length(values)
        assert entry["length"]["min"] == pc.min(lengths).as_py() and entry["length"]["max"] == pc.max(lengths).as_py()
        assert entry["length"]["mean"] == pytest.approx(pc.mean(lengths).as_py())
        return
    numbers = values.to_numpy(zero_copy_only=False).astype(np.float64)
    finite = pa.array(numbers[np.isfinite(numbers)])
    assert entry["min"] == pc.min(finite).as_py() and entry["max"] == pc.max(finite).as_py()
    assert entry["mean"] == pytest.approx(pc.mean(finite).as_py(), rel=1e-9, abs=1e-12)
    assert entry["std"] == pytest.approx(pc.stddev(finite, ddof=0).as_py(), rel=1e-9, abs=1e-12)
    assert entry["num_zeros"] == int(np.count_nonzero(numbers == 0))
    assert entry["num_nan"] == int(np.isnan(numbers).sum())
    assert entry["num_pos_inf"] == int((numbers == np.inf).sum()) and entry["num_neg_inf"] == int((numbers == -np.inf).sum())
    check_quantiles(entry, np.sort(finite.to_numpy()))
    assert sum(bucket["count"] for bucket in entry["histogram"]) == len(finite)
    check_histogram(entry, finite.to_numpy())
    if kind == "int64":
        counts = pc.value_counts(values).to_pylist()
        expected = sorted(((item["counts"], item["values"]) for item in counts), key=lambda pair: (-pair[0], pair[1]))
        got = [(item["count"], item["value"]) for item in entry["top_values"]]
        assert got == expected[: len(got)] and len(got) == min(20, len(expected))
        assert entry["num_unique"] == pc.count_distinct(values).as_py()


def check_quantiles(entry: dict, ordered: np.ndarray) -> None:
    """Each decile's true rank is within the sketch's stated rank error (exact sketches: error 0)."""
    error = entry["quantile_rank_error"]
    n = len(ordered)
    for item, rank in zip(entry["quantiles"], DECILES):
        below = np.searchsorted(ordered, item["value"], side="left") / n
        at_or_below = np.searchsorted(ordered, item["value"], side="right") / n
        assert below - error - 1 / n <= rank <= at_or_below + error + 1 / n, (item, rank, below, at_or_below, error)


def check_histogram(entry: dict, finite: np.ndarray) -> None:
    edges = [bucket["low"] for bucket in entry["histogram"]] + [entry["histogram"][-1]["high"]]
    if len(edges) == 2 and edges[0] == edges[1]:
        assert entry["histogram"][0]["count"] == len(finite)
        return
    truth, _ = np.histogram(finite, bins=np.array(edges))
    tolerance = entry["histogram_count_error"] * 2 + 1 if not entry["histogram_exact"] else 0
    for bucket, expected in zip(entry["histogram"], truth.tolist()):
        assert abs(bucket["count"] - expected) <= tolerance, (bucket, expected, tolerance)


def test_statistics_match_pyarrow_compute(tmp_path):
    table = sample_table(5000)
    paths = [write_table(tmp_path / f"part-{i}.tfrecord", table.slice(i * 2000, 2000)) for i in range(3)]
    stats = compute_stats(str(tmp_path / "part-*.tfrecord"))
    entry = stats["splits"]["files"]
    assert entry["num_examples"] == 5000 and len(paths) == 3
    for name, kind in FEATURE_TYPES.items():
        values, present = decoded_values(table, name)
        feature = entry["features"][name]
        assert DOCUMENTED_KEYS <= set(feature) and feature["type"] == kind
        check_feature(feature, values, present, kind)
    json.dumps(stats, allow_nan=False)


def test_value_counts_per_example_of_lists_and_presence_of_optional_features(tmp_path):
    table = sample_table(3000, seed=3)
    stats = compute_stats(write_table(tmp_path / "one.tfrecord", table))["splits"]["files"]["features"]
    ids = table.column("ids").combine_chunks()
    lengths = pc.list_value_length(ids).drop_null()
    assert stats["ids"]["values_per_example"] == {
        "min": pc.min(lengths).as_py(), "max": pc.max(lengths).as_py(), "mean": pytest.approx(pc.mean(lengths).as_py()),
    }
    assert stats["vector"]["values_per_example"] == {"min": 3, "max": 3, "mean": 3.0}
    sometimes = table.column("sometimes")
    assert stats["sometimes"]["missing"] == sometimes.null_count
    assert stats["sometimes"]["present_fraction"] == pytest.approx(1 - sometimes.null_count / 3000)


def test_merged_accumulators_equal_one_pass_and_survive_pickling(tmp_path):
    table = sample_table(4000, seed=5)
    whole = SplitAccumulator(FEATURE_TYPES)
    whole.merge(accumulate_file(write_table(tmp_path / "all.tfrecord", table), FEATURE_TYPES))
    parts = [
        accumulate_file(write_table(tmp_path / f"p{i}.tfrecord", table.slice(i * 1000, 1000)), FEATURE_TYPES) for i in range(4)
    ]
    merged = SplitAccumulator(FEATURE_TYPES)
    for part in reversed(parts):
        merged.merge(pickle.loads(pickle.dumps(part)))
    a = dataset_stats({"s": whole})["splits"]["s"]["features"]
    b = dataset_stats({"s": merged})["splits"]["s"]["features"]
    for name in FEATURE_TYPES:
        for key in ("present", "num_values", "min", "max", "num_zeros", "num_nan", "top_values", "num_unique", "length"):
            assert a[name][key] == b[name][key], (name, key)
        for key in ("mean", "std"):
            if a[name][key] is not None:
                assert a[name][key] == pytest.approx(b[name][key], rel=1e-12, abs=1e-12)


def test_sketches_at_scale_stay_within_their_stated_errors(tmp_path):
    rng = np.random.default_rng(11)
    rows = 120_000
    zipf = np.minimum(rng.zipf(1.3, rows), 10**9)
    table = pa.table({
        "wide": pa.array(rng.integers(0, 10**12, rows)),  # ~all distinct: the distinct count is an estimate
        "zipf": pa.array([str(value).encode() for value in zipf.tolist()], pa.binary()),  # many distinct: Misra-Gries prunes
        "x": pa.array(rng.lognormal(0, 1, rows).astype(np.float32)),
    })
    stats = compute_stats(write_table(tmp_path / "big.tfrecord", table))["splits"]["files"]["features"]
    wide = stats["wide"]
    true_unique = pc.count_distinct(table.column("wide")).as_py()
    assert wide["num_unique_estimated"] and wide["num_unique_relative_error"] == pytest.approx(1 / math.sqrt(DISTINCT_K - 2))
    assert abs(wide["num_unique"] - true_unique) <= 4 * wide["num_unique_relative_error"] * true_unique
    top = stats["zipf"]
    truth = {item["values"].decode(): item["counts"] for item in pc.value_counts(table.column("zipf")).to_pylist()}
    assert not top["top_values_exact"] and top["top_values_max_error"] > 0
    for item in top["top_values"]:
        assert truth[item["value"]] - top["top_values_max_error"] <= item["count"] <= truth[item["value"]]
    true_top = sorted(truth, key=lambda value: -truth[value])[:10]
    assert [item["value"] for item in top["top_values"][:10]] == true_top
    assert wide["top_values"] is None and wide["top_values_exact"] is None  # an int64 id is not categorical
    x = stats["x"]
    assert not x["histogram_exact"] and x["quantile_rank_error"] > 0
    check_quantiles(x, np.sort(table.column("x").to_numpy().astype(np.float64)))
    check_histogram(x, table.column("x").to_numpy().astype(np.float64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=60), st.integers(0, 5))
def test_binary_hashes_are_equal_exactly_for_equal_values(values, start):
    array = pa.array(values, pa.binary()).slice(min(start, len(values) - 1))
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset:array.offset + len(array) + 1]
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8) if array.buffers()[2] is not None else np.zeros(0, np.uint8)
    hashes = hash_binary(data, offsets).tolist()
    items = array.to_pylist()
    for i in range(len(items)):
        for j in range(len(items)):
            assert (hashes[i] == hashes[j]) == (items[i] == items[j])
    alone = [
        hash_binary(np.frombuffer(item, dtype=np.uint8) if item else np.zeros(0, np.uint8), np.array([0, len(item)]))[0]
        for item in items
    ]
    assert alone == hashes  # a value's hash does not depend on its neighbours


def test_top_values_and_distinct_count_merge_exactly_below_their_bounds():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 500, 20_000).astype(np.uint64)
    left, right = TopValues(), TopValues()
    left.add(keys[:7000])
    right.add(keys[7000:])
    left.merge(right)
    unique, counts = np.unique(keys, return_counts=True)
    assert left.exact and dict(zip(unique.tolist(), counts.tolist())) == dict(zip(left.keys.tolist(), left.counts.tolist()))
    distinct = DistinctCount()
    distinct.add(keys)
    assert distinct.exact and distinct.estimate() == len(unique)


def test_drift_scores():
    assert l_infinity({"a": 0.5, "b": 0.5}, {"a": 0.8, "b": 0.2}) == pytest.approx(0.3)
    assert l_infinity({"a": 1.0}, {"b": 1.0}) == 1.0
    assert jensen_shannon(np.array([1, 2, 3]), np.array([2, 4, 6])) == pytest.approx(0.0)
    assert jensen_shannon(np.array([1, 0]), np.array([0, 1])) == pytest.approx(1.0)


def test_drifted_features_are_flagged_first(tmp_path):
    rng = np.random.default_rng(4)
    base = pa.table({"x": pa.array(rng.normal(0, 1, 4000)), "c": pa.array(rng.choice(["a", "b"], 4000).tolist()),
                     "same": pa.array(rng.integers(0, 1000, 4000))})
    moved = pa.table({"x": pa.array(rng.normal(3, 1, 4000)), "c": pa.array(rng.choice(["a", "b"], 4000, p=[0.9, 0.1]).tolist()),
                      "same": pa.array(rng.integers(0, 1000, 4000))})
    types = {"x": "float", "c": "bytes", "same": "int64"}
    splits = {"train": accumulate_file(write_table(tmp_path / "a.tfrecord", base), types),
              "eval": accumulate_file(write_table(tmp_path / "b.tfrecord", moved), types)}
    drift = dataset_stats(splits)["drift"]
    scores = drift["comparisons"]["eval"]
    assert scores["c"]["method"] == "l_infinity" and scores["c"]["score"] == pytest.approx(0.4, abs=0.03)
    assert scores["x"]["method"] == "jensen_shannon" and scores["x"]["score"] > 0.5
    assert scores["same"]["method"] == "jensen_shannon" and scores["same"]["score"] < 0.05 and not scores["same"]["flagged"]
    assert [item["feature"] for item in drift["flagged"]] == ["x", "c"]


def test_format_fraction_reads_100_only_when_exact():
    assert format_fraction(26_111, 26_115) == "99.98%"
    assert format_fraction(26_115, 26_115) == "100%"
    assert format_fraction(0, 5) == "0%"
    assert format_fraction(1, 3) == "33.3%"
    assert format_fraction(999_999, 1_000_000) == "99.9999%"
    assert format_fraction(1, 10**9) == "0.0000001%" or format_fraction(1, 10**9) == "<0.000001%"
    assert format_fraction(10**9 - 1, 10**9) == ">99.999999%"


def test_inspect_never_rounds_presence_to_100_percent(tmp_path, capsys):
    """Measured today: 26,111 of 26,115 records with a feature printed as 100.0%."""
    path = tmp_path / "almost.tfrecord"
    with RecordWriter(str(path)) as writer:
        for index in range(26_115):
            writer.write(encode_example({"id": [index], **({"tag": [b"x"]} if index % 6529 else {})}))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    tag_line = next(line for line in out.splitlines() if line.startswith("tag "))
    assert "99.98%" in tag_line and "100" not in tag_line
    id_line = next(line for line in out.splitlines() if line.startswith("id "))
    assert "100%" in id_line
    assert "values (tfrbeam stats" in out and "0..26,114 mean 1.306e+04" in out


def test_stats_command_writes_both_files_and_a_summary(tmp_path, capsys):
    write_table(tmp_path / "data.tfrecord", sample_table(500))
    out_dir = tmp_path / "report"
    assert main(["stats", str(tmp_path / "*.tfrecord"), "--output-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    stats = json.loads((out_dir / "stats.json").read_text())
    assert stats["format"] == "tfrbeam-stats/1" and stats["splits"]["files"]["num_examples"] == 500
    assert (out_dir / "stats.html").read_text().count('class="feature-row"') == len(FEATURE_TYPES)
    assert "split files: 500 examples" in out and "label" in out
    assert main(["stats", str(tmp_path / "*.tfrecord")]) == 2
    assert "--output-dir" in capsys.readouterr().err


def test_stats_schema_decodes_every_feature_as_a_nullable_list():
    schema = stats_schema({"b": "bytes", "a": "int64"})
    assert schema.names == ["a", "b"] and all(field.nullable and pa.types.is_list(field.type) for field in schema)


def test_write_dataset_stats_refuses_a_directory_without_manifest(tmp_path):
    from tfrbeam.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tfrbeam_dataset\.json"):
        write_dataset_stats(str(tmp_path))


def test_stats_command_errors_are_one_line(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "none-*.tfrecord"), "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfrbeam: error:") and "none-*.tfrecord" in err and len(err.splitlines()) == 1


def test_drift_threshold_option_flags_more_features(tmp_path, capsys):
    write_table(tmp_path / "data.tfrecord", sample_table(400))
    assert main(["stats", str(tmp_path / "data.tfrecord"), "--output-dir", str(tmp_path / "r"), "--drift-threshold", "0.0"]) == 0
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    assert stats["drift"]["thresholds"] == {"l_infinity": 0.0, "jensen_shannon": 0.0}


def test_export_progress_bar_counts_records(capsys):
    from tfrbeam.cli.main import _records_progress

    show = _records_progress("export")
    show(500, 2000)
    show(7, None)
    err = capsys.readouterr().err
    assert "500/2,000 records export" in err and "[#######" in err and "7 records export" in err


def test_statistics_and_export_do_not_import_beam():
    import subprocess
    import sys

    code = ("import sys, tfrbeam.stats.compute, tfrbeam.stats.html, tfrbeam.stats.export, tfrbeam.cli.file_tools; "
            "print('apache_beam' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_statistics_of_small_data_are_exact_and_the_same_on_every_run(tmp_path):
    for index in range(3):
        write_table(tmp_path / f"p{index}.tfrecord", sample_table(3000, seed=index))
    first = compute_stats(str(tmp_path / "p*.tfrecord"))
    again = compute_stats(str(tmp_path / "p*.tfrecord"), workers=2)
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    numeric = [entry for entry in first["splits"]["files"]["features"].values() if entry["histogram"] is not None]
    assert numeric and all(entry["histogram_exact"] and entry["quantile_rank_error"] == 0 for entry in numeric)


def test_binary_hashes_of_long_values_between_short_ones():
    long_a, long_b = b"a" * 5000, b"a" * 4999 + b"b"
    values = [b"x", long_a, b"", long_b, b"x", long_a, b"y" * 300_000]
    array = pa.array(values, pa.binary())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[: len(values) + 1]
    hashes = hash_binary(np.frombuffer(array.buffers()[2], dtype=np.uint8), offsets).tolist()
    assert hashes[0] == hashes[4] and hashes[1] == hashes[5] and len(set(hashes)) == 5


def test_a_split_too_small_to_show_drift_is_not_flagged_and_says_why(tmp_path):
    """41 eval rows of the train distribution: chance alone moves the scores past 0.1, so nothing is drift."""
    from tfrbeam.stats.text import summary_lines

    rng = np.random.default_rng(0)

    def table(rows: int, shift: float = 0.0) -> pa.Table:
        return pa.table({"x": pa.array(rng.normal(shift, 1, rows)), "c": pa.array(rng.choice(list("abcdef"), rows).tolist()),
                         "n": pa.array(rng.integers(0, 1000, rows))})

    types = {"x": "float", "c": "bytes", "n": "int64"}
    splits = {"train": accumulate_file(write_table(tmp_path / "a.tfrecord", table(3000)), types),
              "eval": accumulate_file(write_table(tmp_path / "b.tfrecord", table(41)), types)}
    stats = dataset_stats(splits)
    scores = stats["drift"]["comparisons"]["eval"]
    assert any(found["score"] > 0.1 for found in scores.values())  # what flagged features before
    assert stats["drift"]["flagged"] == []
    assert all(found["too_small"] and found["chance"] >= 0.1 for found in scores.values())
    assert "  eval: too few values to show drift in 3 feature(s) (c, n, x)" in "\n".join(summary_lines(stats))
    # A real shift in a split of the same small size still is drift.
    splits["moved"] = accumulate_file(write_table(tmp_path / "c.tfrecord", table(41, shift=4.0)), types)
    flagged = dataset_stats(splits)["drift"]["flagged"]
    assert [(item["split"], item["feature"]) for item in flagged] == [("moved", "x")]
