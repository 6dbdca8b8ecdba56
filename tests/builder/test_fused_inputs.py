"""The pieces and their slices cross the runner only through GroupByKeys: Beam's FnApiRunner drops chunks of any
other large stage input (a fusion break or a Flatten), which lost records of a 3M-row build on the embedded portable
job server (docs/runners.md, "The Dataflow path, measured on this machine")."""

from __future__ import annotations

import json
import pathlib

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tests.worker_pool import external_worker_pool, workers_started
from tfrbeam.builder.config import load_config
from tfrbeam.builder.pipeline.commit import discard_staging
from tfrbeam.builder.pipeline.graph import build_pipeline
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
SHAPE = "Build/Shuffle/WriteShardsThroughGroupByKey"


def _transforms(tmp_path: pathlib.Path, store: str) -> dict:
    write_demo_data(str(tmp_path / "demo_data"))
    config = load_config(str(CONFIGS / "demo.yaml"), [
        f"output.path={tmp_path / 'out'}", f"input.path={tmp_path / 'demo_data' / 'csv'}/flights-*.csv",
    ])
    pipeline = beam.Pipeline(options=PipelineOptions([f"--piece_store={store}"]))
    plan = build_pipeline(pipeline, config)
    discard_staging(plan)  # built, never run
    return {t.unique_name: t for t in pipeline.to_runner_api().components.transforms.values()}


def _producers(transforms: dict) -> dict[str, str]:
    """PCollection id -> the leaf transform that outputs it."""
    return {pcoll: name for name, t in transforms.items() if not t.subtransforms for pcoll in t.outputs.values()}


@pytest.mark.parametrize("store", ["inline", "spill"])
def test_the_routing_stage_reads_its_pieces_from_a_group_by_key(tmp_path, store):
    transforms = _transforms(tmp_path, store)
    producers = _producers(transforms)
    routing = next(t for name, t in transforms.items() if name.startswith(f"{SHAPE}/RouteToShards") and not t.subtransforms)
    (main_input,) = [pcoll for tag, pcoll in routing.inputs.items() if "side_input" not in tag]
    assert "/GroupPieces/Group" in producers[main_input], producers[main_input]


@pytest.mark.parametrize("store", ["inline", "spill"])
def test_no_flatten_takes_pieces_or_slices(tmp_path, store):
    transforms = _transforms(tmp_path, store)
    producers = _producers(transforms)
    carrying = ("/SortPieces", "/RouteToShards", "/GroupPieces", "/GroupByShard")
    for name, transform in transforms.items():
        if transform.spec.urn == "beam:transform:flatten:v1":
            sources = [producers.get(pcoll, "") for pcoll in transform.inputs.values()]
            assert not any(part in source for source in sources for part in carrying), (name, sources)


def _table(path: pathlib.Path, rows: int) -> None:
    """About 400 bytes a row: ``rows`` of 50,000 make some 20 MB of pieces, several data-plane chunks (10 MB each)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    blobs = rng.integers(0, 256, size=(rows, 384), dtype=np.uint8)
    pq.write_table(pa.table({"id": np.arange(rows), "blob": [bytes(row) for row in blobs]}), path, row_group_size=8192)


def _build(config: pathlib.Path, output: pathlib.Path, *args: str) -> int:
    config.write_text(json.dumps({
        "input": {"format": "parquet", "path": str(config.parent / "table.parquet")},
        "shuffle": {"enabled": True, "seed": 3}, "output": {"path": str(output), "num_shards": 4},
    }))
    return build_main([str(config), "--quiet", *args])


def _shard_files(output: pathlib.Path) -> list[pathlib.Path]:
    """The shard files (not the indexes, which carry their file's mtime), relative to ``output``."""
    return sorted(p.relative_to(output) for p in output.glob("*/*.tfrecord"))


def test_every_record_arrives_when_the_job_server_flushes_its_streams_every_millisecond(tmp_path, monkeypatch):
    """The FnApiRunner's timed flush drops a chunk written between its get() and _clear(); at its default (1 s) that
    took a 3M-row build, here a flush every millisecond makes it happen at 50,000 rows. The build must still get every
    record to its writers, and write the very bytes the in-process build writes."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    _table(tmp_path / "table.parquet", 50_000)
    assert _build(tmp_path / "here.json", tmp_path / "here") == 0
    monkeypatch.setattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", 1)  # the embedded job server runs in this process
    with external_worker_pool(tmp_path / "pool.log") as (address, log):
        status = _build(tmp_path / "portable.json", tmp_path / "portable", "--piece_store=inline",
                        "--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                        f"--environment_config={address}")
        assert workers_started(log) > 0
    assert status == 0
    here, portable = _shard_files(tmp_path / "here"), _shard_files(tmp_path / "portable")
    assert here and here == portable
    for path in here:
        assert (tmp_path / "portable" / path).read_bytes() == (tmp_path / "here" / path).read_bytes(), path
