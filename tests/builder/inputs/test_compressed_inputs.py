"""Compressed CSV inputs are read to their end-of-stream marker: a cut or damaged stream fails in one line."""

from __future__ import annotations

import bz2
import gzip
import lzma

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.builder.config.schema import CsvOptions
from tfrbeam.builder.inputs.csv import read_csv_file
from tfrbeam.errors import CompressedInputError, InputError

ROWS = [f"{i},{i * 1.0 / 3:.6f},name{i}" for i in range(200)]
TEXT = ("id,v,s\n" + "\n".join(ROWS) + "\n").encode()
CODECS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def read_all(path: str) -> list[tuple]:
    rows = []
    for source in read_csv_file(path, CsvOptions()):
        rows.extend(zip(*(source.batch.column(i).to_pylist() for i in range(3))))
    return rows


FULL = [tuple(value.encode() for value in row.split(",")) for row in ROWS]


def outcome(tmp_path, suffix: str, data: bytes) -> str:
    path = tmp_path / f"in.csv{suffix}"
    path.write_bytes(data)
    try:
        rows = read_all(str(path))
    except InputError as error:
        message = str(error)
        assert "\n" not in message and str(path) in message, message
        return "error"
    assert rows == FULL, f"a short or changed dataset: {len(rows)} rows"
    return "full"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.sampled_from(sorted(CODECS)), cut=st.floats(0.0, 0.999))
def test_a_truncated_stream_is_a_one_line_error_never_a_short_dataset(tmp_path, suffix, cut):
    data = CODECS[suffix](TEXT)
    assert outcome(tmp_path, suffix, data[:int(len(data) * cut)]) == "error"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.sampled_from(sorted(CODECS)), where=st.floats(0.0, 0.999), bit=st.integers(0, 7))
def test_a_flipped_bit_is_the_full_dataset_or_a_one_line_error(tmp_path, suffix, where, bit):
    data = bytearray(CODECS[suffix](TEXT))
    data[int(len(data) * where)] ^= 1 << bit
    outcome(tmp_path, suffix, bytes(data))


def test_a_cut_gzip_names_file_codec_and_compressed_offset(tmp_path):
    data = gzip.compress(TEXT)
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CompressedInputError, match=rf"cut.csv.gz: the gzip stream ends at compressed byte {len(data) // 2} "):
        read_all(str(path))


def test_a_corrupt_gzip_crc_names_the_byte(tmp_path):
    data = bytearray(gzip.compress(TEXT))
    data[-6] ^= 0xFF  # the CRC32 in the trailer
    path = tmp_path / "crc.csv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(CompressedInputError, match=r"crc.csv.gz: the gzip stream is corrupt at compressed byte \d+ "
                                                   r"\(Error -3 .*incorrect data check\)"):
        read_all(str(path))


def test_concatenated_members_read_whole(tmp_path):
    path = tmp_path / "two.csv.gz"
    half = TEXT.index(b"\n100,") + 1
    path.write_bytes(gzip.compress(TEXT[:half]) + gzip.compress(TEXT[half:]))
    assert read_all(str(path)) == FULL


def _tree(root) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("damage", ["cut late", "flipped byte early"])
def test_a_build_over_a_damaged_gzip_publishes_nothing_and_says_so_in_one_line(tmp_path, capsys, damage):
    """End to end through `tfrbeam build`: exit 1, one line naming the file and codec, no dataset, nothing else changed."""
    from tfrbeam.cli.build import main as build_main

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "good.csv.gz").write_bytes(gzip.compress(TEXT))
    data = bytearray(gzip.compress(TEXT))
    if damage == "cut late":
        data = data[:int(len(data) * 0.9)]
    else:
        data[len(data) // 8] ^= 0x10  # inside the first rows, which settle the inferred feature types
    (data_dir / "bad.csv.gz").write_bytes(bytes(data))
    config = tmp_path / "build.yaml"
    config.write_text(f"input: {{format: csv, path: '{data_dir}/*.csv.gz'}}\n"
                      f"output: {{path: '{tmp_path}/out', num_shards: 2}}\n")
    before = _tree(tmp_path)
    code = build_main([str(config), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfrbeam build: error: "), err
    assert "bad.csv.gz" in lines[0] and "gzip" in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    after = {name: content for name, content in _tree(tmp_path).items() if not name.startswith(".out.tfrbeam")}
    assert after == before
