"""Turning in-flight blocks into what the caller asked for: numpy arrays, ``Ragged`` rows or Arrow."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from tfrbeam.codec.kinds import ARROW_TYPES
from tfrbeam.dataset.columns import Block, Column, Ragged, pad_rows, row_offsets
from tfrbeam.dataset.reader import present_key
from tfrbeam.dataset.spec import (
    ContextFeature,
    Feature,
    FixedLenFeature,
    FixedLenSequenceFeature,
    SequenceFeature,
    VarLenFeature,
    VarLenSequenceFeature,
)

Padding = Mapping[str, "int | None"]


def _binary_array(leaf: np.ndarray, byte_lengths: np.ndarray | None) -> pa.Array:
    """Values given as bytes back to back plus lengths (or as ``bytes`` objects), as an Arrow binary array (large
    past 2 GiB)."""
    if leaf.dtype == object:  # raw records: made once as bytes objects (BlockDecoder)
        large = sum(map(len, leaf)) >= 2**31
        return pa.array(leaf, type=pa.large_binary() if large else pa.binary())
    assert byte_lengths is not None
    offsets = row_offsets(byte_lengths)
    large = offsets[-1] >= 2**31
    return (pa.LargeBinaryArray if large else pa.BinaryArray).from_buffers(
        pa.large_binary() if large else pa.binary(),
        len(byte_lengths),
        [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(leaf)],
    )


def _bytes_objects(leaf: np.ndarray, byte_lengths: np.ndarray | None) -> np.ndarray:
    """A numpy object array of ``bytes``, one per value, via Arrow's C++ conversion.

    A leaf of ``bytes`` objects already (raw records) is handed out as it is, or copied when it is a view of a
    block's (the caller's batch must not keep the block's other records alive).
    """
    if leaf.dtype == object:
        return leaf if leaf.base is None else leaf.copy()
    assert byte_lengths is not None
    out = _binary_array(leaf, byte_lengths).to_numpy(zero_copy_only=False)
    return out if out.dtype == object else out.astype(object)


def _writable(array: np.ndarray) -> np.ndarray:
    """Arrays that still view Arrow's (read-only) buffers are copied: callers, and torch, may write to them."""
    return array if array.flags.writeable else array.copy()


def to_numpy(block: Block, features: Mapping[str, Feature], padded: Padding, pad_values: Mapping[str, object] | None = None,
             return_mask: bool = False) -> dict[str, np.ndarray | Ragged]:
    """Fixed-length features as dense arrays, variable-length ones as ``Ragged`` (or padded on request, with masks).

    A feature list is ``Ragged`` over steps (values ``[steps, *shape]``, or a ``Ragged`` of the
    steps' values when their length varies); padded, ``[B, T, *shape]`` (``[B, T, L]``) plus
    ``{name}__steps``, the steps kept of each record.
    """
    out: dict[str, np.ndarray | Ragged] = {}
    for name, feature in features.items():
        column = block[name]
        if isinstance(feature, (FixedLenSequenceFeature, VarLenSequenceFeature)):
            padding = padded[name] if name in padded else _NOT_PADDED
            out.update(_sequence_arrays(name, column, feature, padding, (pad_values or {}).get(name), return_mask))
            continue
        if isinstance(feature, FixedLenFeature):
            if feature.dtype == "bytes":
                values = _bytes_objects(column.leaf, column.levels[-1] if column.levels else None)
                out[name] = values.reshape((column.num_rows,) + feature.shape)
            else:
                out[name] = _writable(column.leaf)
            continue
        values = _bytes_objects(column.leaf, column.levels[-1]) if feature.dtype == "bytes" else _writable(column.leaf)
        lengths = column.levels[0]
        if name in padded and padded[name] is None and isinstance(feature, VarLenFeature) and feature.scalar:
            out.update(_optional_scalar(name, values, lengths, (pad_values or {}).get(name), return_mask))
        elif name in padded:
            dense = pad_rows(values, lengths, padded[name], (pad_values or {}).get(name))
            out[name] = dense
            if return_mask:
                out[f"{name}__mask"] = np.arange(dense.shape[1]) < np.asarray(lengths, dtype=np.int64)[:, None]
        else:
            out[name] = Ragged(values, _writable(lengths))
    return out


_NOT_PADDED = -1


def _optional_scalar(name: str, values: np.ndarray, lengths: np.ndarray, pad_value: object,
                     return_mask: bool) -> dict[str, np.ndarray]:
    """A scalar some records omit as ``[B]``, ``pad_value`` where a record has no value (and ``{name}__mask`` ``[B]``)."""
    present = np.asarray(lengths) == 1  # the decoder refused more than one value
    dense = pad_rows(values, lengths, 1, pad_value).reshape(-1)
    return {name: dense, f"{name}__mask": present} if return_mask else {name: dense}


def _sequence_arrays(name: str, column: Column, feature: SequenceFeature, padding: int | None, pad_value: object,
                     return_mask: bool) -> dict[str, np.ndarray | Ragged]:
    """A feature list's outputs: Ragged over steps, or padded to ``[B, T, ...]`` with ``__steps`` (and ``__mask``)."""
    steps = column.levels[0]
    values, value_lengths = _step_values(Column(column.leaf, column.levels[1:]), feature)
    if padding == _NOT_PADDED:
        inner = values if value_lengths is None else Ragged(values, _writable(value_lengths))
        return {name: Ragged(inner, _writable(steps))}
    if value_lengths is None:
        dense = pad_rows(values, steps, padding, pad_value)
        mask = np.arange(dense.shape[1]) < steps[:, None]
    else:  # steps of any length: pad each step to the longest, then the steps
        step_rows = pad_rows(values, value_lengths, None, pad_value)
        dense = pad_rows(step_rows, steps, padding, pad_value)
        step_mask = np.arange(step_rows.shape[1]) < value_lengths[:, None]
        mask = pad_rows(step_mask, steps, padding, False)
    out: dict[str, np.ndarray | Ragged] = {name: dense, f"{name}__steps": np.minimum(steps, dense.shape[1])}
    if return_mask:
        out[f"{name}__mask"] = mask
    return out


def _step_values(steps: Column, feature: SequenceFeature) -> tuple[np.ndarray, np.ndarray | None]:
    """Every step's values (``[steps, *shape]``, or flat with each step's value count when steps vary)."""
    if isinstance(feature, FixedLenSequenceFeature):
        if feature.dtype == "bytes":
            return _bytes_objects(steps.leaf, steps.levels[-1]).reshape((steps.num_rows, *feature.shape)), None
        return _writable(steps.leaf), None
    values = _bytes_objects(steps.leaf, steps.levels[-1]) if feature.dtype == "bytes" else _writable(steps.leaf)
    return values, steps.levels[0]


def to_arrow(block: Block, features: Mapping[str, Feature]) -> pa.RecordBatch:
    """The block as an Arrow RecordBatch: scalars, fixed_size_list for fixed shapes, list for variable.

    A variable-length feature a record lacks is null there (as ``examples_to_record_batch`` and
    the Parquet export give it); one it holds with no values is ``[]``.
    """
    arrays = []
    for name, feature in features.items():
        array = _arrow_column(block[name], feature)
        present = block.get(present_key(name))
        if present is not None and not present.leaf.all():
            array = _with_nulls(array, present.leaf)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=list(features))


def _with_nulls(array: pa.Array, present: np.ndarray) -> pa.Array:
    """A list array with the rows where ``present`` is False made null (their lists are empty, so offsets hold)."""
    validity = pa.py_buffer(np.packbits(np.asarray(present, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(array.type, len(array), [validity, *array.buffers()[1:2]], children=[array.values])


def _arrow_column(column: Column, feature: Feature) -> pa.Array:
    if isinstance(feature, (FixedLenSequenceFeature, VarLenSequenceFeature)):  # a list<step> column
        steps = _arrow_column(Column(column.leaf, column.levels[1:]), feature.step)
        return pa.ListArray.from_arrays(pa.array(row_offsets(column.levels[0]).astype(np.int32)), steps)
    return _context_arrow_column(column, feature)


def _context_arrow_column(column: Column, feature: ContextFeature) -> pa.Array:
    if feature.dtype == "bytes":
        values: pa.Array = _binary_array(column.leaf, column.levels[-1] if column.levels else None)
        row_lengths = column.levels[0] if len(column.levels) == 2 else None
    else:
        values = pa.array(column.leaf.reshape(-1), type=ARROW_TYPES[feature.dtype])
        row_lengths = column.levels[0] if column.levels else None
    if isinstance(feature, FixedLenFeature):
        # from_buffers with each level's row count: from_arrays refuses (or divides by) a size of 0
        for depth in range(len(feature.shape), 0, -1):
            rows = column.num_rows * math.prod(feature.shape[: depth - 1])
            values = pa.Array.from_buffers(pa.list_(values.type, feature.shape[depth - 1]), rows, [None], children=[values])
        return values
    assert row_lengths is not None
    return pa.ListArray.from_arrays(pa.array(row_offsets(row_lengths).astype(np.int32)), values)
