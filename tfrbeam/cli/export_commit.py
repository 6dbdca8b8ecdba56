"""``tfrbeam export`` under the output's lock, published through a commit journal as the sink publishes.

The export holds OUTPUT_DIR's lock (``.NAME.tfrbeam-lock`` beside it, the lock ``build`` takes) from
start to end, so two exports, or an export and a build, into one folder never interleave: the second
fails at once naming the first. Under the lock it first finishes what a killed run left, then writes
every Parquet file into its own staging folder beside OUTPUT_DIR (``.NAME.tfrbeam-<run>/files/``), writes
the deletions and renames to that folder's ``commit.json`` and only then applies them. A run killed
after the journal is rolled forward by the next export or build into OUTPUT_DIR; one killed before
leaves the old export. Only the export's own Parquet files are replaced: the folder is never swapped,
as it may hold the user's other files.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Sequence

from tfrbeam.base.file_access import is_remote
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.publish import (
    CommitJournal,
    OutputLock,
    StagingDir,
    abandon,
    delete_staging,
    staging_path,
    this_run,
)
from tfrbeam.builder.pipeline.commit import recover_output
from tfrbeam.stats.export import export_to_parquet

STAGED_FILES = "files"  # the staging folder's stand-in for OUTPUT_DIR


@dataclasses.dataclass
class JournaledCommit:
    """An ``ExportCommit`` that stages in this run's staging folder and publishes through its commit journal."""

    staging: StagingDir
    lock: OutputLock
    journaled: bool = False  # once the journal is written, the staging folder is what a recovery rolls forward

    @property
    def staging_root(self) -> str:
        return self.staging.join(STAGED_FILES)

    def publish(self, staged: Sequence[tuple[str, str]], stale: Sequence[str]) -> None:
        self.lock.check_held()  # a bucket lock's lease this run could not renew: another run's now, publish nothing
        journal = CommitJournal(self.staging.owner.run_id, self.staging.output, tuple(stale), tuple(staged))
        journal.write(self.staging.path)
        self.journaled = True
        journal.apply()


def export_locked(
    dataset: str, output_dir: str, splits: Sequence[str] | None = None, columns: Sequence[str] | None = None,
    progress: Callable[[int, int | None], None] | None = None, overwrite: bool = False,
) -> list[str]:
    """``export_to_parquet`` holding OUTPUT_DIR's lock, after recovering a dead run's commit, published by journal.

    Raises ``OutputLockedError`` naming the run that holds the lock. A failure before the journal is written removes
    this run's staging folder (the old export stays); after it, the folder stays for the next run to roll forward.
    """
    target = output_dir.rstrip("/") if is_remote(output_dir) else os.path.abspath(output_dir)
    if is_remote(target):
        fs.use_pipeline_options(None)  # Beam's FileSystems (the journal, staging, recovery) get their options first
    run = this_run(uuid.uuid4().hex[:16])
    with OutputLock(target, run) as lock:
        recover_output(target)
        commit = JournaledCommit(StagingDir(staging_path(target, run.run_id), run, target).create(), lock)
        try:
            paths = export_to_parquet(dataset, target, splits=splits, columns=columns, progress=progress,
                                      overwrite=overwrite, commit=commit)
        except BaseException:
            if commit.journaled:
                abandon(commit.staging.path)  # the next export or build into OUTPUT_DIR completes the commit
            else:
                delete_staging(commit.staging.path)
            raise
        delete_staging(commit.staging.path)
    return paths
