"""Benchmark: what a shard's read index costs to keep and to read, for each use, against the two files of before.

Run by hand from the repository root (the median and range of --repeats runs; the page cache is warm,
every check cache is emptied before each run, the machine may be shared):

    python -m benchmarks.read_index [--rows 1000000] [--repeats 7] [--dataset DIR]

On the benchmark build (benchmarks.build's config: the benchmark table, shuffled, one split, 8
shards; or ``--dataset``, any built dataset, copied first) each shard's ``.index`` is measured as
it is, and as a dataset written before had it, in the same run:

- ``.index``: the one file, its split table (16 bytes a MiB) then its record starts (8 bytes a record);
- ``.idx`` alone: the split table of before, the baseline for splits and seeks;
- ``.offsets`` alone: the record starts of before; what keeping only the dense index would cost
  splits and seeks (the split table is made from them, so they are read whole).

For each: the bytes kept; a split plan (``tfrbeam.beam.source.plan_file``, the Beam source's path,
every shard) locally and, through Beam's GCS file system, from ``gcp-storage-emulator`` holding the
index objects; a seek to the middle record of each shard (``seek_position`` and the header walk
from its entry, the dataset reader's path; for ``.offsets`` alone also the exact offset from the
whole record starts, what a dense-only seek would do); ``TFRecordSource.split`` of the whole split at
8 MiB ranges; and the record starts of every shard (``find_record_starts``, random access and the
reader's block cuts).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import build_config

LAYOUTS = (".index", ".idx alone", ".offsets alone")
_SPLIT_BUNDLE_BYTES = 8 << 20


def _build(rows: int, work: pathlib.Path) -> pathlib.Path:
    from benchmarks.write_dataset import _write_table

    table = work / "table.parquet"
    _write_table(rows, table)
    config = build_config("parquet", table, work / "dataset")
    config_path = work / "config.json"
    config_path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet"], check=True)
    return work / "dataset"


def _shards(dataset: pathlib.Path) -> list[str]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return [str(dataset / shard["path"]) for split in manifest["splits"].values() for shard in split["shards"]
            if shard["path"].endswith(".tfrecord")]


def _lay_out(shards: list[str], sections: dict[str, tuple[bytes, bytes]], layout: str) -> None:
    """The index files of each shard as ``layout`` has them (from the ``.index`` sections kept in memory)."""
    from tfrbeam.tfrecord.read_index import INDEX_SUFFIXES, index_path_for

    for shard in shards:
        for suffix in INDEX_SUFFIXES:
            pathlib.Path(index_path_for(shard, suffix)).unlink(missing_ok=True)
        table, starts = sections[shard]
        content = {".index": (".index", table + starts), ".idx alone": (".idx", table),
                   ".offsets alone": (".offsets", starts)}[layout]
        pathlib.Path(index_path_for(shard, content[0])).write_bytes(content[1])


def _sections(shards: list[str]) -> dict[str, tuple[bytes, bytes]]:
    from tfrbeam.tfrecord.read_index import index_path_for, table_length

    sections = {}
    for shard in shards:
        data = pathlib.Path(index_path_for(shard)).read_bytes()
        cut = table_length(data, shard)
        sections[shard] = (data[:cut], data[cut:])
    return sections


def _fresh() -> None:
    from tfrbeam.tfrecord import read_index

    read_index._checked.clear()
    read_index._warned.clear()


def _timed(function: Callable[[], object], repeats: int) -> list[float]:
    runs = []
    for _ in range(repeats):
        _fresh()
        started = time.perf_counter()
        function()
        runs.append((time.perf_counter() - started) * 1e3)
    return runs


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _plans(shards: list[str], paths: list[str]) -> Callable[[], object]:
    from tfrbeam.beam.source import INDEXED, ReadOptions, plan_file

    stats = [os.stat(shard) for shard in shards]

    def plan() -> None:
        for path, stat in zip(paths, stats):
            mtime = stat.st_mtime if "://" not in path else None
            assert plan_file(path, stat.st_size, mtime, ReadOptions()).mode == INDEXED, path

    return plan


def _seeks(shards: list[str]) -> Callable[[], object]:
    from tfrbeam.tfrecord.blocks import offset_of_record
    from tfrbeam.tfrecord.read_index import seek_position, trusted_index

    counts = {shard: trusted_index(shard).num_records for shard in shards}  # type: ignore[union-attr]

    def seek() -> None:
        for shard, count in counts.items():
            offset, number = seek_position(shard, count // 2, count)
            offset_of_record(shard, offset, count // 2 - number)

    return seek


def _exact_seeks(shards: list[str]) -> Callable[[], object]:
    """A dense-only seek: the whole record starts read and checked, the record's offset taken, its header checked."""
    import struct

    from tfrbeam.tfrecord.read_index import find_record_starts, metadata_problem
    from tfrbeam.tfrecord.records import RECORD_OVERHEAD

    def seek() -> None:
        for shard in shards:
            stat = os.stat(shard)
            starts = find_record_starts(shard, stat.st_size)
            assert starts is not None and metadata_problem(starts.file_size, starts.mtime, stat.st_size,
                                                           stat.st_mtime) is None
            record = starts.num_records // 2
            with open(shard, "rb") as handle:
                handle.seek(int(starts.offsets[record]))
                length = struct.unpack("<Q", handle.read(8))[0]
            assert length + RECORD_OVERHEAD == starts.offsets[record + 1] - starts.offsets[record]

    return seek


def _whole_split(dataset: pathlib.Path) -> Callable[[], object]:
    from tfrbeam.beam.source import TFRecordSource

    pattern = str(dataset / "train" / "*.tfrecord")
    return lambda: list(TFRecordSource(pattern).split(desired_bundle_size=_SPLIT_BUNDLE_BYTES))


def _starts(shards: list[str]) -> Callable[[], object]:
    from tfrbeam.tfrecord.read_index import find_record_starts

    return lambda: [find_record_starts(shard, os.path.getsize(shard)) for shard in shards]


def _in_bucket(shards: list[str], sections: dict[str, tuple[bytes, bytes]], repeats: int) -> dict[str, list[float]]:
    """Split plans of every shard through Beam's GCS file system, from index objects on ``gcp-storage-emulator``."""
    from tests.storage_servers import GcsEmulator, patched_env
    from tfrbeam.tfrecord.read_index import index_path_for

    times = {}
    with GcsEmulator() as server, patched_env(server.env):
        bucket = server.new_bucket()
        for layout in LAYOUTS:
            prefix = f"gs://{bucket}/{layout.split()[0].strip('.')}"
            paths = [f"{prefix}/train/{os.path.basename(shard)}" for shard in shards]
            for shard, path in zip(shards, paths):
                table, starts = sections[shard]
                suffix, content = {".index": (".index", table + starts), ".idx alone": (".idx", table),
                                   ".offsets alone": (".offsets", starts)}[layout]
                key = index_path_for(path, suffix)[len(f"gs://{bucket}/"):]
                server.put(bucket, key, content)
            times[layout] = _timed(_plans(shards, paths), repeats)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dataset", default=None, help="a built dataset to measure instead (copied first)")
    parser.add_argument("--no-bucket", action="store_true", help="leave out the split plans from a GCS emulator")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfrbeam-bench-read-index-") as temp:
        work = pathlib.Path(temp)
        if args.dataset:
            dataset = work / "dataset"
            shutil.copytree(args.dataset, dataset)
        else:
            dataset = _build(args.rows, work)
        shards = _shards(dataset)
        sections = _sections(shards)
        records = sum((len(starts) - 44) // 8 - 1 for _, starts in sections.values())
        data_bytes = sum(os.path.getsize(shard) for shard in shards)
        table_bytes = sum(len(table) for table, _ in sections.values())
        starts_bytes = sum(len(starts) for _, starts in sections.values())
        print(f"{len(shards)} shards, {records:,} records, {data_bytes / 1e6:.1f} MB; repeats: {args.repeats}\n")
        print("| layout | bytes kept | % of the shards |\n|---|---|---|")
        for layout, kept in ((".index", table_bytes + starts_bytes), (".idx alone", table_bytes),
                             (".offsets alone", starts_bytes)):
            print(f"| {layout} | {kept:,} | {100 * kept / data_bytes:.3f} |")
        rows: dict[str, dict[str, str]] = {layout: {} for layout in LAYOUTS}
        for layout in LAYOUTS:
            _lay_out(shards, sections, layout)
            rows[layout]["split plans, local"] = _spread(_timed(_plans(shards, shards), args.repeats))
            rows[layout]["seeks (middle record)"] = _spread(_timed(_seeks(shards), args.repeats))
            rows[layout]["TFRecordSource.split, 8 MiB"] = _spread(_timed(_whole_split(dataset), args.repeats))
            if layout != ".idx alone":
                rows[layout]["record starts (whole)"] = _spread(_timed(_starts(shards), args.repeats))
            if layout == ".offsets alone":
                rows[layout]["exact seeks from the record starts"] = _spread(_timed(_exact_seeks(shards), args.repeats))
        _lay_out(shards, sections, ".index")
        if not args.no_bucket:
            for layout, times in _in_bucket(shards, sections, args.repeats).items():
                rows[layout]["split plans, gs:// emulator"] = _spread(times)
        uses = list(dict.fromkeys(use for layout in LAYOUTS for use in rows[layout]))
        print(f"\nms for all {len(shards)} shards, median (range):\n")
        print("| use | " + " | ".join(LAYOUTS) + " |\n|---|" + "---|" * len(LAYOUTS))
        for use in uses:
            print(f"| {use} | " + " | ".join(rows[layout].get(use, "-") for layout in LAYOUTS) + " |")


if __name__ == "__main__":
    main()
