"""open_dataset's file order: shuffle_files permutes the files, anew each epoch, seeded; without it, sorted.

Records are read raw (each record's bytes name its file), one file at a time (num_parallel_reads=1)
and with no record shuffle (shuffle_buffer=0), so the order files appear in is the file order itself.
"""

from __future__ import annotations

import pathlib

import pytest

from tfrbeam import open_dataset
from tfrbeam.tfrecord.records import RecordWriter

NUM_FILES = 8
RECORDS_PER_FILE = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("file-order")
    for file_index in range(NUM_FILES):
        with RecordWriter(str(directory / f"part-{file_index:02d}.tfrecord")) as writer:
            for record in range(RECORDS_PER_FILE):
                writer.write(f"{file_index:02d}:{record}".encode())
    return directory


def _epochs(directory: pathlib.Path, epochs: int, **options) -> list[list[int]]:
    """The file indices in reading order (one entry per file), per epoch."""
    dataset = open_dataset(str(directory / "*.tfrecord"), raw=True, batch_size=RECORDS_PER_FILE, num_parallel_reads=1,
                           shuffle_buffer=0, executor="threads", **options)
    records = [bytes(value) for batch in dataset.repeat(epochs) for value in batch["record"]]
    dataset.close()
    assert len(records) == epochs * NUM_FILES * RECORDS_PER_FILE
    per_epoch = NUM_FILES * RECORDS_PER_FILE
    orders = []
    for epoch in range(epochs):
        chunk = records[epoch * per_epoch:(epoch + 1) * per_epoch]
        # Within a file the records stay in order, and a file is read whole before the next one.
        assert chunk == [f"{file:02d}:{record}".encode() for file in _files_of(chunk) for record in range(RECORDS_PER_FILE)]
        orders.append(_files_of(chunk))
    return orders


def _files_of(records: list[bytes]) -> list[int]:
    seen: list[int] = []
    for record in records:
        file_index = int(record.split(b":")[0])
        if file_index not in seen:
            seen.append(file_index)
    return seen


def test_without_shuffle_files_every_epoch_reads_the_files_in_sorted_order(files):
    assert _epochs(files, 3, shuffle_files=False, seed=1) == [list(range(NUM_FILES))] * 3


def test_shuffle_files_permutes_the_files_differently_each_epoch(files):
    orders = _epochs(files, 3, shuffle_files=True, seed=1)
    for order in orders:
        assert sorted(order) == list(range(NUM_FILES))
    assert all(order != list(range(NUM_FILES)) for order in orders)
    assert len({tuple(order) for order in orders}) == 3


def test_shuffled_file_order_is_reproducible_from_the_seed(files):
    first = _epochs(files, 2, shuffle_files=True, seed=7)
    assert _epochs(files, 2, shuffle_files=True, seed=7) == first
    assert _epochs(files, 2, shuffle_files=True, seed=8) != first
