"""Datasets from rows that are not files: ``WriteDataset`` (a PTransform for a user's pipeline), and what it shares
with ``write_dataset`` (Arrow data in memory, launched by ``tfrbeam.builder.running.write_table``).

Both are ``tfrbeam build`` after its reading step: the options become a ``BuildConfig`` (the same
checks and defaults as the YAML), ``plan_rows`` plans it against the rows' Arrow schema, and the
rows, as ``SourceBatch`` elements, go through ``BuildDataset``, the build's own convert, split,
shuffle, shard, dead-letter and commit steps. The same rows give the same shard bytes as
``tfrbeam build`` of a Parquet file of them.

Publishing (docs/commit.md): ``write_dataset`` is a launcher: it holds the output's lock from
before its pipeline starts and publishes after it finished (``tfrbeam.builder.running.launch``), as the CLI
does. ``WriteDataset`` lives in a pipeline whose launcher is the user's code, so its Commit step
publishes from the worker that runs it, taking the output's lock itself and refusing when the
process that built the pipeline has ended. Either way the output holds the old dataset or the new
one, never neither and never a mix.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from tfrbeam.builder.config import ROWS_FORMAT, BuildConfig, InputConfig, one_line, parse_config
from tfrbeam.builder.features.convert import BadRow, FeatureSpec, output_type
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.progress import ProgressCounter, progress_dir
from tfrbeam.builder.pipeline.graph import BuildDataset, start_build
from tfrbeam.builder.pipeline.plan import BuildPlan, plan_rows
from tfrbeam.errors import ConfigError, InputError

__all__ = ["ROWS_PER_BATCH", "WriteDataset", "arrow_table", "build_rows", "dataset_config", "plan_for"]

_LOG = logging.getLogger(__name__)

# The features option: the config's mapping, FeatureSpecs, or the path of a TFMD schema.pbtxt (features_from).
FeaturesOption = Mapping[str, Any] | Sequence[FeatureSpec] | str | os.PathLike | None
ROWS_PER_BATCH = 65536  # rows of an in-memory table per element; dicts are gathered into batches of this many


def dataset_config(path: str | os.PathLike, source: str, *, features: FeaturesOption = None,
                   splits: Mapping[str, Any] | None = None, split_key: str | Sequence[str] | None = None,
                   shuffle: bool = True, seed: int = 0, num_shards: int | Mapping[str, int] | None = None,
                   max_bytes_per_shard: int | str | None = None, compression: str | None = None,
                   errors: str | Mapping[str, Any] | None = None, stats: bool = False, dali_index: bool = False,
                   schema_pbtxt: bool = False, tfds: str | Mapping[str, str] | None = None,
                   where: str = "write_dataset") -> BuildConfig:
    """The BuildConfig of keyword options: each is the config key of the same name, checked as the YAML is.

    ``features`` is the config's mapping (a type name alone stands for ``{type: NAME}``), a
    sequence of FeatureSpec, or the path of a TensorFlow Metadata ``schema.pbtxt`` (``features_from``);
    ``errors`` an ``on_bad_record`` value or the whole ``errors`` mapping. ``source`` names the rows
    (``input.path``, with ``input.format: arrow``). A ConfigError lists every problem on one line.
    """
    output: dict[str, Any] = {"path": os.fspath(path)}
    for key, value in (("num_shards", num_shards), ("max_bytes_per_shard", max_bytes_per_shard),
                       ("compression", compression)):
        if value is not None:
            output[key] = dict(value) if isinstance(value, Mapping) else value
    if dali_index:
        output["dali_index"] = True
    if schema_pbtxt:
        output["schema_pbtxt"] = True
    if tfds is not None:
        output["tfds"] = {"name": tfds} if isinstance(tfds, str) else dict(tfds)
    raw: dict[str, Any] = {"output": output, "shuffle": {"enabled": shuffle, "seed": seed}, "stats": stats}
    given: dict[str, Any] = {"input": InputConfig(format=ROWS_FORMAT, path=source)}
    if splits is not None:
        raw["splits"] = dict(splits)
        if "column" not in raw["splits"] and any(isinstance(value, str) for value in raw["splits"].values()):
            raise ConfigError(f"{where}: splits: file patterns split input files, but these rows come from no files; "
                              "split them by fractions or by a split column ({'column': NAME, 'map': {...}})")
    if split_key is not None:
        raw["split_key"] = split_key if isinstance(split_key, str) else list(split_key)
    if errors is not None:
        raw["errors"] = {"on_bad_record": errors} if isinstance(errors, str) else dict(errors)
    if isinstance(features, (str, os.PathLike)):
        raw["features_from"] = os.fspath(features)
    elif features is not None and not isinstance(features, Mapping):
        given["features"] = tuple(features)
        if not all(isinstance(spec, FeatureSpec) for spec in given["features"]):
            raise ConfigError(f"{where}: features: expected a mapping of feature name to its settings (as in the config) "
                              "or a sequence of FeatureSpec")
    elif features is not None:
        raw["features"] = {name: {"type": value} if isinstance(value, str) else value for name, value in features.items()}
    try:
        return parse_config(raw, where=where, given=given)
    except ConfigError as error:
        raise one_line(error) from None


def schema_of_features(config: BuildConfig, where: str) -> pa.Schema:
    """The Arrow schema typed features imply for their source columns (scalars; list features need ``schema=``)."""
    untyped = [spec.name for spec in config.features or () if spec.type is None or spec.source_path is not None]
    if config.features is None or untyped:
        named = f" ({', '.join(untyped)}: no type, or a struct field)" if untyped else ""
        raise ConfigError(f"{where}: give schema= (a pyarrow.Schema of the rows) or a type for every feature{named}: the "
                          "rows of a PCollection are not seen before the pipeline runs, so they cannot be inferred")
    fields: dict[str, pa.DataType] = {}
    for spec in config.features:
        fields.setdefault(spec.source, output_type(spec) if spec.time_unit is None else pa.string())
    return pa.schema(list(fields.items()))


def plan_for(config: BuildConfig, schema: pa.Schema, options: PipelineOptions | None, overwrite: bool,
             input_bytes: int | None = None, own_options: bool = False) -> BuildPlan:
    """``plan_rows`` with config problems on one line."""
    try:
        return plan_rows(config, schema, options, overwrite=overwrite, input_bytes=input_bytes, own_options=own_options,
                         launched=own_options)
    except ConfigError as error:
        raise one_line(error) from None


def build_rows(rows: beam.PCollection, plan: BuildPlan, *, publish: bool, schema: pa.Schema, what: str) -> beam.PCollection:
    """The build after reading on ``rows`` (SourceBatches, record batches, tables or dicts); the manifest's path."""
    start_build(rows.pipeline, plan, what)
    manifests = (
        rows
        | "AsSourceBatches" >> beam.ParDo(_AsSourceBatches(plan, schema)).with_output_types(SourceBatch)
        | "Build" >> BuildDataset(plan, publish=publish)
    )
    return manifests | "ManifestPath" >> beam.Map(lambda _manifest, path=plan.manifest_path: path)


class _AsSourceBatches(beam.DoFn):
    """Rows as the build's SourceBatch elements: record batches and tables as they come, dicts gathered in batches.

    A row's number (its "line" in bad-row messages and dead letters) is its 1-based position in
    its batch. Batches are projected to the plan's columns and cast to the plan's schema where
    their types differ. A dict that does not fit the schema is a bad row, never cast
    (``dict_rows_batch``): a value its column's type cannot hold exactly (5.7 in an int64), a key
    the schema does not declare; a key it lacks is a null, which the feature's ``on_null`` decides.
    """

    def __init__(self, plan: BuildPlan, schema: pa.Schema):
        self._source = plan.config.input.path
        self._schema = pa.schema([schema.field(name) for name in schema.names if name in set(plan.columns)])
        self._declared = frozenset(schema.names)
        self._progress = progress_dir(plan.staging_dir)

    def setup(self) -> None:
        self._counter = ProgressCounter(self._progress) if self._progress is not None else None

    def start_bundle(self) -> None:
        self._rows: list[Mapping[str, Any]] = []

    def process(self, element) -> Iterator[SourceBatch]:
        if isinstance(element, SourceBatch):
            yield self._counted(element)
        elif isinstance(element, pa.RecordBatch):
            yield self._counted(self._source_batch(element))
        elif isinstance(element, pa.Table):
            for batch in element.to_batches(ROWS_PER_BATCH):
                yield self._counted(self._source_batch(batch))
        elif isinstance(element, Mapping):
            self._rows.append(element)
            if len(self._rows) >= ROWS_PER_BATCH:
                yield self._counted(self._dict_batch())
        else:
            raise InputError(f"{self._source}: WriteDataset takes pyarrow RecordBatches or Tables, or dicts (one per "
                             f"row), not {type(element).__name__}")

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._rows:
            yield WindowedValue(self._counted(self._dict_batch()), MIN_TIMESTAMP, [GlobalWindow()])

    def _counted(self, source: SourceBatch) -> SourceBatch:
        if self._counter is not None:
            self._counter.add(source.num_rows + len(source.bad_rows), source.batch.nbytes)
        return source

    def _source_batch(self, batch: pa.RecordBatch) -> SourceBatch:
        lines = np.arange(1, batch.num_rows + 1, dtype=np.int64)
        return SourceBatch(self._source, lines, self._fitted(batch))

    def _fitted(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's columns of the plan's schema, in its order and types."""
        missing = [name for name in self._schema.names if name not in batch.schema.names]
        if missing:
            raise InputError(f"{self._source}: a batch of {batch.num_rows} rows lacks column(s) {', '.join(missing)} "
                             f"(it has {', '.join(batch.schema.names) or 'none'}); every batch needs the planned schema's")
        batch = batch.select(self._schema.names)
        if batch.schema.equals(self._schema):
            return batch
        try:
            return batch.cast(self._schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
            raise InputError(f"{self._source}: a batch's columns do not fit the planned schema ({error}); its types: "
                             f"{batch.schema.to_string(show_schema_metadata=False)}") from error

    def _dict_batch(self) -> SourceBatch:
        """The gathered dicts as one batch of the schema; rows that do not fit it are bad rows (1-based positions)."""
        rows, self._rows = self._rows, []
        try:
            batch = dict_rows_batch(rows, self._schema, self._declared)
            return SourceBatch(self._source, np.arange(1, len(rows) + 1, dtype=np.int64), batch, records=len(rows))
        except _ROW_MISFITS:
            pass  # some row does not fit: find which, row by row
        kept, lines, bad = [], [], []
        for number, row in enumerate(rows, start=1):
            try:
                dict_rows_batch([row], self._schema, self._declared)
            except _ROW_MISFITS as error:
                reason = f"does not fit the schema: {error}"
                bad.append(BadRow(self._source, number, reason, json.dumps(row, default=str, ensure_ascii=False)))
                continue
            kept.append(row)
            lines.append(number)
        batch = dict_rows_batch(kept, self._schema, self._declared)
        return SourceBatch(self._source, np.asarray(lines, dtype=np.int64), batch, bad_rows=tuple(bad),
                           records=len(rows))


_ROW_MISFITS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError)


def dict_rows_batch(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, declared: frozenset[str]) -> pa.RecordBatch:
    """Dicts (one per row) as a batch of ``schema``, every value exactly as given, or ValueError naming the key.

    pyarrow's ``from_pylist`` casts what its column's type cannot hold (5.7 into int64 gives 5, a
    sub-second time into seconds drops it, 1e300 into float32 gives inf): here each column is also
    built from its values alone and must cast to its type safely and back unchanged, as a table's
    column is (``batch.cast`` is safe). A key not in ``declared`` (the schema's names) is refused;
    a missing key is a null.
    """
    for row in rows:
        extra = [key for key in row if key not in declared]
        if extra:
            raise ValueError(f"key(s) {', '.join(map(repr, extra))} not in the schema ({', '.join(sorted(declared))}); "
                             "declare them in schema= or leave them out of the rows")
    batch = pa.RecordBatch.from_pylist(list(rows), schema=schema)
    for field_ in schema:
        _check_exact(field_, [row.get(field_.name) for row in rows], batch.column(field_.name))
    return batch


def _check_exact(field_: pa.Field, values: list[Any], typed: pa.Array) -> None:
    """``typed`` (``values`` converted to the field's type) holds every value exactly, or ValueError naming one."""
    try:
        inferred = pa.array(values, from_pandas=False)
    except _ROW_MISFITS:
        return  # values of several Python types: from_pylist took each as the type asks, which refuses a mismatch
    if inferred.type.equals(field_.type) or pa.types.is_null(inferred.type):
        return
    try:
        safe = pc.cast(inferred, field_.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise ValueError(f"{field_.name!r}: {_shown_values(values)} does not fit {field_.type} without a change "
                         f"({error})") from error
    if _is_floating(field_.type):  # rounding to float32 is the Example's float; an infinity made of a number is not
        overflow = pc.and_(pc.is_inf(_flat(safe)), pc.invert(pc.is_inf(pc.cast(_flat(inferred), pa.float64()))))
        if pc.any(overflow).as_py():
            raise ValueError(f"{field_.name!r}: {_shown_values(values)} is beyond the range of {field_.type}")
        return
    try:
        back = pc.cast(typed, inferred.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return  # no way back to compare (the safe cast above already refused every truncation it knows)
    if not back.equals(inferred):
        raise ValueError(f"{field_.name!r}: {_shown_values(values)} does not fit {field_.type} without a change")


def _is_floating(type_: pa.DataType) -> bool:
    while pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        type_ = type_.value_type
    return pa.types.is_floating(type_)


def _flat(array: pa.Array) -> pa.Array:
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    return array


def _shown_values(values: list[Any]) -> str:
    shown = repr(values[0]) if len(values) == 1 else f"one of {len(values)} values"
    return shown if len(shown) <= 80 else shown[:77] + "..."


class WriteDataset(beam.PTransform):
    """Write a PCollection of rows as a tfrbeam dataset at ``path``, exactly as ``tfrbeam build`` writes one.

    Elements are ``pyarrow.RecordBatch`` (or ``pyarrow.Table``), or dicts, one per row. The
    options are the build config's keys (see docs/build-config.md): ``features`` (the config's
    mapping; left out: every column of ``schema``, typed from it), ``splits`` (fractions, or a split
    column: ``{"column": NAME, "map": {VALUE: SPLIT}}``), ``split_key``,
    ``seed``, ``num_shards`` or ``max_bytes_per_shard``, ``compression``, ``errors``
    (``on_bad_record``, or the mapping), ``stats``, ``schema_pbtxt`` (``output.schema_pbtxt``: write a
    TensorFlow Metadata schema beside the manifest; ``features`` may also be a schema.pbtxt's path),
    ``tfds`` (``output.tfds``: a TFDS dataset name, or ``{"name": ..., "version": ...}``: write the files
    ``tfds.builder_from_directory`` loads);
    ``overwrite`` replaces another dataset.
    ``schema`` (a ``pyarrow.Schema``) is needed unless every feature has a type: a PCollection's
    rows are not seen before the pipeline runs. The output is a PCollection holding the path of
    the published manifest. Config and output problems raise a one-line ConfigError,
    OutputExistsError or OutputNotWritableError when the transform is applied.

    The Commit step publishes from its worker (there is no launcher to do it after the
    pipeline): it takes the output's lock itself, and the output holds the old dataset or the
    new one, never neither (docs/commit.md). ``shuffle=False`` is refused: a PCollection has
    no order to keep (``write_dataset`` keeps a table's).
    """

    def __init__(self, path: str | os.PathLike, *, features: FeaturesOption = None,
                 schema: pa.Schema | None = None, splits: Mapping[str, Any] | None = None,
                 split_key: str | Sequence[str] | None = None, shuffle: bool = True, seed: int = 0,
                 num_shards: int | Mapping[str, int] | None = None, max_bytes_per_shard: int | str | None = None,
                 compression: str | None = None, errors: str | Mapping[str, Any] | None = None, stats: bool = False,
                 schema_pbtxt: bool = False, tfds: str | Mapping[str, str] | None = None, overwrite: bool = False,
                 name: str = "pcollection"):
        super().__init__()
        if not shuffle:
            raise ConfigError("WriteDataset: shuffle=False keeps input order, but a PCollection has none; keep the "
                              "seeded shuffle (it is deterministic), or use write_dataset for a table's order")
        self.config = dataset_config(path, name, features=features, splits=splits, split_key=split_key, seed=seed,
                                     num_shards=num_shards, max_bytes_per_shard=max_bytes_per_shard,
                                     compression=compression, errors=errors, stats=stats, schema_pbtxt=schema_pbtxt,
                                     tfds=tfds, where="WriteDataset")
        self.schema = schema if schema is not None else schema_of_features(self.config, "WriteDataset")
        self.overwrite = overwrite
        self.plan: BuildPlan | None = None  # set when the transform is applied

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        self.plan = plan_for(self.config, self.schema, rows.pipeline.options, self.overwrite)
        return build_rows(rows, self.plan, publish=True, schema=self.schema, what="WriteDataset")


def arrow_table(data: Any, keep_index: bool = False) -> pa.Table:
    """Arrow data in memory as one table: a Table, RecordBatch or RecordBatchReader, anything with ``__arrow_c_stream__``
    (pandas >= 2.2, Polars, DuckDB relations), a dict of columns, or a list of dicts (one per row; types inferred).

    A pandas index that pandas exported as columns (``__index_level_0__`` of a filtered frame, or a
    named index; its schema's pandas metadata names them) is left out unless ``keep_index``: it is
    the frame's row labels, not its data.
    """
    table = _any_table(data)
    return table if keep_index else without_pandas_index(table)


def without_pandas_index(table: pa.Table) -> pa.Table:
    """The table without the columns its pandas metadata names as the frame's index (a RangeIndex is no column)."""
    metadata = (table.schema.metadata or {}).get(b"pandas")
    if metadata is None:
        return table
    try:
        index = json.loads(metadata).get("index_columns") or []
    except (ValueError, AttributeError):
        return table  # not pandas' own metadata: nothing to go by
    names = [name for name in index if isinstance(name, str) and name in table.column_names]
    if names:
        _LOG.info("left out the pandas index column(s) %s (keep_index=True keeps them)", ", ".join(names))
    return table.drop_columns(names) if names else table


def _any_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if hasattr(data, "__arrow_c_stream__"):
        try:
            return pa.RecordBatchReader.from_stream(data).read_all()
        except pa.ArrowInvalid:
            table = _frame_with_tensors(data)
            if table is None:
                raise
            return table
    if isinstance(data, Mapping):
        columns = {name: _tensor_column(values) for name, values in data.items()}
        return pa.table({name: values if columns[name] is None else columns[name] for name, values in data.items()})
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)) and all(isinstance(row, Mapping) for row in data):
        return pa.Table.from_pylist(list(data))
    raise ConfigError(f"write_dataset: cannot take {type(data).__name__} as rows: give a pyarrow Table, RecordBatch or "
                      "RecordBatchReader, an object with __arrow_c_stream__ (pandas >= 2.2, Polars, DuckDB), a dict of "
                      "columns, or a list of dicts")


def _tensor_column(values: Any) -> pa.Array | None:
    """A numpy array of 2+ dimensions as a fixed_shape_tensor column (one tensor per row); a column of numpy arrays
    of 1+ dimensions as one too when they share a shape, else as nested lists (a declared shape then makes a row
    of another shape a bad row); None for any other column."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values)) if values.ndim > 1 else None
    items = values.to_numpy() if hasattr(values, "to_numpy") else values
    if not (isinstance(items, np.ndarray) and items.dtype == object and len(items)
            and isinstance(items[0], np.ndarray) and items[0].ndim >= 2):
        return None
    if len({item.shape if isinstance(item, np.ndarray) else None for item in items}) == 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(np.stack(list(items))))
    return pa.array([item.tolist() if isinstance(item, np.ndarray) else item for item in items])


def _frame_with_tensors(frame: Any) -> pa.Table | None:
    """A pandas frame whose object columns hold numpy arrays of 2+ dimensions (which Arrow's own conversion refuses):
    those columns as tensors (see _tensor_column), the others as Arrow converts them; None for anything else."""
    if not (hasattr(frame, "columns") and hasattr(frame, "drop")):
        return None
    tensors = {name: column for name in frame.columns if (column := _tensor_column(frame[name])) is not None}
    if not tensors:
        return None
    table = pa.RecordBatchReader.from_stream(frame.drop(columns=list(tensors))).read_all()
    for position, name in enumerate(frame.columns):
        if name in tensors:
            table = table.add_column(position, str(name), tensors[name])
    return table
