"""Many TFRecord frames at once (tfrbeam/tfrecord/frames.py): the bytes of records.frame_records, however ordered."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.tfrecord import frames as frames_module
from tfrbeam.tfrecord.frames import frame_gathered, frame_ordered, join_frames_in_buffers, payload_prefixes
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


def test_this_pyarrow_frames_through_binary_views():
    """The test environment's pyarrow (the pinned one) takes the no-call-per-record path; older ones join."""
    assert frames_module._BINARY_VIEW_FRAMES


@pytest.mark.parametrize("binary_views", [True, False])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.binary(max_size=40), max_size=12), min_size=1, max_size=4), st.randoms(use_true_random=False),
       st.booleans())
def test_frames_of_payloads_in_several_buffers_equal_frame_records(monkeypatch, binary_views, parts, rng, given_prefixes):
    """Payloads of 0-12 bytes (held in their views) and longer ones, from several buffers (some unused), in any order;
    their prefixes read by the join or given (``payload_prefixes``, as a shard writer reads them once per window)."""
    monkeypatch.setattr(frames_module, "_BINARY_VIEW_FRAMES", binary_views)  # the same for every example
    buffers, picks = [], []
    for index, payloads in enumerate(parts):
        gap = b"\xff" * rng.randrange(3)  # payloads need not touch each other
        buffers.append(memoryview(b"".join(gap + payload for payload in payloads)) if payloads else None)
        start = 0
        for payload in payloads:
            start += len(gap)
            picks.append((index, start, payload))
            start += len(payload)
    rng.shuffle(picks)
    buffer_of = np.array([pick[0] for pick in picks], dtype=np.int64)
    starts = np.array([pick[1] for pick in picks], dtype=np.int64)
    lengths = np.array([len(pick[2]) for pick in picks], dtype=np.int64)
    masked = frames_module.mask_crcs(np.array([crc32c.crc32c(pick[2]) for pick in picks], dtype=np.uint64))
    prefixes = None
    if given_prefixes:
        prefixes = np.zeros(len(picks), dtype="<u4")
        for index, buffer in enumerate(buffers):
            mine = np.flatnonzero(buffer_of == index)
            if mine.size:
                prefixes[mine] = payload_prefixes(np.frombuffer(buffer, np.uint8), starts[mine], lengths[mine])
    framed = join_frames_in_buffers(buffers, buffer_of, starts, lengths, masked, prefixes)
    assert bytes(framed) == frame_records([pick[2] for pick in picks])



def test_an_older_pyarrow_is_detected_and_frames_by_joining(monkeypatch):
    """pyarrow 14-15 lack binary_view; 16-18 refuse a view array over several buffers; a cast Arrow does not
    implement raises ArrowNotImplementedError: the probe says no to each."""
    import pyarrow as pa

    assert frames_module._binary_view_frames_work()
    monkeypatch.delattr(pa, "binary_view")
    assert not frames_module._binary_view_frames_work()
    monkeypatch.undo()

    class OneBufferArray:
        @staticmethod
        def from_buffers(*args, **kwargs):
            raise ValueError("Type's expected number of buffers (2) did not match the passed number (3)")

    class Pyarrow18:  # pyarrow as 16-18 behave: binary views over one data buffer only
        Array = OneBufferArray

        def __getattr__(self, name):
            return getattr(pa, name)

    monkeypatch.setattr(frames_module, "pa", Pyarrow18())
    assert not frames_module._binary_view_frames_work()

    class ViewsWithoutCast:  # a build whose binary views cannot be cast to large_binary (none released is seen so)
        @staticmethod
        def from_buffers(*args, **kwargs):
            class Uncastable:
                def cast(self, target):
                    raise pa.ArrowNotImplementedError("Unsupported cast from binary_view to large_binary")
            return Uncastable()

    class PyarrowWithoutCast(Pyarrow18):
        Array = ViewsWithoutCast

    monkeypatch.setattr(frames_module, "pa", PyarrowWithoutCast())
    assert not frames_module._binary_view_frames_work()


def test_payload_prefixes_are_the_first_four_bytes_of_long_payloads_only():
    buffer = np.frombuffer(b"ab" + b"0123456789abcdef" + b"xyz" + bytes(range(13)), dtype=np.uint8)
    starts, lengths = np.array([2, 18, 21, 2]), np.array([16, 3, 13, 12])
    prefixes = payload_prefixes(buffer, starts, lengths)
    assert prefixes.tolist() == [int.from_bytes(b"0123", "little"), 0, int.from_bytes(bytes(range(4)), "little"), 0]
