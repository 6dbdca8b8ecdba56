"""Planning a build: list the inputs, settle the features, check the output; one frozen plan for the graph and the manifest.

Everything that reads local state happens here, before any pipeline exists: the input listing
and fingerprints, the resolved features, whether the output holds another dataset, and whether
the output's place can be written at all. Config and output-path problems are therefore reported
in one line before a pipeline starts. Workers receive the plan inside the pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import math
import os
import posixpath
import re
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from apache_beam.io.filesystem import FileSystem
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.beam.publish import RunIdentity, entries_besides_runs_objects, staging_path, this_run
from tfrbeam.builder.config import BuildConfig, SplitFiles, config_to_dict
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.inputs.files import InputFile
from tfrbeam.builder.inputs.sample import check_inputs_hold_rows, input_files
from tfrbeam.builder.pipeline.resolve import resolve_config, validate_against_schema, with_features
from tfrbeam.builder.pipeline.runners import (
    IN_PROCESS,
    WorkerChoice,
    apply_workers,
    choose_piece_store,
    choose_workers,
    held_piece_budget,
    runner_name,
    workers_as_given,
)
from tfrbeam.builder.pipeline.splits import list_split_inputs
from tfrbeam.builder.pipeline.user_files import (
    RESERVED_FILES,
    DatasetNames,
    check_folder_owner,
    keep_plan,
    old_dataset_names,
    refuse_conflicts,
)
from tfrbeam.builder.shuffle import INLINE, MAX_BUCKET_BITS, MEMORY, ShardingSpec, bucket_bits_for
from tfrbeam.errors import ConfigError, ManifestError, OutputExistsError, OutputNotWritableError
from tfrbeam.layout.manifest import check_manifest_file, find_manifest, read_manifest
from tfrbeam.layout.names import (
    DALI_DIR_NAME,
    ERRORS_DIR_NAME,
    LEGACY_MANIFEST_NAME,
    MANIFEST_NAME,
    MANIFEST_NAMES,
    PROBE_PREFIX,
    shard_file_name,
)
from tfrbeam.tfrecord.read_index import index_path_for

__all__ = ["UNKNOWN_ROWS_BYTES", "BuildPlan", "check_output_dir", "plan_build", "plan_rows"]


# One bucket holds about this many input bytes (more in memory: CSV text is about its Arrow size,
# Parquet expands a few times), so one worker's grouping is bounded whatever the input size.
SEQUENCE_BUCKET_INPUT_BYTES = 32 << 20
MAX_SEQUENCE_BUCKETS = 1 << 16


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    """What a build does, fixed before it runs: the resolved config, inputs, features, shards and output."""

    config: BuildConfig
    features: tuple[FeatureSpec, ...]
    input_files: tuple[InputFile, ...]
    columns: tuple[str, ...]
    sharding: ShardingSpec
    output_path: str  # as the config gives it (for messages and the manifest)
    output_root: str  # the same, absolute for local paths: workers may run in another directory
    run: RunIdentity
    runner: str
    overwrite: bool
    piece_store: str = INLINE  # where the shuffle's pieces wait (tfrbeam.builder.pipeline.runners.choose_piece_store)
    workers: WorkerChoice = IN_PROCESS  # tfrbeam.builder.pipeline.runners.choose_workers
    memory_store_bytes: int = 0  # a memory store holds this many bytes of pieces (and held rows), spills the rest
    sequence_buckets: int = 0  # sequence builds: the GroupByKey's buckets of group keys (tfrbeam.builder.pipeline.sequence)
    input_splits: tuple[int, ...] = ()  # file-pattern splits: the split index of each input file

    @property
    def started(self) -> str:
        return self.run.started

    @property
    def staging_dir(self) -> str:
        """Where this run writes everything before the commit (beside the output, same filesystem)."""
        return staging_path(self.output_root, self.run.run_id)

    @property
    def temp_dir(self) -> str:
        return self.staging_dir

    @property
    def inputs(self) -> tuple[dict[str, Any], ...]:
        names = list(self.config.splits)
        splits = [{"split": names[index]} for index in self.input_splits] or [{}] * len(self.input_files)
        return tuple({"path": item.path, "size": item.size, "mtime": item.mtime, **split}
                     for item, split in zip(self.input_files, splits))

    @property
    def manifest_path(self) -> str:
        return fs.join(self.output_path, MANIFEST_NAME)

    @property
    def dead_letter_path(self) -> str | None:
        if self.config.errors.on_bad_record != "dead_letter":
            return None
        return fs.join(self.output_path, ERRORS_DIR_NAME)

    @property
    def resolved_config(self) -> dict:
        return normalized(config_to_dict(self.config))


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def plan_build(config: BuildConfig, options: PipelineOptions | None = None, *, overwrite: bool = False,
               run_id: str | None = None, launched: bool = False) -> BuildPlan:
    """Plan ``config``: every config, input and output problem is raised here, before anything runs.

    Raises ConfigError (features that do not fit the input, an unknown split_key),
    OutputExistsError (the output holds another dataset and ``overwrite`` is false) and
    OutputNotWritableError (the output is a file, cannot be created or written, or its disk is full).
    """
    fs.use_pipeline_options(options)
    if isinstance(config.split_by, SplitFiles):
        inputs, input_splits = list_split_inputs(config.split_by)
    else:
        inputs, input_splits = input_files(config.input), ()
    check_output_outside_inputs(config, inputs)
    _check_workers_can_see(options, "input.path", [item.path for item in inputs])
    resolved_input = resolve_config(config, files=inputs)
    check_inputs_hold_rows(resolved_input.input, inputs, config.errors.allow_empty)
    plan = _planned(config, resolved_input, tuple(inputs), sum(item.size for item in inputs), options, overwrite, run_id,
                    workers="choose", launched=launched)
    return dataclasses.replace(plan, input_splits=input_splits)


# Rows given as Arrow (no input files) of unknown size are taken to be this many bytes when shards are sized by
# max_bytes_per_shard: the estimate only sets how fine the shuffle's buckets are (finer: shards closer to the cap).
UNKNOWN_ROWS_BYTES = 64 << 30


def plan_rows(config: BuildConfig, schema: pa.Schema, options: PipelineOptions | None = None, *, overwrite: bool = False,
              run_id: str | None = None, input_bytes: int | None = None, own_options: bool = False,
              launched: bool = False) -> BuildPlan:
    """Plan a build of rows given as Arrow record batches of ``schema`` rather than read from files.

    ``config.input.path`` names the rows (in messages, dead letters and the manifest); the features
    are the config's, checked against ``schema``, or inferred from it as for Parquet. The plan has
    one input, the rows, of ``input_bytes`` (unknown: ``UNKNOWN_ROWS_BYTES`` sizes the buckets).
    ``own_options``: the options are the launcher's own (write_dataset), so ``--workers N`` applies;
    otherwise they are a user's pipeline's (WriteDataset) and are described, never changed.
    Raises what ``plan_build`` raises, before anything runs.
    """
    if isinstance(config.split_by, SplitFiles):
        raise ConfigError("splits: file patterns split input files, but these rows come from no files; split them by "
                          "fractions or by a split column")
    fs.use_pipeline_options(options)
    resolved_input = validate_against_schema(config, schema, where=config.input.path)
    rows = InputFile(config.input.path, input_bytes or 0, None)
    return _planned(config, resolved_input, (rows,), input_bytes if input_bytes is not None else UNKNOWN_ROWS_BYTES,
                    options, overwrite, run_id, workers="given in memory" if own_options else "as given", launched=launched)


def _planned(config: BuildConfig, resolved_input: BuildConfig, inputs: tuple[InputFile, ...], input_bytes: int,
             options: PipelineOptions | None, overwrite: bool, run_id: str | None, workers: str,
             launched: bool = False) -> BuildPlan:
    """The plan of a config whose features were resolved against its input: split key and output checked.

    ``workers``: "choose" (tfrbeam build) and "given in memory" (rows in this process): ``--workers N`` or auto
    (this process), set on ``options``; "as given": a user's pipeline, its options unchanged. ``launched``: the
    plan goes to ``launch``, which checks the output again under its lock; a bucket's output is then checked only
    there, as each check costs a metadata request and a listing.
    """
    features = resolved_input.features
    columns = resolved_input.input.columns
    assert features is not None and columns is not None  # resolving settles both
    _check_split_key(config, features)
    resolved = with_features(config, features, csv=resolved_input.input.csv)
    _check_workers_can_see(options, "output.path", [config.output.path])
    output_root = output_root_of(config)
    check_output_place(output_root, config.output.path)
    if not (launched and fs.is_remote(output_root)):
        check_output_dir(output_root, normalized(config_to_dict(resolved)), overwrite, shown=config.output.path)
    check_users_paths_keepable(output_root, config, shown=config.output.path)
    options = options if options is not None else PipelineOptions([])
    if workers == "as given":
        chosen = workers_as_given(options)
    else:
        chosen = choose_workers(options)
        apply_workers(options, chosen)  # before the piece store is chosen: workers in other processes need files
    return BuildPlan(
        config=resolved, features=features, input_files=inputs, columns=tuple(sorted(columns)),
        sharding=sharding_spec(resolved, input_bytes),
        output_path=config.output.path, output_root=output_root,
        run=this_run(run_id or uuid.uuid4().hex[:16]), runner=runner_name(options), overwrite=overwrite,
        piece_store=(piece_store := choose_piece_store(options)), workers=chosen,
        memory_store_bytes=held_piece_budget(options) if piece_store == MEMORY else 0,
        sequence_buckets=sequence_buckets_for(input_bytes) if config.sequence is not None else 0,
    )


_REMOTE_WORKER_RUNNERS = ("DataflowRunner",)


def _check_workers_can_see(options: PipelineOptions | None, key: str, paths: list[str]) -> None:
    """Dataflow's workers run on other machines: a local input or output path is refused before anything runs."""
    runner = runner_name(options)
    local = [path for path in paths if not fs.is_remote(path)]
    if runner in _REMOTE_WORKER_RUNNERS and local:
        raise ConfigError(f"{key}: {local[0]} is on this machine, but {runner}'s workers run elsewhere and cannot see "
                          "it; put it in a bucket (gs://BUCKET/...) and give that path")


def _check_split_key(config: BuildConfig, features: tuple[FeatureSpec, ...]) -> None:
    names = {spec.name for spec in features}
    unknown = [name for name in config.split_key or () if name not in names]
    if unknown:
        raise ConfigError(
            f"split_key: {', '.join(map(repr, unknown))} {'is not a feature' if len(unknown) == 1 else 'are not features'} "
            f"(allowed: the feature names {', '.join(sorted(names))}); the split key is hashed from the converted feature values"
        )


def sequence_buckets_for(input_bytes: int) -> int:
    """A sequence build's GroupByKey bucket count: one per SEQUENCE_BUCKET_INPUT_BYTES of input, at least 1."""
    return max(1, min(MAX_SEQUENCE_BUCKETS, math.ceil(input_bytes / SEQUENCE_BUCKET_INPUT_BYTES)))


def sharding_spec(config: BuildConfig, input_bytes: int) -> ShardingSpec:
    output = config.output
    counts = tuple(output.shards_for(split) for split in config.splits)
    if output.max_bytes_per_shard is not None and all(count is None for count in counts):
        # Encoded Examples rarely exceed 8x the input bytes (compressed Parquet); the estimate only sizes buckets.
        estimated = max(1, -(-8 * input_bytes // output.max_bytes_per_shard))
    else:
        estimated = max(count or 1 for count in counts)
    ordered, bucket_bits = not config.shuffle.enabled, bucket_bits_for(estimated)
    if config.sequence is not None and ordered:
        # A bucket of SequenceExamples holds groups from all over the input, so the row blocks of the ordered
        # mode do not apply: input-order keys (file index, then line) in hash mode, one histogram bucket per file.
        ordered, bucket_bits = False, MAX_BUCKET_BITS
    return ShardingSpec(
        splits=tuple(config.splits), num_shards=counts,
        max_bytes_per_shard=output.max_bytes_per_shard if all(count is None for count in counts) else None,
        ordered=ordered, bucket_bits=bucket_bits, compression=output.compression,
    )


# --------------------------------------------------------------------------- the output directory


def normalized(config: dict) -> dict:
    return json.loads(json.dumps(config))


def output_root_of(config: BuildConfig) -> str:
    """The output path, absolute for local paths: workers may run in another directory."""
    return config.output.path if fs.is_remote(config.output.path) else os.path.abspath(config.output.path)


def check_output_place(output_root: str, shown: str) -> None:
    """The output is a directory (or can become one) whose parent this process can write, on a disk with room.

    A probe file is written and removed in the nearest existing directory, so a read-only
    directory or a full disk is found now, not after the whole pipeline ran. Object stores are
    checked when the run starts (listing and writing there needs credentials).
    """
    if fs.is_remote(output_root):
        return
    if os.path.exists(output_root) and not os.path.isdir(output_root):
        raise OutputNotWritableError(f"output.path {shown} is a file, not a directory; choose another output.path")
    existing = os.path.dirname(output_root)
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            raise OutputNotWritableError(f"output.path {shown} cannot be created: {existing} is not a directory")
        existing = os.path.dirname(existing)
    _probe(existing, shown)  # the staging directory and the lock file go beside the output
    if os.path.isdir(output_root):
        _probe(output_root, shown)


def _probe(directory: str, shown: str) -> None:
    probe = os.path.join(directory, f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        reason = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
        raise OutputNotWritableError(f"output.path {shown}: cannot write in {directory} ({reason})") from error
    finally:
        with contextlib.suppress(OSError):  # a probe that could not be created leaves nothing to remove
            os.unlink(probe)


def _user_entries(output_root: str, listing: Mapping[str, int] | None = None) -> list[str]:
    """Entries of an output directory without a manifest: all the user's (a plan's probe file aside, and the objects an
    interrupted run wrote straight into a bucket output, which recovery removes: ``tfrbeam.beam.publish``)."""
    return sorted(name for name in entries_besides_runs_objects(output_root, listing)
                  if not name.startswith(PROBE_PREFIX))


def check_output_dir(output_root: str, resolved_config: dict, overwrite: bool, shown: str | None = None,
                     listing: Mapping[str, int] | None = None) -> None:
    """Refuse to build into a directory holding another dataset (or other files) unless ``overwrite``.

    A directory holding the same dataset (same resolved config) may be rebuilt: the result is the
    same bytes. A damaged manifest is replaced only with ``overwrite``. ``listing``: a bucket output's objects
    (``fs.list_objects``), just listed by the caller; the manifest is then read only when it is listed.
    """
    shown = shown or output_root
    if overwrite:
        check_manifest_file(output_root)  # a FIFO, link or sparse giant there: refused before anything is touched
        return
    # In a bucket each name tried is a request: the new name, then the listing below (needed anyway) shows the old one.
    names: tuple[str, ...] = (MANIFEST_NAME,) if fs.is_remote(output_root) else MANIFEST_NAMES
    others: list[str] | None = None
    try:
        if listing is not None:
            others = _user_entries(output_root, listing)
            names = tuple(name for name in MANIFEST_NAMES if name in others)[:1]
        manifest = read_manifest(output_root, BEAM_FILES, names=names) if names else None
        if manifest is None and names == (MANIFEST_NAME,) and listing is None:
            others = _user_entries(output_root)
            if LEGACY_MANIFEST_NAME in others:
                manifest = read_manifest(output_root, BEAM_FILES, names=(LEGACY_MANIFEST_NAME,))
    except ManifestError:
        raise
    except Exception as error:
        first = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise OutputNotWritableError(
            f"output.path {shown}: cannot look at the output ({type(error).__name__}: {first}); check the path, "
            "the network and the credentials"
        ) from error
    if manifest is not None:
        previous = manifest.rest.get("config")
        if previous == normalized(resolved_config):
            return
        differing = _differing_keys(previous or {}, normalized(resolved_config))
        raise OutputExistsError(
            f"{shown} holds a different dataset (its config differs at {', '.join(differing) or 'the top level'}); "
            "pass --overwrite to replace it, or choose another output.path"
        )
    others = _user_entries(output_root) if others is None else others
    if others:
        listed = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise OutputExistsError(
            f"{shown} is not empty ({listed}) and holds no tfrbeam dataset manifest; "
            "pass --overwrite to build into it anyway (files that are not part of a dataset are kept), "
            "or choose another output.path"
        )


def check_users_paths_keepable(output_root: str, config: BuildConfig, shown: str) -> None:
    """Before anything runs, locally: refuse (naming them) a folder owner this process cannot keep, a manifest that is no
    readable one, and paths of the user's where the new dataset's split folders, manifest or shards go. The publish
    checks again with every file it made (``tfrbeam.builder.pipeline.user_files``)."""
    if fs.is_remote(output_root) or not os.path.isdir(output_root) or os.path.islink(output_root):
        return
    check_folder_owner(output_root, shown)
    refuse_conflicts(output_root, keep_plan(output_root, old_dataset_names(output_root), _expected_names(config)))


def _expected_names(config: BuildConfig) -> DatasetNames:
    """What the new dataset will hold that is known before it runs: split folders, reserved names, counted shards."""
    shards = [f"{split}/{shard_file_name(split, shard, count, config.output.compression)}"
              for split in config.splits for count in [config.output.shards_for(split) or 0] for shard in range(count)]
    return DatasetNames.of([*RESERVED_FILES, *shards], config.splits)


# --------------------------------------------------------------------------- an output inside the input


def check_output_outside_inputs(config: BuildConfig, inputs: list[InputFile]) -> None:
    """Refuse a build that would read its own output: an input glob matching files the build writes (its shards,
    manifest, indexes, statistics, what it stages beside the output), or input files that are the output's dataset.

    Without this, each same-config rebuild reads the last one's shards as input too (1,000 rows, then 2,000...).
    """
    output_root = output_root_of(config)
    written = _written_examples(config, output_root)
    for key, pattern in _input_patterns(config):
        matcher = re.compile(FileSystem.translate_pattern(_absolute_pattern(pattern)))
        hit = next((path for path in written if matcher.fullmatch(path)), None)
        if hit is not None:
            raise ConfigError(
                f"{key}: {pattern!r} matches files this build writes into its output {config.output.path} (such as "
                f"{hit}), so every rebuild would read the last one's output as input; narrow the glob to leave "
                "output.path out, or choose an output.path outside it"
            )
    inside = [item.path for item in inputs if _is_inside(_absolute_pattern(item.path), output_root)]
    if inside:
        own = old_dataset_names(output_root).files
        prefix = output_root.rstrip("/") + "/"
        read = [path for path in inside if _absolute_pattern(path)[len(prefix):] in own]
        if read:
            raise ConfigError(
                f"input.path: {read[0]} is a file of the dataset at output.path {config.output.path}, which this build "
                "replaces; a build cannot read its own output: choose another output.path"
            )


def _input_patterns(config: BuildConfig) -> list[tuple[str, str]]:
    if isinstance(config.split_by, SplitFiles):
        return [(f"splits.{name}", pattern) for name, pattern in config.split_by.patterns]
    path = config.input.path
    if config.input.format == "tfrecord" and not fs.is_remote(path) and find_manifest(path) is not None:
        return []  # a dataset directory: it gives the shards its manifest lists, checked as input files
    return [("input.path", path)]


def _absolute_pattern(pattern: str) -> str:
    """A local path or glob made absolute (as the output root is), a local directory as the files in it; URLs as given."""
    if fs.is_remote(pattern):
        return pattern
    absolute = os.path.abspath(pattern) + ("/" if pattern.endswith("/") else "")
    if absolute.endswith("/") or (not _has_glob(pattern) and os.path.isdir(pattern)):
        return absolute.rstrip("/") + "/*"  # what list_inputs lists: the files directly in it
    return absolute


def _has_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def _is_inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _written_examples(config: BuildConfig, output_root: str) -> list[str]:
    """Paths of the kinds of file a build writes, in its output and in its staging directory beside it."""
    join = posixpath.join if fs.is_remote(output_root) else os.path.join
    relatives = [MANIFEST_NAME, *RESERVED_FILES, f"{ERRORS_DIR_NAME}/00000-input.jsonl"]
    for split in config.splits:
        shard = f"{split}/{shard_file_name(split, 0, config.output.shards_for(split) or 1, config.output.compression)}"
        name = posixpath.basename(shard)
        relatives += [shard, index_path_for(shard), f"{DALI_DIR_NAME}/{split}/{name}.idx"]
    staging = staging_path(output_root, "0" * 16)
    return [join(root, *relative.split("/")) for root in (output_root, join(staging, "dataset"), staging)
            for relative in relatives]


def _differing_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(dict.fromkeys([*old, *new]))
        return [path for key in keys for path in _differing_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]

