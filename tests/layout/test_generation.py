"""A read pins one dataset generation: a replace in the middle of an epoch raises DatasetChangedError, never mixes."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.example_builds import build_examples
from tfrbeam.beam.filesystem import exchange
from tfrbeam.cli.build import main as build_main
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import DatasetChangedError
from tfrbeam.layout.generation import Generation


def test_a_replace_during_an_epoch_raises_naming_both_runs(tmp_path, monkeypatch):
    old = build_examples(tmp_path, "demo.yaml")["demo"]
    monkeypatch.chdir(tmp_path)
    new = tmp_path / "out" / "other"
    config = pathlib.Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert build_main([str(config), "--quiet", "--set", "output.path=out/other", "--set", "shuffle.seed=99"]) == 0
    old_run = json.loads((old / "tfrbeam_dataset.json").read_text())["run"]["run_id"]
    new_run = json.loads((new / "tfrbeam_dataset.json").read_text())["run"]["run_id"]
    expected = _records(open_dataset(str(old), "train", batch_size=8, prefetch=0, executor="threads"))
    dataset = open_dataset(str(old), "train", batch_size=8, prefetch=0, executor="threads")
    pinned = dataset_generation(str(old))
    batches = iter(dataset)
    seen = [next(batches)]  # the read has started
    exchange(str(old), str(new))  # the one atomic swap a build's commit makes
    with pytest.raises(DatasetChangedError) as raised:
        pinned.check()  # any shard opened from now on is refused
    assert old_run in str(raised.value) and new_run in str(raised.value)
    try:
        seen.extend(batches)
    except DatasetChangedError as error:  # a shard opened after the swap: refused, naming both runs
        assert old_run in str(error) and new_run in str(error)
    else:  # every shard was open before the swap: the whole epoch is the old generation, nothing mixed
        assert _records(seen) == expected


def dataset_generation(root: str) -> Generation:
    return Generation.of(root, pathlib.Path(root, "tfrbeam_dataset.json").read_bytes())


def _records(batches) -> list[str]:
    """The epoch's batches as text, in order (no shuffle): equal only for the same generation's records."""
    return [repr(sorted(batch.items())) for batch in batches]
