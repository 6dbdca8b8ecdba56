"""The package's layers hold: no upward import, no circle of modules, no module taking another's private name.

The rules and the graph live in .ci/import_graph.py (also runnable by hand); these tests run its
checks on the tree, and on small planted trees so that each check is seen to fail.
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import pathlib
import re
import sys
import textwrap
from types import ModuleType

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", REPO_ROOT / ".ci" / "import_graph.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


graph = _load_graph()


def test_no_package_imports_a_package_above_it():
    assert graph.upward_imports(graph.all_imports()) == []


def test_no_circle_of_modules():
    assert graph.circles(graph.all_imports()) == []


def test_no_module_imports_another_modules_private_name():
    assert graph.private_reach_ins(graph.all_imports()) == []


def test_no_package_offers_a_name_of_a_higher_layer():
    """A package's lazy-export table names modules of its own layer or lower (a string there is as much a dependency
    as an import). The facade (``tfrbeam``) offers every layer's names by design."""
    import importlib

    found = {}
    for name, path in graph.source_modules().items():
        if path.name != "__init__.py" or name == graph.PACKAGE:
            continue
        module = importlib.import_module(name)
        rank = graph.layer_of(name)[0]
        upward = sorted(export for export, target in getattr(module, "_EXPORTS", {}).items()
                        if graph.layer_of(target)[0] > rank)
        if upward:
            found[name] = upward
    assert found == {}


def test_every_module_sits_in_a_layer():
    unplaced = [name for name in graph.source_modules() if graph.layer_of(name) is None]
    assert unplaced == []


def test_every_package_says_what_it_owns():
    """Each package's __init__ opens with a docstring a newcomer can read before its modules."""
    silent = [str(path.relative_to(REPO_ROOT)) for path in sorted((REPO_ROOT / "tfrbeam").rglob("__init__.py"))
              if len((ast.get_docstring(ast.parse(path.read_text())) or "").split()) < 12]
    assert silent == []


# Public names that two modules define on purpose: each command module's entry point, and a local file's
# create (base.fileops, below the framing) beside any filesystem's (beam.filesystem, through Beam).
SHARED_NAMES = {"main": 2, "create": 2}


def test_one_home_per_public_name():
    """A public function or class is defined in one module (two copies drift: runner_name, ShardFile, ranges did)."""
    homes: dict[str, list[str]] = {}
    for path in sorted((REPO_ROOT / "tfrbeam").rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(str(path.relative_to(REPO_ROOT)))
    repeated = {name: paths for name, paths in homes.items() if len(paths) > SHARED_NAMES.get(name, 1)}
    assert repeated == {}


# A concept, the text only its home may hold (a substring, or a pattern), and that home: a second copy is how two
# homes start.
ONE_HOME: dict[str, tuple[str | re.Pattern[str], str]] = {
    "the table of file kinds (FIFO, device, socket ...)": ("S_ISFIFO", "tfrbeam/base/bounded_read.py"),
    "an atomic replace of a local file": ("os.replace(", "tfrbeam/base/fileops.py"),
    "TFRecord's CRC mask": ("0xa282ead8", "tfrbeam/tfrecord/records.py"),
    "the run's identity file in its staging directory": ('"owner.json"', "tfrbeam/layout/names.py"),
    "the commit's journal": ('"commit.json"', "tfrbeam/layout/names.py"),
    "the staged dataset's record": ('"commit-ready.json"', "tfrbeam/layout/names.py"),
    "the manifest's name": ('"tfrbeam_dataset.json"', "tfrbeam/layout/names.py"),
    # A record header is sound when its length CRC matches, its length is at most 2 GiB - 1 and the record fits the
    # file: records.sound_header / header_problem say so for one header (the block checks, vectorised, agree with them).
    "a record header's length CRC check": (re.compile(r"masked_crc32c\([^()]*(:\s*8\]|\+\s*8\])"),
                                           "tfrbeam/tfrecord/records.py"),
    "a record header's layout (length, length CRC)": ('"<QI"', "tfrbeam/tfrecord/records.py"),
    # The suffix a file of each codec is written with, and so read back by under "auto": records.COMPRESSION_SUFFIX.
    "the suffix a compressed TFRecord file is written with": (
        re.compile(r"""["'](gzip|zlib)["']\s*:\s*["']\.(gz|zlib)["']"""), "tfrbeam/tfrecord/records.py"),
    "TFRecord's ZLIB suffix": ('".zlib"', "tfrbeam/tfrecord/records.py"),
    # One spilling store: the memory store's pieces and a sequence build's held rows are kinds of held.py, whose
    # registry alone says a run's data is not in this process, and whose spill-file reads alone say a file changed.
    "what a run holds in this process, by run (the spilling store's registry)": (
        "spill or inline with such runners", "tfrbeam/builder/shuffle/held.py"),
    "a spill file changed under the run": ("damaged on disk while the run used it", "tfrbeam/builder/shuffle/held.py"),
    # The manifest is read into a Manifest in one place: everyone else asks it (or a DatasetDirectory) for a shard's
    # path and the record type, never a dict (before: spec, stats, export, the tfrecord input, verify, TFDS's files).
    "a shard's path read out of a manifest's JSON": (re.compile(r"""shard\[["']path["']\]"""),
                                                    "tfrbeam/layout/manifest_schema.py"),
    "a manifest's record type defaulted to Example by hand": (re.compile(r"""\.get\(\s*["']record_type["']"""),
                                                              "tfrbeam/layout/manifest_schema.py"),
    # Which features TFRecords hold, of which kind and shape: codec.infer alone counts each record's values (before:
    # open_dataset's spec, the builder's TFRecord input and inspect each had their own rules).
    "a TFRecord feature's shape inferred from each record's count of values": ("value_lengths()", "tfrbeam/codec/infer.py"),
    # A --runner value resolved as Beam resolves it (any case, "Runner" optional): runners.known_runner alone.
    "a runner's name resolved from --runner": ('+ "runner"', "tfrbeam/builder/pipeline/runners.py"),
    # Names beside a dataset's files (before: the commit's cleanup and the manifest each spelled them out).
    "the read indexes' directory": ('".tfrbeam-index"', "tfrbeam/tfrecord/read_index.py"),
    "a shard's DALI index path": (re.compile(r"basename\([^()]*\)\s*\+\s*(DALI_INDEX_SUFFIX|[\"']\.idx[\"'])"),
                                  "tfrbeam/layout/names.py"),
}


# Concepts whose one home is built while modules being edited by other work still hold their own copy: each is a
# strict xfail, which fails the day the last copy goes, so the entry then moves up into ONE_HOME.
ONE_HOME_PENDING: dict[str, tuple[str | re.Pattern[str], str, str]] = {}


def _holds(marker: str | re.Pattern[str], text: str) -> bool:
    return bool(marker.search(text)) if isinstance(marker, re.Pattern) else marker.lower() in text.lower()


@pytest.mark.parametrize("concept", sorted(ONE_HOME) + [
    pytest.param(concept, marks=pytest.mark.xfail(strict=True, reason=ONE_HOME_PENDING[concept][2]))
    for concept in sorted(ONE_HOME_PENDING)])
def test_one_home_per_concept(concept):
    marker, home = ONE_HOME[concept] if concept in ONE_HOME else ONE_HOME_PENDING[concept][:2]
    holders = sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "tfrbeam").rglob("*.py")
                     if _holds(marker, path.read_text()))
    assert holders == [home], f"{concept}: {holders}"


def test_only_beam_and_build_import_apache_beam():
    """The format core, the reader, stats and the layout run where Beam is not installed; the commands (cli) reach
    Beam only through beam/ and builder/, which they import when a command needs them."""
    importers = []
    for name, path in graph.source_modules().items():
        if name.startswith(("tfrbeam.beam", "tfrbeam.builder")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(module.split(".")[0] == "apache_beam" for module in modules):
                importers.append(name)
    assert importers == []


@pytest.fixture()
def planted(tmp_path, monkeypatch):
    """A tree of our own layout whose modules the test writes: the checks read it in place of the real one."""
    root = tmp_path / "repo"

    def write(files: dict[str, str]) -> list:
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.setattr(graph, "ROOT", root)
        return graph.all_imports()

    return write


def test_an_upward_import_is_found(planted):
    imports = planted({
        "tfrbeam/__init__.py": "",
        "tfrbeam/tfrecord/__init__.py": "",
        "tfrbeam/tfrecord/records.py": "def frame():\n    from tfrbeam.dataset.reader import Segment\n",
        "tfrbeam/dataset/__init__.py": "",
        "tfrbeam/dataset/reader.py": "Segment = 1\n",
    })
    problems = graph.upward_imports(imports)
    assert len(problems) == 1 and "tfrbeam.tfrecord.records:2 imports tfrbeam.dataset.reader: upward" in problems[0]


def test_a_circle_is_found_even_through_a_function_level_import(planted):
    imports = planted({
        "tfrbeam/__init__.py": "",
        "tfrbeam/builder/__init__.py": "",
        "tfrbeam/builder/pipeline/__init__.py": "",
        "tfrbeam/builder/pipeline/plan.py": "from tfrbeam.builder.pipeline import sequence\n",
        "tfrbeam/builder/pipeline/sequence.py": "def f():\n    from tfrbeam.builder.pipeline.plan import BuildPlan\n",
    })
    assert graph.circles(imports) == [["tfrbeam.builder.pipeline.plan", "tfrbeam.builder.pipeline.sequence"]]


def test_a_private_name_from_another_module_is_found(planted):
    imports = planted({
        "tfrbeam/__init__.py": "",
        "tfrbeam/codec/__init__.py": "",
        "tfrbeam/codec/decode.py": "def _gather():\n    return 1\n",
        "tfrbeam/codec/sequence_decode.py": "from .decode import _gather, __doc__\n",
    })
    assert graph.private_reach_ins(imports) == ["tfrbeam.codec.sequence_decode:1 imports tfrbeam.codec.decode._gather"]


def test_a_top_level_module_outside_the_layers_is_found(planted):
    planted({"tfrbeam/__init__.py": "", "tfrbeam/records.py": "x = 1\n"})
    assert graph.layer_of("tfrbeam.records") is None
    assert graph.layer_of("tfrbeam.errors") == (0, "tfrbeam.errors")


# Compression has one home (issue 44): tfrbeam/tfrecord/records.py says what every spelling means. Elsewhere a
# compression or codec value is passed on, never compared with a spelling ("auto", "none", "gzip", ...).
COMPRESSION_HOME = "tfrbeam/tfrecord/records.py"
COMPRESSION_EXEMPT = {
    # Whole-file codecs of CSV/JSON/... build inputs (bzip2, xz, zstd included), not a TFRecord's compression.
    "tfrbeam/builder/inputs/compressed.py": None,
}


def _names_a_compression(name: str) -> bool:
    return bool({"compression", "compressions", "codec"} & set(name.lower().split("_")))


def _compression_named(node: ast.AST) -> bool:
    """``compression``, ``self._codec``, ``options.compression.strip().lower()``, ``compressions[path]``, ..."""
    while isinstance(node, (ast.Call, ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Attribute) and _names_a_compression(node.attr):
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and _names_a_compression(node.id)


def _string_literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _string_literals(element)]
    return []


def compression_spelling_comparisons(root: pathlib.Path) -> list[str]:
    """Each comparison of a compression- or codec-named value with a string literal outside the home."""
    found = []
    for path in sorted((root / "tfrbeam").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == COMPRESSION_HOME or (relative in COMPRESSION_EXEMPT and COMPRESSION_EXEMPT[relative] is None):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            literals = {value for operand in operands for value in _string_literals(operand)}
            if literals - (COMPRESSION_EXEMPT.get(relative) or set()) and any(map(_compression_named, operands)):
                found.append(f"{relative}:{node.lineno} compares a compression with {sorted(literals)}")
    return found


def test_only_the_compression_home_compares_compression_spellings():
    assert compression_spelling_comparisons(REPO_ROOT) == []


def test_a_compression_spelling_compared_elsewhere_is_found(tmp_path):
    (tmp_path / "tfrbeam" / "dataset").mkdir(parents=True)
    (tmp_path / "tfrbeam" / "dataset" / "spec.py").write_text(
        'def codec(compression, stored):\n    return stored if compression.strip().lower() == "auto" else compression\n')
    assert compression_spelling_comparisons(tmp_path) == ['tfrbeam/dataset/spec.py:2 compares a compression with [\'auto\']']


def test_every_test_file_has_a_name_of_its_own():
    """pytest imports test files by their base name (the test folders are not packages), so two ``test_x.py`` in
    different folders stop the suite at collection."""
    names = collections.Counter(path.name for path in (REPO_ROOT / "tests").rglob("test_*.py"))
    assert sorted(name for name, count in names.items() if count > 1) == []
