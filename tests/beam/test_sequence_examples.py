"""WriteSequenceExamples and ReadSequenceExamples: (context, feature_lists) pairs in, the same pairs out."""

from __future__ import annotations

import collections
import os
import pathlib

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests.beam.test_source import run_pipeline, write_records
from tests.faults import injected
from tests.helpers import shard_files, with_float32_bits
from tfrbeam.beam import ReadSequenceExamples, WriteSequenceExamples
from tfrbeam.beam.sequence_examples import DecodeToPairs, _EncodePairs
from tfrbeam.codec.example import decode_sequence_example, encode_example, encode_sequence_example
from tfrbeam.errors import ExampleDecodeError, ExampleEncodeError, OutputExistsError
from tfrbeam.tfrecord.blocks import RecordBlock
from tfrbeam.tfrecord.records import read_records

PAIRS = [
    ({"user": [i], "country": [b"c%d" % (i % 3)]},
     {"clicks": [[j] for j in range(1 + i % 4)], "pos": [[j / 2, -j] for j in range(1 + i % 4)],
      "query": [[b"q%d" % j] * (j % 2) for j in range(1 + i % 4)]})
    for i in range(40)
]  # fmt: skip
LIST_KINDS = {"clicks": "int64", "pos": "float", "query": "bytes"}


def _written(prefix: str, suffix: str = "", compression: str = "auto") -> collections.Counter:
    return collections.Counter(r for path in shard_files(prefix, suffix) for r in read_records(path, compression))


def _expected() -> collections.Counter:
    return collections.Counter(encode_sequence_example(c, f, feature_list_kinds=LIST_KINDS) for c, f in PAIRS)


def test_write_sequence_examples_writes_the_codecs_bytes_with_the_sinks_knobs(tmp_path):
    fixed, limited = str(tmp_path / "fixed"), str(tmp_path / "limited")

    def build(pipeline):
        pairs = pipeline | beam.Create(PAIRS)
        _ = pairs | "Fixed" >> WriteSequenceExamples(fixed, num_shards=3, feature_list_kinds=LIST_KINDS)
        _ = pairs | "Limited" >> WriteSequenceExamples(limited, max_records_per_shard=7, file_name_suffix=".gz",
                                                       feature_list_kinds=LIST_KINDS)

    run_pipeline(build)
    assert len(shard_files(fixed)) == 3
    assert _written(fixed) == _expected()  # byte for byte encode_sequence_example's output
    assert len(shard_files(limited, ".gz")) >= 6
    assert all(sum(1 for _ in read_records(path)) <= 7 for path in shard_files(limited, ".gz"))
    assert _written(limited, ".gz") == _expected()


def test_write_sequence_examples_takes_context_kinds_and_refuses_an_existing_output(tmp_path):
    prefix = str(tmp_path / "out")
    pairs = [({"empty": []}, {"steps": [[], []]})]
    kinds = {"empty": "float"}
    run_pipeline(lambda p: p | beam.Create(pairs) | WriteSequenceExamples(
        prefix, context_kinds=kinds, feature_list_kinds={"steps": "bytes"}, compression="gzip"))
    (record,) = _written(prefix, compression="gzip")
    assert decode_sequence_example(record, kinds=True) == ({"empty": ("float", [])},
                                                           {"steps": [("bytes", []), ("bytes", [])]})
    with pytest.raises(OutputExistsError):
        run_pipeline(lambda p: p | beam.Create(pairs) | WriteSequenceExamples(
            prefix, context_kinds=kinds, feature_list_kinds={"steps": "bytes"}, overwrite=False))


def test_write_sequence_examples_refuses_what_it_cannot_encode():
    encode = _EncodePairs(None, {"s": "int64"})
    with pytest.raises(ExampleEncodeError, match=r"takes \(context dict, feature_lists dict\) pairs, got a dict"):
        encode({"a": [1]})
    with pytest.raises(ExampleEncodeError, match=r"pairs, got a tuple"):
        encode(({}, {}, {}))
    with pytest.raises(ExampleEncodeError, match=r"feature list 's': step 0: float value 1.5"):
        encode(({}, {"s": [[1.5]]}))
    with pytest.raises(Exception, match=r"context feature 'c'"):
        run_pipeline(lambda p: p | beam.Create([({"c": [object()]}, {})]) | WriteSequenceExamples("/nonexistent/x"))


def test_read_sequence_examples_gives_the_decoded_pairs(tmp_path, tf_vectors):
    prefix = str(tmp_path / "seq")
    run_pipeline(lambda p: p | beam.Create(PAIRS) | WriteSequenceExamples(prefix, num_shards=2,
                                                                          feature_list_kinds=LIST_KINDS))
    vectors = str(tf_vectors / "sequence_examples.tfrecord")
    expected_vectors = [repr(with_float32_bits(decode_sequence_example(r))) for r in read_records(vectors)]
    expected_ours = [repr(with_float32_bits(decode_sequence_example(r))) for r in _written(prefix).elements()]

    def build(pipeline):
        ours = pipeline | "Ours" >> ReadSequenceExamples(f"{prefix}-*")
        assert_that(ours | "ReprOurs" >> beam.Map(lambda pair: repr(with_float32_bits(pair))), equal_to(expected_ours),
                    label="Ours")
        theirs = pipeline | "TF" >> ReadSequenceExamples(vectors)
        assert_that(theirs | "ReprTF" >> beam.Map(lambda pair: repr(with_float32_bits(pair))), equal_to(expected_vectors),
                    label="TF")

    run_pipeline(build)
    assert len(expected_ours) == len(PAIRS)
    first = decode_sequence_example(encode_sequence_example(*PAIRS[5], feature_list_kinds=LIST_KINDS))
    assert first == ({"country": [b"c2"], "user": [5]},
                     {"clicks": [[0], [1]], "pos": [[0.0, 0.0], [0.5, -1.0]], "query": [[], [b"q1"]]})


def test_read_sequence_examples_names_the_file_and_offset_of_a_malformed_record(tmp_path):
    good = [encode_sequence_example(*pair, feature_list_kinds=LIST_KINDS) for pair in PAIRS[:3]]
    path = tmp_path / "bad.tfrecord"
    starts = write_records(path, [good[0], good[1], b"\x12\x05\x0a\x03", good[2]])
    with pytest.raises(ExampleDecodeError, match=f"{path}: the record at offset {starts[2]}: malformed"):
        list(DecodeToPairs()(str(path), RecordBlock.from_payloads(
            [good[0], good[1], b"\x12\x05\x0a\x03"], starts[:3])))
    with pytest.raises(Exception, match=f"{path}: the record at offset {starts[2]}: malformed"):
        run_pipeline(lambda p: p | ReadSequenceExamples(str(path)))


def test_read_sequence_examples_takes_the_readers_arguments(tmp_path):
    path = tmp_path / "plain.tfrecord.gz"
    write_records(path, [encode_sequence_example({}, {"x": [[1]]}), encode_example({"y": [2]})], index=False,
                  compression="gzip")
    # An Example's features field is a SequenceExample's context field: it reads as a pair with no lists.
    expected = [repr(({}, {"x": [[1]]})), repr(({"y": [2]}, {}))]
    run_pipeline(lambda p: assert_that(p | ReadSequenceExamples(str(path), compression="gzip") | beam.Map(repr),
                                       equal_to(expected)))
    with pytest.raises(FileNotFoundError):
        ReadSequenceExamples(str(tmp_path / "missing-*"))
    ReadSequenceExamples(str(tmp_path / "missing-*"), validate=False)
    assert os.path.exists(path)


def _write_pairs(prefix: str, pairs: list, fault_at: int = 0, log: list[str] | None = None) -> bool:
    """Write pairs into 2 shards, with a full disk at finalize operation fault_at (0: none); whether it succeeded."""
    try:
        with injected("enospc" if fault_at else None, fault_at, log):
            run_pipeline(lambda p: p | beam.Create(pairs) | WriteSequenceExamples(prefix, num_shards=2))
    except Exception:  # the runner wraps the injected OSError
        return False
    return True


def _snapshot(directory: pathlib.Path) -> dict[pathlib.Path, bytes]:
    """The shards and their read indexes."""
    return {path: path.read_bytes() for path in [*directory.glob("out-*"), *directory.glob(".tfrbeam-index/*")]}


def _restore(directory: pathlib.Path, files: dict[pathlib.Path, bytes]) -> None:
    for path in _snapshot(directory):
        path.unlink()
    for path, data in files.items():
        path.write_bytes(data)


def test_a_full_disk_at_any_finalize_operation_keeps_the_old_output_or_is_completed_by_the_rerun(tmp_path):
    """The sink's guarantee (tests/beam/test_sink_faults.py) holds for SequenceExamples: a fault before its
    journal leaves the earlier run's shards whole; after it, the next run completes the commit first."""
    prefix = str(tmp_path / "out")
    old = [({"id": [i]}, {"s": [[i]]}) for i in range(6)]
    new = [({"id": [i]}, {"s": [[i], [i + 1]]}) for i in range(9)]
    encoded = lambda pairs: collections.Counter(encode_sequence_example(*pair) for pair in pairs)
    ops: list[str] = []
    assert _write_pairs(prefix, old) and _write_pairs(prefix, new, log=ops) and _written(prefix) == encoded(new)
    journal = next(number for number, line in enumerate(ops, 1) if line.split()[2].endswith("commit.json"))
    assert _write_pairs(prefix, old)
    earlier = _snapshot(tmp_path)
    for at in range(1, len(ops) + 1):
        _restore(tmp_path, earlier)
        assert _written(prefix) == encoded(old)
        if _write_pairs(prefix, new, fault_at=at):  # the step had a second way (an offset index rebuilt from headers)
            assert _written(prefix) == encoded(new), ops[at - 1]
            continue
        if at <= journal:
            assert _written(prefix) == encoded(old), ops[at - 1]
        assert _write_pairs(prefix, new) and _written(prefix) == encoded(new), ops[at - 1]
        assert not [name for name in os.listdir(tmp_path) if ".tfrbeam-" in name and name != ".tfrbeam-index"]
