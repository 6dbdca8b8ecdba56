"""End-to-end dataset builds (pipelines/build): read back, compared row by row with the input."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import demo_table, write_demo_data
from tfrbeam.codec.example import decode_example
from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest import verify_dataset
from tfrbeam.tfrecord.read_index import INDEX_DIR_NAME
from tfrbeam.tfrecord.records import read_records

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
CONFIGS = REPO_ROOT / "configs"
# flight_id of the three rows the demo data breaks on purpose (rows 17, 345 and 678 of the middle CSV file).
BROKEN_FLIGHT_IDS = {1018, 1346, 1679}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("demo")
    write_demo_data(str(directory / "demo_data"))
    return directory


def build(workdir: pathlib.Path, config: str, *args: str, quiet: bool = True) -> int:
    """Run the build command in ``workdir`` (config paths in configs/ are relative to it); ``quiet`` prints no summary."""
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        return build_main([str(CONFIGS / config), *(["--quiet"] if quiet else []), *args])
    finally:
        os.chdir(previous)


def read_split(dataset: pathlib.Path, split: str) -> list[bytes]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return [
        record
        for shard in manifest["splits"][split]["shards"]
        for record in read_records(str(dataset / shard["path"]))
    ]


def canonical(example: dict) -> tuple:
    return tuple(sorted((name, tuple(values)) for name, values in example.items()))


def expected_demo_examples() -> collections.Counter:
    """The demo config's Examples computed straight from the generated table, not through the pipeline."""
    f32 = lambda value: float(np.float32(value))
    expected = collections.Counter()
    for row in demo_table().to_pylist():
        if row["flight_id"] in BROKEN_FLIGHT_IDS:
            continue
        example = {
            "flight_id": [row["flight_id"]], "carrier": [row["carrier"].encode()], "origin": [row["origin"].encode()],
            "dest": [row["dest"].encode()], "distance": [f32(row["distance"])],
            "dep_delay": [f32(row["dep_delay"]) if row["dep_delay"] is not None else 0.0],
            "cancelled": [row["cancelled"]], "embedding": [f32(value) for value in row["embedding"]],
        }
        if row["tailnum"] is not None:
            example["tailnum"] = [row["tailnum"].encode()]
        expected[canonical(example)] += 1
    return expected


def test_demo_build_writes_every_good_row_once_with_dead_letters(demo_dir, capsys):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/demo", quiet=False) == 0
    dataset = demo_dir / "out" / "demo"
    summary = capsys.readouterr().out
    assert "rows read:  3,000" in summary and "bad rows:   3 (dead_letter)" in summary
    assert str(pathlib.Path("out/demo/tfrbeam_dataset.json")) in summary
    records = read_split(dataset, "train") + read_split(dataset, "eval")
    assert collections.Counter(canonical(decode_example(record)) for record in records) == expected_demo_examples()
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    assert manifest["rows_read"] == 3000 and manifest["bad_records"]["count"] == 3
    assert manifest["record_type"] == "Example"
    assert [len(split["shards"]) for split in manifest["splits"].values()] == [4, 1]
    train_sizes = [shard["num_examples"] for shard in manifest["splits"]["train"]["shards"]]
    assert max(train_sizes) - min(train_sizes) <= 1
    assert 0.08 < manifest["splits"]["eval"]["num_examples"] / 2997 < 0.12
    assert manifest["parse_example_spec"]["embedding"] == "tf.io.FixedLenFeature([4], tf.float32)"
    assert manifest["parse_example_spec"]["tailnum"] == "tf.io.VarLenFeature(tf.string)"
    assert manifest["features"]["tailnum"] == {"type": "bytes", "shape": [], "always_present": False}
    assert {item["path"] for item in manifest["inputs"]} == {f"demo_data/csv/flights-0000{i}.csv" for i in range(3)}
    assert manifest["seed"] == 42 and manifest["config"]["shuffle"]["seed"] == 42
    dead = [json.loads(line) for path in sorted((dataset / "_errors").iterdir()) for line in path.read_text().splitlines()]
    assert [(row["file"], row["line"]) for row in dead] == [
        ("demo_data/csv/flights-00001.csv", 19), ("demo_data/csv/flights-00001.csv", 347),
        ("demo_data/csv/flights-00001.csv", 680),
    ][: len(dead)] and len(dead) == 3
    assert "unknown" in dead[0]["raw"] and dead[0]["reason"]
    assert not [name for name in os.listdir(dataset) if name.startswith(".tfrbeam-tmp")]
    assert verify_dataset(str(dataset)) == []


def _shard_bytes(dataset: pathlib.Path) -> dict[str, bytes]:
    """Every file of a dataset but its manifest and its indexes (which record each shard's mtime)."""
    return {
        str(path.relative_to(dataset)): path.read_bytes()
        for path in sorted(dataset.rglob("*"))
        if path.is_file() and path.name != "tfrbeam_dataset.json" and INDEX_DIR_NAME not in path.parts
    }


def test_reruns_input_file_order_and_seeds(demo_dir, tmp_path):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/a") == 0
    # The same files under other names, so they list in the opposite order.
    renamed = tmp_path / "demo_data" / "csv"
    renamed.mkdir(parents=True)
    for index, source in enumerate(sorted((demo_dir / "demo_data" / "csv").iterdir())):
        shutil.copy(source, renamed / f"flights-{9 - index:05d}.csv")
    assert build(tmp_path, "demo.yaml", "--set", "output.path=out/b") == 0
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/a") == 0  # a rerun into the same directory
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/c", "--set", "shuffle.seed=43") == 0
    first, moved, other_seed = (
        _shard_bytes(demo_dir / "out" / "a"),
        _shard_bytes(tmp_path / "out" / "b"),
        _shard_bytes(demo_dir / "out" / "c"),
    )
    dead_letters = {name for name in first if name.startswith("_errors")}
    assert {k: v for k, v in first.items() if k not in dead_letters} == {
        k: v for k, v in moved.items() if not k.startswith("_errors")
    }
    assert first.keys() == other_seed.keys()
    assert first["train/train-00000-of-00004.tfrecord"] != other_seed["train/train-00000-of-00004.tfrecord"]
    for split in ("train", "eval"):  # the seed reorders, it never moves an example between splits
        assert collections.Counter(read_split(demo_dir / "out" / "a", split)) == collections.Counter(
            read_split(demo_dir / "out" / "c", split))
    from tfrbeam.builder.shuffle import runs_holding_pieces

    assert runs_holding_pieces() == []  # these in-process builds held their pieces in memory, and let go of them


def test_unshuffled_build_keeps_input_order(demo_dir):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/ordered", "--set", "shuffle.enabled=false",
                 "--set", "splits={train: 1.0}", "--set", "output.num_shards=3") == 0
    ids = [decode_example(record)["flight_id"][0] for record in read_split(demo_dir / "out" / "ordered", "train")]
    assert ids == sorted(ids) and len(ids) == 2997


def test_skip_counts_bad_rows_without_dead_letters(demo_dir):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/skip", "--set", "errors.on_bad_record=skip") == 0
    manifest = json.loads((demo_dir / "out" / "skip" / "tfrbeam_dataset.json").read_text())
    assert manifest["bad_records"] == {"count": 3, "action": "skip", "dead_letter_path": None, "files": []}
    assert not (demo_dir / "out" / "skip" / "_errors").exists()


def test_too_many_bad_rows_fails_before_anything_is_published(demo_dir, capsys):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/strict", "--set", "errors.max_bad_fraction=0.0005") == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tfrbeam build: error: 3 of 3000 input rows") and "\n" not in error
    out = demo_dir / "out" / "strict"
    assert not (out / "tfrbeam_dataset.json").exists() and not (out / "train").exists()
    kept = list((demo_dir / "out").glob(".strict.tfrbeam-*/_errors/*.jsonl"))
    assert len(kept) == 1 and str(kept[0].parent) in error  # the dead letters stay for a look, and the error says where


def test_fail_on_bad_row_names_file_and_line(demo_dir, capsys):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/fail", "--set", "errors.on_bad_record=fail") == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tfrbeam build: error: demo_data/csv/flights-00001.csv:19: ")
    assert "\n" not in error and "unknown" in error
    assert not (demo_dir / "out" / "fail" / "tfrbeam_dataset.json").exists()


def test_a_different_dataset_is_refused_unless_overwrite(demo_dir, capsys):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/over") == 0
    capsys.readouterr()
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/over", "--set", "output.num_shards=2") == 2
    assert "holds a different dataset" in capsys.readouterr().err
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/over", "--set", "output.num_shards=2", "--overwrite") == 0
    dataset = demo_dir / "out" / "over"
    assert sorted(path.name for path in (dataset / "train").glob("train-*")) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]  # the 4 old shards are gone
    assert verify_dataset(str(dataset)) == []
    # A directory with foreign files is refused too.
    foreign = demo_dir / "out" / "foreign"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/foreign") == 2
    assert "is not empty (notes.txt)" in capsys.readouterr().err


def test_verify_dataset_finds_damage(demo_dir):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/verify") == 0
    dataset = demo_dir / "out" / "verify"
    shard = dataset / "train" / "train-00001-of-00004.tfrecord"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    (dataset / "train" / "train-00009-of-00009.tfrecord").write_bytes(b"")
    (dataset / "eval" / "eval-00000-of-00001.tfrecord").unlink()
    problems = "\n".join(verify_dataset(str(dataset)))
    assert "train-00001-of-00004.tfrecord: sha256" in problems and "CRC" in problems.upper()
    assert "train-00009-of-00009.tfrecord: in split directory train/ but not listed" in problems
    assert "eval-00000-of-00001.tfrecord: listed in the manifest but missing" in problems
    assert "no manifest: not a tfrbeam dataset, or its build did not finish" in verify_dataset(str(demo_dir / "nothing"))[0]


def test_csv_example_config(demo_dir):
    assert build(demo_dir, "csv_example.yaml") == 0
    dataset = demo_dir / "out" / "csv_example"
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    assert manifest["compression"] == "gzip" and manifest["bad_records"]["count"] == 3
    assert [shard["path"] for shard in manifest["splits"]["validation"]["shards"]] == [
        "validation/validation-00000-of-00001.tfrecord.gz"]
    tails = {}
    for split in ("train", "validation", "test"):
        for record in read_split(dataset, split):
            example = decode_example(record)
            assert len(example["embedding"]) == 4
            for tail in example.get("tailnum", []):
                tails.setdefault(tail, set()).add(split)
    assert tails and all(len(splits) == 1 for splits in tails.values())  # split_key: one split per aircraft
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == 2997
    assert verify_dataset(str(dataset)) == []


def test_parquet_example_config(demo_dir):
    assert build(demo_dir, "parquet_example.yaml") == 0
    dataset = demo_dir / "out" / "parquet_example"
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    null_labels = sum(1 for row in demo_table().to_pylist() if row["label"] is None)
    assert manifest["bad_records"]["count"] == null_labels > 0
    train = manifest["splits"]["train"]
    assert len(train["shards"]) > 1 and all(shard["num_bytes"] <= 64 * 1024 for shard in train["shards"])
    sizes = [shard["num_examples"] for shard in train["shards"]]
    assert max(sizes) - min(sizes) <= 1
    examples = [decode_example(record) for split in ("train", "eval") for record in read_split(dataset, split)]
    assert len(examples) == 3000 - null_labels
    assert any(example["tags"] == [] for example in examples) and any(b"UNKNOWN" in example["tailnum"] for example in examples)
    assert manifest["parse_example_spec"]["dep_delay"] == "tf.io.VarLenFeature(tf.float32)"


def _write_config(directory: pathlib.Path, text: str) -> str:
    path = directory / "inferred.yaml"
    path.write_text(text)
    return str(path)


def test_inferred_csv_features_are_always_present_without_null_values(tmp_path, capsys):
    (tmp_path / "rows.csv").write_text("a,b,c\n1,0.5,x\n0,0.0,\n2,1.5,z\n")
    config = _write_config(
        tmp_path, f"input: {{format: csv, path: '{tmp_path}/rows.csv'}}\noutput: {{path: '{tmp_path}/out', num_shards: 1}}\n"
    )
    assert build_main([config, "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    assert {name: (f["type"], f["always_present"]) for name, f in manifest["features"].items()} == {
        "a": ("int64", True), "b": ("float", True), "c": ("bytes", True),
    }
    rows = sorted(canonical(decode_example(r)) for r in read_split(tmp_path / "out", "train"))
    assert rows == sorted([
        canonical({"a": [1], "b": [0.5], "c": [b"x"]}),
        canonical({"a": [0], "b": [0.0], "c": [b""]}),  # zeros and "" are values, never missing
        canonical({"a": [2], "b": [1.5], "c": [b"z"]}),
    ])


def test_every_schema_problem_is_reported_before_the_pipeline(tmp_path, capsys):
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    config = _write_config(tmp_path, (
        f"input: {{format: csv, path: '{tmp_path}/rows.csv'}}\n"
        f"output: {{path: '{tmp_path}/out', num_shards: 1}}\n"
        "features:\n  x: {type: int64, source: aa}\n  y: {type: float, source: bee}\n"
    ))
    assert build_main([config, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "2 problems" in err and "features.x.source" in err and "features.y.source" in err
    assert not (tmp_path / "out").exists()


def test_piece_store_is_chosen_once_from_the_option_and_the_runner():
    """auto: memory only when every worker runs in this process, spill for other local runners, inline elsewhere."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.pipeline.runners import choose_piece_store, held_piece_budget, workers_share_this_process

    def store(*args: str) -> str:
        return choose_piece_store(PipelineOptions(list(args)))

    assert store() == store("--runner=FnApiRunner") == store("--runner=DirectRunner") == "memory"
    assert store("--direct_running_mode=multi_threading", "--direct_num_workers=2") == "memory"
    assert store("--direct_running_mode=multi_processing", "--direct_num_workers=2") == "spill"
    assert store("--runner=PortableRunner", "--job_endpoint=embed") == "spill"
    assert store("--runner=PrismRunner") == "spill"
    assert store("--runner=DataflowRunner") == store("--runner=FlinkRunner") == "inline"
    assert store("--direct_running_mode=multi_processing", "--piece_store=inline") == "inline"
    assert store("--runner=DataflowRunner", "--piece-store=spill") == "spill"
    assert not workers_share_this_process(PipelineOptions(["--runner=PortableRunner", "--job_endpoint=embed"]))
    with pytest.raises(ConfigError, match="--piece_store memory keeps pieces in this process, but the DataflowRunner"):
        store("--runner=DataflowRunner", "--piece_store=memory")
    assert 0 < held_piece_budget() <= 384 << 20


def test_piece_store_is_in_the_plan_and_the_manifest(demo_dir):
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/spilled", "--piece_store=spill") == 0
    manifest = json.loads((demo_dir / "out" / "spilled" / "tfrbeam_dataset.json").read_text())
    assert (manifest["run"]["runner"], manifest["run"]["piece_store"]) == ("FnApiRunner", "spill")
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/inline", "--piece_store=inline") == 0
    inline = json.loads((demo_dir / "out" / "inline" / "tfrbeam_dataset.json").read_text())
    # What crossed the runner, twice (the pieces into the routing stage, then the shards' slices to the writers):
    # a stub a piece and a slice (a file and a record range: keys and frames wait in spill files, under a byte a
    # record here, 12 bytes a record before issue 45); keys, offsets and the frames with the inline store, compressed
    # in blocks (the demo's Examples repeat their feature names: under half their size each time).
    shard_bytes = sum(split["num_bytes"] for split in inline["splits"].values())
    assert 0 < manifest["run"]["shuffled_bytes"] < inline["rows_read"]
    assert 2 * 12 * inline["rows_read"] < inline["run"]["shuffled_bytes"] < shard_bytes
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/bad", "--piece_store=memory",
                 "--direct_running_mode=multi_processing") == 2


@pytest.mark.parametrize("store, shape", [
    ("memory", "Build/Shuffle/WriteShardsFromPieceList"), ("spill", "Build/Shuffle/WriteShardsThroughGroupByKey"),
    ("inline", "Build/Shuffle/WriteShardsThroughGroupByKey"),
])
def test_each_piece_store_gets_its_named_graph_shape(demo_dir, store, shape):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.commit import discard_staging
    from tfrbeam.builder.pipeline.graph import build_pipeline

    config = load_config(str(CONFIGS / "demo.yaml"), [
        f"output.path={demo_dir / 'out' / ('shape-' + store)}", f"input.path={demo_dir / 'demo_data' / 'csv'}/flights-*.csv",
    ])
    pipeline = beam.Pipeline(options=PipelineOptions([f"--piece_store={store}"]))
    plan = build_pipeline(pipeline, config)
    names = {transform.unique_name for transform in pipeline.to_runner_api().components.transforms.values()}
    discard_staging(plan)  # built, never run
    assert plan.piece_store == store and shape in names
    assert (f"{shape}/GroupByShard" in names) == (store != "memory")


def test_presence_is_what_the_build_saw_not_what_the_schema_allows(tmp_path, monkeypatch):
    """Parquet columns are nullable by default; one with no null in any row is a dense, always-present feature."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tfrbeam.dataset import Ragged, open_dataset

    monkeypatch.chdir(tmp_path)
    table = pa.table({"id": pa.array(range(400), pa.int64()),
                      "score": pa.array([None if i % 4 == 1 else i * 0.5 for i in range(400)], pa.float32())})
    assert table.schema.field("id").nullable
    pq.write_table(table, "t.parquet")
    (tmp_path / "cfg.yaml").write_text(
        "input: {format: parquet, path: t.parquet}\nsplits: {train: 0.5, eval: 0.5}\noutput: {path: out, num_shards: 1}\n")
    assert build_main(["cfg.yaml", "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    assert manifest["features"]["id"]["always_present"] is True
    assert manifest["features"]["score"]["always_present"] is False
    assert manifest["parse_example_spec"]["id"] == "tf.io.FixedLenFeature([], tf.int64)"
    assert manifest["parse_example_spec"]["score"] == "tf.io.VarLenFeature(tf.float32)"
    for entry in manifest["splits"].values():
        assert entry["examples_with_feature"]["id"] == entry["num_examples"]
        assert entry["examples_with_feature"]["score"] <= entry["num_examples"]
    assert sum(entry["num_examples"] - entry["examples_with_feature"]["score"] for entry in manifest["splits"].values()) == 100
    batch = next(iter(open_dataset("out", split="train", batch_size=50)))
    assert not isinstance(batch["id"], Ragged) and batch["id"].shape == (50,)
    assert isinstance(batch["score"], Ragged)


def test_the_build_writes_dali_index_files_on_request(demo_dir):
    from tfrbeam.builder.config import load_config
    from tfrbeam.errors import ConfigError
    from tfrbeam.tfrecord.records import RECORD_OVERHEAD

    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/dali", "--set", "output.dali_index=true") == 0
    dataset = demo_dir / "out" / "dali"
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            path = dataset / shard["path"]
            lines, offset = [], 0
            for payload in read_records(str(path)):  # an independent header walk
                lines.append(f"{offset} {len(payload) + RECORD_OVERHEAD}")
                offset += len(payload) + RECORD_OVERHEAD
            index = dataset / "dali" / split / (path.name + ".idx")
            assert index.read_text().splitlines() == lines
    assert verify_dataset(str(dataset)) == []
    with pytest.raises(ConfigError, match=r"output\.dali_index: DALI indexes describe uncompressed"):
        load_config(str(REPO_ROOT / "configs" / "demo.yaml"), ["output.dali_index=true", "output.compression=gzip"])


def test_stats_true_writes_the_report_with_the_dataset(demo_dir):
    from tfrbeam.builder.config import load_config
    from tfrbeam.errors import ConfigError

    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/with_stats", "--set", "stats=true") == 0
    dataset = demo_dir / "out" / "with_stats"
    stats = json.loads((dataset / "stats.json").read_text())
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    assert {split: entry["num_examples"] for split, entry in stats["splits"].items()} == {
        split: entry["num_examples"] for split, entry in manifest["splits"].items()}
    assert (dataset / "stats.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert verify_dataset(str(dataset)) == []
    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/no_stats") == 0
    assert not (demo_dir / "out" / "no_stats" / "stats.json").exists()  # off by default
    with pytest.raises(ConfigError, match="stats: 'yes please' is not a boolean"):
        load_config(str(REPO_ROOT / "configs" / "demo.yaml"), ["stats='yes please'"])


def test_the_memory_store_budget_is_fixed_not_a_share_of_ram(monkeypatch):
    """A build's peak memory must not grow with the machine or the dataset: the default budget is
    DEFAULT_HELD_PIECE_BYTES (a quarter of RAM on small machines), and --memory_store_bytes sets it."""
    import os

    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.pipeline import runners

    def machine_with(ram: int) -> None:
        pages = {"SC_PHYS_PAGES": ram // 4096, "SC_PAGE_SIZE": 4096}
        monkeypatch.setattr(os, "sysconf", lambda name: pages[name])

    machine_with(1 << 40)  # 1 TiB
    assert runners.held_piece_budget() == 384 << 20
    machine_with(1 << 30)
    assert runners.held_piece_budget() == 256 << 20
    machine_with(1 << 40)
    assert runners.held_piece_budget(PipelineOptions(["--memory_store_bytes=64MiB"])) == 64 << 20
    assert runners.held_piece_budget(PipelineOptions(["--memory_store_bytes", "3000000"])) == 3_000_000
    with pytest.raises(ConfigError, match="--memory_store_bytes: 'lots' is not a size"):
        runners.held_piece_budget(PipelineOptions(["--memory_store_bytes=lots"]))


def test_a_shuffled_block_damaged_in_the_runner_fails_the_build_naming_it_and_the_old_dataset_stays(
        demo_dir, capsys, monkeypatch):
    from tests.integration.sandbox import snapshot
    from tfrbeam.builder.shuffle import PieceCoder

    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/damaged", "--piece_store=inline") == 0
    capsys.readouterr()
    before = snapshot(demo_dir / "out")
    decode, damaged = PieceCoder.decode, []

    def damaging_decode(self, encoded):  # the runner hands the first slice it delivers with one byte flipped
        piece = decode(self, encoded)
        packed = piece.ref.packed
        if packed is not None and packed.nbytes and not damaged:
            damaged.append(piece)
            stored = packed.stored.copy()
            stored[len(stored) // 2] ^= 0x10
            object.__setattr__(packed, "stored", stored)
        return piece

    monkeypatch.setattr(PieceCoder, "decode", damaging_decode)
    error = _refused_keeping_the_old_dataset(demo_dir, capsys, "damaged", "inline", before)
    assert damaged and re.search(r"split \w+ shard \d+: block \d+ of \d+ of a shuffled piece's frames", error)
    assert "the runner delivered damaged bytes" in error


def _refused_keeping_the_old_dataset(demo_dir: pathlib.Path, capsys, name: str, store: str, before: dict) -> str:
    """Rebuilds out/NAME with another shard count: the build must fail in one ShuffledDataError line and leave
    everything under out/ as it was, but its own staging directory. Returns the error line."""
    from tests.integration.sandbox import snapshot

    assert build(demo_dir, "demo.yaml", "--set", f"output.path=out/{name}", f"--piece_store={store}",
                 "--set", "output.num_shards=2", "--overwrite") == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tfrbeam build: error: split ") and "\n" not in error
    after = snapshot(demo_dir / "out")
    assert {path: value for path, value in after.items() if not path.startswith(f".{name}.tfrbeam-")} == before
    assert verify_dataset(str(demo_dir / "out" / name)) == []
    return error


def test_a_spill_file_damaged_on_disk_fails_the_build_naming_it_and_the_old_dataset_stays(demo_dir, capsys, monkeypatch):
    from tests.integration.sandbox import snapshot
    from tfrbeam.builder.shuffle import held

    assert build(demo_dir, "demo.yaml", "--set", "output.path=out/spill-damaged", "--piece_store=spill") == 0
    capsys.readouterr()
    before = snapshot(demo_dir / "out")
    write_spill_file, damaged = held.write_spill_file, []

    def damaging_write(path, blocks, overlap=False):  # the first spill file's bytes change on disk once written
        write_spill_file(path, blocks, overlap)
        size = os.path.getsize(path)
        if not damaged and size > 100:
            damaged.append(path)
            with open(path, "r+b") as handle:
                handle.seek(size // 2)
                byte = handle.read(1)
                handle.seek(size // 2)
                handle.write(bytes([byte[0] ^ 0x08]))

    monkeypatch.setattr(held, "write_spill_file", damaging_write)  # every spill file: a piece alone, or a run
    error = _refused_keeping_the_old_dataset(demo_dir, capsys, "spill-damaged", "spill", before)
    assert damaged and f"{os.path.basename(damaged[0])}: record " in error and "changed or damaged on disk" in error
