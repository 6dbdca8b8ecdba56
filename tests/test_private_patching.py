"""Tests exercise tfrbeam through its public seams: monkeypatching a private (``_name``) tfrbeam function,
class or constant is allowed only where the allow-list below says why.

A patch is a ``setattr``/``delattr`` call (``monkeypatch.setattr``, builtin ``setattr``, ``mock.patch``,
``mock.patch.object``) or an assignment whose target reaches a ``_name`` through a name the test file bound to
a tfrbeam module or object. Prefer a public seam: a public function's result, a public name the module uses
(patched where the module looks it up), a log record, a metric, the fault harness (tests/faults.py), a fixture.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parent

# Knobs: a size or count the module reads at call time, shrunk so a small input takes the many-chunk path.
_KNOB = "size knob shrunk so a small input crosses the boundaries a large one would"
# Spies that count internal work for a speed property that no public result, log or metric shows.
_SPEED = "counts internal work for a speed property; no public seam shows it"

# (test file, patched target as written) -> why it stays.
ALLOWED: dict[tuple[str, str], str] = {
    ("codec/test_decode.py", "columnar_decode._Walk._entries_from_windows"):
        _SPEED + " (alike entries take one comparison, not the windowed path)",
    ("codec/test_decode.py", "columnar_decode._CHUNK_RECORDS"): _KNOB,
    ("codec/test_wide_records.py", "columnar_decode._count_entries"):
        _SPEED + " (records too short to pass max_features are never counted)",
    ("codec/test_wide_records.py", "columnar_decode._Walk._step"):
        _SPEED + " (one lockstep walk step per feature of a wide record)",
    ("codec/test_sequence_encode.py", "sequence_encode._taken"):
        _SPEED + " (the next run's rows are taken on a thread while this run is encoded)",
    ("codec/test_sequence_encode.py", "sequence_encode._ROWS_PER_CHUNK"): _KNOB,
    ("codec/test_sequence_decode.py", "sequence_decode._plain_steps"):
        "turns the plain-steps fast path off to compare it with the general path on the same records",
    ("codec/test_encode.py", "columnar_encode._SEGMENT_BYTES_PER_GROUP"): _KNOB,
    ("codec/test_encode.py", "columnar_encode._ROWS_PER_CHUNK"): _KNOB,
    ("codec/test_example.py", "example_module._NAME_CACHE"): "starts the name cache empty (module state)",
    ("codec/test_example.py", "example_module._NAME_CACHE_LIMIT"): _KNOB,
    ("codec/test_example.py", "example_module._STRUCT_IS_NUMPY"):
        "takes the struct fallback that numpy-less platforms take",
    ("codec/test_example.py", "example_module._WireWalker.example"):
        "makes our walker pass bytes protobuf rejects, a disagreement no known input gives",
    ("tfrecord/test_frames.py", "frames_module._BINARY_VIEW_FRAMES"):
        "runs the binary_view and the plain frame path on one pyarrow",
    ("dataset/test_read_speed.py", "output_module._binary_array"):
        _SPEED + " (raw records reach numpy batches without a round trip through Arrow)",
    ("builder/pipeline/test_resolve.py", "csv_read._CSV_BLOCK_BYTES"): _KNOB,
    ("builder/pipeline/test_commit_trust.py", "publish._HOLDER_WAITS"): _KNOB,
    ("builder/shuffle/test_spilled_runs.py", "stores._CHECK_BLOCK_BYTES"): _KNOB,
    ("builder/features/test_file_features.py", "features._RECORD_FILE_BYTES"):
        _KNOB + " (stands in for TFRecord's 2 GiB - 1)",
    ("builder/inputs/test_jsonl.py", "jsonl_read._BLOCK_BYTES"): _KNOB,
    ("builder/inputs/test_jsonl_long_lines.py", "jsonl_read._BLOCK_BYTES"): _KNOB,
    ("builder/inputs/test_inputs.py", "csv_read._CSV_BLOCK_BYTES"): _KNOB,
    ("builder/inputs/test_inputs.py", "csv_text._READ_CHUNK_BYTES"): _KNOB,
    ("builder/inputs/test_inputs.py", "parquet_read._PARQUET_BATCH_ROWS"): _KNOB,
    ("builder/pipeline/test_sequence_build.py", "sequence_encode._ROWS_PER_CHUNK"): _KNOB,
    ("builder/pipeline/test_commit_faults.py", "write._HashingFile.write"):
        "a full disk as a shard is written: the shard's bytes go through Beam's file system, which no fault hook reaches",
}

# Whole files whose patches another piece of work is replacing; each entry goes when that work lands.
ALLOWED_FILES: dict[str, str] = {}

_PATCH_CALLS = {"setattr", "delattr"}
_MOCK_CALLS = {"patch", "object"}  # mock.patch("tfrbeam.x._y"), mock.patch.object(module, "_y")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _tfrbeam_names(tree: ast.AST) -> set[str]:
    """Names the file binds (anywhere) to a tfrbeam module or to a name taken from one."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tfrbeam":
                    bound.add(alias.asname or "tfrbeam")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tfrbeam":
            bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _patched_target(node: ast.AST, bound: set[str]) -> str | None:
    """The dotted target when ``node`` patches a private tfrbeam name, else None."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in _PATCH_CALLS | _MOCK_CALLS or not node.args:
            return None
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):  # "tfrbeam.module._name"
            parts = first.value.split(".")
            return first.value if parts[0] == "tfrbeam" and any(map(_private, parts)) else None
        chain = _chain(first)
        if chain is None or chain[0] not in bound:
            return None
        if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            chain.append(node.args[1].value)
        return ".".join(chain) if any(map(_private, chain[1:])) else None
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            chain = _chain(target) if isinstance(target, ast.Attribute) else None
            if chain is not None and chain[0] in bound and any(map(_private, chain[1:])):
                return ".".join(chain)
    return None


def private_patches(source: str) -> list[tuple[int, str]]:
    """(line, target) of every patch of a private tfrbeam name in a test file's source."""
    tree = ast.parse(source)
    bound = _tfrbeam_names(tree)
    found = {(node.lineno, target) for node in ast.walk(tree)
             if (target := _patched_target(node, bound)) is not None}
    return sorted(found)


def _all_patches() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = private_patches(path.read_text(encoding="utf-8"))
        if found:
            out[path.relative_to(TESTS).as_posix()] = found
    return out


def test_no_test_patches_a_private_name_outside_the_allow_list():
    unexplained = [f"tests/{path}:{line}: {target}" for path, found in _all_patches().items()
                   if path not in ALLOWED_FILES for line, target in found if (path, target) not in ALLOWED]
    assert unexplained == [], "patch a public seam instead, or add an entry to ALLOWED saying why:\n" + "\n".join(
        unexplained)


def test_every_allowed_patch_is_still_made():
    """An entry whose patch went away goes too, so the list only shrinks."""
    made = {(path, target) for path, found in _all_patches().items() for _, target in found}
    assert sorted(set(ALLOWED) - made) == []
    assert all(reason.strip() for reason in [*ALLOWED.values(), *ALLOWED_FILES.values()])


@pytest.mark.parametrize("source, target", [
    ("import tfrbeam.codec.decode as d\ndef test(monkeypatch):\n    monkeypatch.setattr(d, '_walk', None)",
     "d._walk"),
    ("from tfrbeam.codec import decode\ndef test(monkeypatch):\n    monkeypatch.setattr(decode._Walk, 'run', None)",
     "decode._Walk.run"),
    ("def test(monkeypatch):\n    from tfrbeam.dataset import columns as c\n    c._LIMIT = 3", "c._LIMIT"),
    ("import tfrbeam\ndef test(monkeypatch):\n    monkeypatch.setattr('tfrbeam.codec.decode._walk', None)",
     "tfrbeam.codec.decode._walk"),
    ("from unittest import mock\nfrom tfrbeam.codec import decode\n"
     "def test():\n    with mock.patch.object(decode, '_walk'):\n        pass", "decode._walk"),
    ("from tfrbeam.codec import decode\ndef test():\n    setattr(decode, '_walk', None)", "decode._walk"),
])
def test_a_planted_private_patch_is_found(source, target):
    assert [found for _, found in private_patches(textwrap.dedent(source))] == [target]


@pytest.mark.parametrize("source", [
    "import tfrbeam.codec.decode as d\ndef test(monkeypatch):\n    monkeypatch.setattr(d, 'examples_to_record_batch', 1)",
    "import os\ndef test(monkeypatch):\n    monkeypatch.setattr(os, '_exit', None)",  # not tfrbeam's
    "class A:\n    def __init__(self):\n        self._x = 1",
])
def test_public_names_and_other_packages_are_not_counted(source):
    assert private_patches(source) == []
