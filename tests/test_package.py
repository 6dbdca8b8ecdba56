"""The package facade: every exported name resolves, and the format core never imports Apache Beam."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tfrbeam


@pytest.mark.parametrize("name", sorted(set(tfrbeam.__all__) - {"__version__"}))
def test_every_exported_name_resolves(name):
    assert getattr(tfrbeam, name) is not None


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfrbeam.nope  # noqa: B018


def test_the_format_core_does_not_import_beam():
    code = (
        "import sys, tfrbeam\n"
        "for name in ('read_records', 'RecordWriter', 'encode_example', 'decode_example', 'record_blocks',\n"
        "             'record_batch_to_examples', 'examples_to_record_batch', 'open_dataset'):\n"
        "    getattr(tfrbeam, name)\n"
        "import tfrbeam.record_index, tfrbeam.manifest, tfrbeam.file_access, tfrbeam.file_tools\n"
        "print('apache_beam' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
