"""WriteToTFRecord's split of a batch over shards: slices differ by at most one record, any remainder."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tfrbeam.beam import sink
from tfrbeam.beam.sink import frame_batch
from tfrbeam.tfrecord.records import read_records


@pytest.mark.parametrize("count, shards", [(23, 6), (59, 10), (100, 7), (3, 8)])
def test_one_batch_is_cut_into_slices_within_one_record(count, shards):
    splitter = sink._SplitByShardFn(shards)
    splitter.start_bundle()
    payloads = [b"%d" % index for index in range(count)]
    emitted = list(splitter.process(frame_batch(payloads))) + [value.value for value in splitter.finish_bundle()]
    sizes = dict.fromkeys(range(shards), 0)
    seen = []
    for shard, (framed, lengths) in emitted:
        records = list(read_records(io.BytesIO(framed), None))
        assert [len(record) for record in records] == np.frombuffer(lengths, "<u4").tolist()
        sizes[shard] += len(records)
        seen += records
    assert seen == payloads  # one batch, drained shard by shard: the slices are contiguous and in order
    base, remainder = divmod(count, shards)
    assert sorted(sizes.values()) == [base] * (shards - remainder) + [base + 1] * remainder
