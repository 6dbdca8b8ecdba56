"""A Beam coder for pyarrow RecordBatches: Arrow IPC bytes, and size estimates without encoding.

Beam otherwise pickles a RecordBatch, also just to estimate its size for the runner's element
counters (the first elements of every bundle are all measured); a batch's buffers already say
how large it is. Importing this module registers the coder for ``pyarrow.RecordBatch``
PCollections (``tfrbeam.beam`` imports it).
"""

from __future__ import annotations

import pyarrow as pa
from apache_beam import coders


class RecordBatchCoder(coders.Coder):
    """One RecordBatch as an Arrow IPC stream (schema and batch)."""

    def encode(self, batch: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.RecordBatch:
        return pa.ipc.open_stream(encoded).read_next_batch()

    def estimate_size(self, batch: pa.RecordBatch) -> int:
        return batch.get_total_buffer_size()

    def is_deterministic(self) -> bool:
        return False  # equal batches may be laid out in different buffers

    def to_type_hint(self):
        return pa.RecordBatch


coders.registry.register_coder(pa.RecordBatch, RecordBatchCoder)
