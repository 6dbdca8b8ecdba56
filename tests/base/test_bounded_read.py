"""The one bounded, typed read of a found file: a FIFO, device, directory, link or giant is one line, at once.

Issue 43 item 1: found files were read whole (``handle.read()``), so a FIFO hung a tool and a sparse
5 GB file or ``/dev/zero`` took it past 3 GB. Each case here would hang on an unbounded reader: a
helper opens the FIFO's other end after a few seconds, so such a test fails in seconds instead.
"""

from __future__ import annotations

import os
import resource

import pytest

from tests.planted import not_blocked_by
from tfrbeam.base.bounded_read import check_found, open_regular
from tfrbeam.base.file_access import read_found
from tfrbeam.errors import RefusedFileError


def test_a_regular_file_within_its_cap_is_read_whole(tmp_path):
    path = tmp_path / "owner.json"
    path.write_bytes(b"x" * 1000)
    assert read_found(str(path), 1000, "owner record") == b"x" * 1000


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_found(str(tmp_path / "absent"), 10, "lock file")


def test_a_fifo_is_refused_at_once_naming_it(tmp_path):
    path = tmp_path / "tfrbeam_dataset.json"
    os.mkfifo(path)
    with not_blocked_by(path), pytest.raises(RefusedFileError, match="FIFO") as refused:
        read_found(str(path), 1 << 20, "manifest")
    assert str(path) in str(refused.value) and "manifest" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_a_shard_that_is_a_fifo_is_refused_when_opened(tmp_path):
    path = tmp_path / "train-00000-of-00001.tfrecord"
    os.mkfifo(path)
    with not_blocked_by(path), pytest.raises(RefusedFileError, match="FIFO"):
        open_regular(str(path), "TFRecord file")


def test_a_sparse_giant_is_refused_from_its_size_without_a_read(tmp_path):
    path = tmp_path / "tfrbeam_dataset.json"
    with open(path, "wb") as handle:
        handle.truncate(5 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RefusedFileError, match=f"{5 << 30} bytes, larger than any manifest"):
        read_found(str(path), 512 << 20, "manifest")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: not even the cap was read


def test_a_file_larger_than_its_size_says_is_read_to_the_cap_plus_one_only():
    # /proc files report 0 bytes: only the read itself can find that one holds more than the cap.
    with pytest.raises(RefusedFileError, match="more than 16 bytes"):
        read_found("/proc/self/maps", 16, "lock file")


def test_a_link_to_dev_zero_is_refused_as_a_link_or_as_a_device(tmp_path):
    link = tmp_path / "tfrbeam_dataset.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(RefusedFileError, match=r"symbolic link .*'/dev/zero'"):
        read_found(str(link), 1 << 20, "manifest")
    with pytest.raises(RefusedFileError, match="character device"):
        read_found(str(link), 1 << 20, "manifest", follow_links=True)


def test_a_link_to_a_regular_file_is_refused_unless_links_are_followed(tmp_path):
    (tmp_path / "real.json").write_bytes(b"{}")
    (tmp_path / "tfrbeam_dataset.json").symlink_to("real.json")
    with pytest.raises(RefusedFileError, match="symbolic link"):
        read_found(str(tmp_path / "tfrbeam_dataset.json"), 100, "manifest")
    assert read_found(str(tmp_path / "tfrbeam_dataset.json"), 100, "manifest", follow_links=True) == b"{}"


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(RefusedFileError, match="a directory"):
        read_found(str(tmp_path), 100, "journal")


def test_check_found_refuses_the_same_without_opening(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFileError, match="FIFO"):
        check_found(str(fifo), 100, "manifest")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(RefusedFileError, match="101 bytes"):
        check_found(str(big), 100, "manifest")
    check_found(str(big), 101, "manifest")


def test_an_opened_regular_file_reads_normally(tmp_path):
    path = tmp_path / "shard"
    path.write_bytes(b"abc" * 1000)
    with open_regular(str(path)) as handle:
        assert handle.read(3) == b"abc"
        handle.seek(2997)
        assert handle.read() == b"abc"
