"""SequenceExample builds end to end, against an independent pyarrow grouping (tests/builder/pipeline/sequence_oracle.py).

The demo CSV data (aircraft by tailnum, ordered by flight_id), the demo flight log per aircraft
(configs/sequence_example.yaml) and a generated table of 10,000 groups of 1 to 500 steps with
nulls, ties and varying context values. Then determinism (reruns, input order, worker
processes, piece stores, bucket counts), and every error a sequence build reports.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.builder.pipeline.sequence_oracle import check_manifest_counts, dataset_records, decoded, oracle
from tfrbeam.builder.pipeline import plan as build_plan, sequence as sequence_stage
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import aircraft_flights_table, demo_table, write_demo_data
from tfrbeam.codec.example import decode_sequence_example
from tfrbeam.layout.manifest import verify_dataset
from tfrbeam.tfrecord.read_index import INDEX_DIR_NAME

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
BROKEN_FLIGHT_IDS = {1018, 1346, 1679}  # the demo CSV's three broken rows
GROUPS = 10_000
GENERATED_KINDS = {"user": "bytes", "t": "int64", "ctx": "int64", "v": "float", "tokens": "bytes", "emb": "float",
                   "label": "bytes"}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("sequence-demo")
    write_demo_data(str(directory / "demo_data"))
    return directory


def _build(workdir: pathlib.Path, config: pathlib.Path | str, *args: str) -> int:
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        return build_main([str(config), "--quiet", *args])
    finally:
        os.chdir(previous)


def _manifest(dataset: pathlib.Path) -> dict:
    return json.loads((dataset / "tfrbeam_dataset.json").read_text())


def _dead_letters(dataset: pathlib.Path) -> list[dict]:
    return [json.loads(line) for path in sorted((dataset / "_errors").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def _assert_same_as_oracle(dataset: pathlib.Path, expected) -> None:
    records = dataset_records(dataset)
    assert sorted(records) == sorted(expected.splits)
    for split, counts in expected.splits.items():
        assert decoded(records[split]) == decoded(counts.examples), split
        assert collections.Counter(records[split]) == counts.examples, split  # the very bytes, too


def _f32(values):
    return pa.array(values, pa.float32())


# ------------------------------------------------------------------------------- the demo data


def test_demo_csv_one_sequence_per_aircraft_ordered_by_flight_id(demo_dir):
    config = demo_dir / "by_tailnum.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"format": "csv", "path": "demo_data/csv/flights-*.csv", "csv": {"null_values": [""]}},
        "features": {"flight_id": {"type": "int64"}, "carrier": {"type": "bytes"}, "origin": {"type": "bytes"},
                     "distance": {"type": "float"}, "dep_delay": {"type": "float", "on_null": "omit"},
                     "tailnum": {"type": "bytes", "on_null": "omit"},
                     "embedding": {"type": "float", "separator": ";", "length": 4}},
        "sequence": {"group_by": ["tailnum"], "order_by": ["flight_id"], "context": ["carrier"]},
        "splits": {"train": 0.7, "eval": 0.3},
        "output": {"path": "out/by_tailnum", "num_shards": {"train": 2, "eval": 1}},
        "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5},
    }, sort_keys=False))
    assert _build(demo_dir, config) == 0
    table = demo_table()
    table = table.filter(pa.array([flight not in BROKEN_FLIGHT_IDS for flight in table.column("flight_id").to_pylist()]))
    table = pa.table({"flight_id": table.column("flight_id"), "carrier": table.column("carrier"),
                      "origin": table.column("origin"), "distance": table.column("distance").cast(pa.float32()),
                      "dep_delay": table.column("dep_delay").cast(pa.float32()), "tailnum": table.column("tailnum"),
                      "embedding": table.column("embedding")})
    kinds = {"flight_id": "int64", "carrier": "bytes", "origin": "bytes", "distance": "float", "dep_delay": "float",
             "tailnum": "bytes", "embedding": "float"}
    expected = oracle(table, kinds, {"train": 0.7, "eval": 0.3}, ["tailnum"], ["flight_id"], ["carrier"])
    dataset = demo_dir / "out" / "by_tailnum"
    _assert_same_as_oracle(dataset, expected)
    manifest = _manifest(dataset)
    check_manifest_counts(manifest, expected, rows_read=3000, bad_rows=3 + expected.null_key_rows)
    assert expected.null_key_rows > 50 and expected.bad_group_rows > 50  # both happen in this data
    assert manifest["parse_sequence_example_spec"] == {
        "context_features": {"carrier": "tf.io.FixedLenFeature([], tf.string)",
                             "tailnum": "tf.io.FixedLenFeature([], tf.string)"},
        "sequence_features": {"dep_delay": "tf.io.VarLenFeature(tf.float32)",
                              "distance": "tf.io.FixedLenSequenceFeature([], tf.float32)",
                              "embedding": "tf.io.FixedLenSequenceFeature([4], tf.float32)",
                              "flight_id": "tf.io.FixedLenSequenceFeature([], tf.int64)",
                              "origin": "tf.io.FixedLenSequenceFeature([], tf.string)"}}
    assert "features" not in manifest and "parse_example_spec" not in manifest
    assert manifest["sequence"] == {"group_by": ["tailnum"], "order_by": ["flight_id"], "context": ["carrier"],
                                    "max_steps": None, "overflow": "split", "min_steps": 1}
    letters = _dead_letters(dataset)
    null_keys = [row for row in letters if "'tailnum' is null" in row["reason"]]
    varying = [row for row in letters if "context feature 'carrier' varies" in row["reason"]]
    assert len(null_keys) == expected.null_key_rows and len(varying) == expected.bad_group_rows
    assert len(letters) == 3 + len(null_keys) + len(varying)
    groups = collections.Counter(row["reason"].split(":")[0] for row in varying)
    assert groups == {f"sequence group tailnum={key[0]!r}": rows for key, rows in expected.bad_groups.items()}
    assert all(row["file"].startswith("demo_data/csv/flights-") and row["line"] > 1 for row in varying)
    assert verify_dataset(str(dataset)) == []


def _aircraft_table() -> pa.Table:
    table = aircraft_flights_table()
    seconds = [int(np.datetime64(text[:-1], "s").astype(np.int64)) for text in table.column("sched_dep").to_pylist()]
    return table.set_column(2, "sched_dep", pa.array(seconds, pa.int64())).set_column(
        5, "distance", table.column("distance").cast(pa.float32())).set_column(
        6, "dep_delay", table.column("dep_delay").cast(pa.float32()))


def test_the_sequence_example_config_on_the_flight_log(demo_dir):
    assert _build(demo_dir, REPO_ROOT / "configs" / "sequence_example.yaml") == 0
    kinds = {"tailnum": "bytes", "carrier": "bytes", "sched_dep": "int64", "origin": "bytes", "dest": "bytes",
             "distance": "float", "dep_delay": "float"}
    expected = oracle(_aircraft_table(), kinds, {"train": 0.8, "eval": 0.2}, ["tailnum"], ["sched_dep"], ["carrier"],
                      max_steps=32, min_steps=3)
    dataset = demo_dir / "out" / "sequence_example"
    _assert_same_as_oracle(dataset, expected)
    manifest = _manifest(dataset)
    check_manifest_counts(manifest, expected, rows_read=aircraft_flights_table().num_rows, bad_rows=0)
    assert sum(split["split_groups"] for split in manifest["splits"].values()) > 10
    assert len(expected.bad_groups) == 1  # the aircraft that changes carrier
    # The tie (two flights of one aircraft at one time) is ordered by content hash: the same as the oracle's.
    for record in dataset_records(dataset)["train"] + dataset_records(dataset)["eval"]:
        times = [step[0] for step in decode_sequence_example(record)[1]["sched_dep"]]
        assert times == sorted(times)


# ------------------------------------------------------------------------------- a generated table


def generated_table(groups: int, seed: int = 1) -> pa.Table:
    """``groups`` groups of 1 to 500 rows (p(n) ~ n^-1.7, both ends present), in no order, with nulls, ties in t,
    null group keys and a few groups whose ctx varies."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, 501, dtype=np.float64) ** -1.7
    sizes = rng.choice(np.arange(1, 501), groups, p=weights / weights.sum())
    sizes[:2] = (1, 500)
    user = np.repeat(np.arange(groups), sizes)
    rows = len(user)
    t = rng.integers(0, np.maximum(2, np.repeat(sizes, sizes) // 2))  # about two rows per value of t: ties
    ctx = (user * 7919) % 1000
    varying = rng.choice(np.flatnonzero(sizes > 3), 25, replace=False)
    firsts = np.cumsum(sizes) - sizes
    ctx[firsts[varying] + 1] += 1  # one row of each of these groups disagrees
    order = rng.permutation(rows)
    tokens = [[f"w{value}" for value in range(count)] for count in rng.integers(0, 4, rows)]
    table = pa.table({
        "user": pa.array([f"u{value}" for value in user], mask=rng.random(rows) < 0.005),
        "t": pa.array(t, pa.int64()),
        "ctx": pa.array(ctx, pa.int64()),
        "v": pa.array(rng.normal(size=rows).astype(np.float32), mask=rng.random(rows) < 0.05),
        "tokens": pa.array(tokens, pa.list_(pa.string()), mask=rng.random(rows) < 0.05),
        "emb": pa.array(rng.normal(size=(rows, 3)).astype(np.float32).tolist(), pa.list_(pa.float32(), 3)),
        "label": pa.array(rng.choice(["a", "b", "c"], rows), mask=rng.random(rows) < 0.1),
    })
    return table.take(pa.array(order))


def write_generated(directory: pathlib.Path, table: pa.Table, files: int = 3, names: str = "part-{}.parquet") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-table.num_rows // files)
    for index in range(files):
        pq.write_table(table.slice(index * per_file, per_file), directory / names.format(index), row_group_size=20_000)


def generated_config(directory: pathlib.Path, output: str, **sequence) -> pathlib.Path:
    settings = {"group_by": ["user"], "order_by": ["t"], "context": ["ctx"], "max_steps": 200, "min_steps": 2, **sequence}
    path = directory / f"{output}.yaml"
    path.write_text(yaml.safe_dump({
        "input": {"format": "parquet", "path": str(directory / "in" / "*.parquet")},
        "sequence": settings,
        "splits": {"train": 0.8, "eval": 0.2},
        "output": {"path": str(directory / "out" / output), "num_shards": {"train": 3, "eval": 1}},
        "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.2},
    }, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[pathlib.Path, pa.Table]:
    directory = tmp_path_factory.mktemp("generated")
    table = generated_table(GROUPS)
    write_generated(directory / "in", table)
    return directory, table


def test_ten_thousand_groups_of_one_to_500_steps_against_the_oracle(generated):
    directory, table = generated
    assert _build(directory, generated_config(directory, "big")) == 0
    expected = oracle(table, GENERATED_KINDS, {"train": 0.8, "eval": 0.2}, ["user"], ["t"], ["ctx"], max_steps=200,
                      min_steps=2)
    dataset = directory / "out" / "big"
    _assert_same_as_oracle(dataset, expected)
    manifest = _manifest(dataset)
    check_manifest_counts(manifest, expected, rows_read=table.num_rows, bad_rows=expected.null_key_rows)
    assert len(expected.bad_groups) == 25 and expected.null_key_rows > 0
    assert sum(split["split_groups"] for split in manifest["splits"].values()) > 0
    assert max(split["steps"]["max"] for split in manifest["splits"].values()) == 200
    letters = _dead_letters(dataset)
    varying = collections.Counter(row["reason"].split(":")[0] for row in letters if "varies" in row["reason"])
    assert varying == {f"sequence group user={key[0]!r}": rows for key, rows in expected.bad_groups.items()}
    assert all("context feature 'ctx' varies within the group" in row["reason"] for row in letters if "varies" in row["reason"])
    assert {row["file"] for row in letters} <= {str(directory / "in" / f"part-{index}.parquet") for index in range(3)}
    assert manifest["sequence_features"]["emb"] == {"type": "float", "shape": [3], "always_present": True}
    assert manifest["sequence_features"]["v"]["always_present"] is False
    assert verify_dataset(str(dataset)) == []


@pytest.mark.parametrize("overflow", ["truncate", "error"])
def test_overflow_truncate_and_error_against_the_oracle(generated, overflow):
    directory, table = generated
    config = generated_config(directory, overflow, overflow=overflow, max_steps=50, min_steps=1)
    assert _build(directory, config, "--set", "errors.max_bad_fraction=0.9") == 0  # with error, long groups are bad
    expected = oracle(table, GENERATED_KINDS, {"train": 0.8, "eval": 0.2}, ["user"], ["t"], ["ctx"], max_steps=50,
                      overflow=overflow)
    dataset = directory / "out" / overflow
    _assert_same_as_oracle(dataset, expected)
    check_manifest_counts(_manifest(dataset), expected, rows_read=table.num_rows, bad_rows=expected.null_key_rows)
    if overflow == "error":
        too_long = [row for row in _dead_letters(dataset) if "more than sequence.max_steps=50" in row["reason"]]
        assert too_long and all("(overflow: error;" in row["reason"] for row in too_long)
    else:
        assert sum(split["truncated_steps"] for split in _manifest(dataset)["splits"].values()) > 0


# ------------------------------------------------------------------------------- determinism


def _shard_bytes(dataset: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(dataset)): path.read_bytes() for path in sorted(dataset.rglob("*"))
            if path.is_file() and path.name != "tfrbeam_dataset.json" and INDEX_DIR_NAME not in path.parts
            and "_errors" not in path.parts}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[pathlib.Path, dict[str, bytes]]:
    """A 1,500-group table built once by the default runner: the reference bytes."""
    directory = tmp_path_factory.mktemp("determinism")
    write_generated(directory / "in", generated_table(1500, seed=2))
    assert _build(directory, generated_config(directory, "reference")) == 0
    return directory, _shard_bytes(directory / "out" / "reference")


def test_reruns_and_seeds(small):
    directory, reference = small
    assert _build(directory, generated_config(directory, "reference")) == 0  # a rerun into the same directory
    assert _shard_bytes(directory / "out" / "reference") == reference
    assert _build(directory, generated_config(directory, "seeded"), "--set", "shuffle.seed=9") == 0
    seeded = _shard_bytes(directory / "out" / "seeded")
    assert seeded.keys() == reference.keys() and seeded != reference
    for split in ("train", "eval"):  # the seed reorders, it never moves a sequence between splits
        assert collections.Counter(dataset_records(directory / "out" / "seeded")[split]) == collections.Counter(
            dataset_records(directory / "out" / "reference")[split])


def test_input_order_files_and_rows(small, tmp_path):
    directory, reference = small
    table = pa.concat_tables(pq.read_table(path) for path in sorted((directory / "in").glob("*.parquet")))
    shuffled = table.take(pa.array(np.random.default_rng(5).permutation(table.num_rows)))
    write_generated(tmp_path / "in", shuffled, files=4, names="z-{}.parquet")  # other names, another split of rows
    config = generated_config(tmp_path, "moved")
    assert _build(tmp_path, config) == 0
    assert _shard_bytes(tmp_path / "out" / "moved") == reference


@pytest.mark.parametrize("args", [
    ("--direct_num_workers=2", "--direct_running_mode=multi_processing"),
    ("--direct_num_workers=2", "--direct_running_mode=multi_processing", "--piece_store=inline"),
    ("--piece_store=inline",),
    ("--piece_store=spill",),
], ids=["multi-processing", "multi-processing-inline", "inline", "spill"])
def test_runners_and_piece_stores(small, args):
    directory, reference = small
    name = "-".join(arg.split("=")[-1] for arg in args)
    assert _build(directory, generated_config(directory, name), *args) == 0
    assert _shard_bytes(directory / "out" / name) == reference


def test_bucket_count_changes_nothing_but_the_plan(small, monkeypatch):
    directory, reference = small
    monkeypatch.setattr(build_plan, "SEQUENCE_BUCKET_INPUT_BYTES", 20_000)
    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.plan import plan_build

    config = generated_config(directory, "buckets")
    assert plan_build(load_config(str(config))).sequence_buckets > 20
    assert _build(directory, config) == 0
    assert _shard_bytes(directory / "out" / "buckets") == reference


def _counting_batch_encodes(monkeypatch) -> list[int]:
    """Count the Arrow batches the RecordBatch coder serializes (the GroupByKey's data plane, on the bytes path)."""
    from tfrbeam.beam.arrow_coder import RecordBatchCoder

    encoded, real = [], RecordBatchCoder.encode

    def counting(self, batch):
        encoded.append(batch.num_rows)
        return real(self, batch)

    monkeypatch.setattr(RecordBatchCoder, "encode", counting)
    return encoded


def test_in_process_runs_send_only_references_through_the_group_by_key(small, monkeypatch):
    """On the default in-process runner the buckets' Arrow batches stay in this process; only HeldRows cross the GroupByKey."""
    from tfrbeam.builder.pipeline.held_rows import runs_holding_rows

    directory, reference = small
    encoded = _counting_batch_encodes(monkeypatch)
    assert _build(directory, generated_config(directory, "held")) == 0
    assert encoded == []  # no batch was serialized
    assert _shard_bytes(directory / "out" / "held") == reference
    assert runs_holding_rows() == []  # every bucket was encoded and let go of its rows
    assert _build(directory, generated_config(directory, "sent"), "--piece_store=spill") == 0
    assert sum(encoded) > 0  # piece store spill sends the batches themselves: what the counting sees
    assert _shard_bytes(directory / "out" / "sent") == reference


def _spill_writes(monkeypatch, before=None, after=None) -> list[tuple[str, int]]:
    """(path, bytes) of every held-rows run file written, through the spilling store's one file writer; ``before`` and
    ``after`` a write get its path (to fail it, or to change the file on disk)."""
    from tfrbeam.builder.shuffle import held
    from tfrbeam.layout.names import HELD_ROWS_DIR

    written, real = [], held.write_spill_file

    def write(path, blocks, overlap=False):
        if f"{os.sep}{HELD_ROWS_DIR}{os.sep}" not in path:  # the pieces' spill files
            return real(path, blocks, overlap)
        if before is not None:
            before(path)
        real(path, blocks, overlap)
        written.append((path, os.path.getsize(path)))
        if after is not None:
            after(path)

    monkeypatch.setattr(held, "write_spill_file", write)
    return written


def test_held_rows_stay_within_the_memory_store_budget_and_the_rest_is_spilled(small, monkeypatch):
    """--memory_store_bytes bounds the rows held between the converter and the encoder as well as the pieces:
    batches past it wait in run files under the staging directory, one per budget's worth; the bytes are the reference's."""
    from tfrbeam.builder.pipeline import held_rows

    directory, reference = small
    budget = 256 << 10
    peaks, real_hold = [], held_rows.hold_rows

    def hold(run_key, batch, *args):
        ref = real_hold(run_key, batch, *args)
        peaks.append(held_rows.held_bytes(run_key))
        return ref

    monkeypatch.setattr(sequence_stage, "hold_rows", hold)
    spilled = _spill_writes(monkeypatch)
    monkeypatch.setattr(build_plan, "SEQUENCE_BUCKET_INPUT_BYTES", 64 << 10)  # many buckets, many batches
    assert _build(directory, generated_config(directory, "bounded"), f"--memory_store_bytes={budget}") == 0
    assert _shard_bytes(directory / "out" / "bounded") == reference
    assert 0 < max(size for _, size in peaks) <= budget
    # Most batches were spilled (a file's worth, then the budget's worth again), several to a file.
    assert 1 < len(spilled) < len(peaks) // 4 and sum(size for _, size in spilled) > len(spilled) * budget // 2
    assert held_rows.runs_holding_rows() == [] and not any(os.path.exists(path) for path, _ in spilled)


def test_threads_spilling_held_rows_at_once_give_the_reference_bytes(small, monkeypatch):
    """Two threads of the DirectRunner hold and spill rows into one run's budget at once: a batch being written to a
    run file by one thread is not taken by the other, every batch is read back once, and nothing stays behind."""
    from tfrbeam.builder.pipeline import held_rows

    directory, reference = small
    runs = _spill_writes(monkeypatch)
    monkeypatch.setattr(build_plan, "SEQUENCE_BUCKET_INPUT_BYTES", 64 << 10)  # many buckets, many batches
    assert _build(directory, generated_config(directory, "threads"), "--direct_running_mode=multi_threading",
                  "--direct_num_workers=2", "--memory_store_bytes=128KiB") == 0
    assert _shard_bytes(directory / "out" / "threads") == reference
    assert len(runs) > 1 and held_rows.runs_holding_rows() == []
    assert not list((directory / "out").rglob("*.arrows"))


def test_a_full_disk_while_spilling_held_rows_fails_the_rebuild_and_keeps_the_old_dataset(small, monkeypatch, capsys):
    """ENOSPC writing a held batch: the build fails naming it, the published dataset is the old one, nothing stays."""
    import errno

    from tfrbeam.builder.pipeline import held_rows

    directory, reference = small
    config = generated_config(directory, "full-disk")
    assert _build(directory, config) == 0
    published = _shard_bytes(directory / "out" / "full-disk")
    assert published == reference

    writes = []

    def full(path):
        writes.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", path)

    _spill_writes(monkeypatch, before=full)
    capsys.readouterr()
    assert _build(directory, config, "--overwrite", "--memory_store_bytes=0") == 1
    assert writes and "No space left on device" in capsys.readouterr().err
    assert _shard_bytes(directory / "out" / "full-disk") == published
    assert held_rows.runs_holding_rows() == []
    assert not [path for path in (directory / "out").iterdir() if "tfrbeam-" in path.name]  # no staging left


def test_a_held_rows_file_changed_on_disk_fails_the_rebuild_in_one_line_and_nothing_else_changes(
        small, monkeypatch, capsys):
    """A spilled held batch whose file changes after it is written (one flipped value byte still decodes): the
    build fails in one line naming the file, the old dataset and everything else under out/ stay as they were."""
    from tests.integration.sandbox import snapshot
    from tfrbeam.builder.pipeline import held_rows

    directory, reference = small
    config = generated_config(directory, "changed-held")
    assert _build(directory, config) == 0
    before = snapshot(directory / "out")
    damaged: list[str] = []

    def damage(path):
        if not damaged:
            damaged.append(path)
            data = bytearray(pathlib.Path(path).read_bytes())
            data[len(data) // 2] ^= 0x01
            pathlib.Path(path).write_bytes(bytes(data))

    _spill_writes(monkeypatch, after=damage)
    capsys.readouterr()
    assert _build(directory, config, "--overwrite", "--memory_store_bytes=0") == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tfrbeam build: error: ") and "\n" not in error
    assert damaged and f"{damaged[0]}: held rows spilled there fail their CRC32C" in error
    assert snapshot(directory / "out") == before  # the failed run's staging directory is gone too
    assert _shard_bytes(directory / "out" / "changed-held") == reference
    assert held_rows.runs_holding_rows() == []


def test_a_failed_build_holds_no_rows_afterwards(tmp_path, monkeypatch, capsys):
    """A bucket that fails leaves the other buckets' held rows; the failed build's cleanup frees them."""
    from tfrbeam.builder.pipeline import commit
    from tfrbeam.builder.pipeline.held_rows import discard_held_rows, runs_holding_rows

    monkeypatch.setattr(build_plan, "SEQUENCE_BUCKET_INPUT_BYTES", 200)  # many buckets
    keys = [f"k{index}" for index in range(40)]
    table = pa.table({"k": ["big"] * 300 + keys, "t": list(range(300 + len(keys))), "text": ["x" * 100] * (300 + len(keys))})
    config = _tiny(tmp_path, table, {"group_by": ["k"], "order_by": ["t"], "max_group_bytes": "10KiB"})
    assert _build(tmp_path, config) == 1
    assert "tfrbeam build: error: sequence group k='big'" in _error(capsys)
    assert runs_holding_rows() == []
    monkeypatch.setattr(commit, "discard_held", lambda run_key: None)  # without the cleanup, rows stay held
    assert _build(tmp_path, config) == 1
    left = runs_holding_rows()
    assert len(left) == 1  # the failed bucket's rows at least (it never got to release them)
    discard_held_rows(left[0])
    assert runs_holding_rows() == []


def test_ties_in_a_float_order_by_nan_zeros_and_nulls_are_ordered_by_content_whatever_the_input_order(tmp_path):
    t = [float("nan"), float("nan"), 0.0, -0.0, None, None, 1.0, 1.0, 0.0]
    table = pa.table({"k": ["a"] * 9, "t": pa.array(t, pa.float32()), "v": list(range(9))})
    built = []
    for attempt, order in enumerate(([0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 5, 3, 1, 7, 0, 6, 2, 4])):
        directory = tmp_path / str(attempt)
        write_generated(directory / "in", table.take(pa.array(order)), files=2)
        config = directory / "cfg.yaml"
        config.write_text(yaml.safe_dump({
            "input": {"path": str(directory / "in" / "*.parquet")}, "sequence": {"group_by": ["k"], "order_by": ["t"]},
            "output": {"path": str(directory / "out"), "num_shards": 1}}, sort_keys=False))
        assert _build(directory, config) == 0
        built.append(_shard_bytes(directory / "out"))
    assert built[0] == built[1]
    expected = oracle(table, {"k": "bytes", "t": "float", "v": "int64"}, {"train": 1.0}, ["k"], ["t"])
    _assert_same_as_oracle(tmp_path / "0" / "out", expected)


def test_unshuffled_sequences_are_in_the_input_order_of_their_first_rows(tmp_path):
    table = pa.table({"k": ["b", "a", "b", "c", "a", "d"], "t": [2, 1, 1, 1, 2, 1]})
    write_generated(tmp_path / "in", table, files=2)  # part-0: b a b, part-1: c a d
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": str(tmp_path / "in" / "*.parquet")}, "shuffle": {"enabled": False},
        "sequence": {"group_by": ["k"], "order_by": ["t"]}, "output": {"path": str(tmp_path / "out"), "num_shards": 2},
    }, sort_keys=False))
    assert _build(tmp_path, config) == 0
    records = dataset_records(tmp_path / "out")["train"]
    assert [decode_sequence_example(record)[0]["k"][0] for record in records] == [b"b", b"a", b"c", b"d"]
    assert decode_sequence_example(records[0])[1]["t"] == [[1], [2]]


# ------------------------------------------------------------------------------- errors


def _error(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert "\n" not in error, error
    return error


def _tiny(tmp_path: pathlib.Path, table: pa.Table, sequence: dict, errors: dict | None = None) -> pathlib.Path:
    write_generated(tmp_path / "in", table, files=1)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": str(tmp_path / "in" / "*.parquet")}, "sequence": sequence,
        "output": {"path": str(tmp_path / "out"), "num_shards": 1}, "errors": errors or {"on_bad_record": "fail"},
    }, sort_keys=False))
    return config


def test_a_null_group_key_fails_the_build_naming_the_row(tmp_path, capsys):
    config = _tiny(tmp_path, pa.table({"k": ["a", None, "a"], "t": [1, 2, 3]}), {"group_by": ["k"], "order_by": ["t"]})
    assert _build(tmp_path, config) == 1
    error = _error(capsys)
    assert f"error: {tmp_path / 'in' / 'part-0.parquet'}:2: sequence.group_by feature 'k' is null" in error
    assert not (tmp_path / "out").exists()


def test_a_bad_group_fails_the_build_naming_the_group_and_the_feature(tmp_path, capsys):
    config = _tiny(tmp_path, pa.table({"k": ["a", "a", "b"], "c": [1, 2, 3], "t": [1, 2, 3]}),
                   {"group_by": ["k"], "order_by": ["t"], "context": ["c"]})
    assert _build(tmp_path, config) == 1
    assert ("error: " + str(tmp_path / "in" / "part-0.parquet") + ":1: sequence group k='a': context feature 'c' "
            "varies within the group (1 and 2 among its 2 rows)") in _error(capsys)


def test_overflow_error_with_skip_drops_and_counts_the_group(tmp_path):
    config = _tiny(tmp_path, pa.table({"k": ["a", "a", "a", "b"], "t": [1, 2, 3, 4]}),
                   {"group_by": ["k"], "order_by": ["t"], "max_steps": 2, "overflow": "error"},
                   {"on_bad_record": "skip", "max_bad_fraction": 1.0})
    assert _build(tmp_path, config) == 0
    manifest = _manifest(tmp_path / "out")
    assert manifest["splits"]["train"]["dropped_groups"] == {"too_few_steps": 0, "bad": 1}
    assert manifest["splits"]["train"]["num_examples"] == 1 and manifest["bad_records"]["count"] == 3


def test_a_group_over_max_group_bytes_fails_unless_max_steps_cuts_it(tmp_path, capsys):
    table = pa.table({"k": ["a"] * 300 + ["b"], "t": list(range(301)), "text": ["x" * 100] * 301})
    config = _tiny(tmp_path, table, {"group_by": ["k"], "order_by": ["t"], "max_group_bytes": "10KiB"})
    assert _build(tmp_path, config) == 1
    error = _error(capsys)
    assert "error: sequence group k='a': 300 rows, a SequenceExample of " in error
    assert "more than sequence.max_group_bytes=10,240" in error and "set sequence.max_steps to cut such groups" in error
    assert _build(tmp_path, config, "--set", "sequence.max_steps=50") == 0
    assert _manifest(tmp_path / "out")["splits"]["train"]["num_examples"] == 7


def test_min_steps_drops_and_counts_short_groups(tmp_path):
    config = _tiny(tmp_path, pa.table({"k": ["a", "a", "b", "c", "c", "c"], "t": [1, 2, 3, 4, 5, 6]}),
                   {"group_by": ["k"], "order_by": ["t"], "min_steps": 2})
    assert _build(tmp_path, config) == 0
    split = _manifest(tmp_path / "out")["splits"]["train"]
    assert split["dropped_groups"] == {"too_few_steps": 1, "bad": 0} and split["num_groups"] == 2
    assert split["steps"] == {"total": 5, "min": 2, "mean": 2.5, "max": 3}


def test_config_errors_are_reported_before_anything_runs(tmp_path, capsys):
    config = _tiny(tmp_path, pa.table({"k": ["a"], "t": [1]}), {"group_by": ["key"], "order_by": ["t"], "context": ["t"]})
    assert _build(tmp_path, config) == 2
    error = capsys.readouterr().err
    assert "sequence.context: 't' is in order_by too" in error
    shutil.rmtree(tmp_path / "in")
    config = _tiny(tmp_path, pa.table({"k": ["a"], "t": [1]}), {"group_by": ["key"]})
    assert _build(tmp_path, config) == 2
    error = capsys.readouterr().err
    assert "1 problem" in error and "sequence.group_by: 'key' is not a feature (features: k, t)" in error
    assert not (tmp_path / "out").exists()


def test_lost_sequence_examples_or_rows_fail_the_commit_and_nothing_is_published(tmp_path, monkeypatch, capsys):
    config = _tiny(tmp_path, pa.table({"k": ["a", "a", "b", "c"], "t": [1, 2, 3, 4]}), {"group_by": ["k"], "order_by": ["t"]})
    real = sequence_stage.keyed_pieces

    def losing_one(split, key, offsets, data, crcs, piece_bytes):  # a runner that drops a SequenceExample
        yield from real(split[1:], key[1:], offsets[1:] - offsets[1], data[offsets[1]:], crcs[1:], piece_bytes)

    monkeypatch.setattr(sequence_stage, "keyed_pieces", losing_one)
    assert _build(tmp_path, config) == 1
    error = _error(capsys)
    assert "the shard writers wrote 2 SequenceExamples, but 3 were made of the groups" in error
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    real_sequences = sequence_stage.sequences_of

    def losing_a_row(table, stage):  # a runner that drops a row between the converter and the grouping
        return real_sequences(table.slice(1), stage)

    monkeypatch.setattr(sequence_stage, "sequences_of", losing_a_row)
    assert _build(tmp_path, config) == 1
    assert "4 rows were converted, but the sequence stage received 3 (3 steps kept" in _error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_buckets_sequence_examples_stay_in_the_encoders_runs_and_pieces_are_views_of_them(tmp_path, monkeypatch):
    """No copy joins the encoder's runs of groups: each piece for the shuffle is a slice of one run's buffer."""
    from tfrbeam.builder.config import parse_config
    from tfrbeam.builder.pipeline.plan import plan_build
    from tfrbeam.codec import sequence_encode

    table = generated_table(300, seed=4)
    write_generated(tmp_path / "in", table, files=1)
    config = parse_config(yaml.safe_load(generated_config(tmp_path, "runs").read_text()))
    stage = sequence_stage.SequenceStage.of(plan_build(config))
    keyer = sequence_stage.GroupKeyer(("user",), 1)
    batch = table.combine_chunks().to_batches()[0]
    batch = batch.filter(batch.column("user").is_valid())
    features = batch.select([spec.name for spec in stage.features])
    [(_, rows)] = keyer.rows_by_bucket(features, 0, np.arange(features.num_rows))
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", 500)
    made = sequence_stage.sequences_of(pa.Table.from_batches([rows]), stage)
    assert len(made.chunks) > 3
    pieces = list(made.pieces(20_000))
    assert len(pieces) > len(made.chunks)
    assert sum(map(len, pieces)) == sum(map(len, made.chunks)) == len(made.key)
    for piece in pieces:
        assert sum(np.shares_memory(piece.data, run.data) for run in made.chunks) == 1
    monkeypatch.setattr(sequence_encode, "_ROWS_PER_CHUNK", 65536)
    whole = sequence_stage.sequences_of(pa.Table.from_batches([rows]), stage)
    assert [record for run in whole.chunks for record in run.to_list()] == [
        record for run in made.chunks for record in run.to_list()]
    assert np.array_equal(whole.key, made.key) and np.array_equal(whole.crcs, made.crcs)


def test_the_keyer_sorts_a_source_batch_once_and_each_buckets_rows_are_a_slice_of_it():
    """Issue 45: the keyer took each bucket's rows with a take of its own, so a source batch cost one take per bucket
    and the keying grew with rows times buckets (9x the time for 4x the rows, 3M -> 12M). Now the batch is sorted by
    bucket once and each bucket's rows are a slice of that: every bucket's rows, in no other bucket."""
    keyer = sequence_stage.GroupKeyer(("k",), 50)
    batch = pa.record_batch({"k": [f"key {index % 700}" for index in range(5000)], "v": list(range(5000))})
    made = list(keyer.rows_by_bucket(batch, 0, np.arange(5000)))
    assert len(made) == 50
    assert len({rows.column("v").buffers()[1].address for _, rows in made}) == 1  # slices of one sorted batch
    assert sorted(value for _, rows in made for value in rows.column("v").to_pylist()) == list(range(5000))
    for bucket, rows in made:
        hashes = np.asarray(rows.column(sequence_stage.GROUP_COLUMNS[1]))
        assert set((hashes % np.uint64(50)).tolist()) == {bucket}


def test_a_bucket_is_one_table_chunk_before_it_is_sorted_and_encoded(monkeypatch):
    """Issue 45: a bucket arrives as one small batch per source batch and bucket, more of them the larger the build;
    sorted and taken from as hundreds of chunks, its encoding cost 6x the time for 4x the rows. The encoder joins them
    into one chunk first (one copy of the bucket); the rows are the batches' rows."""
    seen = []
    monkeypatch.setattr(sequence_stage, "sequences_of", lambda table, stage: seen.append(table))
    batches = [pa.record_batch({"v": [index, index + 100]}) for index in range(40)]
    sequence_stage._bucket_sequences(batches, None)  # type: ignore[arg-type]  # the stage only reaches sequences_of
    (table,) = seen
    assert table.column("v").num_chunks == 1
    assert sorted(table.column("v").to_pylist()) == sorted(v for batch in batches for v in batch.column("v").to_pylist())


@pytest.mark.parametrize("names", [["k"], ["k", "n"], ["n", "k"], ["b"], ["f"], ["tokens"], ["k", "f"]])
def test_key_hashes_hash_each_distinct_key_once_and_equal_the_row_by_row_hashes(names):
    rng = np.random.default_rng(3)
    rows = 5000
    table = pa.table({
        "k": pa.array([f"key-{value}" for value in rng.integers(0, 300, rows)], pa.binary()),
        "n": pa.array(rng.integers(-3, 3, rows)),
        "b": pa.array(rng.random(rows) < 0.5),
        "f": pa.array(rng.choice([0.0, -0.0, float("nan"), 1.5], rows), pa.float32()),  # row by row: -0.0 is not 0.0
        "tokens": pa.array([["a"] * int(count) for count in rng.integers(0, 3, rows)]),
    })
    batch = pa.Table.from_batches(table.to_batches(max_chunksize=1500)).combine_chunks().to_batches()[0]
    expected = sequence_stage.group_hashes(batch, names)
    assert np.array_equal(sequence_stage.key_hashes(batch, names), expected)
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=1500))
    assert np.array_equal(sequence_stage.key_hashes(chunked, names), expected)
    assert np.array_equal(sequence_stage.key_hashes(batch.slice(1000, 2000), names), expected[1000:3000])
