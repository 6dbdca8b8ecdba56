"""``WriteTFRecordDataset``: the dataset build (``WriteDataset``) as a Beam YAML transform on schema'd rows.

The rows' Beam schema is mapped to the Arrow schema the build plans with, so no ``schema=`` is
needed. With Beam YAML's ``error_handling: {output: NAME}``, rows the build cannot convert go to
that output in Beam's standard error format (``element``: the row, ``msg``: why, ``stack``) and
are counted as skipped in the manifest; without it, the build's own ``errors`` setting applies
(fail by default). The provider file is ``tfrbeam.beam.yaml_rows.PROVIDERS_FILE``.
"""

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindow
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from tfrbeam.beam.yaml_rows import arrow_schema_of, plain_values
from tfrbeam.builder.config import SplitColumn
from tfrbeam.builder.inputs.batch import SourceBatch, convert_source_batch
from tfrbeam.builder.pipeline.from_rows import ROWS_PER_BATCH, build_rows, dataset_config, dict_rows_batch, plan_for
from tfrbeam.builder.pipeline.plan import BuildPlan
from tfrbeam.builder.pipeline.splits import ColumnSplits
from tfrbeam.errors import ConfigError, InputError

__all__ = ["MANIFEST_ROW", "WriteTFRecordDataset"]

MANIFEST_ROW = RowTypeConstraint.from_fields([("manifest", str)])  # the main output: the published manifest's path
_MAIN, _BAD = "batches", "bad_rows"


class WriteTFRecordDataset(beam.PTransform):
    """Write schema'd rows as a tfrbeam dataset of tf.train.Example: split, shuffled, sharded, with its manifest.

    This is ``tfrbeam build`` after its reading step (docs/build-config.md has every option):
    each feature is a column of the rows, typed from their schema unless ``features`` says
    otherwise; the shuffle is seeded and deterministic; the dataset is published atomically when
    the pipeline's last step runs. The output is one row whose ``manifest`` field is the path of
    the published manifest.

    Args:
      path: The dataset directory (local, gs:// or any Beam filesystem).
      features: Feature settings by name, as in the build config's ``features`` (default: every field).
      splits: Split fractions ({train: 0.8, eval: 0.2}) or a split column ({column: NAME, map: {VALUE: SPLIT}}).
      split_key: Field(s) whose equal values always land in the same split.
      seed: The shuffle's seed.
      num_shards: Shards per split (a number, or one per split name).
      max_bytes_per_shard: The largest shard, as bytes or a size like 256MiB (when num_shards is not given).
      compression: none, gzip or zlib.
      errors: What a bad row does: fail, skip or dead_letter (written to the dataset's _errors/), or the
        build config's whole errors mapping.
      stats: Also write the dataset's statistics (stats.json).
      overwrite: Replace a dataset already at path.
      error_handling: Beam YAML's error output: {output: NAME} sends each row the build cannot convert there
        (element, msg, stack), and the build counts it as skipped (errors may also say dead_letter).
    """

    # Beam YAML reads these annotations at run time for the transform's config schema; it maps typing's Optional and
    # Union to schema types, but an ``X | None`` to Any.
    def __init__(self, path: str, features: Optional[Mapping[str, Any]] = None,  # noqa: UP045
                 splits: Optional[Mapping[str, Any]] = None,  # noqa: UP045
                 split_key: Optional[Union[str, Sequence[str]]] = None,  # noqa: UP007, UP045
                 seed: int = 0, num_shards: Optional[Union[int, Mapping[str, int]]] = None,  # noqa: UP007, UP045
                 max_bytes_per_shard: Optional[Union[int, str]] = None,  # noqa: UP007, UP045
                 compression: Optional[str] = None,  # noqa: UP045
                 errors: Optional[Union[str, Mapping[str, Any]]] = None,  # noqa: UP007, UP045
                 stats: bool = False, overwrite: bool = False,
                 error_handling: Optional[Mapping[str, Any]] = None):  # noqa: UP045
        super().__init__()
        self._error_output = _error_output(error_handling)
        if self._error_output is not None:
            errors = _errors_with_output(errors)
        self._config = dataset_config(path, "pcollection", features=features, splits=splits, split_key=split_key,
                                      seed=seed, num_shards=num_shards, max_bytes_per_shard=max_bytes_per_shard,
                                      compression=compression, errors=errors, stats=stats, where="WriteTFRecordDataset")
        self._overwrite = overwrite

    def expand(self, rows: beam.PCollection):
        schema = arrow_schema_of(rows.element_type, "WriteTFRecordDataset")
        plan = plan_for(self._config, schema, rows.pipeline.options, self._overwrite)
        converted = rows | "ConvertRows" >> beam.ParDo(
            _ConvertRows(plan, schema, self._error_output is not None)).with_output_types(SourceBatch).with_outputs(
            _BAD, main=_MAIN)
        manifest = build_rows(converted[_MAIN], plan, publish=True, schema=schema, what="WriteTFRecordDataset")
        output = manifest | "ManifestRow" >> beam.Map(lambda path: beam.Row(manifest=path)).with_output_types(MANIFEST_ROW)
        if self._error_output is None:
            return output
        error_type = RowTypeConstraint.from_fields([("element", rows.element_type), ("msg", str), ("stack", str)])
        return {"output": output, self._error_output: converted[_BAD] | "ErrorRows" >> beam.Map(
            lambda error: beam.Row(element=error[0], msg=error[1], stack="")).with_output_types(error_type)}


def _error_output(error_handling: Mapping[str, Any] | None) -> str | None:
    """The error output's name Beam YAML's ``error_handling`` gives, or None."""
    if not error_handling:
        return None
    output = error_handling.get("output") if isinstance(error_handling, Mapping) else None
    if not isinstance(output, str) or not output:
        raise ConfigError(f"WriteTFRecordDataset: error_handling must be {{output: NAME}}, got {error_handling!r}")
    return output


def _errors_with_output(errors: str | Mapping[str, Any] | None) -> str | Mapping[str, Any]:
    """The errors setting when bad rows go to an error output: skip unless it says dead_letter; fail contradicts it."""
    settings = {"on_bad_record": errors} if isinstance(errors, str) else dict(errors or {})
    action = settings.setdefault("on_bad_record", "skip")
    if action == "fail":
        raise ConfigError("WriteTFRecordDataset: error_handling sends bad rows to an output, but errors says fail; "
                          "leave errors out (skip) or say dead_letter to also write them to the dataset's _errors/")
    return settings


def _windowed(value: Any) -> WindowedValue:
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


class _ConvertRows(beam.DoFn):
    """Rows -> the build's SourceBatches, their features converted and split column checked; each bad row also tagged
    with its row and reason.

    Rows of a Beam schema fit the Arrow schema mapped from it exactly, so a batch that does not
    is an InputError (a defect), never a changed value.
    """

    def __init__(self, plan: BuildPlan, schema: pa.Schema, tag_bad_rows: bool):
        self._source = plan.config.input.path
        self._specs = plan.features
        split_by = plan.config.split_by
        # A split column's unknown values are bad rows too; the build's own assignment then finds every kept row known.
        self._split_column = ColumnSplits(split_by, tuple(plan.config.splits)) if isinstance(split_by, SplitColumn) else None
        self._schema = pa.schema([schema.field(name) for name in schema.names if name in set(plan.columns)])
        self._declared = frozenset(schema.names)
        self._tag_bad_rows = tag_bad_rows

    def start_bundle(self) -> None:
        self._rows: list[Any] = []

    def process(self, row: Any) -> Iterator[Any]:
        self._rows.append(row)
        if len(self._rows) >= ROWS_PER_BATCH:
            yield from self._batch()

    def finish_bundle(self) -> Iterator[Any]:
        for element in self._batch():
            if isinstance(element, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(element.tag, _windowed(element.value))
            else:
                yield _windowed(element)

    def _batch(self) -> Iterator[Any]:
        rows, self._rows = self._rows, []
        if not rows:
            return
        try:
            batch = dict_rows_batch([plain_values(row) for row in rows], self._schema, self._declared)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as error:
            raise InputError(f"{self._source}: a batch of {len(rows)} rows does not fit the Arrow schema mapped from "
                             f"their Beam schema ({error}); schema: {self._schema.to_string()}") from error
        source = SourceBatch(self._source, np.arange(1, len(rows) + 1, dtype=np.int64), batch, records=len(rows))
        converted = convert_source_batch(source, self._specs)
        if self._split_column is not None:
            converted, _ = self._split_column.assign(source, batch, converted)
        if self._tag_bad_rows:
            for bad in converted.bad_rows:
                yield beam.pvalue.TaggedOutput(_BAD, (rows[bad.line - 1], bad.reason))
        yield dataclasses.replace(source, converted=converted)
