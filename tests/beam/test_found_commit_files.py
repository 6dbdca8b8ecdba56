"""The commit's found files (the output's lock, a staging directory's owner.json and journal) of the wrong kind or
size: read bounded and typed, so a FIFO or a sparse giant is one refusal at once, never a hang (issue 43 item 1)."""

from __future__ import annotations

import os
import pathlib
import resource

import pytest

from tests.planted import not_blocked_by
from tfrbeam.beam.publish import CommitJournal, OutputLock, _owner_of, this_run
from tfrbeam.errors import CommitError
from tfrbeam.layout.names import JOURNAL_NAME, OWNER_NAME, lock_path, staging_path


def _planted(path: pathlib.Path, kind: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as handle:
            handle.truncate(5 << 30)  # sparse: costs no disk
    return path


def _within_bounds(path: pathlib.Path, read):
    """``read()``'s result, proven not to wait on a FIFO nor to take memory to speak of."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with not_blocked_by(path):
        result = read()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB
    return result


@pytest.mark.parametrize("kind", ["fifo", "sparse"])
def test_a_planted_lock_file_names_no_holder(tmp_path, kind):
    target = str(tmp_path / "ds")
    _planted(pathlib.Path(lock_path(target)), kind)
    lock = OutputLock(target, this_run("reader"))
    assert _within_bounds(pathlib.Path(lock.path), lock.holder) is None


@pytest.mark.parametrize("kind", ["fifo", "sparse"])
def test_a_planted_owner_record_makes_a_staging_directory_unprovable(tmp_path, kind):
    staging = pathlib.Path(staging_path(str(tmp_path / "ds"), "20260101-dead"))
    owner = _planted(staging / OWNER_NAME, kind)
    assert _within_bounds(owner, lambda: _owner_of(str(staging))) is None


@pytest.mark.parametrize("kind", ["fifo", "sparse"])
def test_a_planted_journal_is_one_commit_error_naming_it(tmp_path, kind):
    staging = pathlib.Path(staging_path(str(tmp_path / "ds"), "20260101-dead"))
    journal = _planted(staging / JOURNAL_NAME, kind)

    def read() -> str:
        with pytest.raises(CommitError) as refused:
            CommitJournal.read(str(staging))
        return str(refused.value)

    message = _within_bounds(journal, read)
    assert str(journal) in message and ("FIFO" in message or "larger than any commit journal" in message)
