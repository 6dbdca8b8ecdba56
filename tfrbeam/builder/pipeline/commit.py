"""The build's last step: check that every record arrived, then publish the dataset with the commit protocol.

Which process publishes (docs/commit.md): ``tfrbeam build`` runs the pipeline with
``publish=False``, so the pipeline's Commit step only checks and stages (``commit-ready.json``) and
the launcher publishes with ``commit_staged`` after the pipeline, holding the lock it took first;
a worker left behind by a killed launcher never publishes. Library callers of ``build_pipeline``
get ``publish=True``: the Commit step publishes, taking the lock in its own process.

Before anything is published: the bad-row limit holds, the shards hold exactly the examples the
converters produced (records in = records out: a runner that lost elements fails the build, it
never publishes short shards), and every shard file has the size its writer reported. Then,
holding the output's lock (``tfrbeam.beam.publish``):

- local output: the staged shards, indexes and dead letters are renamed into a complete dataset
  directory inside the staging directory, its manifest is written, and one atomic exchange puts
  it in place of the old one (one rename when there is none). Files of the user's in the old
  directory are carried over. A crash before the exchange leaves the old dataset, a crash after
  it the new one; the next run removes the rest.
- object stores (no atomic rename there): a journal of deletions and renames is written first,
  the old manifest goes first and the new one is written last, so readers see the old dataset,
  no dataset, or the new one, never a mix; a dead run's journal is rolled forward by the next run.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import logging
import os
import platform
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np

import tfrbeam
from tfrbeam.base import object_store
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.beam.publish import (
    JOURNAL_NAME,
    MAX_JOURNAL_BYTES,
    OTHER_RUNS,
    OWNER_NAME,
    RECOVERED_WRITES,
    RESERVED_WRITES,
    CommitJournal,
    StagingDir,
    committed_run,
    confined,
    delete_staging,
    held_or_taken,
    holds_lock,
    output_key,
    read_whole,
    recover,
    remove_published_staging,
    remove_unpublished,
    swap_into_place,
    write_whole,
)
from tfrbeam.builder.config import config_to_dict
from tfrbeam.builder.pipeline.plan import BuildPlan, check_output_dir, normalized
from tfrbeam.builder.pipeline.sequence import SequenceCounts, SequenceStage
from tfrbeam.builder.pipeline.splits import describe_split_source
from tfrbeam.builder.pipeline.user_files import (
    DatasetNames,
    carry_over,
    keep_folder_attributes,
    keep_plan,
    old_dataset_names,
    refuse_conflicts,
)
from tfrbeam.builder.shuffle import ShardPlan, WrittenShard
from tfrbeam.builder.shuffle.held import discard_held
from tfrbeam.errors import (
    CommitError,
    ManifestError,
    OutputExistsError,
    PreconditionFailedError,
    RefusedFileError,
    RowCountError,
    ShortWriteError,
    TooManyBadRecordsError,
)
from tfrbeam.layout.manifest import (
    EXAMPLE,
    SEQUENCE_EXAMPLE,
    dataset_files,
    feature_entries,
    find_manifest,
    load_manifest,
    parse_example_spec_of,
    parse_sequence_example_spec_of,
    read_manifest,
)
from tfrbeam.layout.manifest_schema import Manifest, run_id_of
from tfrbeam.layout.names import (
    COMMIT_RECORD,
    ERRORS_DIR_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_NAMES,
    NEW_DATASET_DIR,
    OLD_DATASET_DIR,
    SCHEMA_PBTXT,
    TFDS_DATASET_INFO,
    TFDS_FEATURES,
    dali_index_path,
    shard_file_name,
)
from tfrbeam.layout.tfds_info import tfds_files_for, tfds_files_of
from tfrbeam.layout.tfmd_schema import schema_files_of, schema_text
from tfrbeam.tfrecord.read_index import (
    dali_index_text,
    index_path_for,
    index_paths_for,
    parse_read_index,
    stamp_read_index,
    write_dali_index,
)

__all__ = [
    "CommitDataset", "DeadLetterFile", "DirectWrites", "StagedCommit",
    "commit_staged", "direct_writes", "discard_staging", "discard_unpublished", "publish_staged", "recover_output",
    "shard_destination",
]

_LOG = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class DeadLetterFile:
    """A written dead-letter file (JSON lines) in the staging directory."""

    relative_path: str
    temp_path: str
    count: int


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def sum_counts(counts: Sequence[tuple]) -> tuple[int, int]:
    """Rows read and bad rows over every converted batch's (rows read, bad rows, absent counts, input, its rows)."""
    rows, bad = 0, 0
    for read, failed, *_ in counts:
        rows += read
        bad += failed
    return rows, bad


def absent_counts(counts: Sequence[tuple], num_splits: int, num_features: int) -> np.ndarray:
    """Per split and feature, the examples that lack the feature (a null with on_null: omit), summed."""
    total = np.zeros((num_splits, num_features), dtype=np.int64)
    for _, _, absent, *_ in counts:
        total += np.asarray(absent, dtype=np.int64).reshape(num_splits, num_features)
    return total


def rows_read_per_input(counts: Sequence[tuple]) -> dict[str, int]:
    """Each input's rows read (rows and bad rows), over every converted batch's counts."""
    read: dict[str, int] = {}
    for rows, _, _, path, _ in counts:
        read[path] = read.get(path, 0) + rows
    return read


def check_rows_announced(counts: Sequence[tuple], output: str) -> dict[str, int]:
    """Rows announced = rows read for every input that announced its rows (a footer, block counts, an index, a table's
    num_rows): the whole file's, where the readers checked each piece. Returns each input's rows read."""
    read = rows_read_per_input(counts)
    announced = {path: file_rows for _, _, _, path, file_rows in counts if file_rows is not None}
    for path, rows in sorted(announced.items()):
        if read[path] != rows:
            raise RowCountError(f"{path}: the input announces {rows} rows, but {read[path]} were read (rows and bad "
                                f"rows); the runner lost or duplicated elements, so nothing was published to {output}")
    return read


def check_dead_letters(dead_letters: Sequence[DeadLetterFile], bad: int, output: str) -> None:
    """Examples written + dead letters = rows read: every bad row is in a dead-letter file (errors.on_bad_record:
    dead_letter)."""
    lettered = sum(item.count for item in dead_letters)
    if lettered != bad:
        raise ShortWriteError(f"{output}: {bad} rows were bad, but the dead-letter files hold {lettered}; the runner "
                              "lost or duplicated elements, so nothing was published (see docs/runners.md)")


def too_many_bad(bad: int, rows_read: int, limit: float) -> bool:
    """The bad-row limit: more than ``limit`` of the rows read (exactly at the limit is allowed)."""
    return bad > 0 and bad > limit * rows_read


class CommitDataset(beam.DoFn):
    """Checks the counts and makes the manifest; then publishes the staged dataset, or stages the commit for the launcher.

    ``publish=True`` (``build_pipeline``'s default, for library callers that run the pipeline
    themselves): this step publishes, in whichever worker runs it, taking the output's lock
    itself; it refuses when the process that planned the build is known to have ended.
    ``publish=False`` (``tfrbeam build``): it only writes the commit record (``COMMIT_RECORD``)
    into the staging directory; the launcher publishes it with ``commit_staged`` after the
    pipeline has finished, holding the lock it took before the pipeline started. So a worker
    left running after its launcher was killed never publishes anything.
    """

    def __init__(self, plan: BuildPlan, publish: bool = True):
        self._plan = plan
        self._publish = publish

    def process(self, shard_plan: ShardPlan, files: list[WrittenShard], counts: list[tuple[int, int]],
                dead_letters: list[DeadLetterFile], sequence_counts: list[SequenceCounts] | None = None) -> Iterator[dict]:
        plan = self._plan
        if self._publish and plan.run.is_alive() is False:
            raise CommitError(
                f"the process that launched this build ({plan.run.describe()}) has ended, so this worker published "
                f"nothing to {plan.output_path}; the next build into it removes what this one left"
            )
        manifest = checked_manifest(plan, shard_plan, files, counts, dead_letters, sequence_counts)
        staged = StagedCommit(plan.run.run_id, manifest, tuple(files), tuple(dead_letters))
        if not self._publish:
            try:
                staged.write(plan.staging_dir)
            except OSError as error:
                raise commit_failed(plan, error, "staging the commit") from error
            yield manifest
            return
        publish_staged(plan, staged)
        yield manifest


def checked_manifest(plan: BuildPlan, shard_plan: ShardPlan, files: list[WrittenShard], counts: list[tuple[int, int]],
                     dead_letters: list[DeadLetterFile], sequence_counts: list[SequenceCounts] | None) -> dict[str, Any]:
    """The bad-row limit and records in = records out hold, or this raises; then the manifest of the staged dataset."""
    rows_read, bad = sum_counts(counts)
    read_per_input = check_rows_announced(counts, plan.output_path)
    sequences = None
    if plan.config.sequence is not None:
        sequences = SequenceStage.of(plan).zero_counts()
        for each in sequence_counts or ():
            sequences = sequences + each
    bad_groups_rows = int(sequences.bad_rows.sum()) if sequences is not None else 0
    limit = plan.config.errors.max_bad_fraction
    if too_many_bad(bad + bad_groups_rows, rows_read, limit):
        staged = [(item.temp_path, item.temp_index_path) for item in files]
        fs.delete_files([path for paths in staged for path in paths if path])
        kept = f"; the bad rows are kept in {fs.join(plan.staging_dir, ERRORS_DIR_NAME)}" if dead_letters else ""
        total_bad = bad + bad_groups_rows
        in_groups = f" ({bad_groups_rows} of them in bad sequence groups)" if bad_groups_rows else ""
        raise TooManyBadRecordsError(
            f"{total_bad} of {rows_read} input rows ({total_bad / max(rows_read, 1):.2%}) were bad{in_groups}, more "
            f"than errors.max_bad_fraction={limit:g} allows; nothing was written to {plan.output_path}{kept}"
        )
    if plan.dead_letter_path is not None:
        check_dead_letters(dead_letters, bad + bad_groups_rows, plan.output_path)
    if sequences is None:
        check_every_record_arrived(files, rows_read - bad, plan.output_path)
        absent = absent_counts(counts, len(plan.config.splits), len(plan.features))
        return build_manifest(plan, shard_plan, files, rows_read, bad, dead_letters, absent, read_per_input=read_per_input)
    check_every_sequence_arrived(files, sequences, rows_read - bad, plan.output_path)
    return build_manifest(plan, shard_plan, files, rows_read, bad + bad_groups_rows, dead_letters, sequences=sequences,
                          read_per_input=read_per_input)


@dataclasses.dataclass(frozen=True)
class DirectWrites:
    """The shards and read indexes a launcher's pipeline writes straight to their final, free names in an
    object-store output (no staging copy), as its ``owner.json`` records them before the pipeline starts."""

    paths: tuple[str, ...]
    replaces: str | None  # the run whose manifest the output held when this was decided (None: no dataset)


_DIRECT: dict[str, DirectWrites] = {}  # run id -> its direct writes, decided (and published) in the launcher's process


def shard_destination(plan: BuildPlan, publish: bool) -> str:
    """Where the shard writers write: the output itself when ``direct_writes`` allows it, else the staging directory."""
    return plan.output_root if direct_writes(plan, publish) is not None else plan.staging_dir


def direct_writes(plan: BuildPlan, publish: bool = False, listing: Mapping[str, int] | None = None) -> DirectWrites | None:
    """Decide, once per run, whether its shards go straight to their final names (None: they are staged and copied).

    Only on ``gs://`` and ``s3://``, only for a launcher (``publish=False``) that holds the output's lock now and
    keeps it until it publishes, only for counted shards (their names are known before the pipeline runs), and only
    when none of those names is taken in the output (an old dataset's object or a user's) and this process did not
    just remove a dead run's objects there (its orphaned workers might still write them), and its recovery under
    this lock left no other run's staging directory there (a live run that lost its lock to this one may still
    write the names its owner record lists). A reader never sees the
    new objects as a dataset before the manifest, written last, lists them. ``listing``: the output's objects
    (``fs.list_objects``), listed by the caller under this lock after its recovery.
    """
    if plan.run.run_id in _DIRECT:
        return _DIRECT[plan.run.run_id]
    root, spec = plan.output_root, plan.sharding
    output = output_key(root) if object_store.is_object_store(root) else ""
    if (publish or not output or not holds_lock(root, plan.run.run_id) or any(count is None for count in spec.num_shards)
            or output in RECOVERED_WRITES or output not in OTHER_RUNS or OTHER_RUNS[output]):
        return None
    relatives, found = _planned_names(plan), _objects_under(root, listing)
    if found & set(relatives):
        return None
    replaces = committed_run(root) if found & set(MANIFEST_NAMES) else None  # the listing says whether there is one
    writes = DirectWrites(tuple(fs.join(root, *relative.split("/")) for relative in relatives), replaces)
    StagingDir(plan.staging_dir, plan.run, root).record_writes(writes.paths)  # before any of them is written
    _DIRECT[plan.run.run_id] = writes
    return writes


def _planned_names(plan: BuildPlan) -> list[str]:
    """Every shard's and read index's path in the dataset, relative to its root, as the shard writers name them."""
    spec, names = plan.sharding, []
    for split, count in zip(spec.splits, spec.num_shards):
        for shard in range(count or 0):
            relative = f"{split}/{shard_file_name(split, shard, int(count or 0), spec.compression)}"
            names.append(relative)
            if spec.write_index and spec.compression is None:
                names.append(index_path_for(relative))
    return names


def _objects_under(root: str, listing: Mapping[str, int] | None = None) -> set[str]:
    """The names (relative to ``root``) of every object under the output prefix: one listing (none when given)."""
    prefix = root.rstrip("/") + "/"
    return {path[len(prefix):] for path in (fs.list_objects(root) if listing is None else listing)
            if path.startswith(prefix)}




@dataclasses.dataclass(frozen=True)
class StagedCommit:
    """A checked, staged dataset waiting to be published: its manifest and its staged shard and dead-letter files."""

    run_id: str
    manifest: dict[str, Any]
    files: tuple[WrittenShard, ...]
    dead_letters: tuple[DeadLetterFile, ...]

    def write(self, staging_dir: str) -> None:
        """Write the record atomically (a whole record or none), for the launcher to publish.

        Only into a staging directory that still has its ``owner.json``: a worker that outlived its
        launcher must not recreate a directory the next run's recovery removed (or abandoned).
        """
        if not fs.exists(fs.join(staging_dir, OWNER_NAME)):
            raise CommitError(f"{staging_dir}: this run's staging directory is gone or abandoned (its launcher ended?); "
                              "nothing was staged or published")
        data = json.dumps({"run_id": self.run_id, "manifest": self.manifest,
                           "files": [dataclasses.asdict(item) for item in self.files],
                           "dead_letters": [dataclasses.asdict(item) for item in self.dead_letters]}).encode("utf-8")
        write_whole(fs.join(staging_dir, COMMIT_RECORD), data)

    @classmethod
    def read(cls, plan: BuildPlan) -> StagedCommit | None:
        """This run's record from its staging directory (None: the pipeline staged none); refuses one that is not."""
        path = fs.join(plan.staging_dir, COMMIT_RECORD)
        try:
            data = read_whole(path, MAX_JOURNAL_BYTES, "commit record")
            if data is None:
                return None
            raw = json.loads(data.decode("utf-8"))
            staged = cls(raw["run_id"], raw["manifest"], tuple(WrittenShard(**item) for item in raw["files"]),
                         tuple(DeadLetterFile(**item) for item in raw["dead_letters"]))
        except (RefusedFileError, ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise CommitError(f"{path}: an unreadable commit record ({error}); nothing was published to "
                              f"{plan.output_path}; rerun the build") from error
        problem = staged.untrusted(plan)
        if problem is not None:
            raise CommitError(f"{path}: {problem}, so nothing was published to {plan.output_path}; rerun the build")
        return staged

    def untrusted(self, plan: BuildPlan) -> str | None:
        """Why the record is not this run's staged dataset (another run, a path outside the staging directory)."""
        if self.run_id != plan.run.run_id or run_id_of(self.manifest) != plan.run.run_id:
            return f"the record is run {self.run_id}'s, not this run's ({plan.run.run_id})"
        staged = [path for item in self.files for path in (item.temp_path, item.temp_index_path)
                  if path is not None] + [item.temp_path for item in self.dead_letters]
        direct = _DIRECT.get(plan.run.run_id)
        written_straight = set(direct.paths) if direct is not None else set()
        for path in staged:
            if not confined(path, plan.staging_dir, plan.staging_dir) and path not in written_straight:
                return f"it names {path!r}, outside the staging directory"
        for relative in [*(item.relative_path for item in self.files), *(item.relative_path for item in self.dead_letters)]:
            parts = relative.split("/")
            if relative.startswith("/") or "\\" in relative or any(part in ("", ".", "..") for part in parts):
                return f"it names the dataset path {relative!r}, which is not a plain relative path"
        return None


def commit_staged(plan: BuildPlan) -> dict[str, Any] | None:
    """The launcher's commit, after the pipeline: publish the record the pipeline staged; None when it staged none."""
    staged = StagedCommit.read(plan)
    if staged is None:
        return None
    publish_staged(plan, staged)
    return staged.manifest


def publish_staged(plan: BuildPlan, staged: StagedCommit) -> None:
    """Holding the output's lock: recover what dead runs left, check the output again, publish."""
    with held_or_taken(plan.output_root, plan.run):
        try:
            if plan.run.run_id not in _DIRECT:  # else this launcher recovered under the lock it has held since
                recover_output(plan.output_root, keep=plan.staging_dir)
        except OSError as error:
            raise commit_failed(plan, error, "recovering what an earlier run left") from error
        _check_output_unchanged(plan)
        try:
            manifest = Manifest.from_dict(staged.manifest, "<new manifest>", verifiable=True)
            if fs.is_remote(plan.output_root):
                publish_by_switch(plan, staged.files, staged.dead_letters, manifest)
            else:
                publish_by_swap(plan, staged.files, staged.dead_letters, manifest)
        except OSError as error:  # before the commit point: after it a failure is only a warning
            raise commit_failed(plan, error, "publishing") from error
    _LOG.info("wrote %s", plan.manifest_path)


def commit_failed(plan: BuildPlan, error: OSError, step: str) -> CommitError:
    """One line for a file-system failure in the commit: the path, why, and what the output holds now."""
    path, code, reason = _failure_of(error)
    why = "the disk is full" if code == errno.ENOSPC else reason
    return CommitError(f"{path or plan.staging_dir}: {why} while {step} {plan.output_path}; {_output_state(plan)}")


def _failure_of(error: BaseException) -> tuple[str | None, int | None, str]:
    """(path, errno, reason) of an OSError, looking inside Beam's BeamIOError (a dict of per-path errors)."""
    details = getattr(error, "exception_details", None)
    if isinstance(details, dict) and details:
        key, inner = next(iter(details.items()))
        path, code, reason = _failure_of(inner)
        return path or str(key[-1] if isinstance(key, tuple) else key), code, reason
    if isinstance(error, OSError) and error.args and isinstance(error.args[0], BaseException):
        return _failure_of(error.args[0])
    if isinstance(error, OSError):
        filename = error.filename if isinstance(error.filename, str) else None
        return filename, error.errno, error.strerror or str(error)
    return None, None, str(error)


def _output_state(plan: BuildPlan) -> str:
    """What a reader finds at the output after a failed commit."""
    try:
        return _what_the_output_holds(plan)
    except OSError:  # the store that failed the commit does not answer this either
        return (f"what {plan.output_path} holds now could not be read; the old or the new dataset is there whole, "
                f"and the next build into it finishes or undoes this commit from {plan.staging_dir}")


def _what_the_output_holds(plan: BuildPlan) -> str:
    try:
        manifest = read_manifest(plan.output_root, BEAM_FILES)
    except (ManifestError, OSError):
        manifest = None
    if manifest is not None and manifest.run_id == plan.run.run_id:
        return "the new dataset is published nonetheless"
    if manifest is not None:
        return (f"nothing was published: the old dataset at {plan.output_path} is intact; free space and rerun "
                "(the next build removes what this one staged)")
    old_dir = fs.join(plan.staging_dir, OLD_DATASET_DIR)
    if not fs.is_remote(old_dir) and os.path.isdir(old_dir):
        return (f"nothing was published and {plan.output_path} holds no complete dataset now: the old one is in "
                f"{old_dir}, and the next build into it completes the commit")
    if not fs.exists(plan.output_root) and not fs.exists(fs.join(plan.staging_dir, JOURNAL_NAME)):
        return f"nothing was published and there is no dataset at {plan.output_path}; free space and rerun"
    return (f"nothing was published and {plan.output_path} holds no complete dataset now; the next build into it "
            f"completes the commit from {plan.staging_dir} or removes it")


def _check_output_unchanged(plan: BuildPlan) -> None:
    """Another run may have published into the output since this build was planned: check again, under the lock."""
    if plan.run.run_id in _DIRECT:  # its own objects are in the output now: publish_by_switch checks the manifest
        return
    try:
        check_output_dir(plan.output_root, plan.resolved_config, plan.overwrite, shown=plan.output_path)
    except OutputExistsError as error:
        raise CommitError(f"the output changed while this build ran, so nothing was published: {error}") from error


def check_every_record_arrived(files: Sequence[WrittenShard], expected: int, output: str,
                               made: str = "rows were converted", records: str = "examples") -> None:
    """Records in = records out, and every shard file is as long as its writer said; else nothing is published."""
    written = sum(item.num_examples for item in files)
    if written != expected:
        raise ShortWriteError(
            f"{output}: the shard writers wrote {written} {records}, but {expected} {made}; the runner "
            "lost or duplicated elements, so nothing was published (see docs/runners.md)"
        )
    sizes = _sizes_of([item.temp_path for item in files])
    wrong = [item for item in files if sizes[item.temp_path] != item.num_bytes]
    if wrong:
        first = wrong[0]
        raise ShortWriteError(
            f"{first.temp_path}: {sizes[first.temp_path]} bytes on disk, its writer reported {first.num_bytes} "
            f"({len(wrong)} shard(s) differ); the runner lost a write, so nothing was published to {output}"
        )


def _sizes_of(paths: Sequence[str]) -> dict[str, int | None]:
    """Each file's size (None: missing): on an object store one listing per folder, elsewhere one match per file."""
    if paths and object_store.is_object_store(paths[0]):
        listed: dict[str, int] = {}
        for folder in sorted({fs.parent(path) for path in paths}):
            listed.update(fs.list_objects(folder))
        return {path: listed.get(path) for path in paths}
    sizes: dict[str, int | None] = {}
    for path in paths:
        found = fs.match(path)
        sizes[path] = next(iter(found.values())).size_in_bytes if found else None
    return sizes


def check_every_sequence_arrived(files: Sequence[WrittenShard], sequences: SequenceCounts, converted: int, output: str) -> None:
    """Sequence builds: every converted row reached the sequence stage, and every SequenceExample it made a shard."""
    if sequences.rows != converted:
        raise ShortWriteError(
            f"{output}: {converted} rows were converted, but the sequence stage received {sequences.rows} "
            f"({int(sequences.steps.sum())} steps kept, {int(sequences.too_few_rows.sum())} in groups under min_steps, "
            f"{int(sequences.bad_rows.sum())} in bad groups, {int(sequences.truncated_steps.sum())} truncated); the "
            "runner lost or duplicated elements, so nothing was published (see docs/runners.md)"
        )
    check_every_record_arrived(files, int(sequences.examples.sum()), output, "were made of the groups",
                               "SequenceExamples")


def build_manifest(plan: BuildPlan, shard_plan: ShardPlan, files: Sequence[WrittenShard], rows_read: int, bad: int,
                   dead_letters: Sequence[DeadLetterFile], absent: np.ndarray | None = None,
                   sequences: SequenceCounts | None = None, read_per_input: dict[str, int] | None = None) -> dict[str, Any]:
    """The manifest of a finished build; ``sequences`` (the summed counts of a sequence build) makes it a SequenceExample one.
    ``read_per_input``: each input's rows read, recorded in its ``inputs`` entry (``rows_read``)."""
    config = plan.config
    shards_of = {split_plan.name: sorted((item for item in files if item.split == split_plan.name),
                                         key=lambda item: item.shard) for split_plan in shard_plan.splits}
    splits = {
        name: {
            "num_examples": sum(item.num_examples for item in shards),
            "num_bytes": sum(item.num_bytes for item in shards),
            "shards": [
                {"path": item.relative_path, "num_examples": item.num_examples, "num_bytes": item.num_bytes,
                 "sha256": item.sha256}
                for item in shards
            ],
        }
        for name, shards in shards_of.items()
    }
    if sequences is None:
        schema = _example_schema(plan, splits, absent)
    else:
        schema = _sequence_schema(plan, splits, sequences)
    record = "SequenceExample" if sequences is not None else "example"
    return {
        "format": MANIFEST_FORMAT,
        "record_type": SEQUENCE_EXAMPLE if sequences is not None else EXAMPLE,
        "splits": splits,
        "compression": config.output.compression,
        **schema,
        **({"schema_pbtxt": SCHEMA_PBTXT} if config.output.schema_pbtxt and sequences is None else {}),
        **({"tfds": {"name": config.output.tfds.name, "version": config.output.tfds.version}}
           if config.output.tfds is not None and sequences is None else {}),
        "inputs": [{**entry, "rows_read": (read_per_input or {}).get(entry["path"], 0)} for entry in plan.inputs],
        "config": normalized(config_to_dict(config)),
        "seed": config.shuffle.effective_seed,
        "order": (
            f"shuffled: sorted by a seed-keyed mix of each {record}'s XXH3-128 content hash, ties by bytes"
            if config.shuffle.enabled else "input order: input files sorted by path, then row order"
            + (" of each SequenceExample's earliest row" if sequences is not None else "")
        ),
        "split_assignment": describe_split_source(config, plan.input_splits) if config.split_by is not None else (
            "XXH3-128 hash of " + (f"split_key {list(config.split_key)}" if config.split_key else "the whole example")
            + (" (of each group)" if sequences is not None else "") + " against cumulative fractions; independent of the seed"
        ),
        "versions": {"tfrbeam": tfrbeam.__version__, "apache_beam": beam.__version__, "python": platform.python_version()},
        "rows_read": rows_read,
        "bad_records": {
            "count": bad,
            "action": config.errors.on_bad_record,
            "dead_letter_path": plan.dead_letter_path if dead_letters else None,
            "files": sorted(item.relative_path for item in dead_letters),
        },
        # How this run made the dataset, apart from what the dataset is (manifest_schema.RUN_KEYS). Its run_id
        # names the generation: the commit, recovery and pinned readers' messages find it with run_id_of.
        "run": {
            "run_id": plan.run.run_id,
            "started": plan.started,
            "finished": _utc_now(),
            "runner": plan.runner,
            "piece_store": plan.piece_store,
            "workers": {"count": plan.workers.count, "mode": plan.workers.mode, "chosen_by": plan.workers.reason},
            # What the shuffle's elements took as the runner moved them (frames too with the inline store, compressed):
            # the prepared pieces into the routing stage (a memory store's stay in this process), then the shards' slices.
            "shuffled_bytes": shard_plan.piece_bytes + sum(item.received_bytes for item in files),
        },
    }


def _example_schema(plan: BuildPlan, splits: dict[str, dict[str, Any]], absent: np.ndarray | None) -> dict[str, Any]:
    """An Example build's features and parse spec, and per split the examples that have each feature."""
    if absent is None:
        absent = np.zeros((len(plan.config.splits), len(plan.features)), dtype=np.int64)
    names = [spec.name for spec in plan.features]
    features = feature_entries(plan.features)
    for column, name in enumerate(names):  # presence as the build saw it, not as the schema allows
        features[name]["always_present"] = bool(absent[:, column].sum() == 0)
    for index, entry in enumerate(splits.values()):
        entry["examples_with_feature"] = {
            name: entry["num_examples"] - int(absent[index, column])
            for column, name in enumerate(names)
        }
    return {"features": features, "parse_example_spec": parse_example_spec_of(features)}


def _sequence_schema(plan: BuildPlan, splits: dict[str, dict[str, Any]], counts: SequenceCounts) -> dict[str, Any]:
    """A SequenceExample build's context and sequence features, parse spec, settings and per-split group and step counts."""
    sequence = plan.config.sequence
    assert sequence is not None  # a sequence build
    stage = SequenceStage.of(plan)
    specs = {spec.name: spec for spec in plan.features}
    context = feature_entries([specs[name] for name in stage.context])
    steps = feature_entries([specs[name] for name in stage.feature_lists])
    for column, name in enumerate(stage.context):
        context[name]["always_present"] = bool(counts.context_present[:, column].sum() == counts.examples.sum())
    for column, name in enumerate(stage.feature_lists):
        steps[name]["always_present"] = bool(counts.steps_present[:, column].sum() == counts.steps.sum())
    for index, entry in enumerate(splits.values()):
        examples, total = int(counts.examples[index]), int(counts.steps[index])
        entry.update({
            "num_groups": int(counts.groups[index]),
            "steps": {"total": total, "min": int(counts.min_steps[index]) if examples else 0,
                      "mean": total / examples if examples else 0.0, "max": int(counts.max_steps[index])},
            "dropped_groups": {"too_few_steps": int(counts.too_few_groups[index]), "bad": int(counts.bad_groups[index])},
            "split_groups": int(counts.split_groups[index]),
            "truncated_steps": int(counts.truncated_steps[index]),
            "examples_with_feature": {name: int(counts.context_present[index, column])
                                      for column, name in enumerate(stage.context)},
            "steps_with_feature": {name: int(counts.steps_present[index, column])
                                   for column, name in enumerate(stage.feature_lists)},
        })
    return {
        "context_features": context,
        "sequence_features": steps,
        "parse_sequence_example_spec": parse_sequence_example_spec_of(context, steps),
        "sequence": {"group_by": list(sequence.group_by), "order_by": list(sequence.order_by),
                     "context": list(sequence.context), "max_steps": sequence.max_steps, "overflow": sequence.overflow,
                     "min_steps": sequence.min_steps},
    }


def _staged_moves(plan: BuildPlan, files: Sequence[WrittenShard], dead_letters: Sequence[DeadLetterFile],
                  root: str) -> list[tuple[str, str]]:
    """(staged file, its path under ``root``) for every shard, read index and dead-letter file."""
    moves = [(item.temp_path, fs.join(root, *item.relative_path.split("/"))) for item in files]
    moves += [(item.temp_index_path, fs.join(root, *index_path_for(item.relative_path).split("/")))
              for item in files if item.temp_index_path]
    moves += [(item.temp_path, fs.join(root, *item.relative_path.split("/"))) for item in dead_letters]
    return moves


def publish_by_swap(plan: BuildPlan, files: Sequence[WrittenShard], dead_letters: Sequence[DeadLetterFile],
                    manifest: Manifest) -> None:
    """Local output: assemble the dataset in the staging directory, then swap it in with one atomic step."""
    new_dir = fs.join(plan.staging_dir, NEW_DATASET_DIR)
    old_dir = fs.join(plan.staging_dir, OLD_DATASET_DIR)
    fs.mkdirs(new_dir)
    for split in plan.config.splits:
        fs.mkdirs(fs.join(new_dir, split))
    moves = _staged_moves(plan, files, dead_letters, new_dir)
    for directory in sorted({fs.parent(destination) for _, destination in moves}):
        fs.mkdirs(directory)
    fs.rename(moves)
    if plan.config.output.compression is None:
        fs.in_threads(_finish_indexes, [fs.join(new_dir, *item.relative_path.split("/")) for item in files])
    if plan.config.output.dali_index:
        for item in files:
            write_dali_index(fs.join(new_dir, *item.relative_path.split("/")), _dali_path(new_dir, item))
    _write_schema_pbtxt(manifest, new_dir)
    write_tfds_files(manifest, new_dir)
    fs.write_bytes(fs.join(new_dir, MANIFEST_NAME), manifest.to_bytes(), "application/json")
    if os.path.lexists(plan.output_root):
        _prepare_replace(plan.output_root, new_dir)
    replaced = swap_into_place(new_dir, plan.output_root, old_dir)  # the commit point
    try:
        carry_over(replaced, plan.output_root)
        fs.delete_tree(plan.staging_dir)
    except OSError as error:  # published already: what is left is the next run's to remove
        _LOG.warning("published %s, but could not clean up %s (%s); the next build into it finishes this",
                     plan.output_path, plan.staging_dir, error)
    if plan.config.stats:
        write_stats(plan)


def _write_schema_pbtxt(manifest: Manifest, root: str) -> str | None:
    """``output.schema_pbtxt``: the features as a TFMD schema, at the path the manifest lists under ``root``."""
    for relative in schema_files_of(manifest):
        path = fs.join(root, *relative.split("/"))
        fs.write_bytes(path, schema_text(manifest.features or {}).encode("utf-8"), "text/plain")
        return path
    return None


def write_tfds_files(manifest: Manifest, root: str) -> None:
    """``output.tfds``: TFDS's features.json, then its dataset_info.json (what TFDS opens first), under ``root``."""
    if not tfds_files_of(manifest):
        return
    files = tfds_files_for(manifest)
    for name in (TFDS_FEATURES, TFDS_DATASET_INFO):
        fs.write_bytes(fs.join(root, name), files[name], "application/json")


def write_stats(plan: BuildPlan) -> None:
    """``stats: true``: stats.json and stats.html of the published dataset; a failure is a warning (it is published)."""
    from tfrbeam.stats.compute import write_dataset_stats

    try:
        json_path, _ = write_dataset_stats(plan.output_root)
    except Exception as error:  # the dataset is published; nothing about its statistics may undo that
        _LOG.warning("published %s, but its statistics failed (%s); run tfrbeam stats %s", plan.output_path, error,
                     plan.output_path)
        return
    _LOG.info("wrote %s and stats.html", json_path)


def load_offsets_of(staged_shard: str) -> Any:
    """Record starts (and the end) of a staged shard, from the read index its writer wrote."""
    index_path = index_path_for(staged_shard)
    with fs.open_read(index_path) as handle:
        starts = parse_read_index(handle.read(), index_path).starts
    if starts is None:
        raise CommitError(f"{index_path}: the read index its writer wrote holds no record starts; rerun the build")
    return starts.offsets


def _dali_path(root: str, item: WrittenShard) -> str:
    """Where a shard's DALI index goes: ``{root}/dali/{split}/{shard file name}.idx``."""
    return fs.join(root, *dali_index_path(item.split, item.relative_path).split("/"))


def _finish_indexes(shard_path: str) -> None:
    """Stamp a staged shard's read index with the file's mtime (the swap's renames keep it)."""
    if os.path.exists(index_path_for(shard_path)):
        stamp_read_index(shard_path)


def _old_manifest(output_root: str) -> tuple[Manifest | None, str]:
    """The published manifest (None when there is none or it is damaged) and its file name."""
    path = find_manifest(output_root, BEAM_FILES)
    if path is None:
        return None, MANIFEST_NAME
    try:
        return load_manifest(path, BEAM_FILES)[0], posixpath.basename(path)
    except ManifestError:
        return None, posixpath.basename(path)


def _prepare_replace(output_root: str, new_dir: str) -> None:
    """Before the exchange: refuse (naming it) a path of the user's the new dataset cannot keep, and give the new
    dataset's folders the old ones' mode and owner, so the commit point changes nothing of the user's."""
    new = DatasetNames.of_tree(new_dir)
    refuse_conflicts(output_root, keep_plan(output_root, old_dataset_names(output_root), new))
    keep_folder_attributes(output_root, new_dir, new)


def publish_by_switch(plan: BuildPlan, files: Sequence[WrittenShard], dead_letters: Sequence[DeadLetterFile],
                      manifest: Manifest) -> None:
    """Object stores: the new objects under names no object there has, then the manifest in one write, then GC.

    A rename in a bucket is a copy and a delete, so no set of renames is atomic; one whole-object
    write is. The new generation's shards, indexes and dead letters go in beside the old ones (a
    name already taken gets this run's tag, ``generation_name``), the manifest's one write switches
    every reader that opens it from the old dataset to the new, and only then are the old
    dataset's objects deleted. A switch journal in the staging prefix lets the next run finish
    (or undo) whatever a crash interrupted (docs/cloud-storage.md).
    """
    root = plan.output_root
    direct = _DIRECT.get(plan.run.run_id)
    written_straight = {path[len(root.rstrip("/")) + 1:] for path in direct.paths} if direct is not None else set()
    only_written_straight = (direct is not None and not dead_letters and not plan.config.output.dali_index
                             and not schema_files_of(manifest))
    # A first build of only objects written straight: no manifest was there when it planned, under this lock,
    # and the switch below creates the manifest only if none has appeared since: nothing to read first.
    first = only_written_straight and direct is not None and direct.replaces is None
    old, old_name = (None, MANIFEST_NAME) if first else _old_manifest(root)
    if direct is not None and not first and (old.run_id if old is not None else None) != direct.replaces:
        raise CommitError(f"the output changed while this build ran (its manifest is no longer run {direct.replaces}'s), "
                          f"so nothing was published to {plan.output_path}")
    if only_written_straight:
        # Only the run's own objects, already at their free names: no listing needed to choose names, and the
        # old dataset's objects are what its manifest lists (a delete of one already gone is no error).
        found = written_straight | ({old_name, *dataset_files(old)} if old is not None else set())
    else:  # the objects there, and those a live run that lost this lock may still write (they are not free)
        reserved = RESERVED_WRITES.get(output_key(root), set()) if object_store.is_object_store(root) else set()
        prefix = root.rstrip("/") + "/"
        found = _objects_under(root) | {path[len(prefix):] for path in reserved if path.startswith(prefix)}
    renamed = _free_names([item.relative_path for item in files] + [item.relative_path for item in dead_letters]
                          + sorted(schema_files_of(manifest)), found - written_straight, plan.run.run_id)
    files = [dataclasses.replace(item, relative_path=renamed[item.relative_path]) for item in files]
    dead_letters = [dataclasses.replace(item, relative_path=renamed[item.relative_path]) for item in dead_letters]
    manifest = manifest.renamed(renamed)
    # Objects written straight to their final names stay where they are: only staged ones move.
    moves = [(staged, final) for staged, final in _staged_moves(plan, files, dead_letters, root) if staged != final]
    if plan.config.output.dali_index:  # written from the staged shards, moved in with them
        for item in files:
            staged = fs.join(plan.staging_dir, *dali_index_path(item.split, item.relative_path).split("/"))
            fs.write_bytes(staged, dali_index_text(load_offsets_of(item.temp_path)).encode("ascii"), "text/plain")
            moves.append((staged, _dali_path(root, item)))
    staged_schema = _write_schema_pbtxt(manifest, plan.staging_dir)  # moved in with the shards, before the switch
    if staged_schema is not None:
        moves.append((staged_schema, fs.join(root, *next(iter(schema_files_of(manifest))).split("/"))))
    final_manifest = fs.join(root, MANIFEST_NAME)
    published = {final for _, final in moves} | {final_manifest} | {fs.join(root, name) for name in tfds_files_of(manifest)}
    prefix = root.rstrip("/") + "/"
    # What the old manifest makes its own (an unreadable manifest is refused there, naming it); never a user's object.
    own = set() if first else (DatasetNames.of_manifest(old, old_name) if old is not None
                               else old_dataset_names(root)).files
    own -= {MANIFEST_NAME}
    doomed = sorted(prefix + name for name in found & own if prefix + name not in published)
    if not moves and not doomed:
        # Nothing to move and nothing to collect: the switch alone (one whole-object write) publishes; a crash
        # before it leaves the objects owner.json names for the next run to remove.
        _switch(plan, final_manifest, manifest.to_bytes(), first)
    else:
        staged_manifest = fs.join(plan.staging_dir, MANIFEST_NAME)
        fs.write_bytes(staged_manifest, manifest.to_bytes(), "application/json")
        journal = CommitJournal(plan.run.run_id, root, tuple(doomed), (*moves, (staged_manifest, final_manifest)),
                                switch=True, replaces=old.run_id if old is not None else None)
        journal.write(plan.staging_dir)
        journal.apply()
    try:  # after the switch: TFDS's dataset_info.json may be where the replaced dataset kept its manifest
        write_tfds_files(manifest, root)
    except OSError as error:
        _LOG.warning("published %s, but could not write TFDS's files beside it (%s); rerun the same build to write "
                     "them", plan.output_path, error)
    try:
        remove_published_staging(plan.staging_dir)
    except OSError as error:  # published already: what is left is the next run's to remove
        _LOG.warning("published %s, but could not clean up %s (%s); the next build into it finishes this",
                     plan.output_path, plan.staging_dir, error)
    if plan.config.stats:
        _LOG.warning("stats: true computes statistics of local outputs only; run tfrbeam stats where %s is readable",
                     plan.output_path)


def _switch(plan: BuildPlan, manifest_path: str, data: bytes, first: bool) -> None:
    """Write the manifest, the commit point; ``first``: only if no manifest is there (else CommitError)."""
    if not first:
        fs.write_bytes(manifest_path, data, "application/json")
        return
    try:
        fs.write_if_absent(manifest_path, data)
    except PreconditionFailedError as error:
        raise CommitError(f"{manifest_path}: a manifest appeared while this build ran, so nothing was published to "
                          f"{plan.output_path}; the next build into it removes what this one wrote") from error


def generation_name(relative: str, run_id: str) -> str:
    """``train/train-00000-of-00002.tfrecord`` as this run's: ``train/train-g<run>-00000-of-00002.tfrecord``.

    The tag goes into the shard name's prefix, so the name still matches ``SHARD_NAME`` and a glob
    such as ``train-*-of-*.tfrecord``; other files get it before their extension.
    """
    directory, _, name = relative.rpartition("/")
    tag = f"g{run_id[:12]}"
    match = re.match(r"(.*?)(-\d{5,}-of-\d{5,}\..*)", name)
    tagged = f"{match.group(1)}-{tag}{match.group(2)}" if match else f"{tag}-{name}"
    return f"{directory}/{tagged}" if directory else tagged


def _free_names(relatives: Sequence[str], taken: set[str], run_id: str) -> dict[str, str]:
    """Each new file's published name: its own where neither it nor its indexes are taken, else this run's tagged one."""
    def clashes(relative: str) -> bool:
        return bool({relative, *index_paths_for(relative)} & taken)

    return {relative: generation_name(relative, run_id) if clashes(relative) else relative for relative in relatives}


def recover_output(output_root: str, keep: str | None = None) -> list[str]:
    """Recover what dead builds left beside ``output_root`` (see ``tfrbeam.beam.publish.recover``)."""
    return recover(output_root, keep=keep, new_name=NEW_DATASET_DIR, old_name=OLD_DATASET_DIR, carry_over=carry_over)


def discard_unpublished(plan: BuildPlan) -> None:
    """After a failed launcher commit: remove the staging directory only if the commit changed nothing yet.

    Once a journal is written, or the old dataset was moved aside (a swap without ``renameat2``),
    or the new dataset is in place, the staging directory is what the next run's recovery finishes
    the commit from: it stays.
    """
    started = fs.exists(fs.join(plan.staging_dir, JOURNAL_NAME)) or committed_run(plan.output_root) == plan.run.run_id
    if not fs.is_remote(plan.staging_dir):
        started = started or os.path.lexists(fs.join(plan.staging_dir, OLD_DATASET_DIR))
    if not started:
        discard_staging(plan)


def discard_staging(plan: BuildPlan, keep_dead_letters: bool = False) -> None:
    """Remove a failed run's staging directory (its partial shards) and free the pieces and rows it held in memory.

    A store that fails this too (it stopped answering) leaves the directory to the next run's recovery: the
    run's failure is what its caller reports, not this.
    """
    discard_held(plan.staging_dir)
    try:
        direct = _DIRECT.get(plan.run.run_id)
        if direct is not None:  # before owner.json, which names them for the next run, goes
            remove_unpublished(plan.output_root, direct.paths)
        _remove_staging(plan, keep_dead_letters)
    except OSError as error:
        _LOG.warning("could not remove %s (%s); the next build into %s removes it", plan.staging_dir, error,
                     plan.output_path)


def _remove_staging(plan: BuildPlan, keep_dead_letters: bool) -> None:
    if keep_dead_letters:
        for name in fs.list_names(plan.staging_dir):
            if name != ERRORS_DIR_NAME and name != OWNER_NAME:
                fs.delete_tree(fs.join(plan.staging_dir, name))
        return
    delete_staging(plan.staging_dir)
