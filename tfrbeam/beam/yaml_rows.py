"""Beam YAML's schema'd rows and tfrbeam datasets: ``ReadTFExamples``, and the row types both directions need.

Beam YAML pipelines pass ``beam.Row`` elements whose PCollection carries a Beam schema. This
module maps a Beam schema to the Arrow schema a build plans with (``arrow_schema_of``), an
Arrow schema back to a Beam row type (``row_type_of``), and reads a dataset's Examples as rows
typed from its manifest (``ReadTFExamples``). ``PROVIDERS_FILE`` is the Beam YAML provider file
tfrbeam ships (``providers: [{include: ...}]``); docs/ecosystem.md#beam-yaml shows both ways in.
"""

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.portability.api import schema_pb2
from apache_beam.typehints.arrow_type_compatibility import arrow_schema_from_beam_schema
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.typehints.schemas import schema_from_element_type

from tfrbeam.beam.stats_combine import read_batches, resolve_beam_input
from tfrbeam.errors import ConfigError, ExampleDecodeError
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.stats.export import NotText, as_text, export_schema, flat_schema, text_columns, with_binary

__all__ = ["PROVIDERS_FILE", "ReadTFExamples", "arrow_schema_of", "plain_values", "row_type_of"]

PROVIDERS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yaml_providers.yaml")

_PYTHON_TYPES: dict[pa.DataType, type] = {
    pa.int64(): int, pa.int32(): np.int32, pa.int16(): np.int16, pa.int8(): np.int8,
    pa.float64(): float, pa.float32(): np.float32, pa.bool_(): bool, pa.string(): str, pa.binary(): bytes,
}


def arrow_schema_of(element_type: Any, where: str) -> pa.Schema:
    """The Arrow schema of a schema'd PCollection's rows (Beam's own mapping), or a ConfigError naming the field.

    Beam logical types (timestamps, decimals) have no Arrow mapping in Beam; such a field must be
    turned into a plain type first (e.g. with ``MapToFields``).
    """
    try:
        beam_schema = schema_from_element_type(element_type)
    except TypeError as error:
        raise ConfigError(f"{where}: its input has no Beam schema ({element_type}); give it schema'd rows (Beam YAML's "
                          "readers and MapToFields make them)") from error
    fields = []
    for field in beam_schema.fields:
        try:
            fields.extend(arrow_schema_from_beam_schema(schema_pb2.Schema(fields=[field])))
        except (NotImplementedError, ValueError, TypeError) as error:
            raise ConfigError(f"{where}: field {field.name!r} has a Beam type with no Arrow equivalent ({error}); "
                              "map it to a string, number or list first (MapToFields)") from error
    return pa.schema([field.remove_metadata() for field in fields])


def row_type_of(schema: pa.Schema) -> RowTypeConstraint:
    """The Beam row type of rows of an Arrow schema: scalars, lists of them (fixed-size lists too), nullable fields Optional."""
    return RowTypeConstraint.from_fields([(field.name, _python_type(field.type, field.name, field.nullable))
                                          for field in schema])


def _python_type(arrow_type: pa.DataType, name: str, nullable: bool) -> Any:
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        python_type: Any = Sequence[_python_type(arrow_type.value_type, name, False)]  # type: ignore[misc]
    elif arrow_type in _PYTHON_TYPES:
        python_type = _PYTHON_TYPES[arrow_type]
    else:
        raise ConfigError(f"column {name!r}: {arrow_type} has no Beam row type here (numbers, strings, bytes and lists "
                          "of them do)")
    return Optional[python_type] if nullable else python_type  # noqa: UP045 (a Beam type hint: it maps Optional)


def plain_values(row: Any) -> dict[str, Any]:
    """A Beam row as a dict of plain Python values (nested rows as dicts), the form the build's dict rows take."""
    return {name: _plain(value) for name, value in row._asdict().items()}


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return plain_values(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class ReadTFExamples(beam.PTransform):
    """Read a tfrbeam dataset, or TFRecord files of tf.train.Example, as schema'd rows.

    The row schema comes from the dataset's manifest (plain files: from their records, as
    ``tfrbeam inspect`` infers it): a scalar feature is a scalar field, a fixed-length or
    variable-length one a list, a feature some examples lack is nullable. int64 features are
    integers, float features 32-bit floats (what an Example holds), bytes features strings
    unless named in ``binary``; a bytes value that is not UTF-8 fails the read naming the
    feature, never a replaced character.

    Args:
      path: A dataset directory written by tfrbeam (local, gs:// or any Beam filesystem), or a
        glob of local TFRecord files of tf.train.Example.
      splits: The splits to read (default: every split of the dataset).
      binary: Bytes features to give as bytes, not text (images, serialized protos).
      split_field: If set, each row also has a string field of this name holding its split.
      batch_size: Examples decoded at a time.
    """

    # Beam YAML reads these annotations at run time for the config schema: it maps Optional, but ``X | None`` to Any.
    def __init__(self, path: str, splits: Optional[Sequence[str]] = None,  # noqa: UP045
                 binary: Optional[Sequence[str]] = None,  # noqa: UP045
                 split_field: Optional[str] = None, batch_size: int = 8192):  # noqa: UP045
        super().__init__()
        self._input = resolve_beam_input(path, list(splits) if splits else None)
        features = _features_of(self._input.manifest, self._input.feature_types, self._input.shapes)
        unknown = sorted(set(binary or ()) - set(features))
        if unknown:
            raise ConfigError(f"ReadTFExamples: binary names {unknown}, which are not features of {path} "
                              f"(it has {sorted(features)})")
        self._schema = flat_schema(export_schema(features, binary=binary or ()))  # Beam rows: a tensor's values flat
        if split_field is not None and (self._input.manifest is None or split_field in features):
            reason = "it is a feature's name" if self._input.manifest is not None else "plain TFRecord files have no splits"
            raise ConfigError(f"ReadTFExamples: split_field {split_field!r} cannot be used: {reason}")
        self._split_field = split_field
        self._batch_size = batch_size
        self._path = path

    def expand(self, pbegin):
        fields = [*self._schema, *([pa.field(self._split_field, pa.string(), nullable=False)] if self._split_field else [])]
        row_type = row_type_of(pa.schema(fields))
        decode_schema = with_binary(self._schema, text_columns(self._schema))
        reads = []
        for split, files in self._input.splits.items():
            if not files:
                continue
            batches = read_batches(pbegin, split, files, decode_schema, self._input.compressions, self._batch_size)
            extra = {self._split_field: split} if self._split_field else {}
            reads.append(batches | f"Rows {split}" >> beam.FlatMap(
                _batch_rows, self._schema, extra, self._path).with_output_types(row_type))
        if not reads:
            return pbegin | "NoRows" >> beam.Create([]).with_output_types(row_type)
        return reads[0] if len(reads) == 1 else reads | "FlattenSplits" >> beam.Flatten().with_output_types(row_type)


def _features_of(manifest: Manifest | None, types: Mapping[str, str],
                 shapes: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's features, or, for plain files, the inferred ones (nullable: a later record may lack any)."""
    if manifest is not None:
        return dict(manifest.features or {})
    return {name: {"type": kind, "shape": shapes.get(name), "always_present": False} for name, kind in types.items()}


def _batch_rows(batch: pa.RecordBatch, schema: pa.Schema, extra: Mapping[str, str], where: str) -> Iterator[beam.Row]:
    """A decoded batch's rows, bytes features as text (UTF-8 checked)."""
    try:
        batch = as_text(batch, schema, where)
    except NotText as error:
        raise ExampleDecodeError(f"{error}; name them in ReadTFExamples' binary to read them as bytes") from error
    for row in batch.to_pylist():
        yield beam.Row(**row, **extra)
