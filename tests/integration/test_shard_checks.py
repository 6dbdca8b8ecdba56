"""``stats`` and ``export`` check every shard against the manifest (bytes, records) as ``open_dataset`` does.

Measured (issue 23): a shard cut at a record boundary made ``tfrbeam stats`` report 2,374 examples
and ``export`` write 2,374 rows against the manifest's 2,714, exit 0; a shard replaced by a symlink
to another file behaved the same. Now both fail in one line naming the shard and expected vs found.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests.integration.sandbox import changed_outside, copy_dataset, cut_at_record, edit_manifest, snapshot
from tfrbeam.cli.main import main as cli_main
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import ManifestError

SHARD = "train/train-00001-of-00004.tfrecord"


def _drop_sizes(manifest: dict) -> None:
    """A manifest without the optional num_bytes and sha256: only the record counts are left to check."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            del shard["num_bytes"], shard["sha256"]


def _cut(dataset: pathlib.Path, sandbox: pathlib.Path) -> str:
    cut_at_record(dataset / SHARD, 340)
    return "bytes"


def _cut_without_sizes(dataset: pathlib.Path, sandbox: pathlib.Path) -> str:
    edit_manifest(dataset, _drop_sizes)
    cut_at_record(dataset / SHARD, 340)
    return "records"


def _link_to_other_shard(dataset: pathlib.Path, sandbox: pathlib.Path) -> str:
    (dataset / SHARD).unlink()
    (dataset / SHARD).symlink_to(dataset / "eval" / "eval-00000-of-00001.tfrecord")
    return "bytes"


def _link_outside(dataset: pathlib.Path, sandbox: pathlib.Path) -> str:
    shutil.copy2(dataset / SHARD, sandbox / "elsewhere.tfrecord")
    (dataset / SHARD).unlink()
    (dataset / SHARD).symlink_to(sandbox / "elsewhere.tfrecord")
    return "outside the dataset"


DAMAGE = {"cut at a record boundary": _cut, "cut, the manifest without sizes": _cut_without_sizes,
          "a symlink to another shard": _link_to_other_shard, "a symlink to a file outside": _link_outside}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("tool", ["stats", "export"])
def test_stats_and_export_refuse_a_shard_that_is_not_the_manifests(demo_dataset, tmp_path, capsys, damage, tool):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    expected = DAMAGE[damage](dataset, sandbox)
    with pytest.raises(Exception, match=expected if expected != "bytes" else "the manifest says"):
        list(open_dataset(str(dataset), split="train", batch_size=4096))  # what the reader already refuses
    before = snapshot(sandbox)
    argv = ["stats", str(dataset)] if tool == "stats" else ["export", str(dataset), str(sandbox / "out")]
    code = cli_main(argv)
    captured = capsys.readouterr()
    assert code in (1, 2), captured
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and SHARD.split("/")[1] in lines[0] and expected in lines[0], lines
    if expected in ("bytes", "records"):
        assert "the manifest says" in lines[0] and "the shard has" in lines[0]
    assert changed_outside(before, snapshot(sandbox), ("out",)) == {}  # no stats.json, nothing in the dataset
    exported = sorted(path.name for path in (sandbox / "out").rglob("*")) if (sandbox / "out").exists() else []
    # Sizes and paths are checked before anything is written; a damage found only by reading fails the export,
    # which publishes its files only once all are whole, so none is left (at most the empty split folder).
    assert exported in ([], ["train"])


def test_stats_with_worker_processes_checks_the_shards_too(demo_dataset, tmp_path, capsys):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    _cut_without_sizes(dataset, sandbox)
    assert cli_main(["stats", str(dataset), "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "the manifest says 678 records, the shard has 340" in err and "Traceback" not in err, err


def test_stats_and_export_of_an_intact_dataset_count_the_manifests_examples(demo_dataset, tmp_path, capsys):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    before = snapshot(sandbox)
    assert cli_main(["stats", str(dataset)]) == 0
    assert cli_main(["export", str(dataset), str(sandbox / "out")]) == 0
    capsys.readouterr()
    assert set(changed_outside(before, snapshot(sandbox), ("out",))) == {os.path.join("ds", "stats.json"),
                                                                           os.path.join("ds", "stats.html")}


def test_a_lost_shard_entry_is_refused_by_every_reader(demo_dataset, tmp_path, capsys):
    """Found by tests/integration/test_mutation_property.py: with one shard entry gone, open_dataset read 2,036 of 2,714."""
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    edit_manifest(dataset, lambda manifest: manifest["splits"]["train"]["shards"].pop(1))
    with pytest.raises(ManifestError, match=r"splits\.train\.num_examples: 2714, but its shards list 2036 examples"):
        open_dataset(str(dataset), split="train")
    before = snapshot(sandbox)
    for argv in (["stats", str(dataset)], ["export", str(dataset), str(sandbox / "out")], ["verify", str(dataset)]):
        assert cli_main(argv) == 1, argv
        captured = capsys.readouterr()
        assert "but its shards list 2036 examples" in captured.out + captured.err and "Traceback" not in captured.err
    assert snapshot(sandbox) == before


def test_a_shard_the_manifest_lists_but_the_directory_lacks_is_one_tfrbeam_error(tmp_path):
    """Not a bare FileNotFoundError from deep in the reader: the shard named, and what to do."""
    import shutil

    import tfrbeam
    from tests.example_builds import build_examples
    from tfrbeam.errors import MissingShardError

    dataset = build_examples(tmp_path, "demo.yaml")["demo"]
    shard = sorted((dataset / "train").glob("*.tfrecord"))[1]
    shutil.move(str(shard), str(tmp_path / "elsewhere.tfrecord"))
    with pytest.raises(MissingShardError, match=f"{shard.name}: the manifest lists this shard, but there is no such file"):
        list(tfrbeam.open_dataset(str(dataset), split="train", batch_size=256))
