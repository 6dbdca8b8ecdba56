"""STAND-IN (helper seq-build): the reference ``encode_sequence_batch``, one ``encode_sequence_example`` call per group.

Helper seq-io writes the vectorised encoder with this exact signature and output; the lead merges it
into main and this file is then replaced by main's version. It is the reference: slow (Python values
per step), but correct by construction, so the build can be written and tested against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tfrbeam.columnar_encode import EncodedExamples, feature_kind
from tfrbeam.example import encode_sequence_example

__all__ = ["encode_sequence_batch"]


def encode_sequence_batch(
    table: pa.Table | pa.RecordBatch,
    group_offsets: np.ndarray,
    context: Sequence[str],
    feature_lists: Sequence[str],
) -> EncodedExamples:
    """One SequenceExample per group ``table[group_offsets[i]:group_offsets[i + 1]]`` (rows in step order).

    Context columns are taken from each group's first row (a null there leaves the feature out);
    feature-list columns give one step per row (a null step is an empty list of the column's kind).
    """
    kinds = {name: feature_kind(name, table.schema.field(name).type)[0] for name in (*context, *feature_lists)}
    columns = {name: table.column(name).to_pylist() for name in (*context, *feature_lists)}
    bounds = np.asarray(group_offsets, dtype=np.int64).tolist()
    records = []
    for start, end in zip(bounds, bounds[1:]):
        context_values = {name: columns[name][start] for name in context if columns[name][start] is not None}
        steps = {name: [[] if value is None else value for value in columns[name][start:end]] for name in feature_lists}
        records.append(encode_sequence_example(
            context_values, steps, kinds={name: kinds[name] for name in context},
            feature_list_kinds={name: kinds[name] for name in feature_lists},
        ))
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(record) for record in records], out=offsets[1:])
    return EncodedExamples(data=np.frombuffer(b"".join(records), dtype=np.uint8), offsets=offsets)
