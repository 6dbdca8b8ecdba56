"""The package facade: every exported name resolves, and the format core never imports Apache Beam."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tfrbeam

# Each public name and the module that defines it, written out here rather than read from the
# facade's own table, so a name bound to the wrong object (or a module of the same name) fails.
DEFINED_IN = {
    "RecordReader": "tfrbeam.tfrecord.records",
    "RecordWriter": "tfrbeam.tfrecord.records",
    "masked_crc32c": "tfrbeam.tfrecord.records",
    "read_records": "tfrbeam.tfrecord.records",
    "record_blocks": "tfrbeam.tfrecord.blocks",
    "decode_example": "tfrbeam.codec.example",
    "decode_sequence_example": "tfrbeam.codec.example",
    "encode_example": "tfrbeam.codec.example",
    "encode_sequence_example": "tfrbeam.codec.example",
    "encode_record_batch": "tfrbeam.codec.encode",
    "record_batch_to_examples": "tfrbeam.codec.encode",
    "encode_sequence_batch": "tfrbeam.codec.sequence_encode",
    "examples_to_record_batch": "tfrbeam.codec.decode",
    "ReadAllFromTFRecord": "tfrbeam.beam.source",
    "ReadFromTFRecord": "tfrbeam.beam.source",
    "TFRecordSource": "tfrbeam.beam.source",
    "WriteToTFRecord": "tfrbeam.beam.sink",
    "ReadExamples": "tfrbeam.beam.examples_read",
    "WriteExamples": "tfrbeam.beam.examples_write",
    "ReadSequenceExamples": "tfrbeam.beam.sequence_examples",
    "WriteSequenceExamples": "tfrbeam.beam.sequence_examples",
    "open_dataset": "tfrbeam.dataset.pipeline",
    "open_random_access": "tfrbeam.dataset.random_access",
    "even_splits": "tfrbeam.dataset.splits",
    "mix": "tfrbeam.dataset.mixing",
    "WriteDataset": "tfrbeam.builder.pipeline.from_rows",
    "write_dataset": "tfrbeam.builder.running.write_table",
}


def test_the_exports_are_exactly_the_documented_names():
    assert sorted(tfrbeam.__all__) == sorted([*DEFINED_IN, "__version__"])
    assert isinstance(tfrbeam.__version__, str) and tfrbeam.__version__.count(".") == 2


# Names that are also a submodule's name (tfrbeam.record_blocks): in one process their binding
# depends on import order, so they are checked in a fresh process below.
CLASHING = sorted(name for name, module in DEFINED_IN.items() if module == f"tfrbeam.{name}")


@pytest.mark.parametrize("name", sorted(set(DEFINED_IN) - set(CLASHING)))
def test_every_exported_name_is_the_object_its_module_defines(name):
    defining = importlib.import_module(DEFINED_IN[name])
    exported = getattr(tfrbeam, name)
    assert exported is getattr(defining, name)
    assert (exported.__module__, exported.__qualname__) == (DEFINED_IN[name], name)


_FRESH_PROCESS_CHECK = """
import importlib, sys, tfrbeam
defined_in = {defined_in!r}
for module in sorted(set(defined_in.values())):  # as an application might: modules first, then the facade
    importlib.import_module(module)
wrong = []
for name, module in sorted(defined_in.items()):
    exported = getattr(tfrbeam, name)
    if exported is not getattr(importlib.import_module(module), name) or getattr(exported, "__module__", None) != module:
        wrong.append(name)
print(wrong)
"""


def test_every_exported_name_is_its_definition_even_after_the_modules_were_imported():
    code = _FRESH_PROCESS_CHECK.format(defined_in=DEFINED_IN)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_beam_package_exports_the_same_transforms():
    import tfrbeam.beam

    for name in ("ReadExamples", "WriteExamples", "ReadSequenceExamples", "WriteSequenceExamples", "WriteToTFRecord"):
        assert name in tfrbeam.beam.__all__
        assert getattr(tfrbeam.beam, name) is getattr(tfrbeam, name)


def test_the_build_package_offers_the_python_api():
    import tfrbeam.builder

    assert tfrbeam.builder.__all__ == ["BuildResult", "WriteDataset", "run", "write_dataset"]
    assert tfrbeam.builder.run is importlib.import_module("tfrbeam.builder.running.launch").run
    assert tfrbeam.builder.write_dataset is tfrbeam.write_dataset and tfrbeam.builder.WriteDataset is tfrbeam.WriteDataset


def test_a_build_does_not_import_the_readers_statistics_or_parquet_export():
    """tfrbeam.beam's names load on first use: the build's start-up (every run pays it) skips what it never runs."""
    code = (
        "import sys\n"
        "import tfrbeam.cli.build\n"
        "print(sorted(m for m in sys.modules if m in ('tfrbeam.beam.examples_read', 'tfrbeam.beam.stats_combine',\n"
        "             'tfrbeam.beam.parquet_export', 'tfrbeam.beam.sequence_examples', 'tfrbeam.codec.decode')))\n"
        "import pyarrow, tfrbeam.beam\n"
        "from apache_beam.coders import registry\n"
        "print(type(registry.get_coder(pyarrow.RecordBatch)).__name__)\n"
        "print(sorted(dir(tfrbeam.beam)) == sorted(tfrbeam.beam.__all__), tfrbeam.beam.ReadExamples.__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:3] == ["[]", "RecordBatchCoder", "True tfrbeam.beam.examples_read"]
    import tfrbeam.beam

    with pytest.raises(AttributeError, match=r"tfrbeam\.beam' has no attribute 'nope'"):
        tfrbeam.beam.nope


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfrbeam.nope


def test_the_format_core_does_not_import_beam():
    code = (
        "import sys, tfrbeam\n"
        "for name in ('read_records', 'RecordWriter', 'encode_example', 'decode_example', 'record_blocks',\n"
        "             'record_batch_to_examples', 'examples_to_record_batch', 'encode_sequence_batch', 'open_dataset'):\n"
        "    getattr(tfrbeam, name)\n"
        "import tfrbeam.tfrecord.read_index, tfrbeam.layout.manifest, tfrbeam.base.file_access, tfrbeam.cli.file_tools\n"
        "print('apache_beam' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_generated_messages_name_the_module_they_live_in():
    """Pickling (Beam's cloudpickle) finds a message class by its __module__: a stale name after a move breaks it."""
    from tfrbeam.codec.protos import example_pb2

    for message in (example_pb2.Example, example_pb2.SequenceExample, example_pb2.Features):
        assert message.__module__ == example_pb2.__name__
    assert example_pb2.DESCRIPTOR.name == "tfrbeam/codec/protos/example.proto"
