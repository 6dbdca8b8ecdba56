"""``tfrbeam export`` writes only inside OUTPUT_DIR, and ``--overwrite`` deletes only the files export itself writes.

Measured (issue 23): a split named ``/abs/lake`` (or ``../victim``) made ``export DS OUT --overwrite``
delete ``lake/*.parquet``, write its own file there and exit 0.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.integration.sandbox import changed_outside, copy_dataset, edit_manifest, snapshot
from tfrbeam.cli.main import main as cli_main


def _sandbox(demo_dataset: pathlib.Path, tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(the sandbox, its dataset) with a user's Parquet lake beside the dataset."""
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    for lake in ("lake", "victim"):
        (sandbox / lake).mkdir()
        (sandbox / lake / "part-0.parquet").write_bytes(b"the user's own data")
    return sandbox, dataset


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.err


@pytest.mark.parametrize("hostile", ["ABSOLUTE/lake", "../victim", "../../victim", "eval/../../victim", ".hidden"])
def test_a_hostile_split_name_is_refused_and_nothing_outside_changes(demo_dataset, tmp_path, capsys, hostile):
    sandbox, dataset = _sandbox(demo_dataset, tmp_path)
    name = hostile.replace("ABSOLUTE", str(sandbox))
    edit_manifest(dataset, lambda manifest: manifest["splits"].__setitem__(name, manifest["splits"].pop("eval")))
    before = snapshot(sandbox)
    code, err = _run(capsys, "export", str(dataset), str(sandbox / "out"), "--overwrite")
    assert code in (1, 2)
    assert len(err.strip().splitlines()) == 1 and "not a safe split name" in err, err
    assert changed_outside(before, snapshot(sandbox), ("out",)) == {}
    assert not list((sandbox / "out").rglob("*.parquet")) if (sandbox / "out").exists() else True


def test_overwrite_deletes_only_the_files_export_writes(demo_dataset, tmp_path, capsys):
    sandbox, dataset = _sandbox(demo_dataset, tmp_path)
    out = sandbox / "out"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "eval-00003-of-00008.parquet").write_bytes(b"left over from an older export")
    (out / "eval" / "notes.parquet").write_bytes(b"not written by export")
    before = snapshot(sandbox)
    code, err = _run(capsys, "export", str(dataset), str(out), "--split", "eval", "--overwrite")
    assert code == 2 and "notes.parquet" in err and "not a file export writes" in err, err
    assert snapshot(sandbox) == before  # refused before anything was deleted or written
    (out / "eval" / "notes.parquet").unlink()
    code, err = _run(capsys, "export", str(dataset), str(out), "--split", "eval", "--overwrite")
    assert code == 0, err
    assert sorted(path.name for path in (out / "eval").iterdir()) == ["eval-00000-of-00001.parquet"]


def test_export_does_not_follow_a_symlinked_split_directory_out_of_the_output(demo_dataset, tmp_path, capsys):
    sandbox, dataset = _sandbox(demo_dataset, tmp_path)
    out = sandbox / "out"
    out.mkdir()
    (out / "eval").symlink_to(sandbox / "lake", target_is_directory=True)
    before = snapshot(sandbox)
    code, err = _run(capsys, "export", str(dataset), str(out), "--split", "eval", "--overwrite")
    assert code == 2 and "outside" in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(sandbox) == before


def test_export_of_an_intact_dataset_writes_only_under_the_output(demo_dataset, tmp_path, capsys):
    sandbox, dataset = _sandbox(demo_dataset, tmp_path)
    before = snapshot(sandbox)
    code, err = _run(capsys, "export", str(dataset), str(sandbox / "out"))
    assert code == 0, err
    assert changed_outside(before, snapshot(sandbox), ("out",)) == {}
    assert len(list((sandbox / "out").rglob("*.parquet"))) == 5
