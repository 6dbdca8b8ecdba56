"""Errors raised by tfrbeam: each names the file, offset, row or key it is about and how to fix it."""

from __future__ import annotations

__all__ = ["ArrowConversionError", "BadRecordError", "BuildFailedError", "CommitError", "CompressedInputError",
    "ConfigError", "CorruptRecordError", "DatasetChangedError", "ExampleDecodeError", "ExampleEncodeError",
    "GroupTooLargeError", "HeldDataMissingError", "InputError", "ManifestError", "MissingShardError",
    "ObjectNotFoundError", "ObjectTooLargeError", "OutputExistsError", "OutputLockedError", "OutputNotWritableError",
    "ParquetSchemaError", "PreconditionFailedError", "RandomAccessError", "RecordError", "RecordIndexError",
    "RecordLimitError", "RecordTooLargeError", "RefusedFileError", "RowCountError", "ShardMismatchError",
    "ShortWriteError", "ShuffledDataError", "StorageError", "StoragePermissionError", "StorageUnavailableError",
    "TfrbeamError", "TooManyBadRecordsError", "TruncatedRecordError", "UnsafeOutputError", "UnsafePathError",
    "UnsupportedCompressionError", "UnsupportedRunnerError"]


class TfrbeamError(Exception):
    """Base class of every error tfrbeam raises on purpose."""


class RecordError(TfrbeamError):
    """A TFRecord file could not be read at a given record.

    Attributes:
      path: the file (or a description of the stream) being read.
      offset: byte offset of the start of the bad record; for a compressed file it is the
        offset in the decompressed stream.
      check: which check failed, one of CHECKS.
      detail: extra evidence (expected and actual values).
    """

    CHECKS: tuple[str, ...] = ()

    def __init__(self, path: str, offset: int, check: str, detail: str = "", compressed: bool = False):
        self.path = path
        self.offset = offset
        self.check = check
        self.detail = detail
        self.compressed = compressed
        super().__init__(self._message())

    def _message(self) -> str:
        where = "decompressed offset" if self.compressed else "offset"
        message = f"{self.path}: {self.DESCRIPTIONS[self.check]} in the record at {where} {self.offset}"
        if self.detail:
            message += f" ({self.detail})"
        if self.offset == 0 and self.check != "truncated_stream":
            message += (
                ". The very first record is bad: this file may not be a TFRecord file at all, "
                "or it may be compressed (pass compression='gzip' or 'zlib')"
            )
        return message + "."

    DESCRIPTIONS: dict[str, str] = {}

    def __reduce__(self):  # keep pickling (Beam ships errors between processes) exact
        return (type(self), (self.path, self.offset, self.check, self.detail, self.compressed))


class CorruptRecordError(RecordError):
    """A record's length CRC or data CRC does not match: the bytes on disk are damaged."""

    CHECKS = ("length_crc", "length_too_large", "data_crc", "compressed_stream")
    DESCRIPTIONS = {
        "length_crc": "length CRC mismatch (the 8-byte length header is damaged)",
        "length_too_large": "length field larger than any TFRecord payload",
        "data_crc": "data CRC mismatch (the payload or its CRC footer is damaged)",
        "compressed_stream": "the compressed stream is corrupt",
    }


class TruncatedRecordError(RecordError):
    """The file ends inside a record, or a compressed stream ends before its end marker."""

    CHECKS = ("truncated_header", "truncated_payload", "truncated_footer", "truncated_stream")
    DESCRIPTIONS = {
        "truncated_header": "file ends inside the 12-byte header",
        "truncated_payload": "file ends inside the payload",
        "truncated_footer": "file ends inside the 4-byte data CRC footer",
        "truncated_stream": "compressed stream ends early or lacks its trailer",
    }


class RecordTooLargeError(TfrbeamError, ValueError):
    """A payload does not fit a TFRecord (at most 2 GiB - 1 bytes)."""


class UnsupportedCompressionError(TfrbeamError, ValueError):
    """A compression codec other than none, gzip or zlib was asked for."""


class RecordIndexError(TfrbeamError, ValueError):
    """A read index file (``.tfrbeam-index/<name>.idx``) is malformed; readers ignore it and log why."""


class ExampleDecodeError(TfrbeamError, ValueError):
    """Bytes that should hold a tf.train.Example (or SequenceExample) are malformed."""


class ExampleEncodeError(TfrbeamError, ValueError):
    """A value cannot be written as a tf.train.Example feature."""


class ArrowConversionError(TfrbeamError, ValueError):
    """An Arrow column or value has no Example feature mapping (or the reverse)."""


class ConfigError(TfrbeamError, ValueError):
    """A build config is invalid; the message names the key path, the value and what is allowed."""


class OutputExistsError(TfrbeamError):
    """Output files of an earlier run are in the way; rerun with overwrite=True to replace them."""


class BadRecordError(TfrbeamError, ValueError):
    """An input row could not be converted and the build's ``errors.on_bad_record`` is ``fail``."""


class GroupTooLargeError(TfrbeamError, ValueError):
    """A SequenceExample build's group holds more bytes than ``sequence.max_group_bytes`` allows and max_steps does not cut it."""


class HeldDataMissingError(TfrbeamError, RuntimeError):
    """Data a run held in this process's memory is gone: the run ended, or a worker in another process held it."""


class TooManyBadRecordsError(TfrbeamError):
    """More input rows were bad than ``errors.max_bad_fraction`` allows; nothing was published."""


class BuildFailedError(TfrbeamError):
    """A build's pipeline failed with an error that is not one of ours (the runner's, or a worker's): its name and last line."""


class InputError(TfrbeamError, ValueError):
    """An input file (CSV, Parquet, JSON lines, ORC, Avro, TFRecord) cannot be read at all: names the file, what is
    wrong and, where known, where."""


class ManifestError(TfrbeamError, ValueError):
    """A dataset manifest that cannot be read, or lacks a key its readers need."""


class OutputLockedError(TfrbeamError):
    """Another run holds the output's lock: it is building or committing into the same place right now."""


class OutputNotWritableError(TfrbeamError):
    """The output path is a file, cannot be created, is not writable, or its disk is full (found before anything ran)."""


class CommitError(TfrbeamError):
    """Publishing a finished write failed, or found that something changed the output under it; the old output is intact."""


class ShortWriteError(TfrbeamError):
    """Fewer records reached the output than the pipeline produced: the runner lost data; nothing was published."""


class RowCountError(ShortWriteError):
    """An input's reader gave other than the rows the input announced (a footer, block counts, an index, the table's
    num_rows), or than its parser found: names the input and both counts; nothing was published."""


class ShardMismatchError(TfrbeamError):
    """A shard of a built dataset does not match its manifest entry (record count or byte size).

    Attributes: path (the shard), what ("records" or "bytes"), expected (the manifest's figure),
    found (the shard's).
    """

    def __init__(self, path: str, what: str, expected: int, found: int):
        self.path, self.what, self.expected, self.found = path, what, expected, found
        super().__init__(
            f"{path}: the manifest says {expected} {what}, the shard has {found}: it was truncated, replaced or "
            "rewritten after the build. Run `tfrbeam verify` on the dataset directory to check every shard, "
            "and rebuild (or restore) the damaged ones"
        )

    def __reduce__(self):  # exact across processes (the reader's worker processes send errors back)
        return (type(self), (self.path, self.what, self.expected, self.found))


class RandomAccessError(TfrbeamError, ValueError):
    """A dataset cannot be read by record number (a compressed shard, an index out of range)."""


class RecordLimitError(TfrbeamError, ValueError):
    """A record is wider than a decode limit allows (names the record and the option that raises the limit).

    Attributes: record (its index in the decoded batch, when known) and limit.
    """

    def __init__(self, message: str, record: int | None = None, limit: int | None = None):
        self.record, self.limit = record, limit
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.record, self.limit))


class ShuffledDataError(TfrbeamError):
    """Bytes a build reads back fail their checksum: a block that came through the runner's shuffle (or does not
    decompress), a record of one of the run's spill files or a sequence build's spilled rows changed on disk. Names
    the split, shard and block, or the file (and record); nothing is published."""


class UnsupportedRunnerError(TfrbeamError):
    """The pipeline's runner is known to lose elements tfrbeam's transforms depend on; refused before anything runs."""


# --- input-read ---

class CompressedInputError(InputError):
    """A compressed input file ends before its end-of-stream marker or fails a checksum: names the file, codec and byte."""

# --- trust-read ---

class RefusedFileError(TfrbeamError, OSError):
    """A file tfrbeam found (not one it just wrote) is not what it reads there: a FIFO, device, directory or socket, a
    symlink where tfrbeam writes none, or larger than any file of its kind tfrbeam writes (``tfrbeam.base.bounded_read``)."""

class UnsafePathError(ManifestError):
    """A manifest names a path outside its dataset (absolute, ``..``, an odd component, a symlink leading out)."""

class DatasetChangedError(TfrbeamError):
    """The dataset was replaced (another build's ``--overwrite``) while it was being read; nothing was mixed.

    Attributes: root (the dataset directory), pinned (the run id read at the start), found (the run id now).
    """

    def __init__(self, root: str, pinned: str, found: str):
        self.root, self.pinned, self.found = root, pinned, found
        super().__init__(
            f"{root}: the dataset was replaced while it was read (run {pinned} when reading started, run {found} now); "
            "no records of the two were mixed: start the read again to read the new dataset"
        )

    def __reduce__(self):
        return (type(self), (self.root, self.pinned, self.found))


# --- trust-tools ---

class UnsafeOutputError(ConfigError):
    """A tool's output path would land outside the output directory it was given (a symlink leading out of it)."""


# --- parquet ---

class ParquetSchemaError(InputError):
    """The Parquet files of one input disagree on a column's type (beyond lossless widening), or one repeats a name."""


# --- main ---

class MissingShardError(TfrbeamError):
    """A shard the manifest lists is not in the dataset directory (deleted, moved or never copied)."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"{path}: the manifest lists this shard, but there is no such file: the dataset is incomplete "
                         "(deleted, moved or partly copied). Run `tfrbeam verify` on it, and rebuild or copy it again")

    def __reduce__(self):  # exact across processes
        return (type(self), (self.path,))


# --- object stores ---

class StorageError(TfrbeamError, OSError):
    """An object store (GCS, S3) refused or failed a request: names the object, the request and what to do.

    Every storage client's own exceptions become one of these at one boundary
    (``tfrbeam.base.object_store.storage_error``), never deeper in tfrbeam.
    """


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or bucket) does not exist."""


class PreconditionFailedError(StorageError, FileExistsError):
    """A conditional request lost: the object exists (create-if-absent) or changed (replace-if-match)."""


class StoragePermissionError(StorageError, PermissionError):
    """The credentials in use may not do that to that object or bucket."""


class ObjectTooLargeError(StorageError, RefusedFileError):
    """An object tfrbeam reads whole (a lock, a journal) is larger than any it writes: not one of its own."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The store did not answer (connection refused, timed out): nothing is known about the request's effect."""
