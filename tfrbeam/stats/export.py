"""TFRecord Examples -> Parquet: one Parquet file per shard, with the schema the manifest (or the files) give.

Schema: a scalar feature (shape ``[]``) is a scalar column, a fixed-length one (``[n]``) a
``fixed_size_list``, a numeric tensor (``[2, 3]``) Arrow's ``fixed_shape_tensor`` of its shape (its
values row-major in a ``fixed_size_list``, the shape in the Parquet file's Arrow schema), a variable-length
one a ``list``; a feature some examples lack is nullable and null there. Types: int64, float32 (what
an Example holds), and for bytes ``string`` when every value of the feature in every exported file is
UTF-8 (the rule ``cat`` shows text by), else ``binary``: no value is changed. An Example does not say
which bytes are text, so the export finds out: locally it writes every bytes feature as text and
starts again with a feature as ``binary`` when a value is not UTF-8 (a binary column shows itself in
its first block); the Beam export reads the bytes features once before it writes. Parquet page checksums
are written (``write_page_checksum``). Each input file is read with its own compression (a folder
may mix GZIP, ZLIB and uncompressed files). The export is published as a whole: every file is
written to a temp name beside its target, and only when all are whole are they renamed to their
final names; a failure leaves none of them (nor a temp) behind. A caller may hand in the publish step
(``ExportCommit``): ``tfrbeam export`` stages the files in its own folder beside OUTPUT_DIR and publishes
them through the commit journal, under the output's lock (``tfrbeam.cli.export_commit``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import posixpath
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from tfrbeam.base import fileops
from tfrbeam.base.file_access import is_remote
from tfrbeam.base.object_store import is_object_store
from tfrbeam.errors import ConfigError, OutputExistsError, UnsafeOutputError
from tfrbeam.layout.names import EXPORT_NAME, RECORD_SUFFIXES
from tfrbeam.layout.paths import escapes, path_problem
from tfrbeam.stats.accumulators import FEATURE_TYPES
from tfrbeam.stats.compute import (
    BLOCK_RECORDS,
    StatsInput,
    check_shard_records,
    check_shard_sizes,
    checked_shard,
    decode_block,
    resolve_input,
)
from tfrbeam.tfrecord.blocks import record_blocks

if TYPE_CHECKING:
    from tfrbeam.dataset.reader import Segment

PARQUET_COMPRESSION = "snappy"
_RECORD_SUFFIXES = RECORD_SUFFIXES


class ExportCommit(Protocol):
    """The publish step of an export, given by its caller: where the files are written, and how they reach their places.

    The stats layer cannot take the output's lock or write a commit journal (they live in ``tfrbeam.beam.publish``),
    so the CLI hands in a commit that does, and the export writes into ``staging_root`` instead of beside the targets.
    """

    @property
    def staging_root(self) -> str:
        """A folder that stands in for OUTPUT_DIR while the files are written (its layout: ``<split>/<file>``)."""

    def publish(self, staged: Sequence[tuple[str, str]], stale: Sequence[str]) -> None:
        """Give each staged file (staged, final) its final name and delete ``stale`` (none of them a final name)."""


class NotText(Exception):
    """Bytes features exported as text hold a value that is not UTF-8: the export must write them as binary."""

    def __init__(self, names: frozenset[str], where: str):
        super().__init__(f"{where}: bytes features {sorted(names)} hold values that are not UTF-8")
        self.names = names


def export_field(name: str, kind: str, shape: Sequence[int] | None, always_present: bool, text: bool = False) -> pa.Field:
    """The Parquet column of one feature: scalar, fixed_size_list or list; nullable unless every example has it.

    A bytes feature is ``string`` with ``text``, else ``binary``.
    """
    value_type = pa.string() if text and kind == "bytes" else FEATURE_TYPES[kind]
    size = None if shape is None else math.prod(shape)
    if shape is None or (len(shape) and size == 0):
        # A fixed length of 0 (a feature inferred from records that all hold no values) is a list:
        # Arrow cannot build fixed_size_list<0> arrays (pyarrow dies with SIGFPE).
        return pa.field(name, pa.list_(value_type), nullable=True)
    if len(shape) > 1 and kind != "bytes":
        # Nested fixed-size lists would say the shape too, but pyarrow cannot read them back from Parquet where an
        # optional tensor is missing; the canonical tensor type keeps the values flat and the shape in the schema.
        return pa.field(name, pa.fixed_shape_tensor(value_type, list(shape)), nullable=not always_present)
    arrow_type = value_type if len(shape) == 0 else pa.list_(value_type, size)
    return pa.field(name, arrow_type, nullable=not always_present)


def flat_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each tensor column as the fixed-size list of all its values that holds it: what an Example
    holds, and what the decoder makes."""
    return pa.schema([field.with_type(_flat_type(field.type)) for field in schema])


def _flat_type(arrow_type: pa.DataType) -> pa.DataType:
    return arrow_type.storage_type if isinstance(arrow_type, pa.FixedShapeTensorType) else arrow_type


def with_tensor_shapes(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch of ``flat_schema(schema)`` as ``schema``: each tensor column's flat values as a tensor of its shape,
    without a copy (a missing tensor stays null)."""
    columns = [pa.ExtensionArray.from_storage(field.type, column) if column.type != field.type else column
               for field, column in zip(schema, batch.columns)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def export_schema(features: Mapping[str, Mapping[str, Any]], columns: Sequence[str] | None = None,
                  binary: Collection[str] = ()) -> pa.Schema:
    """The export schema of manifest-style features ``{name: {type, shape, always_present}}``, columns in that order;
    bytes features are text (``string``) but those named in ``binary``."""
    names = list(columns) if columns else list(features)  # a manifest's order: the source's columns
    unknown = [name for name in names if name not in features]
    if unknown:
        raise ConfigError(f"--columns {unknown} are not features of this dataset; it has {sorted(features)}")
    return pa.schema([
        export_field(name, features[name]["type"], features[name].get("shape"), bool(features[name].get("always_present", True)),
                     text=name not in binary)
        for name in names
    ])


def with_binary(schema: pa.Schema, binary: Collection[str]) -> pa.Schema:
    """``schema`` with the text columns named in ``binary`` made binary again (the bytes an Example holds)."""
    return pa.schema([field.with_type(_as_binary(field.type)) if field.name in binary else field for field in schema])


def _as_binary(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_string(arrow_type):
        return pa.binary()
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(_as_binary(arrow_type.value_type), arrow_type.list_size)
    if pa.types.is_list(arrow_type):
        return pa.list_(_as_binary(arrow_type.value_type))
    return arrow_type


def text_columns(schema: pa.Schema) -> list[str]:
    """The columns of an export schema that hold text."""
    return [field.name for field in schema if _as_binary(field.type) != field.type]


def as_text(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """A batch decoded with ``with_binary(schema, text_columns(schema))`` cast to ``schema`` (UTF-8 checked).

    Raises ``NotText`` naming every text column of the batch with a value that is not UTF-8.
    """
    columns, not_text = [], set()
    for field, column in zip(schema, batch.columns):
        try:
            columns.append(column.cast(field.type) if column.type != field.type else column)
        except pa.ArrowInvalid:
            not_text.add(field.name)
    if not_text:
        raise NotText(frozenset(not_text), where)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def non_text_features(records: str | BinaryIO, name: str, schema: pa.Schema, compression: str | None,
                      block_length: int = BLOCK_RECORDS) -> frozenset[str]:
    """The text columns of ``schema`` holding a value that is not UTF-8 in one TFRecord file (only they are decoded)."""
    text = flat_schema(pa.schema([field for field in schema if field.name in set(text_columns(schema))]))
    raw = with_binary(text, text.names)
    found: set[str] = set()
    for block in record_blocks(records, compression, block_length=block_length, name=name):
        try:
            as_text(decode_block(name, block, raw), text, name)
        except NotText as error:
            found |= error.names
            if found == set(text.names):
                break
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """Which TFRecord file becomes which Parquet file, with what schema."""

    schema: pa.Schema
    compressions: Mapping[str, str | None]  # each TFRecord path: its codec, as the readers resolve it
    files: tuple[tuple[str, str, int | None, str | None], ...]  # (TFRecord path, Parquet path, records, split)
    segments: Mapping[str, Segment] = dataclasses.field(default_factory=dict)  # a dataset's shards, as checked

    @property
    def num_records(self) -> int | None:
        counts = [count for _, _, count, _ in self.files]
        known = [count for count in counts if count is not None]
        return sum(known) if len(known) == len(counts) else None


def parquet_name(record_path: str) -> str:
    """``train-00000-of-00004.tfrecord.gz`` -> ``train-00000-of-00004.parquet``."""
    name = os.path.basename(record_path)
    stripped = True
    while stripped:
        stripped = False
        for suffix in _RECORD_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name + ".parquet"


def plan_export(
    path: str, output_dir: str, splits: Sequence[str] | None = None, columns: Sequence[str] | None = None,
    source: StatsInput | None = None, join: Callable[..., str] = os.path.join,
) -> ExportPlan:
    """The export of a build directory (``OUTPUT_DIR/<split>/<shard>.parquet``) or TFRecord files
    (``OUTPUT_DIR/<file>.parquet``).

    ``source`` is what ``resolve_input`` finds at ``path`` (the Beam export resolves it through
    Beam's FileSystems); ``join`` joins paths of the output's and the dataset's filesystem.
    """
    source = source if source is not None else resolve_input(path, splits)
    if source.manifest is not None:
        features = source.manifest.features or {}
        files: tuple[tuple[str, str, int | None, str | None], ...] = tuple(
            (record, output_path(output_dir, (split, parquet_name(record)), join), source.counts.get(record), split)
            for split, records in source.splits.items() for record in records
        )
    else:
        features = {
            name: {"type": kind, "shape": source.shapes.get(name), "always_present": False}  # inferred: later records may lack it
            for name, kind in source.feature_types.items()
        }
        files = tuple(
            (record, output_path(output_dir, (parquet_name(record),), join), None, None)
            for records in source.splits.values() for record in records
        )
    targets = [target for _, target, _, _ in files]
    if len(set(targets)) != len(targets):
        raise ConfigError(
            "two input files would be exported to the same Parquet file name; export them into separate directories"
        )
    return ExportPlan(export_schema(features, columns), source.compressions, files, source.segments)


def output_path(output_dir: str, parts: Sequence[str], join: Callable[..., str] = os.path.join) -> str:
    """``output_dir`` joined with ``parts``, proven to stay inside it: no odd component, no symlink leading out."""
    problem = path_problem("/".join(parts))
    if problem is not None:
        raise UnsafeOutputError(f"{output_dir}: an export file name {problem}")
    joined = join(output_dir, *parts)
    real = None if is_remote(output_dir) else escapes(output_dir, joined)
    if real is not None:
        raise UnsafeOutputError(
            f"{joined} resolves to {real}, outside the output directory {output_dir} (a symlink leads out of it); "
            "export writes only inside OUTPUT_DIR: remove the link or choose another OUTPUT_DIR"
        )
    return joined


def files_to_replace(plan: ExportPlan, found: Sequence[str]) -> list[str]:
    """Of the Parquet files ``found`` where the export writes, those ``--overwrite`` may delete: export's own.

    Export's own are the files it is about to write and files named as it names a shard's
    (``<split>-NNNNN-of-NNNNN.parquet``, an older export with more shards). Any other file is not
    ours to delete: ``OutputExistsError`` naming it, before anything is deleted.
    """
    targets = {target for _, target, _, _ in plan.files}
    foreign = [path for path in found if path not in targets and not EXPORT_NAME.fullmatch(_basename(path))]
    if foreign:
        raise OutputExistsError(
            f"{foreign[0]} (and {len(foreign) - 1} more) is not a file export writes (export names its files "
            "<split>-NNNNN-of-NNNNN.parquet, after the shards); --overwrite replaces only export's own files: "
            "move it away, or choose an empty OUTPUT_DIR"
        )
    return list(found)


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def parquet_writer(where: Any, schema: pa.Schema) -> pq.ParquetWriter:
    """A Parquet writer with page checksums on (``where``: a path or a binary file object)."""
    return pq.ParquetWriter(where, schema, compression=PARQUET_COMPRESSION, write_page_checksum=True)


def write_parquet(records: str | BinaryIO, name: str, target: str | BinaryIO, schema: pa.Schema,
                  compression: str | None = "auto", progress: Callable[[int], None] | None = None,
                  block_length: int = BLOCK_RECORDS) -> int:
    """Write the Examples of one TFRecord file (a path or an open binary file, named ``name``) as Parquet into
    ``target`` (a path or a binary file object); returns the row count.

    Raises ``NotText`` when a text column of ``schema`` meets a value that is not UTF-8.
    """
    rows = 0
    flat = flat_schema(schema)
    raw, shaped = with_binary(flat, text_columns(flat)), flat != schema
    with parquet_writer(target, schema) as writer:
        for block in record_blocks(records, compression, block_length=block_length, name=name):
            batch = as_text(decode_block(name, block, raw), flat, name)
            batch = with_tensor_shapes(batch, schema) if shaped else batch
            writer.write_batch(batch)
            rows += batch.num_rows
            if progress is not None:
                progress(batch.num_rows)
        if rows == 0:
            writer.write_table(schema.empty_table())
    return rows


def stage_file(record_path: str, parquet_path: str, schema: pa.Schema, compression: str | None = "auto",
               progress: Callable[[int], None] | None = None, segment: Segment | None = None) -> tuple[str, int]:
    """Write one TFRecord file's Examples as Parquet to a temp file beside ``parquet_path``; returns (temp, rows).

    A dataset's shard comes with its ``segment``: unless its size and record count are the manifest's, no file is left.
    """
    with fileops.staged_file(parquet_path) as (target, temp):
        with checked_shard(segment) if segment is not None else contextlib.nullcontext(record_path) as records:
            rows = write_parquet(records, record_path, target, schema, compression, progress)
        check_shard_records(segment, rows)
    return temp, rows


def _in_the_way(plan: ExportPlan, overwrite: bool) -> list[str]:
    """The Parquet files already in the directories the export writes to: refused unless ``overwrite``, else
    those to delete (export's own, see ``files_to_replace``) once the new files are whole.

    Without deleting them, a re-export with fewer shards would leave the old extra files beside the new ones.
    """
    directories = sorted({os.path.dirname(target) for _, target, _, _ in plan.files})
    found = sorted(
        os.path.join(directory, name) for directory in directories if os.path.isdir(directory)
        for name in os.listdir(directory) if name.endswith(".parquet")
    )
    if found and not overwrite:
        raise existing_files_error(found)
    return files_to_replace(plan, found)


def existing_files_error(found: Sequence[str]) -> OutputExistsError:
    """The refusal of an export into directories that already hold Parquet files."""
    return OutputExistsError(
        f"{found[0]} (and {len(found) - 1} more Parquet file(s)) already exist where the export writes; "
        "pass --overwrite (overwrite=True) to replace them, or choose an empty OUTPUT_DIR"
    )


def publish_export_files(staged: Sequence[tuple[str, str]], stale: Sequence[str]) -> None:
    """Delete ``stale`` files, then rename each staged (temp, final) pair; on a failure the files already renamed are
    removed again and every temp left is removed, so a failed export leaves no file of its own."""
    published: list[str] = []
    try:
        for path in _not_replaced(stale, [final for _, final in staged]):
            fileops.remove(path, missing_ok=True)
        for temp, final in staged:
            fileops.replace(temp, final)
            published.append(final)
    except BaseException:
        _discard(staged, published)
        raise


def _discard(staged: Sequence[tuple[str, str]], published: Sequence[str]) -> None:
    for temp, _ in staged:
        fileops.remove_temp(temp)
    for final in published:
        with contextlib.suppress(OSError):
            fileops.remove(final, missing_ok=True)


def _stage_all(plan: ExportPlan, schema: pa.Schema, progress: Callable[[int], None],
               staged_target: Callable[[str], str]) -> list[tuple[str, str]]:
    """Every file of ``plan`` written with ``schema`` to a temp beside its ``staged_target``: the (temp, final) pairs;
    on a failure (``NotText`` too) no temp is left."""
    staged: list[tuple[str, str]] = []
    try:
        for record_path, parquet_path, _, _ in plan.files:
            temp, _ = stage_file(record_path, staged_target(parquet_path), schema, plan.compressions[record_path],
                                 progress, plan.segments.get(record_path))
            staged.append((temp, parquet_path))
    except BaseException:
        _discard(staged, [])
        raise
    return staged


def export_to_parquet(
    path: str, output_dir: str, splits: Sequence[str] | None = None, columns: Sequence[str] | None = None,
    progress: Callable[[int, int | None], None] | None = None, overwrite: bool = False,
    commit: ExportCommit | None = None,
) -> list[str]:
    """Export a build directory or TFRecord files to Parquet (see ``plan_export``); returns the Parquet paths.

    Parquet files already in the target directories are refused unless ``overwrite`` (then export's
    own are deleted, see ``files_to_replace``, once the new files are whole). Shards of a dataset are
    checked against the manifest: every size before anything is written, each record count as it
    is read. Every file is staged under a temp name and all are renamed at the end: a failure
    anywhere leaves no Parquet file of this export (an existing export stays as it was until then).
    Bytes features are written as text until one holds a value that is not UTF-8; then every file is
    written again with that feature binary (``progress`` starts again from 0).
    ``progress(records_done, records_total_or_None)`` is called after every block. With a ``commit``, the files are
    written under its ``staging_root`` and it publishes them (it takes over the renames and deletions).
    """
    if is_object_store(output_dir):
        return _export_into_bucket(path, output_dir, splits, columns, progress, overwrite, commit)
    plan = plan_export(path, output_dir, splits, columns)
    check_shard_sizes(plan.segments)  # a truncated or replaced shard is refused before anything is deleted or written
    stale = _in_the_way(plan, overwrite)
    done = 0
    total = plan.num_records

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    def staged_target(final: str) -> str:
        return final if commit is None else os.path.join(commit.staging_root, os.path.relpath(final, output_dir))

    binary: set[str] = set()
    while True:
        try:
            staged = _stage_all(plan, with_binary(plan.schema, binary), advance, staged_target)
            break
        except NotText as error:  # a bytes feature that is not text: write every file again with it binary
            binary |= error.names
            done = 0
    if commit is None:
        publish_export_files(staged, stale)
    else:
        commit.publish(staged, _not_replaced(stale, [final for _, final in staged]))
    return [parquet_path for _, parquet_path, _, _ in plan.files]


def _not_replaced(stale: Sequence[str], finals: Sequence[str]) -> list[str]:
    """The ``stale`` files no new file replaces (a file of a new file's name goes by its rename, in one step)."""
    replaced = set(finals)
    return [path for path in stale if path not in replaced]


def _export_into_bucket(
    path: str, output_dir: str, splits: Sequence[str] | None, columns: Sequence[str] | None,
    progress: Callable[[int, int | None], None] | None, overwrite: bool, commit: ExportCommit | None = None,
) -> list[str]:
    """``export_to_parquet`` into a bucket prefix: earlier Parquet objects refused (unless ``overwrite``) before
    anything is written, the whole export written into a local temp directory, then each file uploaded as one object
    (``tfrbeam.stats.bucket_output``); the objects are the files a local export writes. With a ``commit`` the files
    are uploaded under its ``staging_root`` and it publishes them."""
    from tfrbeam.stats.bucket_output import parquet_objects_beside, upload_export

    plan = plan_export(path, output_dir.rstrip("/"), splits, columns, join=posixpath.join)
    found = parquet_objects_beside([target for _, target, _, _ in plan.files])
    if found and not overwrite:
        raise existing_files_error(found)
    stale = files_to_replace(plan, found)
    with tempfile.TemporaryDirectory(prefix="tfrbeam-export-") as local:
        written = export_to_parquet(path, local, splits, columns, progress)
        if commit is None:
            return upload_export(local, written, output_dir, stale)
        staged = upload_export(local, written, commit.staging_root, [])
    root, output = commit.staging_root.rstrip("/"), output_dir.rstrip("/")
    finals = [posixpath.join(output, url[len(root) + 1:]) for url in staged]  # upload_export put each under root/
    commit.publish(list(zip(staged, finals)), _not_replaced(stale, finals))
    return finals
