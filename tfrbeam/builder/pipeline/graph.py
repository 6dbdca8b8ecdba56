"""The dataset build as a Beam graph: read → convert → key → shuffle/split/shard → commit.

A SequenceExample build (``sequence:`` in the config) adds one stage between converting and the
shuffle (``tfrbeam.builder.pipeline.sequence``): rows keyed by a bucket of their group key, grouped by the
runner, then sorted, checked and encoded as SequenceExamples, which the same shuffle writes.

``build_pipeline(pipeline, plan)`` adds the whole build to a pipeline: ``ReadTabular``, then
``BuildDataset``, the part after reading that ``tfrbeam.WriteDataset`` shares; the plan
(``tfrbeam.builder.pipeline.plan``) was settled before, and the commit (``tfrbeam.builder.pipeline.commit``) publishes
the staged dataset with the commit protocol only when every shard is written and counted.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np

from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.publish import StagingDir
from tfrbeam.beam.runner_support import TAGGED_SIDE_INPUT_LOSERS, refuse_lossy_runner
from tfrbeam.builder.config import BuildConfig, SplitColumn
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.read import ReadTabular
from tfrbeam.builder.pipeline.commit import CommitDataset, DeadLetterFile, shard_destination
from tfrbeam.builder.pipeline.plan import BuildPlan, plan_build
from tfrbeam.builder.pipeline.sequence import (
    BAD_ROWS as SEQUENCE_BAD_ROWS,
    STATS as SEQUENCE_STATS,
    EncodeSequences,
    GroupKeyer,
    SequenceStage,
)
from tfrbeam.builder.pipeline.splits import ColumnSplits
from tfrbeam.builder.shuffle import (
    KeyedRecords,
    ShardingSpec,
    WriteShuffledShards,
    content_digests,
    input_order_keys,
    keyed_pieces,
    make_piece_store,
    record_checksums,
    seeded_sort_keys,
    split_indices,
)
from tfrbeam.codec.encode import encode_record_batch
from tfrbeam.errors import BadRecordError
from tfrbeam.layout.names import ERRORS_DIR_NAME

__all__ = ["BuildDataset", "build_pipeline", "start_build"]

_LOG = logging.getLogger(__name__)

# Largest piece of encoded records one element carries (also capped at one output shard's size).
PIECE_MAX_BYTES = 32 << 20
_PROGRESS_SECONDS = 5.0
_PIECES, _BAD_ROWS, _STATS = "pieces", "bad_rows", "stats"


def build_pipeline(pipeline: beam.Pipeline, plan: BuildPlan | BuildConfig, *, overwrite: bool = False,
                   publish: bool = True) -> BuildPlan:
    """Add the dataset build of ``plan`` (or of a config, planned here) to ``pipeline``; returns the plan.

    ``publish=True``: the pipeline's last step publishes the dataset (in a worker, taking the
    output's lock itself). ``publish=False``: it only stages the commit, and the caller publishes
    it after the pipeline finished with ``tfrbeam.builder.pipeline.commit.commit_staged(plan)``, as ``tfrbeam
    build`` does (see docs/commit.md: only the launcher publishes).

    The shuffle keeps its pieces in the plan's piece store (``plan.piece_store``, chosen when the
    build was planned: see ``tfrbeam.builder.pipeline.runners.choose_piece_store``). After a failed run,
    ``tfrbeam.builder.pipeline.commit.discard_staging`` frees what the store holds.

    A config is planned here (``plan_build``: ConfigError, OutputExistsError, OutputNotWritableError
    before anything runs). The staging directory is created now, which also proves it can be written.
    """
    if isinstance(plan, BuildConfig):
        plan = plan_build(plan, pipeline.options, overwrite=overwrite)
    start_build(pipeline, plan, "tfrbeam build")
    _ = (
        pipeline
        | "ReadInputs" >> ReadTabular(plan.config.input, list(plan.columns), inputs=list(plan.input_files),
                                      progress_under=plan.staging_dir, convert_with=plan.features)
        | "Build" >> BuildDataset(plan, publish=publish)
    )
    return plan


def start_build(pipeline: beam.Pipeline, plan: BuildPlan, what: str) -> None:
    """Before ``BuildDataset`` is applied: refuse a runner that loses elements, and create the plan's staging directory
    (which also proves it can be written)."""
    refuse_lossy_runner(pipeline, what, also=TAGGED_SIDE_INPUT_LOSERS)
    StagingDir(plan.staging_dir, plan.run, plan.output_root).create()


class BuildDataset(beam.PTransform):
    """Everything a build does after reading: convert, key, (group sequences,) shuffle, split, shard, dead letters, commit.

    Takes the ``SourceBatch`` elements of the plan's inputs (``plan.input_files`` names them: their
    position in that list orders an unshuffled build) and gives the manifest the Commit step made
    (one dict). ``tfrbeam build`` applies it after ``ReadTabular``; ``tfrbeam.WriteDataset``
    after turning a PCollection's rows into SourceBatches. ``start_build`` must run first. ``publish``: see ``build_pipeline``.
    """

    def __init__(self, plan: BuildPlan, *, publish: bool = True):
        super().__init__()
        self._plan = plan
        self._publish = publish

    def expand(self, sources):
        plan = self._plan
        config = plan.config
        converter = _ConvertAndKey(plan, plan.sharding, [item.path for item in plan.input_files])
        converted = (
            sources
            | "ConvertAndKey" >> beam.ParDo(converter)
            .with_output_types(KeyedRecords if config.sequence is None else GroupKeyer.of(plan).element_type)
            .with_outputs(_BAD_ROWS, _STATS, main=_PIECES)
        )
        records, bad_rows, sequence_counts = converted[_PIECES], [converted[_BAD_ROWS]], {}
        if config.sequence is not None:
            sequences = (
                records
                | "GroupRowsByBucket" >> beam.GroupByKey()
                | "EncodeSequences" >> beam.ParDo(EncodeSequences(SequenceStage.of(plan), converter.piece_bytes))
                .with_output_types(KeyedRecords).with_outputs(SEQUENCE_BAD_ROWS, SEQUENCE_STATS, main=_PIECES)
            )
            records = sequences[_PIECES]
            bad_rows.append(sequences[SEQUENCE_BAD_ROWS])
            sequence_counts = {"sequence_counts": beam.pvalue.AsList(sequences[SEQUENCE_STATS])}
        store = make_piece_store(plan.piece_store, plan.staging_dir, plan.memory_store_bytes,
                                 merge_runs=not plan.sharding.ordered)
        shards = records | "Shuffle" >> WriteShuffledShards(plan.sharding, shard_destination(plan, self._publish), store,
                                                                  progress_under=plan.staging_dir)
        # The commit's inputs are side inputs, so they are complete before it runs; no combine (each
        # costs several stages on the local runners) and no dead-letter stages unless they are written.
        dead_letters: list[DeadLetterFile] | beam.pvalue.AsList = []  # a list, as Commit's hint says (Beam 2.78 checks it)
        if plan.dead_letter_path is not None:
            every_bad_row = bad_rows[0] if len(bad_rows) == 1 else tuple(bad_rows) | "EveryBadRow" >> beam.Flatten()
            dead_letters = beam.pvalue.AsList(
                every_bad_row
                | "GroupBadRowsByFile" >> beam.GroupByKey()
                | "WriteDeadLetters" >> beam.ParDo(_WriteDeadLetters(plan.staging_dir))
            )
        return shards["plan"] | "Commit" >> beam.ParDo(
            CommitDataset(plan, publish=self._publish),
            files=beam.pvalue.AsList(shards["files"]),
            counts=beam.pvalue.AsList(converted[_STATS]),
            dead_letters=dead_letters,
            **sequence_counts,
        )


# ---------------------------------------------------------------------------- convert and key


class _ConvertAndKey(beam.DoFn):
    """Converts a source batch to Examples and emits them keyed for the shuffle, in pieces of bounded size.

    Side outputs: bad rows per input file (dead_letter), and (rows read, bad rows) counts. In a
    sequence build the rows go out as Arrow batches keyed by their group key's bucket instead
    (``GroupKeyer``; a null in the key makes a bad row).
    """

    def __init__(self, run: BuildPlan, spec: ShardingSpec, input_paths: list[str]):
        self._features = run.features
        self._split_key = run.config.split_key
        self._num_splits = len(run.config.splits)
        self._fractions = run.config.fractions if run.config.split_by is None else ()
        split_by = run.config.split_by
        self._split_column = ColumnSplits(split_by, tuple(run.config.splits)) if isinstance(split_by, SplitColumn) else None
        # File-pattern splits: each input file's split (the plan listed every glob once).
        self._file_split = {item.path: split for item, split in zip(run.input_files, run.input_splits)}
        self._seed = run.config.shuffle.effective_seed
        self._action = run.config.errors.on_bad_record
        self._input_index = {path: index for index, path in enumerate(sorted(input_paths))}
        cap = spec.max_bytes_per_shard
        self.piece_bytes = min(PIECE_MAX_BYTES, cap) if cap else PIECE_MAX_BYTES
        self._keyer = GroupKeyer.of(run) if run.config.sequence is not None else None

    def setup(self) -> None:
        self._rows = 0
        self._started = self._last_log = time.monotonic()

    def process(self, source) -> Iterator[Any]:
        converted = source.converted if source.converted is not None else convert_source_batch(source, self._features)
        if self._keyer is not None:
            converted = self._keyer.without_null_keys(source, converted)
        split = None
        if self._split_column is not None:  # rows whose split value is null or unknown become bad rows here
            converted, split = self._split_column.assign(source, source.batch, converted)
        bad_rows = converted.bad_rows
        rows_read = source.batch.num_rows + len(source.bad_rows)  # the reader's rejects are not in the batch
        self._absent = np.zeros((self._num_splits, len(self._features)), dtype=np.int64)
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
        if batch.num_rows and self._keyer is not None:
            lines = np.asarray(source.lines, dtype=np.int64)[converted.kept_rows]
            yield from self._keyer.rows_by_bucket(batch, self._input_index[source.path], lines)
        elif batch.num_rows:
            yield from self._pieces(source, batch, converted.kept_rows, split)
        # (rows read, bad rows, per split and feature the examples that lack it, input, its announced rows): the commit
        # checks the counts against the shards and each input's announcement, and records presence from the data.
        yield beam.pvalue.TaggedOutput(_STATS, (rows_read, len(bad_rows), tuple(map(tuple, self._absent.tolist())),
                                                source.path, source.file_rows))
        self._progress(rows_read)

    def _pieces(self, source, batch, kept_rows: np.ndarray, split: np.ndarray | None) -> Iterator[KeyedRecords]:
        encoded = encode_record_batch(batch)
        data, offsets = encoded.data, encoded.offsets
        digests, crcs = record_checksums(data, offsets)
        if split is None and source.path in self._file_split:
            split = np.full(batch.num_rows, self._file_split[source.path], dtype=np.uint16)
        elif split is None:
            split = split_indices(self._split_hashes(batch, digests), self._fractions)
        for column, spec in enumerate(self._features):
            if batch.column(spec.name).null_count:
                missing = np.asarray(batch.column(spec.name).is_null(), dtype=bool)
                self._absent[:, column] += np.bincount(split[missing], minlength=self._num_splits)
        if self._seed is not None:
            keys = seeded_sort_keys(digests[:, 1], self._seed)
        else:
            keys = input_order_keys(self._input_index[source.path], np.asarray(source.lines, dtype=np.int64)[kept_rows])
        yield from keyed_pieces(split, keys, offsets, data, crcs, self.piece_bytes)

    def _split_hashes(self, batch, digests: np.ndarray) -> np.ndarray:
        """What fraction splits hash: the split_key features' encoding, or the whole example's digest."""
        if not self._split_key:
            return digests[:, 0]
        key_encoded = encode_record_batch(batch.select(list(self._split_key)))
        return content_digests(key_encoded.data, key_encoded.offsets)[:, 0]

    def _progress(self, rows: int) -> None:
        self._rows += rows
        now = time.monotonic()
        if now - self._last_log >= _PROGRESS_SECONDS:
            self._last_log = now
            _LOG.info("read and encoded %d rows (%.0f rows/s in this worker)", self._rows, self._rows / (now - self._started))


# ------------------------------------------------------------------------------ dead letters


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
        temp_path = fs.join(self._temp_dir, ERRORS_DIR_NAME, relative.split("/", 1)[1])
        with fs.create(temp_path, "application/json") as handle:
            for row in rows:
                line = json.dumps({"file": row.path, "line": row.line, "reason": row.reason, "raw": row.raw}, ensure_ascii=False)
                handle.write(line.encode("utf-8") + b"\n")
        yield DeadLetterFile(relative, temp_path, len(rows))
