"""The pieces and their slices cross the runner only through GroupByKeys: Beam's FnApiRunner drops chunks of any
other large stage input (a fusion break or a Flatten), which lost records of a 3M-row build on the embedded portable
job server (docs/runners.md, "The Dataflow path, measured on this machine")."""

from __future__ import annotations

import pathlib

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.build.commit import discard_staging
from tfrbeam.build.config import load_config
from tfrbeam.build.graph import build_pipeline
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
