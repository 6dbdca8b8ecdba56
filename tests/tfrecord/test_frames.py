"""Many TFRecord frames at once (tfrbeam/tfrecord/frames.py): the bytes of records.frame_records, however ordered."""

from __future__ import annotations

import crc32c
import numpy as np
from hypothesis import given, settings, strategies as st

from tfrbeam.tfrecord.frames import frame_gathered, frame_ordered
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, frame_records


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30), st.randoms(use_true_random=False))
def test_frame_gathered_equals_frame_records(payloads, rng):
    offsets = np.cumsum([0] + [len(item) for item in payloads]).astype(np.int64)
    order = list(range(len(payloads)))
    rng.shuffle(order)
    starts, ends = offsets[order], offsets[np.array(order, dtype=np.int64) + 1]
    view = memoryview(b"".join(payloads))
    expected = frame_records([view[s:e] for s, e in zip(starts.tolist(), ends.tolist())])
    assert frame_gathered(view, starts, ends) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40), st.randoms(use_true_random=False), st.booleans())
def test_frame_ordered_equals_frame_records(payloads, rng, many_lengths):
    if many_lengths:  # more distinct lengths than frame_ordered copies group by group
        payloads = payloads + [bytes([index % 256]) * (index + 1) for index in range(100)]
    offsets = np.cumsum([0] + [len(item) for item in payloads]).astype(np.int64)
    order = list(range(len(payloads)))
    rng.shuffle(order)
    data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    crcs = np.array([crc32c.crc32c(item) for item in payloads], dtype=np.uint32)
    framed, framed_offsets = frame_ordered(data, offsets, np.array(order, dtype=np.int64), crcs)
    assert framed.tobytes() == frame_records([payloads[index] for index in order])
    assert framed_offsets.tolist() == np.cumsum([0] + [len(payloads[index]) + RECORD_OVERHEAD for index in order]).tolist()
