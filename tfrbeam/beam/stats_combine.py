"""Dataset statistics as a Beam combine, so they scale out (Dataflow): the same accumulators as ``tfrbeam stats``.

``ComputeDatasetStats(dataset_dir)`` reads every split with ``ReadExamples`` (record batches with
the statistics schema), combines each split's batches with ``SplitStatsCombineFn`` (add, merge,
extract: the mergeable accumulators of ``tfrbeam.stats``) and gives one element, the
``stats.json`` document; ``WriteStatsFiles`` writes it and the HTML report.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from tfrbeam.base.file_access import is_remote
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.examples_read import ReadExamples
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.errors import ConfigError
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.stats.accumulators import SplitAccumulator, stats_schema
from tfrbeam.stats.compute import StatsInput, input_from_dataset, resolve_input
from tfrbeam.stats.files import STATS_HTML, STATS_JSON
from tfrbeam.stats.report import dataset_stats


def files_pattern(files: Sequence[str]) -> str | None:
    """One glob that matches exactly ``files`` (same directory, ``*`` + their common suffix), or None."""
    directories = {posixpath.dirname(path.replace(os.sep, "/")) for path in files}
    if len(directories) != 1 or not files:
        return None
    names = [posixpath.basename(path.replace(os.sep, "/")) for path in files]
    suffix = os.path.commonprefix([name[::-1] for name in names])[::-1]  # noqa: RUF071 - a common suffix of characters is meant
    pattern = os.path.join(os.path.dirname(files[0]), "*" + suffix)
    matched = fs.match(pattern)  # {} when the glob cannot be matched: then it matches not exactly ``files``
    return pattern if {os.path.normpath(path) for path in matched} == {os.path.normpath(path) for path in files} else None


def read_batches(pbegin, label: str, files: Sequence[str], schema: pa.Schema, compressions: Mapping[str, str | None],
                 batch_size: int):
    """``ReadExamples`` record batches of ``files``, each read with its own compression (``compressions``): per
    codec, one read of a glob when one matches exactly that codec's files, else one per file."""
    by_codec: dict[str | None, list[str]] = {}
    for path in files:
        by_codec.setdefault(compressions[path], []).append(path)
    reads: list[beam.PCollection] = []
    for codec, paths in by_codec.items():
        pattern = files_pattern(paths)
        for item in [pattern] if pattern is not None else paths:
            reads.append(pbegin | f"Read {label} {len(reads)}" >> ReadExamples(
                item, output="record_batches", schema=schema, batch_size=batch_size, compression=codec,
            ))
    return reads[0] if len(reads) == 1 else reads | f"Flatten {label}" >> beam.Flatten()


class SplitStatsCombineFn(beam.CombineFn):
    """Combines Arrow RecordBatches (decoded with ``stats_schema``) into one split's SplitAccumulator."""

    def __init__(self, feature_types: Mapping[str, str]):
        super().__init__()
        self._feature_types = dict(feature_types)

    def create_accumulator(self) -> SplitAccumulator:
        return SplitAccumulator(self._feature_types)

    def add_input(self, accumulator: SplitAccumulator, batch: pa.RecordBatch) -> SplitAccumulator:
        accumulator.add(batch)
        return accumulator

    def merge_accumulators(self, accumulators) -> SplitAccumulator:
        merged = self.create_accumulator()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: SplitAccumulator) -> SplitAccumulator:
        return accumulator


class _StatsDocument(beam.DoFn):
    """All splits' accumulators -> the stats.json document (splits in manifest order; the first is the baseline)."""

    def __init__(self, order: Sequence[str], feature_types: Mapping[str, str], shapes: Mapping[str, Any],
                 thresholds: Mapping[str, float] | None, source: str):
        self._order = list(order)
        self._feature_types = dict(feature_types)
        self._shapes = dict(shapes)
        self._thresholds = thresholds
        self._source = source

    def process(self, pairs):
        found = dict(pairs)
        # A split with no records has no key after the combine: it is reported with 0 examples.
        splits = {name: found.get(name) or SplitAccumulator(self._feature_types) for name in self._order}
        yield dataset_stats(splits, self._shapes, self._thresholds, source=self._source)


def resolve_beam_input(path: str, splits: Sequence[str] | None = None) -> StatsInput:
    """``resolve_input`` on any Beam filesystem: a build directory's manifest is read through Beam's FileSystems
    (``gs://`` and the like work); plain TFRecord files (no manifest) are local, features inferred as
    ``open_dataset`` does."""
    dataset = DatasetDirectory.find(path, BEAM_FILES)
    if dataset is not None:
        return input_from_dataset(dataset, splits)
    if is_remote(path):
        raise ConfigError(f"{path}: no {MANIFEST_NAME} there; on a non-local filesystem only a directory written by "
                          "`tfrbeam build` can be read (plain TFRecord files are read from local paths)")
    return resolve_input(path, splits)


class ComputeDatasetStats(beam.PTransform):
    """Read a build directory's splits and give its ``stats.json`` document as one element.

    The manifest is read when the pipeline is constructed, through Beam's FileSystems (a
    ``gs://`` dataset works); the shards are read by the workers. ``splits`` picks some splits
    (default all); ``batch_size`` is ReadExamples'. A dataset of SequenceExamples is refused.
    """

    def __init__(self, dataset_dir: str, splits: Sequence[str] | None = None,
                 thresholds: Mapping[str, float] | None = None, batch_size: int = 8192):
        super().__init__()
        self._source = resolve_beam_input(dataset_dir, splits)
        self._thresholds = thresholds
        self._batch_size = batch_size

    def expand(self, pbegin):
        source = self._source
        schema = stats_schema(source.feature_types)
        keyed = []
        for split, files in source.splits.items():
            batches = read_batches(pbegin, split, files, schema, source.compressions, self._batch_size)
            keyed.append(batches | f"Key {split}" >> beam.Map(lambda batch, name=split: (name, batch)))
        per_split = (
            keyed | "FlattenSplits" >> beam.Flatten()
            | "CombineSplits" >> beam.CombinePerKey(SplitStatsCombineFn(source.feature_types))
        )
        return (
            per_split
            | "AllSplits" >> beam.combiners.ToList()
            | "Document" >> beam.ParDo(_StatsDocument(
                list(source.splits), source.feature_types, source.shapes, self._thresholds, source.source,
            ))
        )


class _WriteStats(beam.DoFn):
    def __init__(self, output_dir: str, title: str | None):
        self._output_dir = output_dir
        self._title = title

    def process(self, stats: dict):
        from tfrbeam.stats.html import render_html

        written = []
        for name, text in ((STATS_JSON, json.dumps(stats, indent=2, allow_nan=False) + "\n"),
                           (STATS_HTML, render_html(stats, title=self._title or self._output_dir))):
            path = fs.join(self._output_dir, name)
            with fs.create(path) as handle:
                handle.write(text.encode("utf-8"))
            written.append(path)
        yield from written


class WriteStatsFiles(beam.PTransform):
    """Write a stats document as ``stats.json`` and ``stats.html`` in ``output_dir`` (any Beam filesystem); gives the paths."""

    def __init__(self, output_dir: str, title: str | None = None):
        super().__init__()
        self._output_dir = output_dir
        self._title = title

    def expand(self, stats):
        return stats | "WriteStats" >> beam.ParDo(_WriteStats(self._output_dir, self._title))
