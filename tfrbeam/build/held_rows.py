"""A sequence build's bucketed rows held in this process, so only a small reference crosses the GroupByKey.

On runners whose every worker runs in this process (the in-process FnApiRunner, the DirectRunner
in_memory / multi_threading: the runs whose piece store is ``memory``), the converter puts each
Arrow batch of a bucket's rows here and emits a ``HeldRows`` reference instead of the batch. The
runner's GroupByKey still groups the references by bucket (so the graph is the one Dataflow
runs), but it no longer serializes every batch through its data plane, holds a second and a
third copy of them in its grouping buffers, and decodes them again for the encoder.

Lifetime: a run's batches live under its staging directory's name. The encoder takes a bucket's
batches and releases them once the bucket is encoded; the run's entry goes with its last batch.
After a failed run ``discard_held_rows`` (called by the commit's cleanup, with the held pieces)
frees whatever is left, so nothing outlives a build (``runs_holding_rows()`` is empty after it).
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import threading
from collections.abc import Iterable

import pyarrow as pa
from apache_beam import coders

from tfrbeam.errors import HeldDataMissingError

__all__ = [
    "HeldRows", "HeldRowsCoder", "discard_held_rows", "held_batches", "hold_rows", "release_rows", "runs_holding_rows",
]


@dataclasses.dataclass(frozen=True)
class HeldRows:
    """What crosses the GroupByKey for one held batch: the run it belongs to, its number there and its row count."""

    run_key: str
    number: int
    rows: int


# The held batches of every run in this process, by staging directory, then by number.
_RUNS: dict[str, dict[int, pa.RecordBatch]] = {}
_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def hold_rows(run_key: str, batch: pa.RecordBatch) -> HeldRows:
    """Keep ``batch`` in this process for the run staging in ``run_key``; the reference to send instead."""
    with _LOCK:
        number = next(_NUMBERS)
        _RUNS.setdefault(run_key, {})[number] = batch
    return HeldRows(run_key, number, batch.num_rows)


def held_batches(refs: Iterable[HeldRows]) -> list[pa.RecordBatch]:
    """The batches ``refs`` point to (still held until ``release_rows``), or HeldDataMissingError naming the run."""
    batches = []
    with _LOCK:
        for ref in refs:
            batch = _RUNS.get(ref.run_key, {}).get(ref.number)
            if batch is None:
                raise HeldDataMissingError(
                    f"rows held for the run staging in {ref.run_key} (batch {ref.number}) are not in this process: the "
                    "run ended or failed, the bucket was already encoded (a retried bundle), or a worker in another "
                    "process held them (use --piece_store spill or inline with such runners)")
            batches.append(batch)
    return batches


def release_rows(refs: Iterable[HeldRows]) -> None:
    """Free the batches of ``refs`` (their bucket is encoded); a run's entry goes with its last batch."""
    with _LOCK:
        for ref in refs:
            held = _RUNS.get(ref.run_key)
            if held is None:
                continue
            held.pop(ref.number, None)
            if not held:
                del _RUNS[ref.run_key]


def discard_held_rows(run_key: str) -> None:
    """Free every batch the run staging in ``run_key`` holds in this process (after a failure; a no-op otherwise)."""
    with _LOCK:
        _RUNS.pop(run_key, None)


def runs_holding_rows() -> list[str]:
    """The runs that hold rows in this process now (none once every build has ended)."""
    with _LOCK:
        return sorted(_RUNS)


_HEADER = struct.Struct("<QQ")


class HeldRowsCoder(coders.Coder):
    """A HeldRows as its number, row count and run key: a few dozen bytes, whatever the batch's size."""

    def encode(self, ref: HeldRows) -> bytes:
        return _HEADER.pack(ref.number, ref.rows) + ref.run_key.encode("utf-8")

    def decode(self, encoded: bytes) -> HeldRows:
        number, rows = _HEADER.unpack_from(encoded)
        return HeldRows(encoded[_HEADER.size:].decode("utf-8"), number, rows)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return HeldRows


coders.registry.register_coder(HeldRows, HeldRowsCoder)
