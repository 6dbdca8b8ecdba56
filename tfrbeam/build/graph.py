"""The dataset build as a Beam pipeline: read → convert → key → shuffle/split/shard → commit atomically.

``build_pipeline(pipeline, config)`` adds the whole build to a pipeline. Everything that reads
local state happens here, at construction: the config, the input listing and fingerprints, the
resolved features and the output directory check. Workers get it all inside the pipeline.

Atomic output: shards, their read indexes and the dead letters are written under
``{output.path}/.tfrbeam-tmp-<run>/``. Only when every shard is written and the bad-row limit is
met does one final step delete the old manifest, replace the split directories (and
``_errors/``), rename the new files into place and write ``dataset_info.json`` last. A reader that
finds the manifest finds a complete dataset; old and new shards never mix.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import platform
import posixpath
import time
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PortableOptions, StandardOptions

import tfrbeam
from tfrbeam.build.config import BuildConfig, config_to_dict, resolve_config, with_features
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.beam.filesystem import join as join_path
from tfrbeam.manifest import ERRORS_DIR_NAME, MANIFEST_FORMAT, MANIFEST_NAME, feature_entries, manifest_bytes, parse_example_spec
from tfrbeam.manifest import read_manifest as _read_manifest
from tfrbeam.build.shuffle import (
    KeyedRecords,
    ShardFile,
    ShardingSpec,
    ShardPlan,
    WriteShuffledShards,
    bucket_bits_for,
    content_digests,
    input_order_keys,
    record_checksums,
    release_held_pieces,
    seeded_sort_keys,
    split_indices,
)
from tfrbeam.build.inputs import InputFile, ReadTabular, convert_source_batch, list_inputs
from tfrbeam.columnar_encode import encode_record_batch
from tfrbeam.errors import BadRecordError, ConfigError, OutputExistsError, TooManyBadRecordsError
from tfrbeam.build.features import FeatureSpec
from tfrbeam.record_index import INDEX_DIR_NAME

__all__ = ["BuildRun", "TEMP_DIR_PREFIX", "build_pipeline", "check_output_dir", "remove_temp_dir"]

_LOG = logging.getLogger(__name__)

TEMP_DIR_PREFIX = ".tfrbeam-tmp-"
# Largest piece of encoded records one element carries (also capped at one output shard's size).
PIECE_MAX_BYTES = 32 << 20
# In-process local runs keep up to this many bytes of prepared pieces in memory rather than in spill files.
HELD_PIECES_MAX_BYTES = 2 << 30
_PROGRESS_SECONDS = 5.0
_PIECES, _BAD_ROWS, _STATS = "pieces", "bad_rows", "stats"


@dataclasses.dataclass(frozen=True)
class BuildRun:
    """What build_pipeline fixed at construction: where things go and what the manifest will say."""

    config: BuildConfig
    features: tuple[FeatureSpec, ...]
    inputs: tuple[dict[str, Any], ...]
    output_path: str  # as the config gives it (for messages and the manifest)
    output_root: str  # the same, absolute for local paths: workers may run in another directory
    temp_dir: str
    runner: str
    started: str

    @property
    def manifest_path(self) -> str:
        return manifest_path(self.output_path)

    @property
    def dead_letter_path(self) -> str | None:
        if self.config.errors.on_bad_record != "dead_letter":
            return None
        return join_path(self.output_path, ERRORS_DIR_NAME)


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def build_pipeline(
    pipeline: beam.Pipeline, config: BuildConfig, *, overwrite: bool = False, spill: bool | None = None
) -> BuildRun:
    """Add the dataset build described by ``config`` to ``pipeline``; returns what was fixed at construction.

    ``spill`` (default: on for the local runners) keeps the records' bytes in files under the temp
    dir while only keys and offsets go through Beam, or in this process's memory when every worker
    runs in it (up to ``held_piece_budget()``); see ``uses_local_workers``. After a failed run,
    ``remove_temp_dir`` frees both.

    Raises ConfigError (features that do not fit the input, an unknown split_key) and
    OutputExistsError (the output holds another dataset and ``overwrite`` is false) before anything runs.
    """
    inputs = list_inputs(config.input.path)
    features, columns = resolve_features(config, inputs)
    _check_split_key(config, features)
    resolved = with_features(config, features)
    check_output_dir(config.output.path, config_to_dict(resolved), overwrite)
    runner = pipeline.options.view_as(StandardOptions).runner or "DirectRunner"
    output_root = config.output.path if _is_remote(config.output.path) else os.path.abspath(config.output.path)
    run = BuildRun(
        config=resolved, features=features,
        inputs=tuple({"path": item.path, "size": item.size, "mtime": item.mtime} for item in inputs),
        output_path=config.output.path, output_root=output_root,
        temp_dir=join_path(output_root, TEMP_DIR_PREFIX + uuid.uuid4().hex[:12]),
        runner=runner if isinstance(runner, str) else type(runner).__name__, started=_utc_now(),
    )
    spec = _sharding_spec(resolved, sum(item.size for item in inputs))
    converted = (
        pipeline
        | "ReadInputs" >> ReadTabular(config.input, columns, inputs=inputs)
        | "ConvertAndKey" >> beam.ParDo(_ConvertAndKey(run, spec, [item.path for item in inputs]))
        .with_output_types(KeyedRecords).with_outputs(_BAD_ROWS, _STATS, main=_PIECES)
    )
    pieces = converted[_PIECES]
    if spill is None:
        spill = uses_local_workers(pipeline.options)
    hold_bytes = held_piece_budget() if spill and workers_share_this_process(pipeline.options) else 0
    shards = pieces | "Shuffle" >> WriteShuffledShards(spec, run.temp_dir, spill=spill, hold_bytes=hold_bytes)
    # The commit's inputs are side inputs, so they are complete before it runs; no combine (each
    # costs several stages on the local runners) and no dead-letter stages unless they are written.
    dead_letters = ()
    if run.dead_letter_path is not None:
        dead_letters = beam.pvalue.AsList(
            converted[_BAD_ROWS]
            | "GroupBadRowsByFile" >> beam.GroupByKey()
            | "WriteDeadLetters" >> beam.ParDo(_WriteDeadLetters(run.temp_dir))
        )
    _ = shards["plan"] | "Commit" >> beam.ParDo(
        _CommitDataset(run),
        files=beam.pvalue.AsList(shards["files"]),
        counts=beam.pvalue.AsList(converted[_STATS]),
        dead_letters=dead_letters,
    )
    return run


_LOCAL_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner", "PrismRunner")


def _runner_name(options) -> str:
    runner = options.view_as(StandardOptions).runner
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else "DirectRunner"
    return name.rsplit(".", 1)[-1]


def uses_local_workers(options) -> bool:
    """Whether every worker runs on this machine (Beam's local runners, or a portable job server embedded here).

    Then the records' bytes are spilled to files under the temp dir instead of going through the
    runner's GroupByKey: the local runners copy every element several times through their data
    plane and hold each stage's output in memory, which would cost several times the dataset in
    RAM. Distributed runners shuffle the bytes themselves (and no element exceeds one piece).
    When the workers even share this process (see workers_share_this_process), the pieces stay in
    its memory instead of spill files, up to held_piece_budget().
    """
    name = _runner_name(options)
    if name in _LOCAL_RUNNERS:
        return True
    return name == "PortableRunner" and options.view_as(PortableOptions).job_endpoint == "embed"


def workers_share_this_process(options) -> bool:
    """Whether every worker runs inside this process: the DirectRunner in its in_memory or multi_threading mode."""
    if _runner_name(options) not in ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner"):
        return False
    return options.view_as(DirectOptions).direct_running_mode in ("in_memory", "multi_threading")


def held_piece_budget() -> int:
    """Bytes of prepared pieces a build keeps in this process's memory instead of spill files (see uses_local_workers).

    A quarter of the physical memory, at most HELD_PIECES_MAX_BYTES; pieces beyond it are spilled.
    """
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0
    return min(HELD_PIECES_MAX_BYTES, physical // 4)


def resolve_features(config: BuildConfig, inputs: list[InputFile]) -> tuple[tuple[FeatureSpec, ...], list[str]]:
    """The features with types and list shapes settled on the first input file, and the input columns they read.

    Delegates to the config's own schema check (every problem reported at once, defaults checked
    against inferred types, input.columns honoured; inferred CSV features omit nulls only when
    null_values are configured).
    """
    resolved = resolve_config(config, files=inputs)
    return resolved.features, sorted(resolved.input.columns)


def _check_split_key(config: BuildConfig, features: tuple[FeatureSpec, ...]) -> None:
    names = {spec.name for spec in features}
    unknown = [name for name in config.split_key or () if name not in names]
    if unknown:
        raise ConfigError(
            f"split_key: {', '.join(map(repr, unknown))} {'is not a feature' if len(unknown) == 1 else 'are not features'} "
            f"(allowed: the feature names {', '.join(sorted(names))}); the split key is hashed from the converted feature values"
        )


def _sharding_spec(config: BuildConfig, input_bytes: int) -> ShardingSpec:
    output = config.output
    counts = tuple(output.shards_for(split) for split in config.splits)
    if output.max_bytes_per_shard is not None and all(count is None for count in counts):
        # Encoded Examples rarely exceed 8x the input bytes (compressed Parquet); the estimate only sizes buckets.
        estimated = max(1, -(-8 * input_bytes // output.max_bytes_per_shard))
    else:
        estimated = max(count or 1 for count in counts)
    return ShardingSpec(
        splits=tuple(config.splits), num_shards=counts,
        max_bytes_per_shard=output.max_bytes_per_shard if all(count is None for count in counts) else None,
        ordered=not config.shuffle.enabled, bucket_bits=bucket_bits_for(estimated),
        compression=output.compression,
    )


# --------------------------------------------------------------------------- the output directory


def _entries(directory: str) -> list[str]:
    """Names directly inside ``directory`` (files, sub-directories, hidden ones too); [] when it does not exist."""
    if not _is_remote(directory):
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    prefix = directory.rstrip("/") + "/"
    return sorted({item.path[len(prefix):].split("/")[0] for item in _match(prefix + "**") if item.path.startswith(prefix)})


def _normalized(config: dict) -> dict:
    return json.loads(json.dumps(config))


def check_output_dir(output_path: str, resolved_config: dict, overwrite: bool) -> None:
    """Refuse to build into a directory holding another dataset (or other files) unless ``overwrite``.

    A directory holding the same dataset (same resolved config) may be rebuilt: the result is the
    same bytes. Leftover temp directories of interrupted builds are ignored here and removed by
    the next successful build.
    """
    if overwrite:
        return
    manifest = read_manifest(output_path)
    if manifest is not None:
        previous = manifest.get("config")
        if previous == _normalized(resolved_config):
            return
        differing = _differing_keys(previous or {}, _normalized(resolved_config))
        raise OutputExistsError(
            f"{output_path} holds a different dataset (its config differs at {', '.join(differing) or 'the top level'}); "
            "pass --overwrite to replace it, or choose another output.path"
        )
    others = [name for name in _entries(output_path) if not name.startswith(TEMP_DIR_PREFIX)]
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise OutputExistsError(
            f"{output_path} is not empty ({shown}) and holds no tfrbeam dataset manifest; "
            "pass --overwrite to build into it anyway (its split directories and _errors/ are replaced), "
            "or choose another output.path"
        )


def _differing_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(dict.fromkeys([*old, *new]))
        return [path for key in keys for path in _differing_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]


# ---------------------------------------------------------------------------- convert and key


class _ConvertAndKey(beam.DoFn):
    """Converts a source batch to Examples and emits them keyed for the shuffle, in pieces of bounded size.

    Side outputs: bad rows per input file (dead_letter), and (rows read, bad rows) counts.
    """

    def __init__(self, run: BuildRun, spec: ShardingSpec, input_paths: list[str]):
        self._features = run.features
        self._split_key = run.config.split_key
        self._fractions = list(run.config.splits.values())
        self._seed = run.config.shuffle.seed if run.config.shuffle.enabled else None
        self._action = run.config.errors.on_bad_record
        self._input_index = {path: index for index, path in enumerate(sorted(input_paths))}
        cap = spec.max_bytes_per_shard
        self._piece_bytes = min(PIECE_MAX_BYTES, cap) if cap else PIECE_MAX_BYTES

    def setup(self) -> None:
        self._rows = 0
        self._started = self._last_log = time.monotonic()

    def process(self, source) -> Iterator[Any]:
        converted = convert_source_batch(source, self._features)
        bad_rows = converted.bad_rows
        rows_read = source.batch.num_rows + len(source.bad_rows)  # the reader's rejects are not in the batch
        yield beam.pvalue.TaggedOutput(_STATS, (rows_read, len(bad_rows)))
        if bad_rows:
            beam.metrics.Metrics.counter("tfrbeam", "bad_rows").inc(len(bad_rows))
            if self._action == "fail":
                first = min(bad_rows, key=lambda row: row.line)
                raise BadRecordError(
                    f"{first.describe()} (errors.on_bad_record is fail; set it to skip or dead_letter to keep going)"
                )
            if self._action == "dead_letter":
                yield beam.pvalue.TaggedOutput(_BAD_ROWS, (self._input_index.get(source.path, -1), bad_rows))
        batch = converted.batch
        if batch.num_rows:
            yield from self._pieces(source, batch, converted.kept_rows)
        self._progress(rows_read)

    def _pieces(self, source, batch, kept_rows: np.ndarray) -> Iterator[KeyedRecords]:
        encoded = encode_record_batch(batch)
        data, offsets = encoded.data, encoded.offsets
        digests, crcs = record_checksums(data, offsets)
        if self._split_key:
            key_encoded = encode_record_batch(batch.select(list(self._split_key)))
            split_hashes = content_digests(key_encoded.data, key_encoded.offsets)[:, 0]
        else:
            split_hashes = digests[:, 0]
        split = split_indices(split_hashes, self._fractions)
        if self._seed is not None:
            keys = seeded_sort_keys(digests[:, 1], self._seed)
        else:
            keys = input_order_keys(self._input_index[source.path], np.asarray(source.lines, dtype=np.int64)[kept_rows])
        start = 0
        while start < len(keys):
            end = int(np.searchsorted(offsets, offsets[start] + self._piece_bytes, side="right")) - 1
            end = min(max(end, start + 1), len(keys))
            base = offsets[start]
            yield KeyedRecords(split[start:end], keys[start:end], offsets[start:end + 1] - base, data[base:offsets[end]],
                               crcs=crcs[start:end])
            start = end

    def _progress(self, rows: int) -> None:
        self._rows += rows
        now = time.monotonic()
        if now - self._last_log >= _PROGRESS_SECONDS:
            self._last_log = now
            _LOG.info("read and encoded %d rows (%.0f rows/s in this worker)", self._rows, self._rows / (now - self._started))


def _sum_counts(counts) -> tuple[int, int]:
    rows, bad = 0, 0
    for read, failed in counts:
        rows += read
        bad += failed
    return rows, bad


# ------------------------------------------------------------------------------ dead letters


@dataclasses.dataclass(frozen=True)
class DeadLetterFile:
    """A written dead-letter file (JSON lines) in the temp dir."""

    relative_path: str
    temp_path: str
    count: int


class _WriteDeadLetters(beam.DoFn):
    """Writes one input file's bad rows, in line order, as JSON lines: file, line, reason, raw."""

    def __init__(self, temp_dir: str):
        self._temp_dir = temp_dir

    def process(self, element) -> Iterator[DeadLetterFile]:
        input_index, batches = element
        rows = sorted((row for batch in batches for row in batch), key=lambda row: (row.path, row.line))
        if not rows:
            return
        base = posixpath.basename(rows[0].path.replace("\\", "/")) or "input"
        relative = f"{ERRORS_DIR_NAME}/{input_index:05d}-{base}.jsonl"
        temp_path = join_path(self._temp_dir, ERRORS_DIR_NAME, relative.split("/", 1)[1])
        with FileSystems.create(temp_path, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            for row in rows:
                line = json.dumps({"file": row.path, "line": row.line, "reason": row.reason, "raw": row.raw}, ensure_ascii=False)
                handle.write(line.encode("utf-8") + b"\n")
        yield DeadLetterFile(relative, temp_path, len(rows))


# ------------------------------------------------------------------------------------ commit


class _CommitDataset(beam.DoFn):
    """The last step: check the bad-row limit, move every file into place, write the manifest last."""

    def __init__(self, run: BuildRun):
        self._run = run

    def process(
        self, plan: ShardPlan, files: list[ShardFile], counts: list[tuple[int, int]], dead_letters: list[DeadLetterFile]
    ):
        run = self._run
        rows_read, bad = _sum_counts(counts)
        limit = run.config.errors.max_bad_fraction
        if bad and bad > limit * rows_read:
            self._discard_shards(files)
            kept = (f"; the bad rows are kept in {join_path(run.temp_dir, ERRORS_DIR_NAME)}" if dead_letters else "")
            raise TooManyBadRecordsError(
                f"{bad} of {rows_read} input rows ({bad / max(rows_read, 1):.2%}) were bad, more than "
                f"errors.max_bad_fraction={limit:g} allows; nothing was written to {run.output_path}{kept}"
            )
        self._replace_old_dataset(plan)
        moves = [(item.temp_path, join_path(run.output_root, *item.relative_path.split("/"))) for item in files]
        moves += [
            (item.temp_index_path, join_path(run.output_root, item.split, INDEX_DIR_NAME, posixpath.basename(item.temp_index_path)))
            for item in files if item.temp_index_path
        ]
        moves += [(item.temp_path, join_path(run.output_root, *item.relative_path.split("/"))) for item in dead_letters]
        _move_files(moves)
        manifest = self._manifest(files, plan, rows_read, bad, dead_letters)
        write_manifest(run.output_root, manifest)
        self._remove_temp_dirs()
        _LOG.info("wrote %s", run.manifest_path)
        yield manifest

    def _discard_shards(self, files: list[ShardFile]) -> None:
        paths = [item.temp_path for item in files] + [item.temp_index_path for item in files if item.temp_index_path]
        _delete_quietly(paths)

    def _replace_old_dataset(self, plan: ShardPlan) -> None:
        """Delete the old manifest first, then the split directories and dead letters the new dataset replaces."""
        run = self._run
        old = read_manifest(run.output_root)
        stale = [manifest_path(run.output_root)]
        splits = set(run.config.splits) | set((old or {}).get("splits", {}))
        stale += [join_path(run.output_root, split) for split in sorted(splits)]
        stale.append(join_path(run.output_root, ERRORS_DIR_NAME))
        _delete_quietly([path for path in stale if FileSystems.exists(path)])

    def _manifest(self, files: list[ShardFile], plan: ShardPlan, rows_read: int, bad: int, dead_letters) -> dict:
        run = self._run
        splits = {}
        for split_plan in plan.splits:
            shards = sorted((item for item in files if item.split == split_plan.name), key=lambda item: item.shard)
            splits[split_plan.name] = {
                "num_examples": sum(item.num_examples for item in shards),
                "num_bytes": sum(item.num_bytes for item in shards),
                "shards": [
                    {"path": item.relative_path, "num_examples": item.num_examples, "num_bytes": item.num_bytes,
                     "sha256": item.sha256}
                    for item in shards
                ],
            }
        config = run.config
        return {
            "format": MANIFEST_FORMAT,
            "splits": splits,
            "compression": config.output.compression,
            "features": feature_entries(run.features),
            "parse_example_spec": parse_example_spec(run.features),
            "inputs": list(run.inputs),
            "config": _normalized(config_to_dict(config)),
            "seed": config.shuffle.seed if config.shuffle.enabled else None,
            "order": (
                "shuffled: sorted by a seed-keyed mix of each example's XXH3-128 content hash, ties by bytes"
                if config.shuffle.enabled else "input order: input files sorted by path, then row order"
            ),
            "split_assignment": "XXH3-128 hash of " + (
                f"split_key {list(config.split_key)}" if config.split_key else "the whole example"
            ) + " against cumulative fractions; independent of the seed",
            "versions": {"tfrbeam": tfrbeam.__version__, "apache_beam": beam.__version__, "python": platform.python_version()},
            "runner": run.runner,
            "started": run.started,
            "finished": _utc_now(),
            "rows_read": rows_read,
            "bad_records": {
                "count": bad,
                "action": config.errors.on_bad_record,
                "dead_letter_path": run.dead_letter_path if dead_letters else None,
                "files": sorted(item.relative_path for item in dead_letters),
            },
        }

    def _remove_temp_dirs(self) -> None:
        """Remove this run's temp dir and those left by interrupted earlier builds."""
        run = self._run
        leftovers = [join_path(run.output_root, name) for name in _entries(run.output_root) if name.startswith(TEMP_DIR_PREFIX)]
        _delete_quietly(sorted(set(leftovers) | {run.temp_dir}))


def remove_temp_dir(run: BuildRun) -> None:
    """Remove a failed run's temp dir (its partial shards) and free the pieces it held in memory."""
    release_held_pieces(run.temp_dir)
    _delete_quietly([run.temp_dir])


def _move_files(moves: list[tuple[str, str]]) -> None:
    for directory in sorted({_parent(destination) for _, destination in moves}):
        if not FileSystems.exists(directory):
            try:
                FileSystems.mkdirs(directory)
            except OSError:  # created concurrently, or an object store without directories
                pass
    if moves:
        FileSystems.rename([source for source, _ in moves], [destination for _, destination in moves])


def _is_remote(path: str) -> bool:
    return "://" in path


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if _is_remote(path) else os.path.dirname(path)


def _delete_quietly(paths: list[str]) -> None:
    """Delete files and directory trees (on object stores: every object under the prefix) that exist."""
    doomed: list[str] = []
    for path in paths:
        if not _is_remote(path):
            if FileSystems.exists(path):
                doomed.append(path)
            continue
        if FileSystems.exists(path):
            doomed.append(path)
        doomed += [item.path for item in _match(path.rstrip("/") + "/**")]
    if doomed:
        FileSystems.delete(doomed)


def _match(pattern: str) -> list:
    try:
        return FileSystems.match([pattern])[0].metadata_list
    except (OSError, ValueError):
        return []


def manifest_path(dataset_dir: str) -> str:
    return join_path(dataset_dir, MANIFEST_NAME)


def read_manifest(dataset_dir: str) -> dict | None:
    return _read_manifest(dataset_dir, BEAM_FILES)


def write_manifest(dataset_dir: str, manifest: dict) -> str:
    final_path = manifest_path(dataset_dir)
    temp_path = join_path(dataset_dir, f".{MANIFEST_NAME}.tmp")
    fs.write_bytes(temp_path, manifest_bytes(manifest), "application/json")
    fs.delete_files([final_path])
    fs.rename([(temp_path, final_path)])
    return final_path
