"""Statistics computed locally from TFRecord files: read in blocks, decoded columnar, accumulated, merged.

Files are read a block of records at a time (``tfrbeam.tfrecord.blocks``) and decoded with the
manifest's feature types (``stats_schema``); each file's accumulator is built on its own (in
worker processes when the data is large) and the results are merged, exactly as the Beam
combine merges its accumulators.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import posixpath
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa

from tfrbeam.base import fileops
from tfrbeam.base.file_access import LOCAL_FILES, files_for
from tfrbeam.base.object_store import OBJECT_STORE_FILES, input_size, is_object_store, open_to_read, opened_size
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.errors import ConfigError, DatasetChangedError, ExampleDecodeError
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.manifest import find_manifest, manifest_path
from tfrbeam.layout.manifest_schema import EXAMPLE, Manifest
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.stats.accumulators import SplitAccumulator, stats_schema
from tfrbeam.stats.files import STATS_HTML, STATS_JSON
from tfrbeam.stats.report import dataset_stats
from tfrbeam.tfrecord.blocks import RecordBlock, record_blocks

if TYPE_CHECKING:
    from tfrbeam.dataset.reader import Segment
    from tfrbeam.layout.generation import Generation

_LOG = logging.getLogger(__name__)

BLOCK_RECORDS = 8192
PROCESSES_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves
FILES_SPLIT = "files"  # the split name of plain TFRecord files (no build, no manifest)


@dataclasses.dataclass(frozen=True)
class StatsInput:
    """What statistics read: each split's files, the feature types and shapes, and each file's compression.

    The compression is per file, as the readers resolve it: one folder may hold TensorFlow's GZIP,
    ZLIB and uncompressed files side by side (``cat``, ``verify`` and ``open_dataset`` read them so).
    """

    splits: dict[str, tuple[str, ...]]
    feature_types: dict[str, str]
    shapes: dict[str, Any]
    compressions: Mapping[str, str | None]  # every file's path: its codec (None, "gzip" or "zlib")
    source: str
    manifest: Manifest | None = None
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)  # a dataset's shard path: its manifest's records
    segments: Mapping[str, Segment] = dataclasses.field(default_factory=dict)  # a shard's path: its manifest figures
    generation: Generation | None = None  # a dataset's manifest as it was when the read started


def require_examples(dataset: DatasetDirectory) -> None:
    """Refuse a dataset of SequenceExamples in one line, before any work."""
    if dataset.record_type != EXAMPLE:
        raise ConfigError(f"{dataset.path} holds {dataset.record_type}s; stats/export read Example datasets only")


def require_example_dataset(path: str) -> None:
    """Refuse ``path`` when it lies in a SequenceExample dataset: the dataset directory itself, a split directory,
    or shards (files or a glob) inside one."""
    directory = dataset_holding(path)
    if directory is not None:
        require_examples(_dataset(directory))


def dataset_holding(path: str) -> str | None:
    """The dataset directory (one with a manifest) that ``path`` is, or lies in as a split directory, a shard or a glob
    of shards; None when there is none. Local or in a bucket."""
    return next((directory for directory in _dataset_candidates(path) if directory and _has_manifest(directory)), None)


def _dataset_candidates(path: str) -> list[str]:
    if not is_object_store(path):
        here = path if os.path.isdir(path) else os.path.dirname(path)
        return [here, os.path.dirname(here.rstrip(os.sep))]
    # A prefix or an object: telling which costs a request too, so the path and two levels up are tried.
    text = path.rstrip("/")
    bucket_root = "/".join(text.split("/", 3)[:3])
    candidates = [text]
    while len(candidates) < 3 and candidates[-1] != bucket_root:
        candidates.append(posixpath.dirname(candidates[-1]))
    return candidates


def _has_manifest(directory: str) -> bool:
    return find_manifest(directory, OBJECT_STORE_FILES if is_object_store(directory) else LOCAL_FILES) is not None


def input_from_dataset(dataset: DatasetDirectory, wanted: Sequence[str] | None) -> StatsInput:
    """What statistics (and the export) read of a build directory, from its manifest alone: shard paths joined
    by the directory's ``files`` (any filesystem), types and shapes of its features, and its shards' compression."""
    require_examples(dataset)
    names = list(wanted) if wanted else list(dataset.split_names)
    if not names:
        raise ConfigError(f"{dataset.path}: the manifest lists no splits")
    shards = {name: dataset.shards([name]) for name in names}
    features = dataset.manifest.features or {}
    codec = dataset.compression  # the manifest's word, not a guess from a shard's name
    return StatsInput(
        splits={name: tuple(shard.path for shard in listed) for name, listed in shards.items()},
        feature_types={name: entry["type"] for name, entry in features.items()},
        shapes={name: entry.get("shape") for name, entry in features.items()},
        compressions={shard.path: codec for listed in shards.values() for shard in listed},
        source=dataset.path,
        manifest=dataset.manifest,
        counts={shard.path: shard.num_examples for listed in shards.values() for shard in listed},
    )


def resolve_input(path: str, splits: Sequence[str] | None = None) -> StatsInput:
    """A ``tfrbeam build`` directory (its manifest) or TFRecord files (a glob; features inferred as ``open_dataset`` does)."""
    if (is_object_store(path) or os.path.isdir(path)) and _has_manifest(path):
        return _from_build(path, splits)
    if splits:
        raise ConfigError(f"--split needs a directory written by `tfrbeam build` (with {MANIFEST_NAME}); {path!r} has none")
    require_example_dataset(path)
    from tfrbeam.dataset import open_dataset  # here, not at the top: worker processes never need it

    dataset = open_dataset(path)
    types = {name: feature.dtype for name, feature in dataset.features.items()}
    shapes = {name: list(feature.shape) if hasattr(feature, "shape") else None for name, feature in dataset.features.items()}
    files = tuple(shard.path for shard in dataset.source.files)
    compressions = {shard.path: shard.compression for shard in dataset.source.files}  # open_dataset's, per file
    return StatsInput({FILES_SPLIT: files}, types, shapes, compressions, path)


def _from_build(directory: str, wanted: Sequence[str] | None) -> StatsInput:
    """Each split's shards as ``open_dataset`` finds them (it reads and checks the manifest); types and shapes from the
    manifest."""
    from tfrbeam.dataset import open_dataset

    dataset = _dataset(directory)
    require_examples(dataset)
    names = list(wanted) if wanted else list(dataset.split_names)
    sources = {name: open_dataset(directory, split=name).source for name in names}
    if not sources:
        raise ConfigError(f"{directory}: the manifest lists no splits")
    first = next(iter(sources.values()))
    assert first.manifest is not None and first.generation is not None  # a dataset directory is opened through its manifest
    for source in sources.values():  # each split was opened on its own: all must be the same generation
        assert source.generation is not None
        if source.generation.digest != first.generation.digest:
            raise DatasetChangedError(directory, first.generation.run_id, source.generation.run_id)
    features = first.manifest.features or {}
    return StatsInput(
        splits={name: tuple(shard.path for shard in source.files) for name, source in sources.items()},
        feature_types={name: entry["type"] for name, entry in features.items()},
        shapes={name: entry.get("shape") for name, entry in features.items()},
        compressions={shard.path: shard.compression for source in sources.values() for shard in source.files},
        source=directory,
        manifest=first.manifest,
        counts={shard.path: shard.num_records for source in sources.values() for shard in source.files
                if shard.num_records is not None},
        segments={shard.path: _segment(shard, first.generation) for source in sources.values() for shard in source.files},
        generation=first.generation,
    )


def _segment(shard: Any, generation: Any) -> Segment:
    """A whole shard as the reader checks it: the manifest's record count and byte size, the pinned generation."""
    from tfrbeam.dataset.reader import Segment

    return Segment(shard.path, shard.compression, expected_records=shard.num_records, expected_bytes=shard.num_bytes,
                   generation=generation)


@contextlib.contextmanager
def checked_shard(segment: Segment) -> Iterator[BinaryIO]:
    """The shard opened, proven to belong to the pinned generation, its size the manifest's (as ``read_segment``)."""
    from tfrbeam.dataset.reader import check_shard_size

    with open_to_read(segment.path, prefetch=True) as handle:
        if segment.generation is not None:
            segment.generation.check()
        check_shard_size(segment, opened_size(handle))
        yield handle


def check_shard_sizes(segments: Mapping[str, Segment]) -> None:
    """Every shard's size against the manifest's (one stat each), before any work is done or any file written."""
    from tfrbeam.dataset.reader import check_shard_size

    for segment in segments.values():
        check_shard_size(segment)


def check_shard_records(segment: Segment | None, records: int) -> None:
    """After reading a whole shard: its record count against the manifest's (``ShardMismatchError``)."""
    if segment is not None:
        from tfrbeam.dataset.reader import check_shard_count

        check_shard_count(segment, records)


def _dataset(directory: str) -> DatasetDirectory:
    files = files_for(directory)
    try:
        return DatasetDirectory.open(directory, files)
    except OSError as error:
        raise ConfigError(f"{manifest_path(directory, files)}: cannot read the dataset manifest: {error}") from error


def accumulate_file(
    path: str, feature_types: Mapping[str, str], compression: str | None = "auto", limit: int | None = None,
    progress: Callable[[int], None] | None = None, segment: Segment | None = None,
) -> SplitAccumulator:
    """The statistics of one TFRecord file of Examples (its first ``limit`` records when given).

    A dataset's shard comes with its ``segment``: its size and record count are checked against the manifest.
    """
    schema = stats_schema(feature_types)
    accumulator = SplitAccumulator(feature_types)
    with checked_shard(segment) if segment is not None else contextlib.nullcontext(path) as source:
        records = 0
        for block in record_blocks(source, compression, block_length=BLOCK_RECORDS, limit=limit, name=path):
            accumulator.add(decode_block(path, block, schema))
            records += block.num_records
            if progress is not None:
                progress(len(block.starts))
    if limit is None:
        check_shard_records(segment, records)
    return accumulator


def decode_block(path: str, block: RecordBlock, schema: pa.Schema) -> pa.RecordBatch:
    """One block decoded with ``schema``; a malformed record is named by file and byte offset."""
    try:
        return examples_to_record_batch((block.data, block.starts, block.ends), schema=schema)
    except ExampleDecodeError as error:
        for index, offset in enumerate(block.offsets.tolist()):
            try:
                examples_to_record_batch([block.payload(index)], schema=schema)
            except ExampleDecodeError as single:
                raise ExampleDecodeError(f"{path}: the record at offset {offset}: {single}") from error
        raise ExampleDecodeError(f"{path}: records at offsets {block.offsets[0]}..{block.offsets[-1]}: {error}") from error


def accumulate_splits(source: StatsInput, workers: int | None = None) -> dict[str, SplitAccumulator]:
    """Each split's merged accumulator, files read in parallel worker processes when the data is large."""
    with replaced_if_gone(source.generation):
        return _accumulate_splits(source, workers)


@contextlib.contextmanager
def replaced_if_gone(generation: Generation | None) -> Iterator[None]:
    """A shard gone while a dataset is read (a concurrent ``--overwrite`` removed it) is ``DatasetChangedError`` naming
    both runs, when the manifest shows the dataset was replaced; any other missing file stays what it is."""
    try:
        yield
    except FileNotFoundError:
        if generation is not None:
            generation.check()
        raise


def _accumulate_splits(source: StatsInput, workers: int | None) -> dict[str, SplitAccumulator]:
    tasks = [(split, path) for split, paths in source.splits.items() for path in paths]
    results = {split: SplitAccumulator(source.feature_types) for split in source.splits}
    check_shard_sizes(source.segments)
    total_bytes = sum(input_size(path) for _, path in tasks)
    if workers is None:
        workers = (os.cpu_count() or 1) if total_bytes >= PROCESSES_MIN_BYTES else 1
    segments = source.segments
    if workers <= 1 or len(tasks) <= 1:
        for split, path in tasks:
            results[split].merge(accumulate_file(path, source.feature_types, source.compressions[path],
                                                 segment=segments.get(path)))
        return results
    context = multiprocessing.get_context("spawn")  # no fork of a process that may run threads
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [(split, pool.submit(accumulate_file, path, source.feature_types, source.compressions[path], None, None,
                                       segments.get(path)))
                   for split, path in tasks]
        for split, future in futures:  # merged in file order, so sums round the same way on every run
            results[split].merge(future.result())
    return results


def compute_stats(
    path: str, splits: Sequence[str] | None = None, thresholds: Mapping[str, float] | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The ``stats.json`` document of a build directory or of TFRecord files."""
    source = resolve_input(path, splits)
    return dataset_stats(accumulate_splits(source, workers), source.shapes, thresholds, source=source.source)


def write_stats_files(stats: Mapping[str, Any], output_dir: str, title: str | None = None) -> tuple[str, str]:
    """Write ``stats.json`` and ``stats.html`` into ``output_dir`` (each through a temp name and a rename; into a
    bucket, each in one whole-object write)."""
    from tfrbeam.stats.html import render_html

    name = title or os.path.basename(os.path.normpath(str(stats.get("source") or output_dir)))
    if is_object_store(output_dir):
        from tfrbeam.stats.bucket_output import put_stats_objects

        json_url, html_url = put_stats_objects(output_dir, {
            STATS_JSON: json.dumps(stats, indent=2, allow_nan=False) + "\n", STATS_HTML: render_html(stats, title=name)})
        return json_url, html_url
    fileops.makedirs(output_dir)
    json_path = os.path.join(output_dir, STATS_JSON)
    html_path = os.path.join(output_dir, STATS_HTML)
    fileops.write_atomically(json_path, json.dumps(stats, indent=2, allow_nan=False) + "\n")
    fileops.write_atomically(html_path, render_html(stats, title=name))
    return json_path, html_path


def write_dataset_stats(
    dataset_dir: str, workers: int | None = None, thresholds: Mapping[str, float] | None = None
) -> tuple[str, str]:
    """Compute a build directory's statistics and write ``stats.json`` and ``stats.html`` beside its manifest.

    The build calls this after it commits the dataset (``stats: true``); returns both paths.
    """
    if find_manifest(dataset_dir) is None:
        raise ConfigError(f"{dataset_dir}: no {MANIFEST_NAME}; statistics are written for finished builds")
    _, json_path, html_path = write_pinned_stats(dataset_dir, workers=workers, thresholds=thresholds)
    return json_path, html_path


def write_pinned_stats(
    path: str, output_dir: str | None = None, splits: Sequence[str] | None = None,
    thresholds: Mapping[str, float] | None = None, workers: int | None = None,
) -> tuple[dict[str, Any], str, str]:
    """The statistics of ``path`` written into ``output_dir`` (default: beside the dataset's manifest), all of one
    generation: a dataset replaced while it was read, or before the files are in, gets nothing written
    (``DatasetChangedError`` naming both runs). Returns the statistics and both paths."""
    source = resolve_input(path, splits)
    stats = dataset_stats(accumulate_splits(source, workers), source.shapes, thresholds, source=source.source)
    generation = source.generation
    if generation is not None:
        generation.check()
    if generation is None or output_dir is not None or is_object_store(path) or not os.path.isdir(_OPEN_DIRS):
        return (stats, *write_stats_files(stats, output_dir or path))
    return (stats, *_write_beside_manifest(stats, path, generation))


_OPEN_DIRS = "/proc/self/fd"  # /proc/self/fd/N names the directory descriptor N opened, wherever it is moved since


def _write_beside_manifest(stats: Mapping[str, Any], dataset_dir: str, generation: Generation) -> tuple[str, str]:
    """Write the statistics into the very directory that holds the pinned manifest, never into a replacement.

    The directory is opened and proven (through the descriptor) to hold the pinned manifest; the files
    go into it through the descriptor, so a replace that swaps directories meanwhile cannot put them
    beside another generation's manifest. If the dataset at ``dataset_dir`` is another one afterwards,
    the files went with the replaced directory: they are removed and ``DatasetChangedError`` raised.
    """
    from tfrbeam.layout.generation import Generation

    descriptor = os.open(dataset_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        opened = f"{_OPEN_DIRS}/{descriptor}"
        try:
            Generation(opened, generation.digest, generation.run_id, generation.manifest_name).check()
        except DatasetChangedError as error:
            raise DatasetChangedError(dataset_dir, error.pinned, error.found) from None
        try:
            write_stats_files(stats, opened, title=os.path.basename(os.path.normpath(dataset_dir)))
        except OSError as error:  # a directory a replace removed meanwhile is the dataset changing, not a file error
            generation.check()
            raise type(error)(error.errno, error.strerror, str(error.filename).replace(opened, dataset_dir)) from error
        try:
            generation.check()
        except DatasetChangedError:
            for name in (STATS_JSON, STATS_HTML):
                with contextlib.suppress(OSError):
                    fileops.remove(os.path.join(opened, name), missing_ok=True)
            raise
    finally:
        os.close(descriptor)
    return os.path.join(dataset_dir, STATS_JSON), os.path.join(dataset_dir, STATS_HTML)
