"""Reader processes work in a process whose sockets default to a timeout (Beam's GCS auth sets one: 60 s)."""

from __future__ import annotations

import socket

import pyarrow as pa

import tfrbeam


def test_worker_processes_read_under_a_process_wide_socket_timeout(tmp_path):
    tfrbeam.write_dataset(pa.table({"x": list(range(2000))}), str(tmp_path / "ds"), num_shards=4, seed=1, progress=False)
    saved = socket.getdefaulttimeout()
    socket.setdefaulttimeout(60)
    try:
        with tfrbeam.open_dataset(str(tmp_path / "ds"), split="train", batch_size=100, num_workers=2,
                                  executor="processes") as dataset:
            values = sorted(int(value) for batch in dataset for value in batch["x"])
            assert dataset.stats["executor"] == "processes"
    finally:
        socket.setdefaulttimeout(saved)
    assert values == list(range(2000))
